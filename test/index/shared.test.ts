// Goal: the shared-memory crtc (src/index/crtc/shared.ts) is the same index as the
// private one: its writer and a reader attached by descriptor both equal the reference
// model on the seeded streams; readers hold freed ids back until they leave.
import { describe, expect, test } from "bun:test";
import { attach, createSharedIndex, type SharedIndexDescriptor } from "../../src/index/crtc/shared";
import { CONTROL, RETIRED_NODE } from "../../src/index/crtc/shared-writer";
import { type KvIndex, MatchResult } from "../../src/index/types";
import { differentialSuite } from "../harness/suite";

/** The writer in shared memory, answering findMatches through a reader on this thread. */
differentialSuite({
  name: "crtc in shared memory, read through a reader",
  // The same tree code as the private crtc's full run (differential.test.ts): a quarter.
  seedShare: 0.25,
  create: (options) => {
    const shared = createSharedIndex(1, { ...options, budgetBytes: 8 * 2 ** 20, maxReaders: 1 });
    const reader = attach(shared.descriptor, { identities: true });
    const index = shared.index;
    index.findMatches = (local, count, out) => reader.findMatches(local, count, out);
    index.workerIdOf = (handle) => reader.workerIdOf(handle);
    index.dpRankOf = (handle) => reader.dpRankOf(handle);
    return index;
  },
});

