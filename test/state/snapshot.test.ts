// Goal: a snapshot rebuilds an index equal to the one it was taken from (every
// backend, randomized streams with mid-chain removals and clears), and a file that is
// corrupt, truncated, of another version or block size is refused whole; writing is
// atomic (no temp file left, the old snapshot survives a failed write).
import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createIndex } from "../../src/index";
import { BACKEND_NAMES, MatchResult } from "../../src/index/types";
import {
  decodeSnapshot, encodeOps, encodeSnapshot, forEachOp, readSnapshotFile, type Snapshot, SNAPSHOT_FILE, SnapshotError,
  writeSnapshotFile,
} from "../../src/state/snapshot";
import { applyHarnessOp, generateStream, pairs } from "../harness/streams";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-snapshot-"));
  dirs.push(dir);
  return dir;
}

function snapshotOf(index: ReturnType<typeof createIndex>): Snapshot {
  const { words, workerIds } = encodeOps(index.dump());
  return {
    blockSize: index.blockSize, createdAt: "2026-01-01T00:00:00Z", workerIds, words,
    positions: [{ workerId: 7n, dpRank: 0, lastSeq: 41, fingerprint: 12345, degraded: false }],
  };
}

function restoreInto(snapshot: Snapshot, backend: (typeof BACKEND_NAMES)[number]) {
  const index = createIndex(backend, snapshot.blockSize, { verify: true });
  forEachOp(snapshot, {
    stored: (w, r, hasParent, hi, lo, external, local, count) => index.applyStored(w, r, hasParent, hi, lo, external, local, count),
    removed: (w, r, external, count) => index.applyRemoved(w, r, external, count),
  });
  return index;
}

function scores(index: ReturnType<typeof createIndex>, query: bigint[]): string {
  const out = new MatchResult(64);
  index.findMatches(pairs(query), query.length, out);
  const rows: string[] = [];
  for (let i = 0; i < out.count; i++) rows.push(`${index.workerIdOf(out.workers[i]!)}/${index.dpRankOf(out.workers[i]!)}=${out.blocks[i]}`);
  return rows.sort().join(",");
}

describe("round trip", () => {
  for (const backend of BACKEND_NAMES) {
    test.each([1, 2, 3, 4, 5, 6])(`${backend}: randomized stream %p, snapshot, file, load: equal dump, workers and matches`, (seed) => {
      const stream = generateStream(seed, { steps: 300 });
      const index = createIndex(backend, 1);
      for (const op of stream.ops) applyHarnessOp(index, op);
      const bytes = encodeSnapshot(snapshotOf(index));
      const loaded = decodeSnapshot(bytes);
      expect(loaded.positions).toEqual([{ workerId: 7n, dpRank: 0, lastSeq: 41, fingerprint: 12345, degraded: false }]);
      const restored = restoreInto(loaded, backend);
      expect(restored.workers()).toEqual(index.workers());
      for (const query of stream.queries) expect(scores(restored, query)).toBe(scores(index, query));
      expect(restored.stats().blocks).toBe(index.stats().blocks);
    });
  }
});

describe("refusals", () => {
  const good = () => {
    const index = createIndex("crtc", 1);
    for (const op of generateStream(9, { steps: 100 }).ops) applyHarnessOp(index, op);
    return encodeSnapshot(snapshotOf(index));
  };

  test("any flipped byte fails the checksum (or an earlier check)", () => {
    const bytes = good();
    for (const at of [0, 17, 40, Math.floor(bytes.length / 2), bytes.length - 9, bytes.length - 1]) {
      const bad = bytes.slice();
      bad[at]! ^= 0x40;
      expect(() => decodeSnapshot(bad)).toThrow(SnapshotError);
    }
  });

  test("truncated at any length is refused", () => {
    const bytes = good();
    for (const length of [0, 10, 28, 100, bytes.length - 1]) {
      expect(() => decodeSnapshot(bytes.subarray(0, length))).toThrow(SnapshotError);
    }
  });

  test("another version is refused by name", () => {
    const bytes = good();
    new DataView(bytes.buffer).setUint32(16, 99, true);
    expect(() => decodeSnapshot(bytes)).toThrow("version 99");
  });

  test("another block size is refused", () => {
    const dir = tempDir();
    writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 16)));
    expect(() => readSnapshotFile(dir, 32)).toThrow("block size 16");
    expect(readSnapshotFile(dir, 16)).not.toBeNull();
  });

  test("a malformed operation inside a well-checksummed file is refused before anything is applied", () => {
    const snapshot: Snapshot = { blockSize: 1, createdAt: "x", workerIds: [1n], positions: [], words: new Uint32Array([1, 0, 0, 0, 0, 0, 50]) };
    expect(() => decodeSnapshot(encodeSnapshot(snapshot))).toThrow("runs past the end");
  });
});

describe("atomic write", () => {
  test("writes, replaces, leaves no temp file; a missing file reads as none", () => {
    const dir = tempDir();
    expect(readSnapshotFile(dir, 1)).toBeNull();
    const index = createIndex("crtc", 1);
    for (const op of generateStream(3, { steps: 100 }).ops) applyHarnessOp(index, op);
    const first = writeSnapshotFile(dir, snapshotOf(index));
    expect(readFileSync(join(dir, SNAPSHOT_FILE)).length).toBe(first);
    writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)));
    expect(readdirSync(dir)).toEqual([SNAPSHOT_FILE]);
    expect(readSnapshotFile(dir, 1)!.words.length).toBe(0);
  });

  test("a failed write keeps the previous snapshot", () => {
    const dir = tempDir();
    writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)));
    const before = readFileSync(join(dir, SNAPSHOT_FILE));
    // A directory where the temp file should go makes the write fail.
    mkdirSync(join(dir, `${SNAPSHOT_FILE}.tmp-${process.pid}`));
    expect(() => writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)))).toThrow();
    expect(readFileSync(join(dir, SNAPSHOT_FILE))).toEqual(before);
    expect(existsSync(join(dir, SNAPSHOT_FILE))).toBe(true);
  });
});
