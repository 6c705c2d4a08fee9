/**
 * Index microbenches on a large index: the workload of bench/workload.ts (64 workers,
 * about 1M held (block, worker) pairs, shared system prompts, multi-turn
 * conversations mostly sticky to a home worker), per backend:
 *
 * - build: every stored event applied once, ns per block (one timed pass, includes
 *   pool and table growth);
 * - bytes per held pair: stats().bytes / stats().blocks after the build;
 * - findMatches on a 128-block prompt (rotating over 1,024 real prompts, their sequence
 *   hashes given as a route gives them; mitata p50);
 * - store + remove of a 32-block chain under a block the worker holds (the next turn
 *   of a conversation, then its eviction), and from the root: ns per block op (p50 of
 *   one store + one remove, divided by 64). Hashes are unique per iteration.
 *
 * Timed regions: the index calls only. Outside: workload generation (seeded), query
 * and event arrays (prebuilt, reused). The reference backend runs at --reference-pairs
 * (default 100,000) pairs: it is the test oracle, not a contender.
 *
 *   bun bench/index.bench.ts [--backend crtc|positional|reference ...] [--pairs N]
 *       [--workers N] [--sticky P] [--json]
 */
import { bench, do_not_optimize, group, run } from "mitata";
import { chainHashes } from "../src/hash";
import { attach, createSharedIndex, type SharedIndexDescriptor } from "../src/index/crtc/shared";
import { createIndex } from "../src/index/index";
import { BACKEND_NAMES, type BackendName, type KvIndex, MatchResult } from "../src/index/types";
import { benchFlags, provenance } from "./lib";
import { buildWorkload, type Workload } from "./workload";

const flags = benchFlags(
  "bun bench/index.bench.ts [--backend crtc|positional|reference ...] [--pairs N] [--reference-pairs N] [--workers N] [--sticky P] [--shared] [--json]",
  {
    backend: { type: "string", multiple: true },
    pairs: { type: "string" },
    "reference-pairs": { type: "string" },
    workers: { type: "string" },
    sticky: { type: "string" },
    shared: { type: "boolean" },
    json: { type: "boolean" },
  },
);
// --shared: the crtc's pools in shared memory (src/index/crtc/shared.ts), written on this thread.
const shared = flags.shared === true;
const json = flags.json === true;
const backends = (flags.backend ?? ["crtc", "positional", "reference"]) as BackendName[];
for (const backend of backends)
  if (!BACKEND_NAMES.includes(backend)) throw new Error(`unknown backend ${backend}`);
const pairs = Number(flags.pairs ?? 1_000_000);
const referencePairs = Number(flags["reference-pairs"] ?? 100_000);
const sticky = Number(flags.sticky ?? 0.8);
const WORKERS = Number(flags.workers ?? 64);
const QUERY_BLOCKS = 128;
const CHAIN_BLOCKS = 32;

interface Built {
  readonly backend: BackendName;
  readonly index: KvIndex;
  /** --shared: readers attach by it (a reader on this thread is timed too). */
  readonly descriptor: SharedIndexDescriptor | null;
  readonly workload: Workload;
  readonly buildNsPerBlock: number;
  readonly bytesPerPair: number;
  readonly pairs: number;
  readonly nodes: number;
}

const workloads = new Map<number, Workload>();
function workloadOf(target: number): Workload {
  let workload = workloads.get(target);
  if (workload === undefined) {
    workload = buildWorkload({ workers: WORKERS, targetPairs: target, sticky, seed: 7 });
    workloads.set(target, workload);
  }
  return workload;
}

function build(backend: BackendName): Built {
  const workload = workloadOf(backend === "reference" ? referencePairs : pairs);
  const sharedIndex =
    shared && backend === "crtc"
      ? createSharedIndex(16, { verify: false, budgetBytes: 4 * 2 ** 30 })
      : null;
  const index = sharedIndex?.index ?? createIndex(backend, 16, { verify: false });
  const started = performance.now();
  for (const event of workload.events) {
    index.applyStored(
      BigInt(event.worker),
      0,
      event.hasParent,
      event.parentHi,
      event.parentLo,
      event.external,
      event.local,
      event.count,
    );
  }
  const elapsed = performance.now() - started;
  const stats = index.stats();
  return {
    backend,
    index,
    descriptor: sharedIndex?.descriptor ?? null,
    workload,
    buildNsPerBlock: (elapsed * 1e6) / workload.pairs,
    bytesPerPair: stats.bytes / stats.blocks,
    pairs: stats.blocks,
    nodes: stats.nodes,
  };
}

/** Per worker: the external hash (pair) of the last block it stored, a block it holds. */
function heldTails(workload: Workload): Uint32Array {
  const tails = new Uint32Array(2 * WORKERS);
  for (const event of workload.events) {
    tails[2 * event.worker] = event.external[2 * (event.count - 1)]!;
    tails[2 * event.worker + 1] = event.external[2 * (event.count - 1) + 1]!;
  }
  return tails;
}

/** Calls fn 100,000 times or for half a second, whichever comes first. */
function warm(fn: () => void): void {
  const until = performance.now() + 500;
  for (let i = 0; i < 100_000 && (i % 256 !== 0 || performance.now() < until); i++) fn();
}

const builds = backends.map(build);
Bun.gc(true); // the build's garbage is collected before anything is timed

