// The one worker numbering: slots, generations, recycling, and the index and router
// sharing it (a match result is a router slot as it is).
import { describe, expect, test } from "bun:test";
import { WorkerTable } from "../../src/domain/worker-table";
import { BACKEND_NAMES, createIndex, MatchResult } from "../../src/index";
import { LoadTracker } from "../../src/route";
import { removeWorker } from "../support/workers";

const pair = (hi: number, lo: number) => Uint32Array.of(hi, lo);

describe("WorkerTable", () => {
  test("a pair keeps its slot; freed slots are reused most recent first, with a new generation", () => {
    const table = new WorkerTable();
    const a = table.acquire(7n, 0);
    const b = table.acquire(7n, 1);
    const c = table.acquire(9n, 0);
    expect([a, b, c]).toEqual([0, 1, 2]);
    expect(table.acquire(7n, 1)).toBe(b);
    expect(table.find(9n, 0)).toBe(c);
    expect(table.slotsOf(7n).sort()).toEqual([a, b]);
    expect(table.workerIdTextOf(c)).toBe("9");
    const generationOfB = table.generation[b]!;
    table.release(b);
    expect(table.find(7n, 1)).toBe(-1);
    expect(table.generation[b]).toBe(0);
    expect(table.isLive(b)).toBe(false);
    expect(() => table.workerIdOf(b)).toThrow(RangeError);
    expect(table.acquire(11n, 3)).toBe(b);
    expect(table.generation[b]).toBeGreaterThan(generationOfB);
    expect(table.dpRankOf(b)).toBe(3);
    expect(table.liveCount).toBe(3);
    expect([...table.liveSlots.subarray(0, table.liveCount)].sort()).toEqual([0, 1, 2]);
  });

  test("full: acquire answers -1; emptied: numbering restarts at 0 and the arrays shrink back", () => {
    const table = new WorkerTable(40);
    const baseline = table.bytes();
    for (let w = 0; w < 40; w++) expect(table.acquire(BigInt(w), 0)).toBe(w);
    expect(table.acquire(99n, 0)).toBe(-1);
    expect(table.bytes()).toBeGreaterThan(baseline);
    for (let w = 0; w < 40; w++) table.release(w);
    expect(table.liveCount).toBe(0);
    expect(table.highWater).toBe(0);
    expect(table.bytes()).toBe(baseline);
    expect(table.acquire(5n, 5)).toBe(0);
  });
});

describe("index and router on one table", () => {
  for (const backend of BACKEND_NAMES) {
    test(`${backend}: match results are router slots; removal frees the slot once both let go`, () => {
      const workers = new WorkerTable();
      const index = createIndex(backend, 4, { workers });
      const load = new LoadTracker({ blockSize: 4, workers });
      const configured = load.table.acquire(1n, 0);
      // A worker first seen in events gets its slot from the index's store.
      expect(index.applyStored(2n, 0, false, 0, 0, pair(0, 10), pair(0, 20), 1)).toBe(0);
      const seen = workers.find(2n, 0);
      expect(seen).not.toBe(configured);
      expect(load.liveCount).toBe(2);
      load.syncSlots();
      expect(load.slotCapacity).toBeGreaterThan(seen);
      const matches = new MatchResult();
      index.findMatches(pair(0, 20), 1, matches);
      expect(matches.count).toBe(1);
      expect(matches.workers[0]).toBe(seen);
      // The index lets go without freeing a shared slot; the router frees it.
      index.removeWorker(2n);
      expect(workers.isLive(seen)).toBe(true);
      expect(index.stats().workers).toBe(0);
      expect(removeWorker(load, 2n, 0)).toBe(true);
      expect(workers.isLive(seen)).toBe(false);
      expect(workers.liveCount).toBe(1);
      // The freed slot goes to the next new worker with nothing inherited.
      expect(index.applyStored(3n, 0, false, 0, 0, pair(0, 11), pair(0, 21), 1)).toBe(0);
      expect(workers.find(3n, 0)).toBe(seen);
      index.findMatches(pair(0, 20), 1, matches);
      expect(matches.count).toBe(0);
      expect(index.stats().blocks).toBe(1);
    });
  }
});
