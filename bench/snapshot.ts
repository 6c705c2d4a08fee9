/**
 * Warm-restart snapshot cost: write and load time and file bytes for an index holding
 * --pairs (block, worker) pairs (default 1,000,000). The index: --workers workers
 * (default 8), each holding chains of 32 blocks; half of each worker's chains share
 * their blocks with every other worker (a common system prompt), half are its own.
 *
 * Phases, each timed alone (one process, after a forced GC):
 *   dump+encode  index.dump() and packing into snapshot words (what blocks the event loop)
 *   write        encode the file, write, fsync, rename, directory fsync
 *   read         read the file, check size, magic, version, checksum and every operation
 *   apply        apply the operations to a fresh index (the load at start)
 * Then checks the loaded index holds the same pairs. RSS after each phase.
 *
 *   bun bench/snapshot.ts [--pairs N] [--workers N] [--dir DIR] [--json]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createIndex } from "../src/index/index";
import { encodeOps, forEachOp, readSnapshotFile, type Snapshot, writeSnapshotFile } from "../src/state/snapshot";
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

const rows: Record<string, number>[] = [];
const index = build();
const held = index.stats().blocks;
const dir = flags.dir ?? mkdtempSync(join(tmpdir(), "kvedge-snapshot-bench-"));
try {
  const snapshot: Snapshot = time("dump_encode_ms", () => {
    const { words, workerIds } = encodeOps(index.dump());
    return { blockSize: BLOCK_SIZE, createdAt: new Date().toISOString(), positions: [], workerIds, words };
  }, rows);
  const bytes = time("write_ms", () => writeSnapshotFile(dir, snapshot), rows);
  const loaded = time("read_check_ms", () => readSnapshotFile(dir, BLOCK_SIZE)!, rows);
  const restored = createIndex("crtc", BLOCK_SIZE);
  time("apply_ms", () => forEachOp(loaded, {
    stored: (w, r, hasParent, hi, lo, external, local, count) => restored.applyStored(w, r, hasParent, hi, lo, external, local, count),
    removed: (w, r, external, count) => restored.applyRemoved(w, r, external, count),
  }), rows);
  const view = (i: typeof index) => i.workers().map((w) => `${w.workerId}/${w.dpRank}=${w.blocks}`).join();
  const equal = view(restored) === view(index) && restored.stats().blocks === held;
  const result = {
    ...provenance(), pairs: held, workers: WORKERS, file_bytes: bytes, bytes_per_pair: bytes / held, equal,
    phases: Object.assign({}, ...rows.map((row) => Object.fromEntries(Object.entries(row).filter(([k]) => k !== "rss_mb")))),
    rss_mb_after: rows.map((row) => Math.round(row.rss_mb!)),
  };
  if (flags.json) console.log(JSON.stringify(result));
  else {
    console.log(`${held.toLocaleString()} pairs, ${WORKERS} workers: file ${(bytes / 2 ** 20).toFixed(1)} MiB (${(bytes / held).toFixed(1)} B/pair), equal after load: ${equal}`);
    for (const row of rows) {
      const [phase, ms] = Object.entries(row)[0]!;
      console.log(`  ${phase.padEnd(16)} ${ms.toFixed(0).padStart(7)} ms   rss ${row.rss_mb!.toFixed(0)} MiB`);
    }
  }
  if (!equal) process.exitCode = 1;
} finally {
  if (flags.dir === undefined) rmSync(dir, { recursive: true, force: true });
}
