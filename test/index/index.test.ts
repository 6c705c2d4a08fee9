// Goal: the event semantics of src/index/README.md on every backend — parents, holes,
// duplicates, rejections and their counters, worker slots and capacity, producers that
// break the engine-hash invariant, dump/restore, workers() — plus crtc-specific shape
// (in-place growth, truncation, chains longer than one run) and that verify() catches a
// corrupted tree. Method: hand-written event sequences, verify() after every event.
import { describe, expect, test } from "bun:test";
import { applyOp } from "../../src/index/apply";
import type { CrtcIndex } from "../../src/index/crtc/crtc";
import { createIndex } from "../../src/index/index";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { MatchResult, StoreStatus } from "../../src/index/types";
import { pairs } from "../harness/streams";
import { BACKENDS, ext, fresh, remove, removeHashes, scores, store } from "./helpers";

const forEach = (name: string, body: (backend: (typeof BACKENDS)[number]) => void) => {
  for (const backend of BACKENDS) test(`${name} [${backend}]`, () => body(backend));
};

describe("stored events", () => {
  forEach("a parent the worker does not hold rejects the whole event", (backend) => {
    const index = fresh(backend);
    expect(store(index, 1, 555n, [1, 2])).toBe(StoreStatus.ParentNotFound);
    expect(index.stats().workers).toBe(0); // no slot for a rejected event
    store(index, 1, null, [1, 2]);
    expect(store(index, 2, ext(1, 2), [3])).toBe(StoreStatus.ParentNotFound); // another worker's block
    remove(index, 1, [2]);
    expect(store(index, 1, ext(1, 2), [3])).toBe(StoreStatus.ParentNotFound); // removed parent
    expect(index.counters.rejectedParentNotFound).toBe(3);
    expect(index.stats().rejected).toEqual({
      total: 3,
      parentNotFound: 3,
      blockSizeMismatch: 0,
      capacity: 0,
      invalid: 0,
    });
    expect(scores(index, [1, 2, 3])).toEqual({ "1/0": 1 });
  });

  forEach("an empty stored event changes nothing and gives no slot", (backend) => {
    const index = fresh(backend);
    expect(store(index, 1, null, [])).toBe(StoreStatus.Ok);
    expect(store(index, 1, 5n, [])).toBe(StoreStatus.ParentNotFound);
    expect(index.stats()).toMatchObject({ workers: 0, blocks: 0 });
  });

  forEach(
    "re-storing held blocks is one more copy of each: counted, nothing else changes",
    (backend) => {
      const index = fresh(backend);
      store(index, 1, null, [1, 2, 3]);
      const before = index.stats();
      store(index, 1, null, [1, 2]);
      store(index, 1, ext(1, 1), [2, 3]);
      expect(index.counters.blocksDuplicate).toBe(4);
      expect(index.stats()).toEqual({ ...before, copies: 4, bytes: index.stats().bytes });
      expect(scores(index, [1, 2, 3])).toEqual({ "1/0": 3 });
    },
  );

  forEach(
    "a block stored twice and removed once is still held (vLLM's duplicate copies)",
    (backend) => {
      const index = fresh(backend);
      const bytes = index.stats().bytes;
      store(index, 1, null, [1, 2]); // request A computes blocks 1, 2
      store(index, 1, null, [1, 2]); // request B computed them too: two physical copies each
      expect(remove(index, 1, [1, 2])).toBe(0); // A's copies evicted
      expect(scores(index, [1, 2])).toEqual({ "1/0": 2 }); // B's copies still serve hits
      expect(index.counters).toMatchObject({ copiesRemoved: 2, blocksRemoved: 0 });
      expect(index.stats()).toMatchObject({ blocks: 2, copies: 0 });
      expect(remove(index, 1, [2])).toBe(0); // the last copy of block 2
      expect(scores(index, [1, 2])).toEqual({ "1/0": 1 });
      // Copies in one event, a hash twice in one removal, a clear that drops every copy.
      store(index, 1, ext(1, 1), [2]);
      store(index, 1, ext(1, 1), [2]);
      store(index, 1, ext(1, 1), [2]);
      expect(index.stats().copies).toBe(2);
      expect(remove(index, 1, [2, 2])).toBe(0);
      expect(scores(index, [1, 2])).toEqual({ "1/0": 2 });
      expect(remove(index, 1, [2, 2])).toBe(1); // the last copy, then unknown
      store(index, 1, ext(1, 1), [2]);
      store(index, 1, null, [1, 2]);
      index.applyCleared(1n, 0);
      expect(index.stats()).toMatchObject({ blocks: 0, copies: 0 });
      expect(scores(index, [1, 2])).toEqual({});
      index.removeWorker(1n);
      expect(index.stats()).toMatchObject({ workers: 0, blocks: 0, copies: 0, bytes });
    },
  );

  forEach(
    "copies are counted per (worker, dp rank): another rank's removal takes none",
    (backend) => {
      const index = fresh(backend);
      store(index, 1, null, [1], undefined, 0);
      store(index, 1, null, [1], undefined, 0);
      store(index, 1, null, [1], undefined, 2);
      remove(index, 1, [1], 2);
      expect(scores(index, [1])).toEqual({ "1/0": 1 });
      remove(index, 1, [1], 0);
      expect(scores(index, [1])).toEqual({ "1/0": 1 });
      remove(index, 1, [1], 0);
      expect(scores(index, [1])).toEqual({});
    },
  );

  forEach("dump and restore keep every copy", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    store(index, 1, ext(1, 1), [2, 3]);
    store(index, 1, ext(1, 2), [3]);
    remove(index, 1, [1]); // block 1 goes; 2 and 3 stay below the hole, with their copies
    store(index, 2, null, [1]);
    const restored = createIndex(backend, 4, { verify: true });
    for (const event of index.dump()) applyOp(restored, event);
    expect(restored.stats()).toMatchObject({ blocks: 3, copies: 3 });
    for (const [worker, copies] of [
      [1, 3],
      [2, 1],
    ] as const) {
      for (let n = 0; n < copies; n++) remove(restored, worker, [1, 2, 3]);
    }
    expect(restored.stats()).toMatchObject({ blocks: 0, copies: 0 });
    // Unknown: worker 1s block 1 three times and block 2 once; worker 2s blocks 2 and 3.
    expect(restored.counters.blocksUnknown).toBe(3 + 1 + 2);
  });

  forEach("dp ranks are separate workers; remove_worker takes them all", (backend) => {
    const index = fresh(backend);
    store(index, 7, null, [1, 2], undefined, 0);
    store(index, 7, null, [1, 2, 3], undefined, 3);
    store(index, 8, null, [1], undefined, 0);
    expect(scores(index, [1, 2, 3])).toEqual({ "7/0": 2, "7/3": 3, "8/0": 1 });
    const listed = index
      .workers()
      .map((w) => `${w.workerId}/${w.dpRank}:${w.blocks}`)
      .sort();
    expect(listed).toEqual(["7/0:2", "7/3:3", "8/0:1"]);
    index.removeWorker(7n);
    expect(scores(index, [1, 2, 3])).toEqual({ "8/0": 1 });
    expect(index.stats().workers).toBe(1);
  });

  forEach("worker ids use all 64 bits", (backend) => {
    const index = fresh(backend);
    const big = (1n << 64n) - 1n;
    index.applyStored(
      big,
      4_000_000_000,
      false,
      0,
      0,
      pairs([0xffff_ffff_ffff_fffen]),
      pairs([1n]),
      1,
    );
    const out = new MatchResult();
    index.findMatches(pairs([1n]), 1, out);
    expect(out.count).toBe(1);
    expect(index.workerIdOf(out.workers[0]!)).toBe(big);
    expect(index.dpRankOf(out.workers[0]!)).toBe(4_000_000_000);
  });

  forEach("parent words may come as signed or unsigned 32-bit numbers", (backend) => {
    const index = fresh(backend);
    const parent = 0xffff_fffe_8000_0001n;
    index.applyStored(1n, 0, false, 0, 0, pairs([parent]), pairs([1n]), 1);
    expect(
      index.applyStored(1n, 0, true, 0xffff_fffe | 0, 0x8000_0001 | 0, pairs([5n]), pairs([2n]), 1),
    ).toBe(StoreStatus.Ok);
    expect(scores(index, [1, 2])).toEqual({ "1/0": 2 });
  });

  forEach("the same content after different prefixes stays apart", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 7, 7], [11n, 12n, 13n]);
    store(index, 2, null, [2, 7, 7], [11n, 12n, 13n]);
    expect(scores(index, [1, 7, 7])).toEqual({ "1/0": 3 });
    expect(scores(index, [2, 7, 7])).toEqual({ "2/0": 3 });
    expect(scores(index, [7])).toEqual({});
  });
});

