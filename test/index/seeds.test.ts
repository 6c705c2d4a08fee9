// Goal: the scenarios of the four Dynamo leak/overcount reports in shared/seeds, as
// named tests on every backend: dead nodes are detached (cascading, sparing live
// owners), replacements survive, ownerless split suffixes go, emptied positional
// entries are deleted, memory returns exactly to baseline after churn, and equal-sized
// worker sets are still intersected. Method: small event sequences with verify() after
// every event, checking scores and exact stats.
import { describe, expect, test } from "bun:test";
import { heapStats } from "bun:jsc";
import { createIndex } from "../../src/index/index";
import { pairs } from "../harness/streams";
import { BACKENDS, ext, fresh, freshBytes, remove, scores, store } from "./helpers";

const forEach = (name: string, body: (backend: (typeof BACKENDS)[number]) => void) => {
  for (const backend of BACKENDS) test(`${name} [${backend}]`, () => body(backend));
};

function expectEmpty(
  index: ReturnType<typeof fresh>,
  backend: (typeof BACKENDS)[number],
  workers = 0,
): void {
  const stats = index.stats();
  expect({
    workers: stats.workers,
    blocks: stats.blocks,
    nodes: stats.nodes,
    lookups: stats.lookupEntries,
    edgeWords: stats.edgeWords,
  }).toEqual({ workers, blocks: 0, nodes: 0, lookups: 0, edgeWords: 0 });
  if (workers === 0) expect(stats.bytes).toBe(freshBytes(backend));
}

describe("seed 000: detach dead radix nodes from their parent on removal", () => {
  forEach("full-chain detach: removing every block of a chain frees every node", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    expect(remove(index, 1, [1, 2, 3])).toBe(0);
    expectEmpty(index, backend, 1);
    expect(scores(index, [1, 2, 3])).toEqual({});
  });

  forEach("cascade through split ancestors", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4]);
    store(index, 2, null, [1, 2, 5]); // splits [1,2,3,4] at 2
    if (backend === "crtc") expect(index.stats().nodes).toBe(3);
    remove(index, 2, [1, 2, 5]);
    expect(scores(index, [1, 2, 3, 4])).toEqual({ "1/0": 4 });
    // Head first: [1,2] loses its last owner but still leads to [3,4]; then the leaf goes
    // and the cascade takes the ownerless split ancestor with it.
    remove(index, 1, [1, 2]);
    expect(scores(index, [1, 2, 3, 4])).toEqual({});
    expect(index.stats().blocks).toBe(2);
    remove(index, 1, [3, 4]);
    expectEmpty(index, backend, 2);
  });

  forEach("multi-worker sparing: nodes another worker holds stay", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    store(index, 2, null, [1, 2, 3]);
    const nodes = index.stats().nodes;
    remove(index, 1, [1, 2, 3]);
    expect(index.stats().nodes).toBe(nodes);
    expect(scores(index, [1, 2, 3])).toEqual({ "2/0": 3 });
    remove(index, 2, [3]);
    expect(scores(index, [1, 2, 3])).toEqual({ "2/0": 2 });
  });

  forEach("worker removal detaches (and so does cleared)", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    store(index, 2, null, [7, 8]);
    index.applyCleared(2n, 0);
    expect(index.stats().workers).toBe(2);
    index.removeWorker(1n);
    expectEmpty(index, backend, 1);
    index.removeWorker(2n);
    expectEmpty(index, backend);
  });

  forEach("store after detach recreates the chain", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3]);
    remove(index, 1, [3, 2, 1]);
    expectEmpty(index, backend, 1);
    store(index, 1, null, [1, 2, 3]);
    expect(scores(index, [1, 2, 3, 4])).toEqual({ "1/0": 3 });
    expect(index.stats().blocks).toBe(3);
  });
});

