/**
 * The slowest load-tracker calls under steady churn: what a routing thread waits for
 * when the tracker's own tables rebuild. Each step admits a request (client-given id,
 * 4 blocks) and finishes the one admitted `active` steps earlier, so the tracker holds
 * `active` requests and remembers the last 65,536 finished ids (the default TTL keeps
 * them), as a gateway that calls done does at a steady rate. With `active` 0 each
 * request is done right after it is admitted, so the tracker empties at every step (a
 * gateway calling done at once, or a quiet fleet).
 *
 * Reported per configuration: the median step, the slowest, and how many steps took
 * over 0.5 ms, over 1,000,000 steps after 200,000 of warm-up. Collections also stop a
 * step now and then (ids are new strings); the slowest steps are read against that.
 *
 *   bun bench/lifecycle-stalls.bench.ts [--json]
 */
import { LoadTracker } from "../src/route";
import { benchFlags, killWithBench, provenance } from "./lib";

// `--active N`: one configuration, in this process (the parent starts one per configuration).
const flags = benchFlags("bun bench/lifecycle-stalls.bench.ts [--json]", {
  json: { type: "boolean" },
  active: { type: "string" },
});

const STEPS = 1_000_000;
const WARMUP = 200_000;

function measure(active: number): { medianUs: number; maxMs: number; over05Ms: number } {
  const load = new LoadTracker({ blockSize: 4 });
  const slot = load.table.acquire(1n, 0);
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
  return {
    medianUs: 1000 * times[STEPS >> 1]!,
    maxMs: times[STEPS - 1]!,
    over05Ms: times.filter((t) => t > 0.5).length,
  };
}

// Each configuration in a fresh process: one's garbage (1.2M id strings) must not
// land as a full collection in the next one's steps.
if (flags.active !== undefined) {
  console.log(JSON.stringify(measure(Number(flags.active))));
  process.exit(0);
}
const rows = [];
for (const active of [0, 1_000, 12_500]) {
  const child = killWithBench(
    Bun.spawn([process.execPath, import.meta.path, "--active", String(active)], {
      stdout: "pipe",
      stderr: "inherit",
    }),
  );
  const text = await new Response(child.stdout).text();
  if ((await child.exited) !== 0) throw new Error(`the run with ${active} active failed`);
  rows.push({ active, ...(JSON.parse(text) as ReturnType<typeof measure>) });
}
if (flags.json === true)
  console.log(JSON.stringify({ bench: "lifecycle-stalls", provenance: provenance(), rows }));
else
  for (const r of rows)
    console.log(
      `${r.active} active: median ${r.medianUs.toFixed(2)} µs, slowest ${r.maxMs.toFixed(2)} ms, ${r.over05Ms} steps over 0.5 ms of ${STEPS}`,
    );
