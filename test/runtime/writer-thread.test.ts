// Goal: engine streams sequenced and applied on the writer thread (fed through the
// event ring from real ZMTP sockets on this thread) leave exactly the index that the
// same streams leave when applied here, with the same sequencing counters mirrored
// back: in-order batches, a lost batch replayed, a lost batch without replay (degraded,
// then exact again after a clear), an engine restart. A ring too small for a burst
// drops batches, counts them, and the stream recovers through its connect probe to the
// same index. Real Worker, real sockets on loopback.
import { afterEach, describe, expect, test } from "bun:test";
import { createIndex, type KvIndex, MatchResult } from "../../src/index";
import { attach } from "../../src/index/crtc/shared";
import { promptHashes } from "../../src/route/input";
import { blockSeed } from "../../src/hash";
import { WorkerTable } from "../../src/domain/worker-table";
import { EngineSource, type SourceConfig } from "../../src/ingest/source";
import { WriterThread } from "../../src/runtime/writer-thread";
import { createLogger } from "../../src/util/log";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { until } from "../support/wait";

const BS = 4;
const log = createLogger({ level: "error" });
const tokens = (first: number, blocks: number) =>
  Array.from({ length: blocks * BS }, (_, i) => first + i);

interface Pair {
  readonly reference: EngineSource;
  readonly threaded: EngineSource;
}

const started: { stop(): Promise<void> }[] = [];
afterEach(async () => {
  for (const item of started.splice(0).reverse()) await item.stop();
});

async function setUp(ringBytes = 1 << 20, sharedReaders = 0) {
  const writer = await WriterThread.start({
    ringBytes,
    cpus: null,
    blockSize: BS,
    backend: "crtc",
    budgetBytes: 1 << 30,
    sequencer: { replayTimeoutMs: 2_000 },
    logLevel: "error",
    sharedReaders,
  });
  started.push(writer);
  const table = new WorkerTable();
  const index: KvIndex = createIndex("crtc", BS, { workers: table });
  const sinkOf = {
    workerTable: table,
    storeAt: index.storeAt.bind(index),
    removeAt: index.removeAt.bind(index),
    clearAt: index.clearAt.bind(index),
    storeTierAt: index.storeTierAt.bind(index),
    removeTierAt: index.removeTierAt.bind(index),
  };
  const pairs: Pair[] = [];
  const add = async (config: SourceConfig): Promise<Pair> => {
    const zmtp = { maxMessageBytes: 4096 };
    const reference = new EngineSource(config, { blockSize: BS, sink: sinkOf, log, zmtp });
    const threaded = new EngineSource(config, {
      blockSize: BS,
      sink: sinkOf,
      log,
      zmtp,
      input: writer.input(config),
    });
    started.push(reference, threaded);
    await Promise.all([reference.start(), threaded.start()]);
    const pair = { reference, threaded };
    pairs.push(pair);
    return pair;
  };
  /** Both sides applied through `seq` (the threaded one as its mirror says). */
  const applied = async (pair: Pair, seq: number) => {
    const at = () => [pair.reference.sequencer.lastSeq, pair.threaded.sequencer.lastSeq];
    const both = () => at()[0] === seq && at()[1] === seq;
    await until(both, `both sides at seq ${seq}`).catch((error) => {
      throw new Error(`${(error as Error).message}; (reference, threaded) at ${at()}`);
    });
  };
  const same = async () => {
    expect(await writer.dump()).toEqual(index.dump());
    for (const { reference, threaded } of pairs) {
      expect({ ...threaded.sequencer.counters }).toEqual({ ...reference.sequencer.counters });
      expect(threaded.sequencer.isDegraded).toBe(reference.sequencer.isDegraded);
      expect(threaded.ranks).toEqual(reference.ranks);
      expect(threaded.normalizer.counters.events).toEqual(reference.normalizer.counters.events);
    }
  };
  return { writer, index, table, add, applied, same };
}

const config = (engine: TestEngine, workerId: bigint): SourceConfig => ({
  workerId,
  dpRank: 0,
  endpoint: engine.endpoint,
  replayEndpoint: engine.replayEndpoint,
  topic: "",
});

