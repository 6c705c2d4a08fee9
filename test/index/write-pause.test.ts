// Goal: a copy taken in slices while writes keep arriving is the index at the copy's
// start (the writes are held, in order, and applied after the last slice), for every
// backend; the live index ends equal to one that took every write at once; past the
// byte bound, or on settle(), the copy completes at once and nothing is lost.
import { describe, expect, test } from "bun:test";
import { WorkerTable } from "../../src/domain/worker-table";
import { createIndex } from "../../src/index";
import { freezeNow, packIndex } from "../../src/index/pack";
import { BACKEND_NAMES, type KvIndex, MatchResult } from "../../src/index/types";
import { PackJob, WritePause } from "../../src/index/write-pause";
import { applyHarnessOp, generateStream, type HarnessOp, pairs } from "../harness/streams";

/** A harness op through the pause, slots resolved as ingest does (remove_worker settles). */
function applyPaused(index: KvIndex, pause: WritePause, op: HarnessOp): void {
  const table = index.workerTable;
  switch (op.kind) {
    case "stored": {
      const parent = op.parent ?? 0n;
      let slot = table.find(op.worker, op.rank);
      const root = op.parent === null && op.local.length > 0;
      if (slot < 0 && root) slot = table.acquire(op.worker, op.rank);
      pause.storeAt(
        slot,
        op.parent !== null,
        Number(parent >> 32n),
        Number(parent & 0xffff_ffffn),
        pairs(op.external),
        pairs(op.local),
        op.local.length,
        0,
      );
      return;
    }
    case "removed":
      return pause.removeAt(
        table.find(op.worker, op.rank),
        pairs(op.external),
        op.external.length,
        0,
      );
    case "cleared":
      return pause.clearAt(table.find(op.worker, op.rank));
    case "remove_worker":
      pause.settle();
      index.removeWorker(op.worker);
      for (const slot of table.slotsOf(op.worker)) table.release(slot);
  }
}

function view(index: KvIndex, queries: readonly bigint[][]): string[] {
  const out = new MatchResult();
  const rows = index
    .workers()
    .map((w) => `${w.workerId}/${w.dpRank}=${w.blocks}`)
    .sort();
  for (const query of queries) {
    index.findMatches(pairs(query), query.length, out);
    const scores: string[] = [];
    for (let i = 0; i < out.count; i++) {
      scores.push(`${index.workerIdOf(out.workers[i]!)}:${out.blocks[i]}`);
    }
    rows.push(scores.sort().join(","));
  }
  return rows;
}

const fakeClock = () => {
  let now = 0;
  return () => now++;
};

describe("write pause", () => {
  for (const backend of BACKEND_NAMES) {
    test.each([31, 32, 33])(`${backend}: stream %p: a sliced copy packs its start`, (seed) => {
      const stream = generateStream(seed, { steps: 400 });
      const index = createIndex(backend, 1, { workers: new WorkerTable() });
      const direct = createIndex("reference", 1);
      const pause = new WritePause(index, 1 << 30);
      const half = Math.floor(stream.ops.length / 2);
      for (const op of stream.ops.slice(0, half)) {
        applyPaused(index, pause, op);
        applyHarnessOp(direct, op);
      }
      const expected = packIndex(freezeNow(index.freeze())).words;
      const job = new PackJob(index, pause, { freezeWords: 5, packBlocks: 3 });
      const clock = fakeClock();
      let held = 0;
      for (const op of stream.ops.slice(half)) {
        if (op.kind === "remove_worker") continue; // settles: covered below
        applyPaused(index, pause, op);
        applyHarnessOp(direct, op);
        if (pause.paused) held++;
        job.step(1, clock);
      }
      while (!job.step(1, clock));
      expect(job.result().words).toEqual(expected);
      expect(pause.paused).toBe(false);
      if (backend === "crtc") expect(held).toBeGreaterThan(10); // the copy really spanned writes
      expect(pause.counters.settled).toBe(0);
      expect(view(index, stream.queries)).toEqual(view(direct, stream.queries));
      index.verify();
    });
  }

  test("past the byte bound the copy completes at once; the pack is still the start's", () => {
    const stream = generateStream(41, { steps: 400 });
    const index = createIndex("crtc", 1, { workers: new WorkerTable() });
    const direct = createIndex("reference", 1);
    const pause = new WritePause(index, 256);
    const ops = stream.ops.filter((op) => op.kind !== "remove_worker");
    for (const op of ops.slice(0, 200)) {
      applyPaused(index, pause, op);
      applyHarnessOp(direct, op);
    }
    const expected = packIndex(freezeNow(index.freeze())).words;
    const job = new PackJob(index, pause, { freezeWords: 1, packBlocks: 3 });
    job.step(0, fakeClock());
    expect(pause.paused).toBe(true);
    for (const op of ops.slice(200)) {
      applyPaused(index, pause, op);
      applyHarnessOp(direct, op);
    }
    expect(pause.counters.settled).toBeGreaterThan(0);
    expect(pause.paused).toBe(false);
    while (!job.step(1, fakeClock()));
    expect(job.result().words).toEqual(expected);
    expect(view(index, stream.queries)).toEqual(view(direct, stream.queries));
  });

  test("settle() (a worker removed) finishes the copy; a cancelled copy resumes writes", () => {
    const index = createIndex("crtc", 1, { workers: new WorkerTable() });
    const pause = new WritePause(index, 1 << 30);
    const op = (worker: bigint, hash: bigint): HarnessOp => ({
      kind: "stored",
      worker,
      rank: 0,
      parent: null,
      external: [hash],
      local: [hash],
    });
    applyPaused(index, pause, op(1n, 10n));
    const expected = packIndex(freezeNow(index.freeze())).words;
    const job = new PackJob(index, pause, { freezeWords: 1, packBlocks: 1 });
    applyPaused(index, pause, op(2n, 20n));
    expect(index.workers()).toHaveLength(1); // held
    applyPaused(index, pause, { kind: "remove_worker", worker: 1n });
    expect(index.workers().map((w) => w.workerId)).toEqual([2n]);
    while (!job.step(1, fakeClock()));
    expect(job.result().words).toEqual(expected);

    const cancelled = new PackJob(index, pause, { freezeWords: 1, packBlocks: 1 });
    applyPaused(index, pause, op(3n, 30n));
    expect(index.workers()).toHaveLength(1);
    cancelled.cancel();
    expect(index.workers()).toHaveLength(2);
  });
});
