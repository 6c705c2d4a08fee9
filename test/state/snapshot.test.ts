// Goal: a snapshot rebuilds an index equal to the one it was taken from (every
// backend, randomized streams with mid-chain removals and clears), and a file that is
// corrupt, truncated, of another version or block size is refused whole; writing is
// atomic (no temp file left, the old snapshot survives a failed write).
import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createIndex } from "../../src/index";
import { freezeNow, IndexPacker, packIndex } from "../../src/index/pack";
import { LoadTracker } from "../../src/route/load";
import { BACKEND_NAMES, MatchResult } from "../../src/index/types";
import {
  decodeSnapshot,
  encodeSnapshot,
  forEachOp,
  putActive,
  readSnapshotFile,
  type Snapshot,
  SNAPSHOT_FILE,
  SnapshotError,
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
  const { words, workerIds } = packIndex(freezeNow(index.freeze()));
  return {
    blockSize: index.blockSize,
    createdAt: "2026-01-01T00:00:00Z",
    workerIds: [...workerIds],
    words,
    positions: [
      { workerId: 7n, dpRank: 0, lastSeq: 41, fingerprint: 12345, degraded: false, ranks: [0, 2] },
    ],
  };
}

function restoreInto(snapshot: Snapshot, backend: (typeof BACKEND_NAMES)[number]) {
  const index = createIndex(backend, snapshot.blockSize, { verify: true });
  forEachOp(snapshot, {
    stored: (w, r, hasParent, hi, lo, external, local, count) =>
      index.applyStored(w, r, hasParent, hi, lo, external, local, count),
    removed: (w, r, external, count) => index.applyRemoved(w, r, external, count),
  });
  return index;
}

function scores(index: ReturnType<typeof createIndex>, query: bigint[]): string {
  const out = new MatchResult(64);
  index.findMatches(pairs(query), query.length, out);
  const rows: string[] = [];
  for (let i = 0; i < out.count; i++)
    rows.push(
      `${index.workerIdOf(out.workers[i]!)}/${index.dpRankOf(out.workers[i]!)}=${out.blocks[i]}`,
    );
  return rows.sort().join(",");
}

describe("round trip", () => {
  for (const backend of BACKEND_NAMES) {
    test.each([1, 2, 3, 4, 5, 6])(
      `${backend}: randomized stream %p, snapshot, file, load: equal dump, workers and matches`,
      (seed) => {
        const stream = generateStream(seed, { steps: 300 });
        const index = createIndex(backend, 1);
        for (const op of stream.ops) applyHarnessOp(index, op);
        const bytes = encodeSnapshot(snapshotOf(index));
        const loaded = decodeSnapshot(bytes);
        expect(loaded.positions).toEqual([
          {
            workerId: 7n,
            dpRank: 0,
            lastSeq: 41,
            fingerprint: 12345,
            degraded: false,
            ranks: [0, 2],
          },
        ]);
        const restored = restoreInto(loaded, backend);
        expect(restored.workers()).toEqual(index.workers());
        for (const query of stream.queries)
          expect(scores(restored, query)).toBe(scores(index, query));
        expect(restored.stats().blocks).toBe(index.stats().blocks);
      },
    );
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
    for (const at of [
      0,
      17,
      40,
      Math.floor(bytes.length / 2),
      bytes.length - 9,
      bytes.length - 1,
    ]) {
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

  test("another block size is refused", async () => {
    const dir = tempDir();
    await writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 16)));
    expect(() => readSnapshotFile(dir, 32)).toThrow("block size 16");
    expect(readSnapshotFile(dir, 16)).not.toBeNull();
  });

  test("the file written in pieces is the in-memory encoding; a late flip is caught", async () => {
    // 3.2 MiB of words: four checksum pieces, the last one short.
    const n = 200_000;
    const words = new Uint32Array(7 + 4 * n);
    words.set([1, 0, 0, 0, 0, 0, n]);
    for (let i = 7; i < words.length; i++) words[i] = (i * 2654435761) >>> 0;
    const snapshot: Snapshot = {
      blockSize: 1,
      createdAt: "x",
      workerIds: [1n],
      positions: [],
      words,
    };
    const dir = tempDir();
    const written = await writeSnapshotFile(dir, snapshot);
    const file = readFileSync(join(dir, SNAPSHOT_FILE));
    expect(written).toBe(file.length);
    expect(Buffer.from(encodeSnapshot(snapshot)).equals(file)).toBe(true);
    expect(decodeSnapshot(file).words).toEqual(words);
    file[file.length - 100]! ^= 1;
    expect(() => decodeSnapshot(file)).toThrow("checksum mismatch");
  });

  test("a malformed operation inside a well-checksummed file is refused before anything is applied", () => {
    const snapshot: Snapshot = {
      blockSize: 1,
      createdAt: "x",
      workerIds: [1n],
      positions: [],
      words: new Uint32Array([1, 0, 0, 0, 0, 0, 50]),
    };
    expect(() => decodeSnapshot(encodeSnapshot(snapshot))).toThrow("runs past the end");
  });
});

