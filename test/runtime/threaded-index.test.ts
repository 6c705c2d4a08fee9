// Goal: lookups through ThreadedIndex (the writer's shared crtc read from another
// table's numbering) name this table's slots for the same workers, whatever order
// each side numbered them in; a worker this side does not know, or removed and whose
// slot went to another worker, is left out, never reported under the recycled slot.
import { describe, expect, test } from "bun:test";
import { WorkerTable } from "../../src/domain/worker-table";
import { MatchResult } from "../../src/index";
import { attach, createSharedIndex } from "../../src/index/crtc/shared";
import { blockSeed } from "../../src/hash";
import { promptHashes } from "../../src/route/input";
import { ThreadedIndex } from "../../src/index/threaded-index";

const BS = 4;

describe("ThreadedIndex", () => {
  test("handles map to this table's slots by identity, through recycling", () => {
    const writerTable = new WorkerTable();
    const options = { workers: writerTable, budgetBytes: 1 << 24, maxReaders: 2 };
    const shared = createSharedIndex(BS, options);
    const tokens = Uint32Array.from({ length: 3 * BS }, (_, i) => i + 1);
    const prompt = promptHashes(tokens, BS, blockSeed());
    const store = (workerId: bigint, blocks: number) =>
      shared.index.applyStored(
        workerId,
        0,
        false,
        0,
        0,
        prompt.local.slice(0, 2 * blocks),
        prompt.local,
        blocks,
      );
    store(1n, 3);
    store(2n, 2);
    store(3n, 1);
    // This side numbers them otherwise: 3, then 1; it does not know 2.
    const table = new WorkerTable();
    const slot3 = table.acquire(3n, 0);
    const slot1 = table.acquire(1n, 0);
    const index = new ThreadedIndex(BS, table, attach(shared.descriptor));
    const answer = () => {
      const out = new MatchResult(2);
      index.findMatches(prompt.local, prompt.blockCount, out);
      const scores: [string, number][] = [];
      for (let i = 0; i < out.count; i++) {
        scores.push([`${table.workerIdOf(out.workers[i]!)}@${out.workers[i]}`, out.blocks[i]!]);
      }
      return scores.sort();
    };
    expect(answer()).toEqual([
      [`1@${slot1}`, 3],
      [`3@${slot3}`, 1],
    ]);
    expect(answer()).toEqual([
      [`1@${slot1}`, 3],
      [`3@${slot3}`, 1],
    ]); // the cached mapping
    // Worker 1 leaves this side; its slot goes to worker 2, still in the writer's index.
    table.release(slot1);
    const slot2 = table.acquire(2n, 0);
    expect(slot2).toBe(slot1);
    expect(answer()).toEqual([
      [`2@${slot2}`, 2],
      [`3@${slot3}`, 1],
    ]);
    // The writer drops worker 3: gone from the answers.
    shared.index.removeWorker(3n);
    expect(answer()).toEqual([[`2@${slot2}`, 2]]);
  });
});