describe("the writer thread", () => {
  test("in order, gaps replayed and lost, a clear, a restart: as on one thread", async () => {
    const a = await new TestEngine({ replay: true }).start();
    const b = await new TestEngine().start();
    started.push(a, b);
    const { add, applied, same } = await setUp();
    const pa = await add(config(a, 1n));
    const pb = await add(config(b, 2n));
    await until(() => a.pub.subscribedPeers === 2 && b.pub.subscribedPeers === 2, "subscriptions");
    // Both sides ran a's connect probe (an empty ring) before anything is published.
    await a.waitForReplayRequests(2);
    const exact = () => !pa.reference.sequencer.isDegraded && !pa.threaded.sequencer.isDegraded;
    await until(exact, "a exact");

    a.publish([stored([1n, 2n, 3n], tokens(1, 3), BS)]);
    a.publish([stored([4n], tokens(13, 1), BS, 3n)]);
    b.publish([stored([10n, 11n], tokens(1, 2), BS)]);
    a.publish([removed([2n])], true); // lost on the wire: replayed
    a.publish([stored([5n], tokens(100, 1), BS)]);
    await applied(pa, 3);
    b.publish([stored([12n], tokens(9, 1), BS, 11n)], true); // lost, no replay: degraded
    b.publish([stored([13n], tokens(50, 1), BS)]);
    await applied(pb, 2);
    await same();
    expect(pb.threaded.sequencer.isDegraded).toBe(true);
    // The reason crosses from the writer thread as it is on one thread.
    expect(pb.threaded.sequencer.degradedReason).toBe(pb.reference.sequencer.degradedReason);
    expect(pb.threaded.sequencer.degradedReason).toStartWith("1 batch lost:");

    b.publish([cleared, stored([14n], tokens(1, 1), BS)]);
    await applied(pb, 3);
    await same();
    expect(pb.threaded.sequencer.isDegraded).toBe(false);
    expect(pb.threaded.sequencer.degradedReason).toBeNull();

    // A batch over the 4 KiB message limit: skipped on the wire, replayed, skipped again:
    // one batch lost to the size limit, on both sides alike.
    const big = Array.from({ length: 400 }, (_, i) => BigInt(50_000 + i));
    a.publish([stored(big, tokens(20_000, 400), BS)]);
    const after = Number(a.publish([stored([60_000n], tokens(30_000, 1), BS)]));
    await applied(pa, after);
    await same();
    expect(pa.threaded.sequencer.counters.oversize).toBeGreaterThan(0);

    // Both sides' connect probes reach the restarted engine before it publishes.
    const asked = a.replayRequests;
    await a.restart();
    await a.waitForReplayRequests(asked + 2);
    a.publish([stored([7n, 8n], tokens(1, 2), BS)]);
    await applied(pa, 0);
    await same();
    expect(pa.threaded.sequencer.counters.restarts).toBe(1);
  }, 30_000);

  test("a burst larger than the ring: drops counted, the same index recovered", async () => {
    const a = await new TestEngine({ replay: true }).start();
    started.push(a);
    const { writer, index, add, applied } = await setUp(4096);
    const pa = await add(config(a, 1n));
    await until(() => a.pub.subscribedPeers === 2, "subscriptions");
    await a.waitForReplayRequests(2);
    await until(() => !pa.threaded.sequencer.isDegraded, "exact");
    // 200 batches of ~100 bytes in one turn: far more than 4 KiB of ring.
    for (let i = 0; i < 200; i++) {
      a.publish([stored([BigInt(1000 + i)], tokens(1000 + 4 * i, 1), BS)]);
    }
    const stream = pa.threaded.stream as unknown as { ringLosses: number };
    await until(() => stream.ringLosses > 0, "the loss announced to the writer");
    expect(writer.producer.counters.droppedFull).toBeGreaterThan(0);
    // The loss made the stream unknown; its probe's replay may overflow the ring in turn
    // (then it stays degraded, counted). A clear makes it exact again: publish one,
    // gently, until the writer is exact at the engine's last batch.
    const deadline = performance.now() + 15_000;
    let cleanSeq = -1;
    while (performance.now() < deadline) {
      cleanSeq = Number(a.publish([cleared, stored([5000n], tokens(5000, 1), BS)]));
      await Bun.sleep(50);
      const threaded = pa.threaded.sequencer;
      if (threaded.lastSeq === cleanSeq && !threaded.isDegraded) break;
    }
    await applied(pa, cleanSeq);
    expect(pa.threaded.sequencer.isDegraded).toBe(false);
    expect(await writer.dump()).toEqual(index.dump());
    const probes = pa.reference.sequencer.counters.probes;
    expect(pa.threaded.sequencer.counters.probes).toBeGreaterThan(probes);
  }, 30_000);

  test("the writer's shared index: lookups here while it streams, then equal to one thread's", async () => {
    const a = await new TestEngine().start();
    const b = await new TestEngine().start();
    started.push(a, b);
    const { writer, index, table, add, applied } = await setUp(1 << 20, 2);
    const pa = await add(config(a, 1n));
    const pb = await add(config(b, 2n));
    await until(() => a.pub.subscribedPeers === 2 && b.pub.subscribedPeers === 2, "subscriptions");
    const reader = attach(writer.descriptor!, { identities: true });
    const prompts = [1, 41, 81].map((first) =>
      promptHashes(new Uint32Array(tokens(first, 10)), BS, blockSeed()),
    );
    const answer = (
      find: (local: Uint32Array, count: number, out: MatchResult) => void,
      idOf: (slot: number) => string,
      local: Uint32Array,
      count: number,
    ) => {
      const out = new MatchResult();
      find(local, count, out);
      const scores: string[] = [];
      for (let i = 0; i < out.count; i++) scores.push(`${idOf(out.workers[i]!)}:${out.blocks[i]}`);
      return scores.sort();
    };
    let lookups = 0;
    let lastA = 0n;
    let lastB = 0n;
    for (let round = 0; round < 40; round++) {
      const first = 1 + 40 * (round % 3);
      const hashes = Array.from({ length: 10 }, (_, i) => BigInt(10_000 * round + i + 1));
      lastA = a.publish([stored(hashes, tokens(first, 10), BS)]);
      if (round % 4 === 3) lastA = a.publish([removed(hashes.slice(3, 5))]);
      lastB = b.publish([stored(hashes.slice(0, 4), tokens(first, 4), BS)]);
      if (round % 7 === 6) lastB = b.publish([cleared]);
      // Lookups on this thread while the writer applies.
      for (const prompt of prompts) {
        answer(
          (l, c, o) => reader.findMatches(l, c, o),
          (slot) => `${reader.workerIdOf(slot)}`,
          prompt.local,
          prompt.blockCount,
        );
        lookups++;
      }
      await Bun.sleep(0);
    }
    await applied(pa, Number(lastA));
    await applied(pb, Number(lastB));
    for (const prompt of prompts) {
      const shared = answer(
        (l, c, o) => reader.findMatches(l, c, o),
        (slot) => `${reader.workerIdOf(slot)}/${reader.dpRankOf(slot)}`,
        prompt.local,
        prompt.blockCount,
      );
      const local = answer(
        (l, c, o) => index.findMatches(l, c, o),
        (slot) => `${table.workerIdOf(slot)}/${table.dpRankOf(slot)}`,
        prompt.local,
        prompt.blockCount,
      );
      expect(shared).toEqual(local);
    }
    expect(await writer.dump()).toEqual(index.dump());
    expect(reader.stats.lookups).toBe(lookups + prompts.length);
    reader.close();
  }, 30_000);

  test("sources added and removed 30 times: stream ids reused, the index empty after", async () => {
    const a = await new TestEngine().start();
    started.push(a);
    const { writer } = await setUp();
    for (let cycle = 0; cycle < 30; cycle++) {
      const source = new EngineSource(config(a, BigInt(cycle + 1)), {
        blockSize: BS,
        log,
        input: writer.input(config(a, BigInt(cycle + 1))),
        sink: {
          workerTable: new WorkerTable(),
          storeAt() {},
          removeAt: () => 0,
          clearAt() {},
          storeTierAt() {},
          removeTierAt() {},
        },
      });
      await source.start();
      await until(() => a.pub.subscribedPeers === 1, "the subscription");
      const seq = Number(a.publish([stored([BigInt(cycle + 1)], tokens(cycle * 4, 1), BS)]));
      await until(() => source.sequencer.lastSeq === seq, "applied");
      expect((await writer.dump()).length).toBeGreaterThan(0);
      await source.stop();
      const workerId = BigInt(cycle + 1);
      writer.release(workerId, writer.workers.slotsOf(workerId));
      await until(() => a.pub.subscribedPeers === 0, "the unsubscription");
    }
    expect(writer.streamIds).toBe(1);
    expect(await writer.dump()).toEqual([]);
    // Every slot given back once the writer let go: the numbering is as new.
    await until(() => writer.workers.retiredCount === 0, "the last slot freed");
    expect(writer.workers.liveCount).toBe(0);
    expect(writer.workers.highWater).toBe(0);
  }, 60_000);
});