describe("atomic write", () => {
  test("writes, replaces, leaves no temp file; a missing file reads as none", async () => {
    const dir = tempDir();
    expect(readSnapshotFile(dir, 1)).toBeNull();
    const index = createIndex("crtc", 1);
    for (const op of generateStream(3, { steps: 100 }).ops) applyHarnessOp(index, op);
    const first = await writeSnapshotFile(dir, snapshotOf(index));
    expect(readFileSync(join(dir, SNAPSHOT_FILE)).length).toBe(first);
    await writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)));
    expect(readdirSync(dir)).toEqual([SNAPSHOT_FILE]);
    expect(readSnapshotFile(dir, 1)!.words.length).toBe(0);
  });

  test("a failed write keeps the previous snapshot", async () => {
    const dir = tempDir();
    await writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)));
    const before = readFileSync(join(dir, SNAPSHOT_FILE));
    // A directory where the temp file should go makes the write fail.
    mkdirSync(join(dir, `${SNAPSHOT_FILE}.tmp-${process.pid}`));
    await expect(writeSnapshotFile(dir, snapshotOf(createIndex("crtc", 1)))).rejects.toThrow();
    expect(readFileSync(join(dir, SNAPSHOT_FILE))).toEqual(before);
    expect(existsSync(join(dir, SNAPSHOT_FILE))).toBe(true);
  });
});

describe("typed packing", () => {
  for (const backend of BACKEND_NAMES) {
    test.each([11, 12, 13])(
      `${backend}: stream %p packed in slices equals packed at once; restored into every backend equals the reference`,
      (seed) => {
        const stream = generateStream(seed, { steps: 300 });
        const index = createIndex(backend, 1);
        const reference = createIndex("reference", 1);
        for (const op of stream.ops) {
          applyHarnessOp(index, op);
          applyHarnessOp(reference, op);
        }
        const whole = packIndex(freezeNow(index.freeze())).words;
        for (const slice of [1, 7]) {
          const packer = new IndexPacker(freezeNow(index.freeze()));
          let steps = 0;
          while (!packer.step(slice)) steps++;
          expect(packer.words()).toEqual(whole);
          if (index.stats().blocks > 8) expect(steps).toBeGreaterThan(0);
        }
        const snapshot = decodeSnapshot(encodeSnapshot(snapshotOf(index)));
        for (const target of BACKEND_NAMES) {
          const restored = restoreInto(snapshot, target);
          const sorted = (i: typeof index) =>
            i
              .workers()
              .map((w) => `${w.workerId}/${w.dpRank}=${w.blocks}`)
              .sort();
          expect(sorted(restored)).toEqual(sorted(reference));
          for (const query of stream.queries)
            expect(scores(restored, query)).toBe(scores(reference, query));
          if (target === backend) {
            // Held pairs and lookups exact; a rebuilt crtc tree may have fewer splits than one with a history.
            const [counts, original] = [restored.stats(), index.stats()];
            expect([counts.workers, counts.blocks, counts.lookupEntries]).toEqual([
              original.workers,
              original.blocks,
              original.lookupEntries,
            ]);
            expect(counts.nodes).toBeLessThanOrEqual(original.nodes);
          }
        }
      },
    );
  }

  test.each(BACKEND_NAMES)(
    "%s: a frozen copy packs the index as it was when frozen, whatever is applied after",
    (backend) => {
      const stream = generateStream(21, { steps: 400 });
      const index = createIndex(backend, 1);
      const half = Math.floor(stream.ops.length / 2);
      for (const op of stream.ops.slice(0, half)) applyHarnessOp(index, op);
      const expected = packIndex(freezeNow(index.freeze())).words;
      const packer = new IndexPacker(freezeNow(index.freeze()));
      let turns = 0;
      for (const op of stream.ops.slice(half)) {
        applyHarnessOp(index, op); // the index moves on between slices
        if (turns++ % 5 === 0) packer.step(3);
      }
      for (const info of index.workers()) index.removeWorker(info.workerId);
      while (!packer.step(3));
      expect(packer.words()).toEqual(expected);
    },
  );

  test("a malformed active request is refused before anything is applied", () => {
    const words = new Uint32Array([3, 0, 0, 5, 0, 0, 0, 1, 0x620061]);
    expect(() =>
      decodeSnapshot(
        encodeSnapshot({ blockSize: 1, createdAt: "x", workerIds: [1n], positions: [], words }),
      ),
    ).toThrow("runs past the end");
  });
});

