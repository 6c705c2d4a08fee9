/**
 * Warm-restart snapshot cost: write and load time and file bytes for an index holding
 * --pairs (block, worker) pairs (default 1,000,000). The index: --workers workers
 * (default 8), each holding chains of 32 blocks; half of each worker's chains share
 * their blocks with every other worker (a common system prompt), half are its own.
 *
 * Phases, each timed alone (one process, after a forced GC):
 *   freeze       the copy of the index, at once (the periodic write: in slices, writes paused)
 *   pack         the copy into snapshot words, all at once (the periodic write runs it in slices)
 *   write        encode the file, write, fsync, rename, directory fsync
 *   read         read the file, check size, magic, version, checksum and every operation
 *   apply        apply the operations to a fresh index (the load at start)
 * Then checks the loaded index holds the same pairs. RSS after each phase. Last, the
 * periodic write's effect on routing: findMatches queries (a route's index work) are
 * issued every 1 ms of timer while the periodic write runs (src/state/warm.ts: the
 * sliced copy and pack, SLICE_MS a turn, then encoding and writing the file), and the
 * delay of each (timer lateness + the query) is reported as p50/p99/max, next to the
 * same without a snapshot running.
 *
 *   bun bench/snapshot.ts [--pairs N] [--workers N] [--dir DIR] [--json]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createIndex } from "../src/index/index";
import { MatchResult } from "../src/index/types";
import { freezeNow, IndexPacker } from "../src/index/pack";
import { PackJob, WritePause } from "../src/index/write-pause";
import {
  forEachOp,
  readSnapshotFile,
  type Snapshot,
  writeSnapshotFile,
} from "../src/state/snapshot";
import { SLICE_MS } from "../src/state/warm";
import { benchFlags, provenance, rssBytes } from "./lib";

const flags = benchFlags("bun bench/snapshot.ts [--pairs N] [--workers N] [--dir DIR] [--json]", {
  pairs: { type: "string" },
  workers: { type: "string" },
  dir: { type: "string" },
  json: { type: "boolean" },
});
const PAIRS = Number(flags.pairs ?? 1_000_000);
const WORKERS = Number(flags.workers ?? 8);
const CHAIN = 32;
const BLOCK_SIZE = 16;

function build() {
  const index = createIndex("crtc", BLOCK_SIZE);
  const external = new Uint32Array(2 * CHAIN);
  const local = new Uint32Array(2 * CHAIN);
  const chainsPerWorker = Math.ceil(PAIRS / WORKERS / CHAIN);
  for (let w = 0; w < WORKERS; w++) {
    for (let c = 0; c < chainsPerWorker; c++) {
      const shared = c % 2 === 0;
      for (let b = 0; b < CHAIN; b++) {
        local[2 * b] = shared ? c : 0x4000_0000 + w;
        local[2 * b + 1] = shared ? b : c * CHAIN + b;
        external[2 * b] = 0x1000 + w;
        external[2 * b + 1] = c * CHAIN + b;
      }
      index.applyStored(BigInt(w + 1), 0, false, 0, 0, external, local, CHAIN);
    }
  }
  return index;
}

function time<T>(phase: string, run: () => T, rows: Record<string, number>[]): T {
  Bun.gc(true);
  const started = performance.now();
  const result = run();
  const ms = performance.now() - started;
  Bun.gc(true);
  rows.push({ [phase]: ms, rss_mb: rssBytes() / 2 ** 20 });
  return result;
}

async function timeAsync<T>(
  phase: string,
  run: () => Promise<T>,
  rows: Record<string, number>[],
): Promise<T> {
  Bun.gc(true);
  const started = performance.now();
  const result = await run();
  const ms = performance.now() - started;
  Bun.gc(true);
  rows.push({ [phase]: ms, rss_mb: rssBytes() / 2 ** 20 });
  return result;
}

const rows: Record<string, number>[] = [];
const index = build();
const held = index.stats().blocks;
const dir = flags.dir ?? mkdtempSync(join(tmpdir(), "kvedge-snapshot-bench-"));
try {
  const frozen = time("freeze_ms", () => freezeNow(index.freeze()), rows);
  const snapshot: Snapshot = time(
    "pack_ms",
    () => {
      const packer = new IndexPacker(frozen);
      while (!packer.step(Infinity));
      return {
        blockSize: BLOCK_SIZE,
        createdAt: new Date().toISOString(),
        positions: [],
        workerIds: [...packer.workerIds],
        words: packer.words(),
      };
    },
    rows,
  );
  const bytes = await timeAsync("write_ms", () => writeSnapshotFile(dir, snapshot), rows);
  const loaded = time("read_check_ms", () => readSnapshotFile(dir, BLOCK_SIZE)!, rows);
  const restored = createIndex("crtc", BLOCK_SIZE);
  time(
    "apply_ms",
    () =>
      forEachOp(loaded, {
        stored: (w, r, hasParent, hi, lo, external, local, count) =>
          restored.applyStored(w, r, hasParent, hi, lo, external, local, count),
        removed: (w, r, external, count) => restored.applyRemoved(w, r, external, count),
      }),
    rows,
  );
  const view = (i: typeof index) =>
    i
      .workers()
      .map((w) => `${w.workerId}/${w.dpRank}=${w.blocks}`)
      .join();
  const equal = view(restored) === view(index) && restored.stats().blocks === held;
  const idle = await routeDelays(async () => {
    await Bun.sleep(1000);
  });
  const during = await routeDelays(async () => {
    const job = new PackJob(index, new WritePause(index, 64 << 20));
    await job.run(SLICE_MS);
    const { words, workerIds } = job.result();
    const createdAt = new Date().toISOString();
    await writeSnapshotFile(dir, {
      blockSize: BLOCK_SIZE,
      createdAt,
      positions: [],
      workerIds: [...workerIds],
      words,
    });
  });
  const result = {
    route_delay_ms: { idle, during_periodic_write: during },
    ...provenance(),
    pairs: held,
    workers: WORKERS,
    file_bytes: bytes,
    bytes_per_pair: bytes / held,
    equal,
    phases: Object.assign(
      {},
      ...rows.map((row) => Object.fromEntries(Object.entries(row).filter(([k]) => k !== "rss_mb"))),
    ),
    rss_mb_after: rows.map((row) => Math.round(row.rss_mb!)),
  };
  if (flags.json) console.log(JSON.stringify(result));
  else {
    console.log(
      `${held.toLocaleString()} pairs, ${WORKERS} workers: file ${(bytes / 2 ** 20).toFixed(1)} MiB (${(bytes / held).toFixed(1)} B/pair), equal after load: ${equal}`,
    );
    const show = (d: Delays) =>
      `p50 ${d.p50.toFixed(2)} p99 ${d.p99.toFixed(2)} max ${d.max.toFixed(1)} ms (${d.n} queries)`;
    console.log(`  route delay, idle:                 ${show(idle)}`);
    console.log(`  route delay, during periodic write: ${show(during)}`);
    for (const row of rows) {
      const [phase, ms] = Object.entries(row)[0]!;
      console.log(
        `  ${phase.padEnd(16)} ${ms.toFixed(0).padStart(7)} ms   rss ${row.rss_mb!.toFixed(0)} MiB`,
      );
    }
  }
  if (!equal) process.exitCode = 1;
} finally {
  if (flags.dir === undefined) rmSync(dir, { recursive: true, force: true });
}

interface Delays {
  n: number;
  p50: number;
  p99: number;
  max: number;
}

/** Queries issued every 1 ms of timer while `work` runs: each one's delay past its due time plus the query. */
async function routeDelays(work: () => Promise<void>): Promise<Delays> {
  const out = new MatchResult(64);
  const query = new Uint32Array(2 * CHAIN);
  for (let b = 0; b < CHAIN; b++) [query[2 * b], query[2 * b + 1]] = [0, b];
  const delays: number[] = [];
  let running = true;
  const ticker = (async () => {
    let due = performance.now() + 1;
    while (running && delays.length < 100_000) {
      await Bun.sleep(Math.max(0, due - performance.now()));
      index.findMatches(query, CHAIN, out);
      const now = performance.now();
      delays.push(now - due);
      due = Math.max(due + 1, now);
    }
  })();
  await work();
  running = false;
  await ticker;
  delays.sort((a, b) => a - b);
  const at = (q: number) => delays[Math.min(delays.length - 1, Math.floor(q * delays.length))]!;
  return { n: delays.length, p50: at(0.5), p99: at(0.99), max: delays[delays.length - 1]! };
}