describe("seed 001: release unowned radix branches after eviction", () => {
  forEach(
    "replacement protection: a dying suffix unlinks from its new prefix, not the old key",
    (backend) => {
      const index = fresh(backend);
      store(index, 1, null, [1, 2, 3, 4]);
      store(index, 2, null, [1, 2, 5]); // the new prefix node [1,2] takes the root's key 1
      remove(index, 1, [3, 4]); // [3,4] dies: its link is (prefix, 3)
      expect(scores(index, [1, 2, 5])).toEqual({ "1/0": 2, "2/0": 3 });
      expect(scores(index, [1, 2, 3, 4])).toEqual({ "1/0": 2, "2/0": 2 });
      if (backend === "crtc") expect(index.stats().nodes).toBe(2);
      store(index, 3, null, [1, 2, 3]); // the key is free again and re-created
      expect(scores(index, [1, 2, 3, 4])).toEqual({ "1/0": 2, "2/0": 2, "3/0": 3 });
    },
  );

  forEach("ownerless split suffix: an evicted tail is not kept for a later split", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4]);
    remove(index, 1, [4, 3]);
    store(index, 2, null, [1, 2, 9]);
    const stats = index.stats();
    expect(stats.blocks).toBe(5);
    // The truncated leaf [1,2] grows in place to [1,2,9]: worker 1 holds its first two blocks.
    if (backend === "crtc")
      expect({ nodes: stats.nodes, edgeWords: stats.edgeWords }).toEqual({
        nodes: 1,
        edgeWords: 6,
      });
    if (backend === "positional") expect(stats.nodes).toBe(3);
    remove(index, 1, [1, 2]);
    remove(index, 2, [1, 2, 9]);
    expectEmpty(index, backend, 2);
  });

  forEach("two workers cut back to the same prefix: the tail is released", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4]);
    store(index, 2, null, [1, 2, 3, 4]);
    remove(index, 2, [3, 4]);
    remove(index, 1, [4, 3]);
    if (backend === "crtc") expect(index.stats().edgeWords).toBe(4);
    expect(scores(index, [1, 2, 3, 4])).toEqual({ "1/0": 2, "2/0": 2 });
  });

  forEach("shared system prompt churn: memory returns to baseline every cycle", (backend) => {
    const index = fresh(backend, { verify: false });
    const prompt = Array.from({ length: 16 }, (_, i) => i + 1);
    store(index, 1, null, prompt);
    const cycle = (n: number): void => {
      const suffix = Array.from({ length: 8 }, (_, i) => 1000 * n + i + 100);
      expect(store(index, 1, ext(1, 16), suffix)).toBe(0);
      expect(remove(index, 1, suffix)).toBe(0);
    };
    for (let n = 0; n < 200; n++) cycle(n & 1); // warm-up with two reused suffixes
    const baseline = index.stats();
    for (let n = 2; n < 2_000; n++) {
      cycle(n);
      if (n % 97 === 0) expect(index.stats()).toEqual(baseline);
    }
    expect(index.stats()).toEqual(baseline);
    expect(baseline.blocks).toBe(16);
    expect(scores(index, [...prompt, 100])).toEqual({ "1/0": 16 });
    index.verify();
  });

  forEach("churn of duplicate copies: memory returns to the fresh counts exactly", (backend) => {
    const index = fresh(backend, { verify: false });
    const freshStats = index.stats();
    const prompt = Array.from({ length: 16 }, (_, i) => i + 1);
    const cycle = (n: number): void => {
      // Two requests compute the prompt and a suffix before either is cached (two copies
      // of each block), a third computes the suffix again; then every copy is evicted,
      // a few at a time and in another order than stored.
      const suffix = Array.from({ length: 8 }, (_, i) => 1000 * n + i + 100);
      store(index, 1, null, prompt);
      store(index, 1, null, prompt);
      for (let k = 0; k < 3; k++) store(index, 1, ext(1, 16), suffix);
      expect(index.stats().copies).toBe(16 + 2 * 8);
      for (let k = 0; k < 3; k++) expect(remove(index, 1, suffix.toReversed())).toBe(0);
      expect(remove(index, 1, prompt.slice(8))).toBe(0);
      expect(scores(index, [...prompt, 100])).toEqual({ "1/0": 16 });
      expect(remove(index, 1, [...prompt.slice(0, 8), ...prompt])).toBe(0);
      index.applyCleared(1n, 0); // holds nothing already: changes nothing
      index.removeWorker(1n);
    };
    for (let n = 0; n < 1_000; n++) {
      cycle(n);
      if (n % 97 === 0) expect(index.stats()).toEqual(freshStats);
    }
    expect(index.stats()).toEqual(freshStats);
    index.verify();
  });
});

