/**
 * Bursts before the first event, in virtual time: the `burst` workload (src/sim/
 * workloads.ts: 64 requests sharing a fresh 4,096-token prefix within 50 ms, a new
 * prefix every 2.5 s) over 8 mock engines, under kvedge's router with and without
 * pending credit (`route.pending_credit`: an active request's blocks count as cached
 * on its worker for a request sharing them; `pending-wN`: with
 * route.pending_recompute_weight N instead of the default 2) and the baselines.
 *
 *   bun bench/burst.ts [--bursts 40] [--interval-ms 2500] [--per-burst 64] [--window-ms 50]
 *                      [--workers 8] [--capacity 32768] [--time-scale 1] [--seed 7]
 *                      [--policies pending,today,pending-w1,pending-w4,pending-w12,round_robin,
                                  least_loaded,approx_prefix] [--json]
 *
 * Per policy: prefill tokens, hit rate, TTFT p50 / p99 (model ms), and the workers each
 * burst's prefix went to (mean and max over bursts): with vLLM V1's prefix cache (the
 * mock engine caches a step's blocks as it is planned) a fresh prefix is computed once
 * per worker its burst reaches. Deterministic; the same on any machine.
 */
import { parseArgs } from "node:util";
import { provenance } from "./lib";
import type { KvAwareConfig, PolicyName } from "../src/sim/policies";
import { simulate } from "../src/sim/simulator";
import { parseTrace, requestIds, transformTrace, type Trace } from "../src/sim/trace";
import { burstTrace } from "../src/sim/workloads";

const { values } = parseArgs({
  options: {
    bursts: { type: "string", default: "40" },
    "interval-ms": { type: "string", default: "2500" },
    "per-burst": { type: "string", default: "64" },
    "window-ms": { type: "string", default: "50" },
    workers: { type: "string", default: "8" },
    capacity: { type: "string", default: "32768" },
    "time-scale": { type: "string", default: "1" },
    seed: { type: "string", default: "7" },
    policies: { type: "string", default: "pending,today,round_robin,least_loaded,approx_prefix" },
    json: { type: "boolean", default: false },
  },
  strict: true,
});

const trace: Trace = transformTrace(
  parseTrace(
    burstTrace({
      bursts: Number(values.bursts),
      intervalMs: Number(values["interval-ms"]),
      requestsPerBurst: Number(values["per-burst"]),
      windowMs: Number(values["window-ms"]),
      seed: Number(values.seed),
    }),
  ),
  { timeScale: Number(values["time-scale"]) },
);

/** The burst of each request: its first hash id names its burst's prefix. */
const burstOf = new Int32Array(trace.count);
const bursts = new Map<number, number>();
for (let i = 0; i < trace.count; i++) {
  const first = requestIds(trace, i)[0]!;
  if (!bursts.has(first)) bursts.set(first, bursts.size);
  burstOf[i] = bursts.get(first)!;
}

const RUNS: Record<string, { policy: PolicyName; kvAware?: KvAwareConfig }> = {
  pending: { policy: "kv_aware_model", kvAware: { policy: "ttft", pendingCredit: true } },
  today: { policy: "kv_aware_model", kvAware: { policy: "ttft", pendingCredit: false } },
  // The pending recompute weight's other values (route.pending_recompute_weight).
  ...Object.fromEntries(
    [1, 4, 12].map((w) => [
      `pending-w${w}`,
      {
        policy: "kv_aware_model" as const,
        kvAware: { policy: "ttft" as const, pendingCredit: true, pendingRecomputeWeight: w },
      },
    ]),
  ),
  round_robin: { policy: "round_robin" },
  random: { policy: "random" },
  least_loaded: { policy: "least_loaded" },
  approx_prefix: { policy: "approx_prefix" },
};

const rows = [];
for (const name of values.policies.split(",")) {
  const run = RUNS[name];
  if (run === undefined) throw new Error(`unknown policy ${name} (known: ${Object.keys(RUNS)})`);
  const workersOf = Array.from({ length: bursts.size }, () => new Set<number>());
  const result = simulate(trace, {
    policy: run.policy,
    workers: Number(values.workers),
    capacityBlocks: Number(values.capacity),
    seed: 42,
    ...(run.kvAware === undefined ? {} : { kvAware: run.kvAware }),
    onRouted: (request, worker) => workersOf[burstOf[request]!]!.add(worker),
  });
  const spread = workersOf.map((set) => set.size);
  rows.push({
    policy: name,
    prefill_tokens: result.prefill_tokens,
    hit_rate: result.hit_rate,
    ttft_p50_ms: result.ttft_p50_ms,
    ttft_p99_ms: result.ttft_p99_ms,
    workers_per_prefix_mean: spread.reduce((a, b) => a + b, 0) / spread.length,
    workers_per_prefix_max: Math.max(...spread),
    load_spread: result.load_spread,
  });
}

if (values.json) {
  process.stdout.write(`${JSON.stringify({ rows, config: values, provenance: provenance() })}\n`);
} else {
  console.log(
    `burst workload: ${bursts.size} bursts of ${values["per-burst"]} requests within ${values["window-ms"]} ms, ` +
      `a fresh 4,096-token prefix every ${Number(values["interval-ms"]) * Number(values["time-scale"])} ms; ` +
      `${values.workers} engines × ${values.capacity} blocks`,
  );
  console.log(
    "policy          prefill tokens  hit rate  TTFT p50  TTFT p99  workers/prefix (max)  spread",
  );
  for (const r of rows) {
    console.log(
      `${r.policy.padEnd(15)} ${(r.prefill_tokens / 1e6).toFixed(2).padStart(12)} M` +
        `  ${(100 * r.hit_rate).toFixed(1).padStart(7)}%  ${r.ttft_p50_ms.toFixed(0).padStart(8)}` +
        `  ${r.ttft_p99_ms.toFixed(0).padStart(8)}  ${r.workers_per_prefix_mean.toFixed(2).padStart(14)} (${r.workers_per_prefix_max})` +
        `  ${r.load_spread.toFixed(2).padStart(6)}`,
    );
  }
}
