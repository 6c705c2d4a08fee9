/**
 * The shared crtc's cost on one thread, in CPU time (robust to the time a shared host
 * takes the process off the CPU): the large-index workload of bench/index.bench.ts
 * (64 workers, ~1M held pairs), then, timed by process.cpuUsage in slices of 200 ms
 * (median of 7): store + remove of a 32-block chain under a held block (ns per block
 * op), findMatches of a 128-block prompt (ns), and with --memory shared a reader on
 * this thread (ns; the protocol's read cost with no writer running).
 *
 *   bun bench/shared-index.bench.ts [--memory private|shared] [--pairs N] [--json]
 *
 * Pair fresh processes, private and shared alternated (and this file against main's
 * code with --memory private).
 */
import { createIndex } from "../src/index/index";
import { type KvIndex, MatchResult } from "../src/index/types";
import { benchFlags, provenance } from "./lib";
import { buildWorkload } from "./workload";

const usage = "bun bench/shared-index.bench.ts [--memory private|shared] [--pairs N] [--json]";
const flags = benchFlags(usage, {
  memory: { type: "string" },
  pairs: { type: "string" },
  json: { type: "boolean" },
});
const memory = flags.memory ?? "private";
if (memory !== "private" && memory !== "shared") {
  throw new Error(`--memory must be private or shared, got ${memory}`);
}
const WORKERS = 64;
const QUERY_BLOCKS = 128;
const CHAIN_BLOCKS = 32;
const SLICES = 7;
const SLICE_MS = 200;

const targetPairs = Number(flags.pairs ?? 1_000_000);
const workload = buildWorkload({ workers: WORKERS, targetPairs, sticky: 0.8, seed: 7 });
let index: KvIndex;
let reader: { findMatches: KvIndex["findMatches"] } | null = null;
if (memory === "shared") {
  // Imported only here, so this file also runs on code without the shared index.
  const { attach, createSharedIndex } = await import("../src/index/crtc/shared");
  const shared = createSharedIndex(16, { verify: false, budgetBytes: 4 * 2 ** 30 });
  index = shared.index;
  reader = attach(shared.descriptor);
} else {
  index = createIndex("crtc", 16, { verify: false });
}
const buildCpu = process.cpuUsage();
for (const event of workload.events) {
  const { worker, hasParent, parentHi, parentLo, external: ext, local: loc, count } = event;
  index.applyStored(BigInt(worker), 0, hasParent, parentHi, parentLo, ext, loc, count);
}
const buildNs = cpuNs(buildCpu) / workload.pairs;
Bun.gc(true);

const tails = new Uint32Array(2 * WORKERS);
for (const event of workload.events) {
  tails[2 * event.worker] = event.external[2 * (event.count - 1)]!;
  tails[2 * event.worker + 1] = event.external[2 * (event.count - 1) + 1]!;
}
const queries = workload.prompts
  .filter((prompt) => prompt.length >= 2 * QUERY_BLOCKS)
  .slice(-1024)
  .map((prompt) => prompt.slice(0, 2 * QUERY_BLOCKS));
const out = new MatchResult();
const external = new Uint32Array(2 * CHAIN_BLOCKS);
const local = new Uint32Array(2 * CHAIN_BLOCKS);
let serial = 0;
let q = 0;
let sink = 0;

function cpuNs(since: NodeJS.CpuUsage): number {
  const used = process.cpuUsage(since);
  return (used.user + used.system) * 1000;
}

function storeRemove(): void {
  serial++;
  for (let i = 0; i < CHAIN_BLOCKS; i++) {
    external[2 * i] = 0xe000_0000 | (serial >>> 12);
    external[2 * i + 1] = ((serial & 0xfff) << 20) | i;
    local[2 * i] = 0xd000_0000 | (serial >>> 12);
    local[2 * i + 1] = ((serial & 0xfff) << 20) | i;
  }
  const worker = serial % WORKERS;
  const [hi, lo] = [tails[2 * worker]!, tails[2 * worker + 1]!];
  index.applyStored(BigInt(worker), 0, true, hi, lo, external, local, CHAIN_BLOCKS);
  sink += index.applyRemoved(BigInt(worker), 0, external, CHAIN_BLOCKS);
}

function lookup(target: { findMatches: KvIndex["findMatches"] }): () => void {
  return () => {
    target.findMatches(queries[q++ % queries.length]!, QUERY_BLOCKS, out);
    sink += out.count;
  };
}

/** CPU ns per call: the median over slices of ~SLICE_MS wall each (after a warm-up slice). */
function measure(fn: () => void): number {
  const rates: number[] = [];
  for (let slice = 0; slice <= SLICES; slice++) {
    const cpu = process.cpuUsage();
    const until = performance.now() + SLICE_MS;
    let calls = 0;
    while (performance.now() < until) {
      for (let i = 0; i < 64; i++) fn();
      calls += 64;
    }
    if (slice > 0) rates.push(cpuNs(cpu) / calls);
  }
  rates.sort((a, b) => a - b);
  return rates[SLICES >> 1]!;
}

const row = {
  memory,
  build_cpu_ns_per_block: Number(buildNs.toFixed(1)),
  store_remove_cpu_ns_per_block_op: Number((measure(storeRemove) / (2 * CHAIN_BLOCKS)).toFixed(1)),
  find_matches_128_cpu_ns: Math.round(measure(lookup(index))),
  ...(reader === null
    ? {}
    : {
        reader_find_matches_128_cpu_ns: Math.round(measure(lookup(reader))),
      }),
  pairs: index.stats().blocks,
  bytes_per_pair: Number((index.stats().bytes / index.stats().blocks).toFixed(2)),
};
if (sink === -1) console.log("unreachable");
const report = { bench: "shared-index", provenance: provenance(), ...row };
if (flags.json === true) console.log(JSON.stringify(report));
else console.log(row);
