// Goal: with the writer thread there is one worker numbering. While workers are added
// and removed at run time, every slot of the writer's shared index is the main thread's
// slot for the same worker, for a configured rank and for ranks first seen in an
// engine's batches (asked of the main thread): a lookup read in shared memory, the
// core's own (ThreadedIndex) and a lane's (slots with their stamps, routed later) name
// the same slots with no translation. A removed worker is left out of lookups at once;
// its slots go to other workers only after the writer let go of them. After the churn,
// every per-slot state on both threads is gone: exact counts. Real Worker, real sockets.
import { afterEach, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore } from "../../src/core/core";
import { MatchResult } from "../../src/index";
import { attach } from "../../src/index/crtc/shared";
import type { ThreadedIndex } from "../../src/index/threaded-index";
import { WriterThread } from "../../src/runtime/writer-thread";
import { silentLogger } from "../../src/util/log";
import { stored, TestEngine } from "../support/engine";
import { until } from "../support/wait";
import { routeInput } from "../support/route-input";

const BS = 4;
const RANKS = [0, 1, 2];
const CYCLES = 8;

const stops: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const stop of stops.splice(0).reverse()) await stop();
});

/** The tokens (worker, rank) holds: 3 blocks of its own. */
const tokensOf = (workerId: bigint, rank: number) =>
  Uint32Array.from({ length: 3 * BS }, (_, i) => 10_000 * Number(workerId) + 100 * rank + i + 1);

/** The engine's hashes of a rank's three blocks. */
const hashesOf = (rank: number) => [1, 2, 3].map((block) => BigInt(10 * rank + block));

async function setUp() {
  const writer = await WriterThread.start({
    ringBytes: 1 << 20,
    cpus: null,
    blockSize: BS,
    backend: "crtc",
    budgetBytes: 1 << 28,
    sequencer: {},
    logLevel: "error",
    sharedReaders: 2,
  });
  stops.push(() => writer.stop());
  const { config } = loadConfig({ env: { KVEDGE_BLOCK_SIZE: String(BS) } });
  const core = new KvedgeCore({ config, log: silentLogger, writer });
  stops.push(() => core.stop());
  const reader = attach(writer.descriptor!, { identities: true });
  stops.push(() => reader.close());
  return { writer, core, reader };
}

test("workers added and removed at run time keep one slot numbering on both threads", async () => {
  const { writer, core, reader } = await setUp();
  const table = core.workerTable;
  const engines = new Map<bigint, TestEngine>();
  let active = 0;

  const add = async (workerId: bigint) => {
    const engine = await new TestEngine().start();
    engines.set(workerId, engine);
    const endpoint = engine.endpoint;
    const http = `http://127.0.0.1:${9000 + Number(workerId)}`;
    const entry = { worker_id: workerId, dp_rank: 0, replay_endpoint: null, topic: "" };
    await core.addWorker({ ...entry, endpoint, http_endpoint: http });
    await engine.waitForSubscriber();
    // The configured rank, then two the writer first sees in batches.
    let last = 0n;
    for (const rank of RANKS)
      last = engine.publish(
        [stored(hashesOf(rank), [...tokensOf(workerId, rank)], BS)],
        false,
        rank,
      );
    const source = core.engineSources.find((s) => s.config.workerId === workerId)!;
    await until(() => source.sequencer.lastSeq === Number(last), `worker ${workerId} applied`);
  };

  /** Each rank's blocks, looked up three ways, name (worker, rank)'s slot here. */
  let routes = 0;
  const sameSlots = (workerId: bigint, keep: boolean) => {
    for (const rank of RANKS) {
      const tokens = tokensOf(workerId, rank);
      const prompt = core.hash(tokens, null, null);
      const found = new MatchResult();
      reader.findMatches(prompt.local, prompt.blockCount, found, prompt.chain);
      expect(found.count).toBe(1);
      const slot = found.workers[0]!;
      expect(table.find(workerId, rank)).toBe(slot);
      expect([reader.workerIdOf(slot), reader.dpRankOf(slot)]).toEqual([workerId, rank]);
      expect(reader.stampOf(slot)).toBe(table.stampOf(slot));
      const scores = core.match(prompt.local, prompt.blockCount);
      expect(scores.map((s) => [s.workerId, s.dpRank, s.blocks])).toEqual([[workerId, rank, 3]]);
      // A lane's lookup: slots and stamps, checked when the main thread decides.
      const matched = {
        slots: found.workers.slice(0, 1),
        stamps: Uint32Array.of(reader.stampOf(slot)),
        blocks: found.blocks.slice(0, 1),
      };
      const id = `r-${routes++}`;
      const { decision } = core.route({ ...routeInput(tokens, id), matched }, 64);
      const candidates = decision.candidates;
      const own = [...Array(candidates.count).keys()].find((i) => candidates.slots[i] === slot)!;
      expect(candidates.overlapBlocks[own]).toBe(3);
      core.recordAnswer(id, decision.workerId, decision.dpRank, tokens.length, 0, 0);
      // One request of each worker stays active: its worker's removal drops it.
      if (keep && rank === 0) active++;
      else core.done(id);
    }
  };

  const remove = async (workerId: bigint) => {
    const prompt = core.hash(tokensOf(workerId, 0), null, null);
    expect(await core.removeWorker(workerId)).toBe(true);
    active--;
    // Out of lookups at once, and no slot of its is given out before the writer let go.
    expect(core.match(prompt.local, prompt.blockCount)).toEqual([]);
    expect(table.retiredCount).toBe(RANKS.length);
    await until(() => table.retiredCount === 0, `worker ${workerId}'s slots freed`);
    await engines.get(workerId)!.stop();
    engines.delete(workerId);
  };

  for (let cycle = 1; cycle <= CYCLES; cycle++) {
    const workerId = BigInt(cycle);
    await add(workerId);
    for (const live of engines.keys()) sameSlots(live, live === workerId);
    if (cycle > 2) await remove(BigInt(cycle - 2));
  }
  // At most three workers of three ranks at once: freed slots were reused.
  expect(table.highWater).toBeLessThanOrEqual(9);
  expect(core.activeRequestCount).toBe(active);
  for (const workerId of [...engines.keys()]) await remove(workerId);

  // Nothing of any worker is left, on either thread.
  expect(table.liveCount).toBe(0);
  expect(table.highWater).toBe(0);
  expect(table.columnEntries).toBe(0);
  expect(core.observedHits.size).toBe(0);
  expect(core.activeRequestCount).toBe(0);
  expect(core.router.load.counters.droppedWithWorker).toBe(CYCLES);
  const index = core.index as ThreadedIndex;
  await until(() => index.writerSlots === 0 && index.stats().workers === 0, "the writer emptied");
  expect(index.stats().blocks).toBe(0);
  expect(await writer.dump()).toEqual([]);
}, 60_000);