describe("removed and cleared", () => {
  forEach("unknown hashes are skipped and counted; the rest applies", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    expect(removeHashes(index, 1, [999n, ext(1, 3), ext(1, 3)])).toBe(2);
    expect(removeHashes(index, 2, [ext(1, 1)])).toBe(1); // unknown worker
    expect(index.counters.blocksUnknown).toBe(3);
    expect(scores(index, [1, 2, 3])).toEqual({ "1/0": 2 });
  });

  forEach("holes: descendants stay held, count again once the hole is stored back", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4, 5, 6, 7, 8]);
    remove(index, 1, [2, 5, 7]);
    expect(scores(index, [1, 2, 3, 4, 5, 6, 7, 8])).toEqual({ "1/0": 1 });
    expect(index.stats().blocks).toBe(5);
    store(index, 1, ext(1, 1), [2]);
    expect(scores(index, [1, 2, 3, 4, 5, 6, 7, 8])).toEqual({ "1/0": 4 });
    store(index, 1, ext(1, 4), [5]);
    store(index, 1, ext(1, 6), [7, 8]);
    expect(scores(index, [1, 2, 3, 4, 5, 6, 7, 8])).toEqual({ "1/0": 8 });
    // A store can hang off a block whose ancestors are gone.
    remove(index, 1, [1]);
    store(index, 1, ext(1, 8), [9]);
    expect(scores(index, [1, 2, 3, 4, 5, 6, 7, 8, 9])).toEqual({});
    store(index, 1, null, [1]);
    expect(scores(index, [1, 2, 3, 4, 5, 6, 7, 8, 9])).toEqual({ "1/0": 9 });
  });

  forEach("cleared keeps the worker present with nothing held", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2]);
    index.applyCleared(1n, 0);
    index.applyCleared(5n, 0); // unknown: nothing happens
    expect(index.stats()).toMatchObject({ workers: 1, blocks: 0, lookupEntries: 0 });
    expect(index.workers()).toEqual([{ workerId: 1n, dpRank: 0, blocks: 0 }]);
    store(index, 1, null, [1]);
    expect(scores(index, [1, 2])).toEqual({ "1/0": 1 });
  });
});