test("seed 001 churn retains no JS objects (crtc, 100,000 cycles)", () => {
  // Goal: the hot path allocates nothing that survives a cycle. Method: full GC and
  // heapStats() before and after; typed arrays only grow when the index grows.
  const index = createIndex("crtc", 16);
  const prompt = pairs(Array.from({ length: 16 }, (_, i) => BigInt(i + 1)));
  index.applyStored(1n, 0, false, 0, 0, prompt, prompt, 16);
  const external = new Uint32Array(16);
  const local = new Uint32Array(16);
  const cycle = (n: number): void => {
    for (let i = 0; i < 8; i++) {
      external[2 * i] = 0x1000 + n;
      external[2 * i + 1] = i;
      local[2 * i] = 0x1000 + n;
      local[2 * i + 1] = i + 100;
    }
    index.applyStored(1n, 0, true, 0, 16, external, local, 8);
    index.applyRemoved(1n, 0, external, 8);
  };
  for (let n = 0; n < 1_000; n++) cycle(n & 1);
  Bun.gc(true);
  const before = heapStats().objectCount;
  for (let n = 2; n < 100_002; n++) cycle(n);
  Bun.gc(true);
  expect(heapStats().objectCount - before).toBeLessThan(200);
  expect(index.stats().blocks).toBe(16);
  expect(index.counters.hashConflicts).toBe(0);
});

describe("seed 004: remove emptied positional entries", () => {
  const rows: [string, (index: ReturnType<typeof fresh>) => void][] = [
    ["removed", (index) => remove(index, 0, [1, 2, 3])],
    ["cleared", (index) => index.applyCleared(0n, 0)],
    ["remove_worker", (index) => index.removeWorker(0n)],
  ];
  for (const [name, drop] of rows) {
    forEach(`worker 0 stores [1,2,3], then ${name}: no entry is left`, (backend) => {
      const index = fresh(backend);
      store(index, 0, null, [1, 2, 3]);
      drop(index);
      expect(index.stats().nodes).toBe(0);
      expect(index.stats().lookupEntries).toBe(0);
    });
  }

  forEach(
    "worker 0 [1,2,3], worker 1 [1,2], worker 0 removes its blocks: worker 1 still scores 2",
    (backend) => {
      const index = fresh(backend);
      store(index, 0, null, [1, 2, 3]);
      store(index, 1, null, [1, 2]);
      remove(index, 0, [1, 2, 3]);
      expect(index.stats().nodes).toBe(backend === "crtc" ? 1 : 2);
      expect(scores(index, [1, 2, 3])).toEqual({ "1/0": 2 });
    },
  );
});

describe("seed 003 / reference §4.4: equal-sized worker sets are intersected for real", () => {
  forEach("a head-first eviction keeps sizes equal but changes the members", (backend) => {
    const index = fresh(backend);
    const prefix = [1, 2, 3];
    const suffix = [4, 5, 6];
    store(index, 1, null, prefix); // A holds only the prefix
    store(index, 2, null, [...prefix, ...suffix]); // B holds everything
    store(index, 3, null, [...prefix, ...suffix]); // C too...
    remove(index, 3, prefix); // ...until it evicts the head: {A,B} full on the prefix, {B,C} on the suffix
    expect(scores(index, [...prefix, ...suffix])).toEqual({ "1/0": 3, "2/0": 6 });
    // C's suffix is still held: storing the hole back makes it count again.
    store(index, 3, null, prefix);
    expect(scores(index, [...prefix, ...suffix])).toEqual({ "1/0": 3, "2/0": 6, "3/0": 6 });
  });

  forEach("a worker present only below a hole never counts past it", (backend) => {
    const index = fresh(backend);
    store(index, 1, null, [1, 2, 3, 4, 5, 6]);
    remove(index, 1, [3]);
    expect(scores(index, [1, 2, 3, 4, 5, 6])).toEqual({ "1/0": 2 });
    expect(index.stats().blocks).toBe(5);
    expect(store(index, 1, ext(1, 2), [3])).toBe(0);
    expect(scores(index, [1, 2, 3, 4, 5, 6])).toEqual({ "1/0": 6 });
  });
});
