/**
 * The status page at `/` and the JSON it polls (`GET /v1/status`): one self-contained
 * HTML document (no external assets: it works air-gapped). The history it draws is the
 * server's (./status-history.ts): a page opened now shows the last few minutes, and
 * each poll fetches only the samples it has not seen (`?since=`). It draws, from the
 * counters' differences over a trailing window: routes/s and the decision time,
 * predicted against observed hits over the same answers, KV events/s and their lag,
 * admission (held, 429s), the proxy's counters (every one it has: a new counter shows
 * without a change here), each worker's cached blocks and load; and each degraded
 * worker with the reason, in compact alerts and the table.
 */
import { workersOp } from "./api";
import type { Cluster } from "../cluster/cluster";
import type { KvedgeCore } from "../core/core";
import {
  HISTORY_SAMPLES,
  numbersOf,
  SAMPLE_MS,
  type StatusHistory,
  statusTotals,
} from "./status-history";

/**
 * GET /v1/status: cumulative counters (the page turns them into rates), the workers,
 * and the history samples taken after `since` (ms since the epoch; 0: all of them); with
 * several processes deciding as one, the cluster (null: this process alone).
 */
export function statusOp(
  core: KvedgeCore,
  history: StatusHistory,
  proxyCounters: object | null,
  since: number,
  cluster: Cluster | null = null,
) {
  const index = core.index.counters;
  const routes = core.routeTotals;
  const totals = statusTotals(core);
  return {
    now_ms: Date.now(),
    block_size: core.blockSize,
    routes: {
      decisions: routes.decisions,
      prompt_tokens: routes.promptTokens,
      predicted_cached_tokens: routes.predictedCachedTokens,
    },
    answers: {
      with_usage: totals.answers,
      prompt_tokens: totals.promptTokens,
      predicted_cached_tokens: totals.predicted,
      observed_cached_tokens: totals.observed,
    },
    events: {
      stored: index.storedEvents,
      removed: index.removedEvents,
      cleared: index.clearedEvents,
    },
    event_lag: { batches: totals.lagBatches, sum_ms: totals.lagSumMs },
    admission: {
      enabled: core.admission.enabled,
      held_now: core.admission.held,
      counts: { ...core.admission.counts },
    },
    pacing: {
      enabled: core.pacing.enabled,
      held_now: core.pacing.held,
      counts: { ...core.pacing.counts },
    },
    proxy: proxyCounters === null ? null : numbersOf(proxyCounters),
    workers: workersOp(core).workers,
    history: { interval_ms: SAMPLE_MS, capacity: HISTORY_SAMPLES, samples: history.since(since) },
    cluster: cluster?.status() ?? null,
  };
}

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kvedge</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2rem 1.6rem; color: #1d1d1f; background: #f6f7f9; }
  h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
  h2 { font-size: .9rem; margin: 0 0 .3rem; font-weight: 600; color: #333; }
  #summary { color: #555; margin-bottom: .8rem; }
  #alerts { margin-bottom: .8rem; }
  .alert { background: #fdecea; color: #8a1c12; border-left: 4px solid #dc2626; border-radius: 3px; padding: .25rem .6rem; margin-bottom: .2rem; font-size: .9rem; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
  .alert.warn { background: #fff7e6; color: #7a4b00; border-left-color: #d97706; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(24rem, 1fr)); gap: .8rem; margin-bottom: 1rem; }
  .card { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; padding: .55rem .8rem .4rem; }
  .value { font-size: 1.15rem; font-weight: 600; min-height: 1.5rem; }
  .legend { font-size: .8rem; color: #444; min-height: 1.1rem; }
  .legend span { margin-right: .8rem; white-space: nowrap; }
  .legend i { display: inline-block; width: .8rem; height: .25rem; vertical-align: middle; margin-right: .3rem; }
  svg { width: 100%; height: 8rem; display: block; }
  table { border-collapse: collapse; width: 100%; background: #fff; font-size: .85rem; }
  th, td { text-align: right; padding: .25rem .5rem; border-bottom: 1px solid #e5e5e5; vertical-align: top; }
  th { background: #fafafa; font-weight: 600; }
  th:first-child, td:first-child, td.text, th.text { text-align: left; }
  td.reason { max-width: 22rem; white-space: normal; }
  .bad { color: #b00020; font-weight: 600; }
  .ok { color: #0a7d32; }
  .muted { color: #888; }
</style>
</head>
<body>
<h1>kvedge</h1>
<div id="summary">loading…</div>
<div id="alerts"></div>
<div class="grid">
  <div class="card"><h2>Routes per second</h2><div class="value" id="routes-now">–</div><div class="legend"></div><svg id="chart-routes"></svg></div>
  <div class="card"><h2>Route decision time</h2><div class="value" id="latency-now">–</div>
    <div class="legend"><span><i style="background:#2563eb"></i>p50</span><span><i style="background:#dc2626"></i>p99</span></div><svg id="chart-latency"></svg></div>
  <div class="card"><h2>Cache hits over the same answers</h2><div class="value" id="hits-now">–</div>
    <div class="legend"><span><i style="background:#2563eb"></i>predicted by the index</span><span><i style="background:#16a34a"></i>observed (engines' usage)</span><span class="muted" id="hits-answers"></span></div><svg id="chart-hits"></svg></div>
  <div class="card"><h2>KV events per second</h2><div class="value" id="events-now">–</div><div class="legend"></div><svg id="chart-events"></svg></div>
  <div class="card"><h2>Event lag (engine timestamp to applied)</h2><div class="value" id="lag-now">–</div><div class="legend"></div><svg id="chart-lag"></svg></div>
  <div class="card"><h2>Admission</h2><div class="value" id="admission-now">–</div>
    <div class="legend"><span><i style="background:#7c3aed"></i>held</span><span><i style="background:#dc2626"></i>429s per second</span></div><svg id="chart-admission"></svg></div>
  <div class="card proxy"><h2>Proxy: requests per second</h2><div class="value" id="proxy-now">–</div><div class="legend" id="proxy-volume-legend"></div><svg id="chart-proxy-volume"></svg></div>
  <div class="card proxy"><h2>Proxy: failures and refusals per second</h2><div class="value" id="proxy-problems-now">–</div><div class="legend" id="proxy-problems-legend"></div><svg id="chart-proxy-problems"></svg></div>
  <div class="card"><h2>Per worker: cached blocks</h2><svg id="chart-blocks"></svg></div>
  <div class="card"><h2>Per worker: active requests</h2><svg id="chart-load"></svg></div>
</div>
<table>
  <thead><tr>
    <th>worker</th><th>dp</th><th class="text">endpoint</th><th class="text">state</th><th class="text">trust</th><th class="text">degraded because</th>
    <th>cached blocks</th><th>active</th><th>prefill tokens</th><th>routed</th>
    <th>predicted hits</th><th>observed hits</th><th>event lag</th><th>last seq</th><th>lost batches</th><th>of them peers'</th>
  </tr></thead>
  <tbody id="workers"></tbody>
</table>
<div id="cluster" hidden>
  <h2 style="margin-top:1.2rem">Cluster <span id="cluster-summary"></span></h2>
  <table>
    <thead><tr>
      <th>peer</th><th class="text">state</th><th>heard</th><th>requests here</th><th>requests it announced</th>
      <th>applied seq</th><th>published seq</th><th>lag</th><th>held</th>
    </tr></thead>
    <tbody id="peers"></tbody>
  </table>
</div>
<script>
const POLL_MS = 1000, WINDOW = 5, ALERTS_MAX = 4, NS = "http://www.w3.org/2000/svg";
// Proxy counters that count traffic; every other one counts a failure of some kind.
const VOLUME = new Set(["requests", "completed"]);
const PALETTE = ["#dc2626", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#4b5563", "#2563eb", "#16a34a", "#9333ea"];
let samples = [], capacity = 300, interval = 1000, lastT = 0;
const el = (id) => document.getElementById(id);
const node = (name, attrs, text) => {
  const n = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
};
const fmt = (v) => v === null || v === undefined ? "–" : v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(1) + "k" : (Math.round(v * 10) / 10).toString();
const pct = (v) => v === null || Number.isNaN(v) ? "–" : (100 * v).toFixed(1) + "%";
const us = (v) => v === null || v === undefined ? "–" : v >= 1000 ? (v / 1000).toFixed(1) + " ms" : fmt(v) + " µs";
const words = (key) => key.replace(/([a-z0-9])([A-Z])/g, "$1 $2").replace(/_/g, " ").toLowerCase();
const last = (list) => list.length === 0 ? null : list[list.length - 1];
const lastValue = (list) => { for (let i = list.length - 1; i >= 0; i--) if (list[i] !== null) return list[i]; return null; };

// Rates and ratios over a trailing window of samples (sparse traffic still draws a line).
function rate(f) {
  return samples.map((s, i) => {
    const p = samples[Math.max(0, i - WINDOW)], dt = (s.t - p.t) / 1000;
    return dt > 0 ? Math.max(0, f(s) - f(p)) / dt : null;
  });
}
function ratio(num, den) {
  return samples.map((s, i) => {
    const p = samples[Math.max(0, i - WINDOW)], d = den(s) - den(p);
    return d > 0 ? (num(s) - num(p)) / d : null;
  });
}
const gauge = (f) => samples.map(f);

function lineChart(svg, series, options = {}) {
  const w = svg.clientWidth || 400, h = svg.clientHeight || 128, pad = 34, bottom = h - 14;
  // The axis spans the history there is (at least a minute), up to the server's capacity.
  const end = lastT || Date.now();
  const span = Math.min(capacity * interval, Math.max(60000, end - (samples[0]?.t ?? end)));
  const start = end - span;
  const values = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const top = Math.max(options.max ?? 0, ...values, 1e-9);
  const label = options.max === 1 ? "100%" : options.unit === "us" ? us(top) : options.unit === "ms" ? fmt(top) + " ms" : fmt(top);
  const children = [node("line", { x1: pad, y1: bottom, x2: w, y2: bottom, stroke: "#ccc" }),
    node("text", { x: 0, y: 10, "font-size": 10, fill: "#777" }, label),
    node("text", { x: 0, y: bottom, "font-size": 10, fill: "#777" }, "0"),
    node("text", { x: pad, y: h - 2, "font-size": 9, fill: "#999" }, span < 90000 ? "−" + Math.round(span / 1000) + " s" : "−" + Math.round(span / 60000) + " min"),
    node("text", { x: w - 20, y: h - 2, "font-size": 9, fill: "#999" }, "now")];
  for (const s of series) {
    const points = [];
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const x = pad + (w - pad) * Math.max(0, samples[i].t - start) / (end - start);
      points.push(x.toFixed(1) + "," + (bottom - (bottom - 10) * v / top).toFixed(1));
    });
    if (points.length === 1) {
      const [x, y] = points[0].split(",");
      children.push(node("circle", { cx: x, cy: y, r: 3, fill: s.color }));
    }
    if (points.length > 0) children.push(node("polyline", { points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.8, class: "series " + s.name, "data-points": points.length }));
  }
  svg.replaceChildren(...children);
}

function barChart(svg, workers, value, label) {
  const w = svg.clientWidth || 400, h = svg.clientHeight || 128;
  const top = Math.max(1, ...workers.map(value));
  const slot = w / Math.max(1, workers.length);
  const children = [];
  workers.forEach((worker, i) => {
    const v = value(worker), bar = (h - 30) * v / top;
    children.push(node("rect", { x: i * slot + slot * 0.15, y: h - 16 - bar, width: slot * 0.7, height: bar,
      fill: worker.degraded ? "#dc2626" : "#2563eb", class: "bar", "data-worker": worker.worker_id }));
    children.push(node("text", { x: i * slot + slot / 2, y: h - 3, "font-size": 10, "text-anchor": "middle", fill: "#555" }, label(worker)));
    children.push(node("text", { x: i * slot + slot / 2, y: h - 19 - bar, "font-size": 10, "text-anchor": "middle", fill: "#333" }, fmt(v)));
  });
  svg.replaceChildren(...children);
}

function legend(id, entries) {
  el(id).replaceChildren(...entries.map(([name, color, text]) => {
    const span = document.createElement("span");
    span.className = "counter";
    span.dataset.counter = name;
    const i = document.createElement("i");
    i.style.background = color;
    span.append(i, words(name) + " " + text);
    return span;
  }));
}

function renderProxy(proxy) {
  for (const card of document.querySelectorAll(".card.proxy")) card.style.display = proxy === null ? "none" : "";
  if (proxy === null) return;
  const keys = Object.keys(proxy);
  const volume = keys.filter((k) => VOLUME.has(k)), problems = keys.filter((k) => !VOLUME.has(k));
  const seriesOf = (list, offset) => list.map((k, i) => ({ name: k, color: PALETTE[(i + offset) % PALETTE.length], values: rate((s) => s.proxy?.[k] ?? 0) }));
  const volumeSeries = seriesOf(volume, 7), problemSeries = seriesOf(problems, 0);
  lineChart(el("chart-proxy-volume"), volumeSeries);
  lineChart(el("chart-proxy-problems"), problemSeries);
  legend("proxy-volume-legend", volumeSeries.map((s) => [s.name, s.color, fmt(proxy[s.name]) + " total"]));
  legend("proxy-problems-legend", problemSeries.map((s) => [s.name, s.color, fmt(proxy[s.name])]));
  el("proxy-now").textContent = fmt(lastValue(volumeSeries[0]?.values ?? [])) + " /s";
  const failing = problems.reduce((sum, k) => sum + (lastValue(rate((s) => s.proxy?.[k] ?? 0)) ?? 0), 0);
  el("proxy-problems-now").textContent = fmt(failing) + " /s";
}

// One line per cause (workers with the same cause together); at most ALERTS_MAX lines.
function renderAlerts(workers, name, cluster) {
  const groups = new Map();
  const add = (key, text, worker, warn) => {
    if (!groups.has(key)) groups.set(key, { text, names: [], warn });
    groups.get(key).names.push(name(worker));
  };
  for (const w of workers) {
    if (w.degraded) {
      const reason = w.degraded_reason ?? "degraded";
      add(reason.replace(/^\\d+ batch(es)? lost:/, "batches lost:"), reason, w, false);
    }
    if (w.observed_hits.under_predicted) add("under", "serves far more than predicted: check the tokenizer and chat template", w, true);
  }
  const list = (names) => (names.length === 1 ? "worker " : names.length + " workers: ") + names.slice(0, 8).join(", ") + (names.length > 8 ? ", …" : "");
  const lines = [...groups.values()].map((g) => ({ text: list(g.names) + " — " + g.text, warn: g.warn }));
  if (cluster !== null && cluster.state !== "connected")
    lines.unshift({ text: "cluster: " + cluster.state + " since " + new Date(cluster.since_ms).toLocaleTimeString() + " (NATS unreachable): deciding on this replica's view", warn: false });
  const syncing = (cluster?.peers ?? []).filter((p) => p.state === "syncing").map((p) => p.replica_id);
  if (syncing.length > 0) lines.push({ text: "cluster: fetching the set of " + syncing.join(", "), warn: true });
  if (lines.length > ALERTS_MAX) {
    const rest = lines.splice(ALERTS_MAX - 1);
    lines.push({ text: rest.length + " more causes, " + rest.length + "+ workers: see the table", warn: false });
  }
  el("alerts").replaceChildren(...lines.map((line) => {
    const div = document.createElement("div");
    div.className = line.warn ? "alert warn" : "alert";
    div.textContent = line.text;
    div.title = line.text;
    return div;
  }));
}

const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };

function renderWorkers(workers, name) {
  el("workers").replaceChildren(...workers.map((w) => {
    const tr = document.createElement("tr");
    const trust = w.degraded ? (w.observed_hits.suspect && w.mode === "exact" ? "hits suspect" : "degraded") : w.mode;
    tr.append(cell(w.worker_id), cell(w.dp_rank), cell(w.endpoint ?? "—", "text"),
      cell(w.state, w.state === "connected" || w.mode === "approximate" ? "text ok" : "text bad"), cell(trust, trust === "exact" || trust === "approximate" ? "text ok" : "text bad"),
      cell(w.degraded_reason ?? "", "text reason"),
      cell(w.blocks), cell(w.active_requests), cell(Math.round(w.active_prefill_tokens)), cell(w.routed_total),
      cell(w.observed_hits.predicted_cached_tokens), cell(w.observed_hits.observed_cached_tokens),
      cell(w.event_lag_ms === null ? "–" : fmt(w.event_lag_ms) + " ms"), cell(w.last_seq), cell(w.lost_batches),
      cell(w.peer_active_requests));
    return tr;
  }));
  barChart(el("chart-blocks"), workers, (w) => w.blocks, name);
  barChart(el("chart-load"), workers, (w) => w.active_requests, name);
}

function renderCharts(status) {
  const routes = rate((s) => s.decisions);
  lineChart(el("chart-routes"), [{ name: "routes", color: "#2563eb", values: routes }]);
  el("routes-now").textContent = fmt(lastValue(routes)) + " /s";
  const p50 = gauge((s) => s.decision_p50_us), p99 = gauge((s) => s.decision_p99_us);
  lineChart(el("chart-latency"), [{ name: "p50", color: "#2563eb", values: p50 }, { name: "p99", color: "#dc2626", values: p99 }], { unit: "us" });
  el("latency-now").textContent = "p50 ≤ " + us(lastValue(p50)) + " · p99 ≤ " + us(lastValue(p99));
  const predicted = ratio((s) => s.answer_predicted_tokens, (s) => s.answer_prompt_tokens);
  const observed = ratio((s) => s.answer_observed_tokens, (s) => s.answer_prompt_tokens);
  lineChart(el("chart-hits"), [{ name: "predicted", color: "#2563eb", values: predicted }, { name: "observed", color: "#16a34a", values: observed }], { max: 1 });
  const a = status.answers, over = (p, t) => t > 0 ? p / t : null;
  el("hits-now").textContent = "predicted " + pct(over(a.predicted_cached_tokens, a.prompt_tokens)) + " · observed " + pct(over(a.observed_cached_tokens, a.prompt_tokens));
  el("hits-answers").textContent = "since start: " + fmt(a.with_usage) + " answers";
  const events = rate((s) => s.events);
  lineChart(el("chart-events"), [{ name: "events", color: "#7c3aed", values: events }]);
  el("events-now").textContent = fmt(lastValue(events)) + " /s";
  const lag = ratio((s) => s.lag_sum_ms, (s) => s.lag_batches);
  lineChart(el("chart-lag"), [{ name: "lag", color: "#0891b2", values: lag }], { unit: "ms" });
  el("lag-now").textContent = lastValue(lag) === null ? "– (no timestamped batches lately)" : fmt(lastValue(lag)) + " ms mean";
  const held = gauge((s) => s.held), rejected = rate((s) => s.rejected);
  lineChart(el("chart-admission"), [{ name: "held", color: "#7c3aed", values: held }, { name: "rejected", color: "#dc2626", values: rejected }]);
  const ad = status.admission;
  el("admission-now").textContent = ad.enabled ? ad.held_now + " held · " + fmt(ad.counts.rejected) + " 429s · " + fmt(ad.counts.overdue) + " overdue" : "off";
}

function render(status) {
  renderCharts(status);
  renderProxy(status.proxy);
  const workers = status.workers;
  const name = (w) => w.dp_rank === 0 ? w.worker_id : w.worker_id + ":" + w.dp_rank;
  renderAlerts(workers, name, status.cluster);
  renderWorkers(workers, name);
  renderCluster(status.cluster);
  const blocks = workers.reduce((sum, w) => sum + w.blocks, 0);
  const active = workers.reduce((sum, w) => sum + w.active_requests, 0);
  const degraded = workers.filter((w) => w.degraded).length;
  el("summary").textContent = workers.length + " workers · " + degraded + " degraded · block size " + status.block_size + " · " + fmt(blocks) + " cached blocks · "
    + active + " active requests · " + fmt(status.routes.decisions) + " routes · updated " + new Date(status.now_ms).toLocaleTimeString();
  document.body.dataset.polls = String(Number(document.body.dataset.polls ?? 0) + 1);
}

function renderCluster(cluster) {
  el("cluster").hidden = cluster === null;
  if (cluster === null) return;
  el("cluster-summary").textContent = cluster.name + ": " + cluster.state + " since " + new Date(cluster.since_ms).toLocaleTimeString()
    + " · this replica " + cluster.replica_id + " · " + cluster.peers.length + " peers";
  el("peers").replaceChildren(...cluster.peers.map((p) => {
    const tr = document.createElement("tr");
    tr.append(cell(p.replica_id), cell(p.state, p.state === "synced" ? "text ok" : "text bad"), cell((p.heard_ms_ago / 1000).toFixed(1) + " s ago"),
      cell(p.requests), cell(p.announced_requests), cell(p.applied_seq), cell(p.published_seq), cell(p.lag_ms + " ms"), cell(p.held));
    return tr;
  }));
}

async function refresh() {
  try {
    const response = await fetch("/v1/status?since=" + lastT);
    const status = await response.json();
    capacity = status.history.capacity;
    interval = status.history.interval_ms;
    samples.push(...status.history.samples);
    if (samples.length > capacity) samples.splice(0, samples.length - capacity);
    lastT = last(samples)?.t ?? lastT;
    render(status);
  } catch (error) {
    el("summary").textContent = "cannot reach kvedge: " + error;
  }
}
refresh();
setInterval(refresh, POLL_MS);
</script>
</body>
</html>
`;

export function statusPage(): string {
  return PAGE;
}