describe("worker slots", () => {
  forEach(
    "a full index rejects new workers (counted) until a slot is freed, and a recycled slot starts empty",
    (backend) => {
      const index = fresh(backend, { maxWorkers: 2 });
      store(index, 1, null, [1, 2]);
      store(index, 2, null, [1]);
      expect(store(index, 3, null, [1, 2, 3])).toBe(StoreStatus.CapacityExhausted);
      expect(index.counters.rejectedCapacity).toBe(1);
      store(index, 1, null, [5]); // existing workers still store
      index.removeWorker(1n);
      expect(store(index, 3, null, [1, 2, 3])).toBe(StoreStatus.Ok);
      expect(scores(index, [1, 2, 3])).toEqual({ "2/0": 1, "3/0": 3 });
      expect(scores(index, [5])).toEqual({});
    },
  );

  test("maxWorkers is bounded by the u16 slot space", () => {
    expect(() => createIndex("crtc", 4, { maxWorkers: 65_537 })).toThrow(RangeError);
    expect(() => createIndex("positional", 4, { maxWorkers: 0 })).toThrow(RangeError);
  });
});

describe("producers that break the engine-hash invariant", () => {
  forEach(
    "a hash that already names another block cuts the event short; nothing else changes",
    (backend) => {
      const index = fresh(backend);
      store(index, 2, null, [1, 2, 3]);
      store(index, 1, null, [1, 2]);
      // Block 9 reuses the hash of worker 1's block 1.
      expect(store(index, 1, ext(1, 2), [3, 9, 4], [ext(1, 3), ext(1, 1), ext(1, 4)])).toBe(
        StoreStatus.Ok,
      );
      expect(index.counters.hashConflicts).toBe(1);
      expect(scores(index, [1, 2, 3, 9, 4])).toEqual({ "1/0": 3, "2/0": 3 });
      expect(index.stats().blocks).toBe(6);
    },
  );

  forEach(
    "a held block under a second hash is refused; the first name still removes it",
    (backend) => {
      const index = fresh(backend);
      store(index, 1, null, [1, 2]);
      store(index, 1, null, [1, 2], [77n, 78n]);
      expect(index.counters.hashConflicts).toBe(1);
      expect(removeHashes(index, 1, [77n])).toBe(1);
      remove(index, 1, [1, 2]);
      expect(index.stats().blocks).toBe(0);
    },
  );

  forEach("one hash twice in one event", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3], [5n, 5n, 6n]);
    expect(scores(index, [1, 2, 3])).toEqual({ "1/0": 1 });
    expect(index.stats().lookupEntries).toBe(1);
  });
});

