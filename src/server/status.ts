/**
 * The status page at `/` and the JSON it polls (`GET /v1/status`): one self-contained
 * HTML document (no external assets: it works air-gapped) that draws, from the
 * counters' differences over the last few polls (a trailing window, so sparse traffic
 * still draws a line), routes/s, predicted vs observed hit rate,
 * events/s, each worker's cached blocks and load, and which workers are distrusted.
 */
import { workersOp } from "./api";
import type { KvedgeCore } from "../core/core";

/** GET /v1/status: cumulative counters (the page turns them into rates) and the workers. */
export function statusOp(core: KvedgeCore) {
  const index = core.index.counters;
  const routes = core.routeTotals;
  const workers = workersOp(core).workers;
  let answers = 0;
  let promptTokens = 0;
  let predicted = 0;
  let observed = 0;
  for (const worker of workers) {
    const hits = worker.observed_hits;
    answers += hits.answers - hits.answers_without_usage - hits.bad_answers;
    promptTokens += worker.observed_hits.prompt_tokens;
    predicted += worker.observed_hits.predicted_cached_tokens;
    observed += worker.observed_hits.observed_cached_tokens;
  }
  return {
    now_ms: Date.now(),
    block_size: core.blockSize,
    routes: {
      decisions: routes.decisions,
      prompt_tokens: routes.promptTokens,
      predicted_cached_tokens: routes.predictedCachedTokens,
    },
    answers: {
      with_usage: answers,
      prompt_tokens: promptTokens,
      predicted_cached_tokens: predicted,
      observed_cached_tokens: observed,
    },
    events: {
      stored: index.storedEvents,
      removed: index.removedEvents,
      cleared: index.clearedEvents,
    },
    workers,
  };
}

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kvedge</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem 2rem; color: #1d1d1f; background: #fafafa; }
  h1 { font-size: 1.3rem; margin: 0 0 .25rem; }
  h2 { font-size: .95rem; margin: 0 0 .4rem; font-weight: 600; }
  #summary { color: #555; margin-bottom: 1rem; }
  #alerts { margin-bottom: 1rem; }
  .alert { background: #fdecea; color: #8a1c12; border-radius: 4px; padding: .4rem .7rem; margin-bottom: .3rem; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(26rem, 1fr)); gap: 1rem; margin-bottom: 1.2rem; }
  .card { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; padding: .7rem .9rem; }
  .value { font-size: 1.35rem; font-weight: 600; }
  .value.small { font-size: 1rem; }
  .legend span { margin-right: 1rem; font-size: .85rem; }
  .legend i { display: inline-block; width: .8rem; height: .25rem; vertical-align: middle; margin-right: .3rem; }
  svg { width: 100%; height: 9rem; display: block; }
  table { border-collapse: collapse; min-width: 60rem; background: #fff; }
  th, td { text-align: right; padding: .3rem .6rem; border-bottom: 1px solid #ddd; }
  th:first-child, td:first-child, td.text, th.text { text-align: left; }
  .bad { color: #b00020; font-weight: 600; }
  .ok { color: #0a7d32; }
</style>
</head>
<body>
<h1>kvedge</h1>
<div id="summary">loading…</div>
<div id="alerts"></div>
<div class="grid">
  <div class="card"><h2>Routes per second</h2><div class="value" id="routes-now">–</div><svg id="chart-routes"></svg></div>
  <div class="card"><h2>Hit rate: predicted vs observed</h2>
    <div class="legend"><span><i style="background:#2563eb"></i>predicted (routes)</span><span><i style="background:#16a34a"></i>observed (engines' usage)</span></div>
    <div class="value small" id="hits-now">–</div><svg id="chart-hits"></svg></div>
  <div class="card"><h2>KV events per second</h2><div class="value" id="events-now">–</div><svg id="chart-events"></svg></div>
  <div class="card"><h2>Per worker: cached blocks</h2><svg id="chart-blocks"></svg></div>
  <div class="card"><h2>Per worker: active requests</h2><svg id="chart-load"></svg></div>
</div>
<table>
  <thead><tr>
    <th>worker</th><th>dp</th><th class="text">endpoint</th><th class="text">state</th><th class="text">trust</th>
    <th>cached blocks</th><th>active requests</th><th>prefill tokens</th><th>routed</th>
    <th>predicted hits</th><th>observed hits</th><th>last seq</th><th>lost batches</th>
  </tr></thead>
  <tbody id="workers"></tbody>
</table>
<script>
const POINTS = 120, POLL_MS = 1000, WINDOW = 5, NS = "http://www.w3.org/2000/svg";
const history = { routes: [], predicted: [], observed: [], events: [] };
const snapshots = [];
const el = (id) => document.getElementById(id);
const node = (name, attrs, text) => {
  const n = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
};
const push = (list, value) => { list.push(value); if (list.length > POINTS) list.shift(); };
const fmt = (v) => v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(1) + "k" : (Math.round(v * 10) / 10).toString();
const pct = (v) => v === null || Number.isNaN(v) ? "–" : (100 * v).toFixed(1) + "%";

function lineChart(svg, series, max) {
  const w = svg.clientWidth || 400, h = svg.clientHeight || 140, pad = 28;
  const top = Math.max(max ?? 0, ...series.flatMap((s) => s.values.filter((v) => v !== null)), 1e-9);
  const children = [node("line", { x1: pad, y1: h - 14, x2: w, y2: h - 14, stroke: "#ccc" }),
    node("text", { x: 0, y: 10, "font-size": 10, fill: "#777" }, max === 1 ? "100%" : fmt(top)),
    node("text", { x: 0, y: h - 14, "font-size": 10, fill: "#777" }, "0")];
  for (const s of series) {
    // A short history spreads over the chart; a long one scrolls (the last POINTS polls).
    const span = Math.max(s.values.length, 30) - 1;
    const points = [];
    s.values.forEach((v, i) => {
      if (v === null) return;
      points.push((pad + (w - pad) * i / span).toFixed(1) + "," + (h - 14 - (h - 24) * v / top).toFixed(1));
    });
    if (points.length === 1) {
      const [x, y] = points[0].split(",");
      children.push(node("circle", { cx: x, cy: y, r: 3, fill: s.color }));
    }
    if (points.length > 0) children.push(node("polyline", { points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 2, class: "series " + s.name }));
  }
  svg.replaceChildren(...children);
}

function barChart(svg, workers, value, label) {
  const w = svg.clientWidth || 400, h = svg.clientHeight || 140;
  const top = Math.max(1, ...workers.map(value));
  const slot = w / Math.max(1, workers.length);
  const children = [];
  workers.forEach((worker, i) => {
    const v = value(worker), bar = (h - 30) * v / top, distrusted = worker.degraded || worker.observed_hits.suspect;
    children.push(node("rect", { x: i * slot + slot * 0.15, y: h - 16 - bar, width: slot * 0.7, height: bar,
      fill: distrusted ? "#dc2626" : "#2563eb", class: "bar", "data-worker": worker.worker_id }));
    children.push(node("text", { x: i * slot + slot / 2, y: h - 3, "font-size": 10, "text-anchor": "middle", fill: "#555" }, label(worker)));
    children.push(node("text", { x: i * slot + slot / 2, y: h - 19 - bar, "font-size": 10, "text-anchor": "middle", fill: "#333" }, fmt(v)));
  });
  svg.replaceChildren(...children);
}

const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };

function render(status) {
  const previous = snapshots.length === 0 ? null : snapshots[0];
  snapshots.push(status);
  if (snapshots.length > WINDOW) snapshots.shift();
  const seconds = previous === null ? 0 : (status.now_ms - previous.now_ms) / 1000;
  if (seconds > 0) {
    const d = (f) => f(status) - f(previous);
    push(history.routes, d((s) => s.routes.decisions) / seconds);
    push(history.events, d((s) => s.events.stored + s.events.removed + s.events.cleared) / seconds);
    const routedPrompt = d((s) => s.routes.prompt_tokens);
    push(history.predicted, routedPrompt > 0 ? d((s) => s.routes.predicted_cached_tokens) / routedPrompt : null);
    const answeredPrompt = d((s) => s.answers.prompt_tokens);
    push(history.observed, answeredPrompt > 0 ? d((s) => s.answers.observed_cached_tokens) / answeredPrompt : null);
  }
  const last = (list) => list.length === 0 ? null : list[list.length - 1];
  el("routes-now").textContent = last(history.routes) === null ? "–" : fmt(last(history.routes)) + " /s";
  el("events-now").textContent = last(history.events) === null ? "–" : fmt(last(history.events)) + " /s";
  const overall = (p, t) => t > 0 ? p / t : null;
  el("hits-now").textContent = "predicted " + pct(overall(status.routes.predicted_cached_tokens, status.routes.prompt_tokens))
    + " · observed " + pct(overall(status.answers.observed_cached_tokens, status.answers.prompt_tokens)) + " (since start)";
  lineChart(el("chart-routes"), [{ name: "routes", color: "#2563eb", values: history.routes }]);
  lineChart(el("chart-hits"), [{ name: "predicted", color: "#2563eb", values: history.predicted },
    { name: "observed", color: "#16a34a", values: history.observed }], 1);
  lineChart(el("chart-events"), [{ name: "events", color: "#7c3aed", values: history.events }]);
  const workers = status.workers;
  const name = (w) => w.dp_rank === 0 ? w.worker_id : w.worker_id + ":" + w.dp_rank;
  barChart(el("chart-blocks"), workers, (w) => w.blocks, name);
  barChart(el("chart-load"), workers, (w) => w.active_requests, name);
  const alerts = [];
  for (const w of workers) {
    if (w.degraded && w.observed_hits.suspect) alerts.push("worker " + name(w) + ": observed hits far below predicted (" + pct(w.observed_hits.recent_ratio) + "); overlap discounted");
    else if (w.degraded) alerts.push("worker " + name(w) + ": degraded (events lost without replay); overlap discounted");
    if (w.observed_hits.under_predicted) alerts.push("worker " + name(w) + ": the engine serves far more than predicted: check the tokenizer and chat template");
    if (w.state !== "connected" && w.state !== "unmanaged") alerts.push("worker " + name(w) + ": " + w.state);
  }
  el("alerts").replaceChildren(...alerts.map((text) => { const div = document.createElement("div"); div.className = "alert"; div.textContent = text; return div; }));
  el("workers").replaceChildren(...workers.map((w) => {
    const tr = document.createElement("tr");
    const trust = w.observed_hits.suspect ? "hits suspect" : w.degraded ? "degraded" : "exact";
    tr.append(cell(w.worker_id), cell(w.dp_rank), cell(w.endpoint ?? "—", "text"),
      cell(w.state, w.state === "connected" ? "text ok" : "text bad"), cell(trust, trust === "exact" ? "text ok" : "text bad"),
      cell(w.blocks), cell(w.active_requests), cell(Math.round(w.active_prefill_tokens)), cell(w.routed_total),
      cell(w.observed_hits.predicted_cached_tokens), cell(w.observed_hits.observed_cached_tokens), cell(w.last_seq), cell(w.lost_batches));
    return tr;
  }));
  const blocks = workers.reduce((sum, w) => sum + w.blocks, 0);
  const active = workers.reduce((sum, w) => sum + w.active_requests, 0);
  const distrusted = workers.filter((w) => w.degraded).length;
  el("summary").textContent = workers.length + " workers · block size " + status.block_size + " · " + blocks + " cached blocks · "
    + active + " active requests · " + distrusted + " degraded · " + status.routes.decisions + " routes · updated " + new Date(status.now_ms).toLocaleTimeString();
  document.body.dataset.polls = String(Number(document.body.dataset.polls ?? 0) + 1);
}

async function refresh() {
  try {
    const response = await fetch("/v1/status");
    render(await response.json());
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
