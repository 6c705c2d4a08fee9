// Goal: the observed-hit check flags a worker only when its engine persistently serves
// less from its cache than predicted (after a full window), clears it with hysteresis,
// ignores answers without usage and surplus hits, counts a usage without cached tokens
// as a miss once the engine has reported some, refuses counts that cannot be true, warns when the engine serves far more
// than predicted (the signature of a tokenizer mismatch), and forgets a worker's record
// with its slot.
import { describe, expect, test } from "bun:test";
import { ObservedHits } from "../../src/core/observed-hits";
import { WorkerTable } from "../../src/domain/worker-table";
import { type LogRecord, memoryLogger } from "../../src/util/log";

/** Records kept per slot of `table`: `slot(id, rank)` names a worker's. */
function rig(floor = 0.5, window = 8) {
  const records: LogRecord[] = [];
  const changes: [bigint, number, boolean][] = [];
  const table = new WorkerTable();
  const hits = new ObservedHits({
    floor,
    window,
    log: memoryLogger(records),
    table,
    onChange: (slot, suspect) =>
      changes.push([table.workerIdOf(slot), table.dpRankOf(slot), suspect]),
  });
  const slot = (workerId: bigint, dpRank: number) => table.acquire(workerId, dpRank);
  return { hits, records, changes, table, slot };
}

describe("observed hits", () => {
  test("a worker serving a fraction of the predicted hits is flagged after a window, with the reason logged", () => {
    const { hits, records, changes, slot } = rig();
    for (let i = 0; i < 7; i++) hits.record(slot(1n, 0), 1000, 160, 16);
    expect(hits.isSuspect(slot(1n, 0))).toBe(false); // not a full window yet
    hits.record(slot(1n, 0), 1000, 160, 16);
    expect(hits.isSuspect(slot(1n, 0))).toBe(true);
    expect(changes).toEqual([[1n, 0, true]]);
    expect(records.at(-1)!.message).toContain("fall persistently below the predicted ones");
    expect(records.at(-1)!.fields.observed_ratio).toBe(0.1);
    expect(hits.view(slot(1n, 0))).toMatchObject({
      answers: 8,
      predictedTokens: 1280,
      observedTokens: 128,
      suspect: true,
    });
    // Recovery needs the ratio back above (floor + 1) / 2, not just above the floor.
    let steps = 0;
    while (hits.isSuspect(slot(1n, 0))) {
      hits.record(slot(1n, 0), 1000, 160, 160);
      steps++;
    }
    const ratio = hits.view(slot(1n, 0)).recentRatio!;
    expect(ratio).toBeGreaterThanOrEqual(0.75);
    expect(steps).toBeGreaterThan(1);
    expect(changes).toEqual([
      [1n, 0, true],
      [1n, 0, false],
    ]);
  });

  test("good workers, surplus hits and answers without usage are never flagged", () => {
    const { hits, changes, records, slot } = rig();
    for (let i = 0; i < 100; i++) {
      hits.record(slot(1n, 0), 1000, 160, 150); // evictions between routing and admission: a little less
      hits.record(slot(2n, 0), 1000, 32, 320); // a concurrent request cached more: capped, never hides misses
      hits.record(slot(3n, 0), 1000, 160, "absent"); // the engine does not report cached tokens
      hits.record(slot(4n, 0), 1000, 0, 0); // nothing predicted: nothing to judge
    }
    expect(changes).toEqual([]);
    expect(hits.view(slot(3n, 0))).toMatchObject({
      answers: 100,
      answersWithoutUsage: 100,
      predictedTokens: 0,
      recentRatio: null,
    });
    expect(records.filter((r) => r.message.includes("no usage.prompt_tokens_details")).length).toBe(
      1,
    );
    expect(hits.view(slot(1n, 0)).recentRatio!).toBeCloseTo(150 / 160, 6);
  });

  test("an engine that leaves cached_tokens out at 0: once it has reported some, its misses count and flag it", () => {
    const { hits, changes, slot } = rig(0.5, 4);
    hits.record(slot(1n, 0), 1000, 160, "absent"); // before any report: unknown
    expect(hits.view(slot(1n, 0)).answersWithoutUsage).toBe(1);
    hits.record(slot(1n, 0), 1000, 160, 160);
    for (let i = 0; i < 6; i++) hits.record(slot(1n, 0), 1000, 160, "absent");
    expect(hits.view(slot(1n, 0))).toMatchObject({
      answers: 8,
      answersWithoutUsage: 1,
      observedTokens: 160,
    });
    expect(changes).toEqual([[1n, 0, true]]);
    hits.record(slot(2n, 0), 1000, 160, "no_usage"); // no usage at all: never a miss
    expect(hits.view(slot(2n, 0)).answersWithoutUsage).toBe(1);
  });

  test("a count that cannot be true is a bad answer: counted once each, logged once, never summed", () => {
    const { hits, records, slot } = rig();
    for (let i = 0; i < 3; i++) hits.record(slot(1n, 0), 1000, 160, "bad");
    hits.record(slot(1n, 0), 1000, 160, 100);
    expect(hits.view(slot(1n, 0))).toMatchObject({
      answers: 4,
      badAnswers: 3,
      observedTokens: 100,
      predictedTokens: 160,
    });
    expect(
      records.filter((r) => r.message.includes("not an integer in [0, prompt tokens]")),
    ).toHaveLength(1);
  });

  test("a mixed worker: the ratio weights tokens, so big misses count more than small hits", () => {
    const { hits, slot } = rig(0.5, 4);
    for (let i = 0; i < 10; i++) {
      hits.record(slot(1n, 0), 1000, 16, 16);
      hits.record(slot(1n, 0), 1000, 1600, 0);
    }
    expect(hits.isSuspect(slot(1n, 0))).toBe(true);
  });

  test("floor 0 disables flagging", () => {
    const { hits, changes, slot } = rig(0, 2);
    for (let i = 0; i < 20; i++) hits.record(slot(1n, 0), 1000, 160, 0);
    expect(changes).toEqual([]);
  });

  test("hits far above the prediction warn of a tokenizer mismatch, without flagging", () => {
    const { hits, records, changes, slot } = rig(0.5, 4);
    for (let i = 0; i < 6; i++) hits.record(slot(1n, 0), 1000, 0, 480);
    expect(hits.view(slot(1n, 0)).underPredicted).toBe(true);
    expect(changes).toEqual([]);
    expect(
      records.filter((r) => r.message.includes("router's tokens are likely not the engine's")),
    ).toHaveLength(1);
  });

  test("a removed worker's record goes with its slot; the slot's next worker starts afresh", () => {
    const { hits, slot, table } = rig();
    hits.record(slot(1n, 0), 1000, 16, 16);
    hits.record(slot(1n, 1), 1000, 16, 16);
    hits.record(slot(2n, 0), 1000, 16, 16);
    for (const gone of table.slotsOf(1n)) table.release(gone);
    expect(hits.size).toBe(1);
    const next = slot(3n, 0);
    expect(table.slotsOf(3n)).toEqual([next]);
    expect(hits.view(next).answers).toBe(0);
    expect(hits.view(slot(2n, 0)).answers).toBe(1);
  });
});