describe("active requests", () => {
  test("saved with their worker, id, state and load; restored equal; past the TTL dropped", () => {
    let now = 1_000;
    const options = { blockSize: 4, requestTtlMs: 10_000, now: () => now };
    const source = new LoadTracker(options);
    const a = source.table.acquire(1n, 0);
    const b = source.table.acquire(2n, 3);
    const chain = new Uint32Array([1, 1, 1, 2, 1, 3]);
    source.admit("req-a", a, chain, 3, 20, 4, 8);
    source.admit("req-b", b, chain, 2, 12, 0, 0);
    now += 6_000;
    source.admit("req-c ünï", a, new Uint32Array([9, 9]), 1, 4, 0, 0);
    source.prefillDone("req-c ünï");
    const out = { words: new Uint32Array(4) };
    let at = 0;
    source.forEachActive((slot, id, prefill, output, idle, c, blocks) => {
      at = putActive(
        out,
        at,
        slot === a ? 0 : 1,
        source.dpRanks[slot]!,
        id,
        prefill,
        output,
        idle,
        c,
        blocks,
      );
    });
    const snapshot = decodeSnapshot(
      encodeSnapshot({
        blockSize: 4,
        createdAt: "x",
        workerIds: [1n, 2n],
        positions: [],
        words: out.words.subarray(0, at),
      }),
    );
    const restore = (elapsed: number) => {
      const target = new LoadTracker(options);
      target.table.acquire(1n, 0);
      target.table.acquire(2n, 3);
      forEachOp(snapshot, {
        stored: () => {},
        removed: () => {},
        active: (workerId, dpRank, id, prefill, output, idle, c, blocks) => {
          target.restore(
            id,
            target.table.find(workerId, dpRank),
            c,
            blocks,
            prefill,
            output,
            idle + elapsed,
          );
        },
      });
      target.verify();
      return target;
    };
    const same = restore(0);
    const view = (t: LoadTracker) => t.workers().map(({ routedTotal: _, ...w }) => w);
    expect(view(same)).toEqual(view(source));
    expect(same.isActive("req-c ünï")).toBe(true);
    // 5 s later: req-a and req-b (idle 6 s) are past the 10 s TTL, req-c (idle 0) is not.
    const later = restore(5_000);
    expect(later.activeRequestCount).toBe(1);
    expect(later.isActive("req-c ünï")).toBe(true);
    now += 4_000;
    expect(later.sweep()).toBe(0);
    now += 1_000;
    expect(later.sweep()).toBe(1);
    expect(later.activeRequestCount).toBe(0);
  });
});
