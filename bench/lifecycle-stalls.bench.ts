/**
 * The slowest load-tracker calls under steady churn: what a routing thread waits for
 * when the tracker's own tables rebuild. Each step admits a request (client-given id,
 * 4 blocks) and finishes the one admitted `active` steps earlier, so the tracker holds
 * `active` requests and remembers the last 65,536 finished ids (the default TTL keeps
 * them), as a gateway that calls done does at a steady rate.
 *
 * Reported per configuration: the median step, the slowest, and how many steps took
 * over 0.5 ms, over 1,000,000 steps after 200,000 of warm-up. Collections also stop a
 * step now and then (ids are new strings); the slowest steps are read against that.
 *
 *   bun bench/lifecycle-stalls.bench.ts [--json]
 */
import { LoadTracker } from "../src/route";
import { provenance } from "./lib";

const STEPS = 1_000_000;
const WARMUP = 200_000;

function measure(active: number): { medianUs: number; maxMs: number; over05Ms: number } {
  const load = new LoadTracker({ blockSize: 4 });
  const slot = load.addWorker(1n, 0);
  const chain = new Uint32Array(8).map((_, i) => i + 1);
  const ids = Array.from({ length: STEPS + WARMUP }, (_, i) => `gw-${i}`);
  const times = new Float64Array(STEPS);
  for (let i = 0; i < STEPS + WARMUP; i++) {
    const started = performance.now();
    load.admit(ids[i]!, slot, chain, 4, 16, 0, 0);
    if (i >= active) load.done(ids[i - active]!);
    if (i >= WARMUP) times[i - WARMUP] = performance.now() - started;
  }
  times.sort();
  return { medianUs: 1000 * times[STEPS >> 1]!, maxMs: times[STEPS - 1]!, over05Ms: times.filter((t) => t > 0.5).length };
}

const rows = [1_000, 12_500].map((active) => ({ active, ...measure(active) }));
if (process.argv.includes("--json")) console.log(JSON.stringify({ bench: "lifecycle-stalls", provenance: provenance(), rows }));
else for (const r of rows) console.log(`${r.active} active: median ${r.medianUs.toFixed(2)} µs, slowest ${r.maxMs.toFixed(2)} ms, ${r.over05Ms} steps over 0.5 ms of ${STEPS}`);