for (const built of builds) {
  const { index, workload, backend } = built;
  const queries = workload.prompts
    .filter((prompt) => prompt.length >= 2 * QUERY_BLOCKS)
    .slice(-1024)
    .map((prompt) => prompt.slice(0, 2 * QUERY_BLOCKS));
  // Their sequence hashes, as a route has them (src/route/input.ts) and passes them.
  const chains = queries.map((query) => {
    const hashes = new Uint32Array(query.length);
    chainHashes(query, QUERY_BLOCKS, hashes);
    return hashes;
  });
  const out = new MatchResult();
  const tails = heldTails(workload);
  const external = new Uint32Array(2 * CHAIN_BLOCKS);
  const local = new Uint32Array(2 * CHAIN_BLOCKS);
  let serial = 0;
  const chain = (): number => {
    serial++;
    for (let i = 0; i < CHAIN_BLOCKS; i++) {
      external[2 * i] = 0xe000_0000 | (serial >>> 12);
      external[2 * i + 1] = ((serial & 0xfff) << 20) | i;
      local[2 * i] = 0xd000_0000 | (serial >>> 12);
      local[2 * i + 1] = ((serial & 0xfff) << 20) | i;
    }
    return serial % WORKERS;
  };
  let q = 0;
  const findMatches = (): void => {
    const k = q++ % queries.length;
    index.findMatches(queries[k]!, QUERY_BLOCKS, out, chains[k]);
    do_not_optimize(out.count);
  };
  const underHeld = (): void => {
    const worker = chain();
    index.applyStored(
      BigInt(worker),
      0,
      true,
      tails[2 * worker]!,
      tails[2 * worker + 1]!,
      external,
      local,
      CHAIN_BLOCKS,
    );
    do_not_optimize(index.applyRemoved(BigInt(worker), 0, external, CHAIN_BLOCKS));
  };
  const fromRoot = (): void => {
    const worker = chain();
    index.applyStored(BigInt(worker), 0, false, 0, 0, external, local, CHAIN_BLOCKS);
    do_not_optimize(index.applyRemoved(BigInt(worker), 0, external, CHAIN_BLOCKS));
  };
  const reader = built.descriptor === null ? null : attach(built.descriptor);
  const readerFindMatches = (): void => {
    const k = q++ % queries.length;
    reader!.findMatches(queries[k]!, QUERY_BLOCKS, out, chains[k]);
    do_not_optimize(out.count);
  };
  // Let the JIT finish compiling before mitata samples: on a busy 2-core host its
  // optimizing tier can land after mitata's own warm-up, which then times slower code.
  for (const fn of [findMatches, underHeld, fromRoot]) warm(fn);
  if (reader !== null) warm(readerFindMatches);
  group(backend, () => {
    bench(`${backend} findMatches ${QUERY_BLOCKS} blocks`, findMatches);
    if (reader !== null) bench(`${backend} reader findMatches`, readerFindMatches);
    bench(`${backend} store+remove ${CHAIN_BLOCKS} blocks under a held block`, underHeld);
    bench(`${backend} store+remove ${CHAIN_BLOCKS} blocks from the root`, fromRoot);
  });
}

const result = await run({ format: json ? "quiet" : "mitata" });
const p50 = (name: string): number =>
  result.benchmarks.flatMap((trial) => trial.runs).find((entry) => entry.name === name)!.stats!.p50;
const rows = builds.map((built) => {
  const { backend } = built;
  const stats = built.index.stats();
  if (stats.blocks !== built.pairs) throw new Error(`${backend}: the benches changed the index`);
  return {
    backend,
    pairs: built.pairs,
    distinct_blocks: built.workload.distinctBlocks,
    nodes: built.nodes,
    bytes_per_pair: Number(built.bytesPerPair.toFixed(2)),
    build_ns_per_block: Number(built.buildNsPerBlock.toFixed(1)),
    find_matches_128_ns: Math.round(p50(`${backend} findMatches ${QUERY_BLOCKS} blocks`)),
    under_held_ns_per_block_op: Number(
      (
        p50(`${backend} store+remove ${CHAIN_BLOCKS} blocks under a held block`) /
        (2 * CHAIN_BLOCKS)
      ).toFixed(1),
    ),
    from_root_ns_per_block_op: Number(
      (
        p50(`${backend} store+remove ${CHAIN_BLOCKS} blocks from the root`) /
        (2 * CHAIN_BLOCKS)
      ).toFixed(1),
    ),
    ...(built.descriptor === null
      ? {}
      : {
          reader_find_matches_128_ns: Math.round(p50(`${backend} reader findMatches`)),
        }),
  };
});
if (json) {
  process.stdout.write(
    `${JSON.stringify({ bench: "index", workers: WORKERS, sticky, provenance: provenance(), rows })}\n`,
  );
} else {
  console.log(
    "\nbackend    | pairs     | bytes/pair | build ns/block | findMatches(128) | store+remove ns/block op (held parent, root)",
  );
  for (const row of rows) {
    console.log(
      `${row.backend.padEnd(10)} | ${String(row.pairs).padEnd(9)} | ${String(row.bytes_per_pair).padEnd(10)} | ` +
        `${String(row.build_ns_per_block).padEnd(14)} | ${`${row.find_matches_128_ns} ns`.padEnd(16)} | ` +
        `${row.under_held_ns_per_block_op}, ${row.from_root_ns_per_block_op}`,
    );
  }
}
