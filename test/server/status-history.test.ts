// Goal: the status page's history on the server is bounded (a ring of HISTORY_SAMPLES:
// the oldest sample goes as a new one comes), answers "the samples after t" exactly,
// copies the proxy's counters by value, whatever counters it has (a new one appears in
// the next sample), and turns the route decision histogram into the quantiles of the
// decisions since the previous sample. On a real core, with sample times given.
import { expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore } from "../../src/core/core";
import { decideRoute } from "../../src/server/api";
import { HISTORY_SAMPLES, StatusHistory } from "../../src/server/status-history";
import { silentLogger } from "../../src/util/log";

const core = () =>
  new KvedgeCore({ config: loadConfig({ env: {} }).config, log: silentLogger, random: () => 0.5 });

test("bounded: after more samples than it holds, it holds the newest HISTORY_SAMPLES, oldest first", () => {
  const counts = new Float64Array(3);
  const history = new StatusHistory({
    core: core(),
    proxyCounters: null,
    decisions: () => ({ bounds: [1e-6, 1e-5, 1e-4], counts }),
  });
  for (let t = 1; t <= HISTORY_SAMPLES + 57; t++) history.sample(t * 1000);
  expect(history.length).toBe(HISTORY_SAMPLES);
  const all = history.since(0);
  expect(all).toHaveLength(HISTORY_SAMPLES);
  expect(all[0]!.t).toBe(58_000);
  expect(all.at(-1)!.t).toBe((HISTORY_SAMPLES + 57) * 1000);
  expect(all.every((sample, i) => i === 0 || sample.t > all[i - 1]!.t)).toBe(true);
  expect(history.since((HISTORY_SAMPLES + 55) * 1000).map((s) => s.t)).toEqual([
    (HISTORY_SAMPLES + 56) * 1000,
    (HISTORY_SAMPLES + 57) * 1000,
  ]);
  expect(history.since(Number.MAX_SAFE_INTEGER)).toEqual([]);
  expect(all[0]!.proxy).toBeNull();
});

test("the proxy's counters are copied by value, every numeric one, new ones included", () => {
  const counters: Record<string, unknown> = { requests: 1, failovers: 0, note: "not a count" };
  const history = new StatusHistory({
    core: core(),
    proxyCounters: counters,
    decisions: () => ({ bounds: [1e-6], counts: new Float64Array(1) }),
  });
  history.sample(1000);
  counters.requests = 5;
  counters.stalls = 2; // a counter added later shows up in the next sample
  history.sample(2000);
  const [first, second] = history.since(0);
  expect(first!.proxy).toEqual({ requests: 1, failovers: 0 });
  expect(second!.proxy).toEqual({ requests: 5, failovers: 0, stalls: 2 });
});

test("decision times: quantiles of the decisions since the previous sample, as bucket bounds in µs", () => {
  const counts = new Float64Array(4); // ≤ 1 µs, ≤ 10 µs, ≤ 100 µs, ≤ 1 ms (not cumulative)
  const history = new StatusHistory({
    core: core(),
    proxyCounters: null,
    decisions: () => ({ bounds: [1e-6, 1e-5, 1e-4, 1e-3], counts }),
  });
  counts[0] = 500; // before the first sample: not counted in any interval
  history.sample(1000);
  counts[1] += 98;
  counts[3] += 2;
  history.sample(2000);
  history.sample(3000); // nothing since
  counts[2] += 10;
  history.sample(4000);
  const [first, second, third, fourth] = history.since(0);
  expect(first).toMatchObject({ timed_decisions: 0, decision_p50_us: null, decision_p99_us: null });
  expect(second).toMatchObject({
    timed_decisions: 100,
    decision_p50_us: 10,
    decision_p99_us: 1000,
  });
  expect(third).toMatchObject({ timed_decisions: 0, decision_p50_us: null });
  expect(fourth).toMatchObject({ timed_decisions: 10, decision_p50_us: 100, decision_p99_us: 100 });
});

test("the route totals and admission are sampled as they stand", () => {
  const kvedge = core();
  const history = new StatusHistory({
    core: kvedge,
    proxyCounters: null,
    decisions: () => ({ bounds: [1e-6], counts: new Float64Array(1) }),
  });
  kvedge.router.load.table.acquire(1n, 0);
  history.sample(1000);
  decideRoute(kvedge, { token_ids: new Array(40).fill(3), request_id: "a" });
  decideRoute(kvedge, { token_ids: new Array(40).fill(3), request_id: "b" });
  history.sample(2000);
  const [before, after] = history.since(0);
  expect(before).toMatchObject({ decisions: 0, active_requests: 0, held: 0, rejected: 0 });
  expect(after).toMatchObject({ decisions: 2, route_prompt_tokens: 80, active_requests: 2 });
});
