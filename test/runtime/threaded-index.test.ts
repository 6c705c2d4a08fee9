// Goal: lookups through ThreadedIndex (the writer's shared crtc, read on the main thread)
// name the main table's slots as they are: the writer's table follows the main one
// (adopts its slots and generations), so nothing is translated. A slot retired on the
// main thread (its worker removed, the writer not yet told) is left out, and so is one
// whose stamp no longer matches (given to another worker since): never reported under
// a recycled slot.
import { describe, expect, test } from "bun:test";
import { SLOT_LIMIT, WorkerTable } from "../../src/domain/worker-table";
import { MatchResult } from "../../src/index";
import { attach, createSharedIndex } from "../../src/index/crtc/shared";
import { blockSeed } from "../../src/hash";
import { promptHashes } from "../../src/route/input";
import { ThreadedIndex } from "../../src/index/threaded-index";

const BS = 4;

describe("ThreadedIndex", () => {
  test("answers in the main table's slots; retired or recycled slots are left out", () => {
    const table = new WorkerTable();
    const follower = new WorkerTable(SLOT_LIMIT, "follower");
    const shared = createSharedIndex(BS, {
      workers: follower,
      budgetBytes: 1 << 24,
      maxReaders: 2,
    });
    const tokens = Uint32Array.from({ length: 3 * BS }, (_, i) => i + 1);
    const prompt = promptHashes(tokens, BS, blockSeed());
    /** The main thread assigns the slot; the writer adopts it and stores there. */
    const store = (workerId: bigint, blocks: number): number => {
      const slot = table.acquire(workerId, 0);
      follower.adopt(slot, workerId, 0, table.generation[slot]!);
      const external = prompt.local.slice(0, 2 * blocks);
      shared.index.storeAt(slot, false, 0, 0, external, prompt.local, blocks);
      return slot;
    };
    const slot3 = store(3n, 1);
    const slot1 = store(1n, 3);
    const slot2 = store(2n, 2);
    const reader = attach(shared.descriptor, { identities: true });
    const index = new ThreadedIndex(BS, table, reader);
    const answer = () => {
      const out = new MatchResult(2);
      index.findMatches(prompt.local, prompt.blockCount, out);
      const scores: string[] = [];
      for (let i = 0; i < out.count; i++) {
        const slot = out.workers[i]!;
        // The same slot names the same worker on both sides.
        expect(reader.workerIdOf(slot)).toBe(table.workerIdOf(slot));
        scores.push(`${table.workerIdOf(slot)}@${slot}=${out.blocks[i]}`);
      }
      return scores.sort();
    };
    expect(answer()).toEqual([`1@${slot1}=3`, `2@${slot2}=2`, `3@${slot3}=1`]);

    // Worker 1 removed here: retired at once, still in the writer's index until told.
    table.retire(slot1);
    expect(answer()).toEqual([`2@${slot2}=2`, `3@${slot3}=1`]);
    // The writer lets go; the slot is freed and goes to worker 4, which holds nothing yet.
    shared.index.dropSlot(slot1);
    follower.release(slot1);
    table.free(slot1);
    const slot4 = table.acquire(4n, 0);
    expect(slot4).toBe(slot1);
    expect(answer()).toEqual([`2@${slot2}=2`, `3@${slot3}=1`]);

    // A slot given to another worker while the shared index still has the old one's
    // blocks there (what the release protocol rules out): its stamp tells, left out.
    const stale = reader.stampOf(slot3);
    table.release(slot3);
    const slot5 = table.acquire(5n, 0);
    expect(slot5).toBe(slot3);
    expect(table.isCurrent(slot5, stale)).toBe(false);
    expect(answer()).toEqual([`2@${slot2}=2`]);
    reader.close();
  });
});