describe("shared crtc: the protocol's bookkeeping", () => {
  const BUDGET = 16 * 2 ** 20;

  /** Worker w stores a chain of `blocks` blocks of its own (local = external = w * 1e6 + i). */
  function storeChain(index: KvIndex, worker: number, blocks: number, salt = 0): void {
    const hashes = new Uint32Array(2 * blocks);
    for (let i = 0; i < blocks; i++) hashes[2 * i + 1] = worker * 1_000_000 + salt * 1000 + i + 1;
    index.applyStored(BigInt(worker), 0, false, 0, 0, hashes, hashes, blocks);
  }

  test("a reader inside a lookup holds freed ids back; they come back once it leaves", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 2 });
    const fresh = shared.index.stats().bytes;
    const control = new Int32Array(shared.descriptor.control);
    const reader = attach(shared.descriptor, { identities: true });
    for (let w = 1; w <= 40; w++) storeChain(shared.index, w, 3);
    const high = shared.index.tree.nodes.highWater;
    // Reader 0 parks inside a lookup at the current epoch (as if descheduled mid-walk).
    Atomics.store(control, CONTROL.readerBase, Atomics.load(control, CONTROL.epoch));
    for (let w = 1; w <= 40; w++) shared.index.removeWorker(BigInt(w));
    expect(shared.counters.retired).toBeGreaterThan(0);
    expect(shared.index.tree.writer!.retiredUnits(RETIRED_NODE)).toBe(40);
    for (let w = 1; w <= 40; w++) storeChain(shared.index, w, 3, 1);
    // No freed id was handed out again: new nodes came from fresh ids.
    expect(shared.index.tree.nodes.highWater).toBe(high + 40);
    shared.index.verify();
    Atomics.store(control, CONTROL.readerBase, 0);
    for (let w = 1; w <= 40; w++) shared.index.removeWorker(BigInt(w));
    expect(shared.index.tree.writer!.limboEmpty).toBe(true);
    shared.index.verify();
    expect(shared.index.stats()).toMatchObject({ nodes: 0, blocks: 0, bytes: fresh });
    reader.close();
  });

  test("a store grows its worker's lookup before it opens a node, never while one is open", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 1 });
    const writer = shared.index.tree.writer!;
    const versions = new Uint32Array(shared.descriptor.regions["nodes.version"]!);
    const touch = writer.touch.bind(writer);
    let resizedWhileOpen = 0;
    let stores = 0;
    const slots = shared.index.slots;
    // A lookup's table replaced between two looks while a node was odd (open to readers).
    const tables = new Map<number, Uint32Array>();
    const check = () => {
      for (let slot = 0; slot < slots.lookup.length; slot++) {
        const lookup = slots.lookupOf(slot);
        if (lookup === null) continue;
        if (tables.has(slot) && tables.get(slot) !== lookup.table && anyOpen()) resizedWhileOpen++;
        tables.set(slot, lookup.table);
      }
    };
    const anyOpen = () => versions.some((version) => (version & 1) !== 0);
    writer.touch = (node) => {
      check();
      touch(node);
    };
    const endEvent = writer.endEvent.bind(writer);
    writer.endEvent = () => {
      check();
      endEvent();
      stores++;
    };
    // Worker 1's chain grows in events of 40 blocks: its lookup passes several growths.
    const hashes = new Uint32Array(2 * 40);
    for (let e = 0; e < 100; e++) {
      for (let i = 0; i < 40; i++) hashes[2 * i + 1] = 40 * e + i + 1;
      const parent = e === 0 ? 0 : 40 * e;
      shared.index.applyStored(1n, 0, e > 0, 0, parent, hashes, hashes, 40);
    }
    expect(stores).toBe(100);
    expect(slots.lookupOf(0)!.count).toBe(4000);
    expect(tables.size).toBe(1);
    expect(resizedWhileOpen).toBe(0);
    shared.index.verify();
  });

  test("shrinking pools give their pages back; the reader still reads the grown index", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 1 });
    const reader = attach(structuredClone(shared.descriptor), { identities: true });
    for (let w = 1; w <= 8; w++) storeChain(shared.index, w, 20_000);
    const out = new MatchResult();
    const query = new Uint32Array(2 * 3);
    for (let i = 0; i < 3; i++) query[2 * i + 1] = 5_000_000 + i + 1;
    reader.findMatches(query, 3, out);
    expect(out.count).toBe(1);
    expect([reader.workerIdOf(out.workers[0]!), out.blocks[0]]).toEqual([5n, 3]);
    for (let w = 1; w <= 8; w++) shared.index.removeWorker(BigInt(w));
    expect(shared.regions.releasedBytes).toBeGreaterThan(8 * 20_000 * 12);
    reader.findMatches(query, 3, out);
    expect(out.count).toBe(0);
    reader.close();
  });

  test("every answer brings its slots' stamps; only a reader with identities names workers", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 2 });
    const table = shared.index.workerTable;
    storeChain(shared.index, 3, 4);
    storeChain(shared.index, 7, 4);
    const named = attach(shared.descriptor, { identities: true });
    const plain = attach(shared.descriptor);
    const query = new Uint32Array(2 * 2);
    for (let i = 0; i < 2; i++) query[2 * i + 1] = 7_000_000 + i + 1;
    const out = new MatchResult();
    for (const reader of [named, plain]) {
      reader.findMatches(query, 2, out);
      expect(out.count).toBe(1);
      expect(reader.stampOf(out.workers[0]!)).toBe(table.stampOf(table.find(7n, 0)));
    }
    named.findMatches(query, 2, out);
    expect([named.workerIdOf(out.workers[0]!), named.dpRankOf(out.workers[0]!)]).toEqual([7n, 0]);
    expect(() => plain.workerIdOf(out.workers[0]!)).toThrow("without identities");
    expect(() => plain.dpRankOf(out.workers[0]!)).toThrow("without identities");
    named.close();
    plain.close();
  });

  test("reader slots are bounded and given back; a bad descriptor is refused", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 2 });
    const a = attach(shared.descriptor);
    const b = attach(shared.descriptor);
    expect(() => attach(shared.descriptor)).toThrow("all 2 reader slots are taken");
    a.close();
    const c = attach(shared.descriptor);
    expect(() => a.findMatches(new Uint32Array(0), 0, new MatchResult())).toThrow("closed");
    b.close();
    c.close();
    expect(() => attach({} as SharedIndexDescriptor)).toThrow("not a shared crtc index descriptor");
    expect(() => createSharedIndex(1, { budgetBytes: 1000 })).toThrow("budget must be >= 1 MiB");
  });

  test("a reader's request makes the writer hold still at the next boundary, bounded", () => {
    const shared = createSharedIndex(1, { budgetBytes: BUDGET, maxReaders: 1 });
    const control = new Int32Array(shared.descriptor.control);
    Atomics.store(control, CONTROL.pauseRequests, 1); // a reader that never finishes
    storeChain(shared.index, 1, 4);
    expect(shared.counters).toMatchObject({ pauses: 1, pauseTimeouts: 1 });
    Atomics.store(control, CONTROL.pauseRequests, 0);
    storeChain(shared.index, 2, 4);
    expect(shared.counters.pauses).toBe(1);
  });
});