describe("dump", () => {
  forEach("rebuilds an equal index, holes and empty workers included", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4, 5]);
    store(
      index,
      2,
      null,
      [1, 2, 9],
      [18_446_744_073_709_551_615n, 18_446_744_073_709_551_614n, 3n],
    );
    remove(index, 1, [2, 4]);
    store(index, 3, null, [8]);
    index.applyCleared(3n, 0);
    const oracle = new ReferenceIndex(4);
    for (const event of index.dump()) applyOp(oracle, JSON.parse(JSON.stringify(event)));
    expect(oracle.canonical()).toEqual([
      "1/0 1001 -> /1",
      "1/0 1003 -> /1/2/3",
      "1/0 1005 -> /1/2/3/4/5",
      "1/0 present",
      "2/0 18446744073709551614 -> /1/2",
      "2/0 18446744073709551615 -> /1",
      "2/0 3 -> /1/2/9",
      "2/0 present",
      "3/0 present",
    ]);
  });
});

describe("crtc shape", () => {
  const crtc = (): CrtcIndex => fresh("crtc") as CrtcIndex;

  test("appends grow a leaf in place; evicting the tail truncates it", () => {
    const index = crtc();
    store(index, 1, null, [1, 2, 3, 4]);
    for (let n = 5; n <= 8; n++) store(index, 1, ext(1, n - 1), [n]); // decode appends
    expect(index.stats()).toMatchObject({ nodes: 1, edgeWords: 16 });
    remove(index, 1, [8, 7]);
    expect(index.stats()).toMatchObject({ nodes: 1, edgeWords: 12 });
    store(index, 2, null, [1, 2, 3, 4, 5, 6]);
    remove(index, 1, [6, 5]);
    expect(index.stats()).toMatchObject({ nodes: 1, edgeWords: 12 }); // worker 2 still holds 6
  });

  test("a chain longer than one block run spans several nodes", () => {
    const index = createIndex("crtc", 1) as CrtcIndex;
    const length = 150_000;
    const external = new Uint32Array(2 * length);
    const local = new Uint32Array(2 * length);
    for (let i = 0; i < length; i++) {
      external[2 * i + 1] = i + 1;
      local[2 * i + 1] = i + 1;
    }
    expect(index.applyStored(1n, 0, false, 0, 0, external, local, length)).toBe(StoreStatus.Ok);
    expect(index.stats().nodes).toBe(2);
    const out = new MatchResult();
    index.findMatches(local, length, out);
    expect(out.blocks[0]).toBe(length);
    index.verify();
    index.applyRemoved(1n, 0, external, length);
    expect(index.stats()).toMatchObject({ nodes: 0, blocks: 0, edgeWords: 0 });
    index.removeWorker(1n);
    expect(index.stats().bytes).toBe(createIndex("crtc", 1).stats().bytes);
  });

  test("verify() catches a corrupted tree", () => {
    const index = crtc();
    store(index, 1, null, [1, 2, 3]);
    store(index, 2, null, [1, 2, 4]);
    index.verify();
    const start = index.tree.nodes.start[2]!;
    index.tree.blocks.node[start] = 0; // a block forgets its node
    expect(() => index.verify()).toThrow("verify: block does not point back to its node");
  });
});
