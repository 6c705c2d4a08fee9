// Goal: engine streams sequenced and applied on the writer thread (fed through the
// event ring from real ZMTP sockets on this thread) leave exactly the index that the
// same streams leave when applied here, with the same sequencing counters mirrored
// back: in-order batches, a lost batch replayed, a lost batch without replay (degraded,
// then exact again after a clear), an engine restart. A ring too small for a burst
// drops batches, counts them, and the stream recovers through its connect probe to the
// same index. Real Worker, real sockets on loopback.
import { afterEach, describe, expect, test } from "bun:test";
import { createIndex, type KvIndex } from "../../src/index";
import { WorkerTable } from "../../src/core/worker-table";
import { EngineSource, type SourceConfig } from "../../src/ingest/source";
import { WriterThread } from "../../src/runtime/writer-thread";
import { createLogger } from "../../src/util/log";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { until } from "../support/wait";

const BS = 4;
const log = createLogger({ level: "error" });
const tokens = (first: number, blocks: number) => Array.from({ length: blocks * BS }, (_, i) => first + i);

interface Pair {
  readonly reference: EngineSource;
  readonly threaded: EngineSource;
}

const started: { stop(): Promise<void> }[] = [];
afterEach(async () => {
  for (const item of started.splice(0).reverse()) await item.stop();
});

async function setUp(ringBytes = 1 << 20) {
  const writer = await WriterThread.start({
    ringBytes, cpus: null, blockSize: BS, backend: "crtc", budgetBytes: 1 << 30,
    sequencer: { replayTimeoutMs: 2_000 }, logLevel: "error",
  });
  started.push(writer);
  const table = new WorkerTable();
  const index: KvIndex = createIndex("crtc", BS, { workers: table });
  const writerOf = { workerTable: table, storeAt: index.storeAt.bind(index),
    removeAt: index.removeAt.bind(index), clearAt: index.clearAt.bind(index) };
  const pairs: Pair[] = [];
  const add = async (config: SourceConfig): Promise<Pair> => {
    const reference = new EngineSource(config, { blockSize: BS, writer: writerOf, log });
    const threaded = new EngineSource(config, { blockSize: BS, writer: writerOf, log, input: writer.input(config) });
    started.push(reference, threaded);
    await Promise.all([reference.start(), threaded.start()]);
    const pair = { reference, threaded };
    pairs.push(pair);
    return pair;
  };
  /** Both sides applied through `seq` (the threaded one as its mirror says). */
  const applied = async (pair: Pair, seq: number) => {
    const at = () => [pair.reference.sequencer.lastSeq, pair.threaded.sequencer.lastSeq];
    await until(() => at()[0] === seq && at()[1] === seq, `both sides at seq ${seq}`).catch((error) => {
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
  return { writer, index, add, applied, same };
}

const config = (engine: TestEngine, workerId: bigint): SourceConfig => ({
  workerId, dpRank: 0, endpoint: engine.endpoint, replayEndpoint: engine.replayEndpoint, topic: "",
});

describe("the writer thread", () => {
  test("in order, a gap replayed, a gap lost, a clear, a restart: the same index as on one thread", async () => {
    const a = await new TestEngine({ replay: true }).start();
    const b = await new TestEngine().start();
    started.push(a, b);
    const { add, applied, same } = await setUp();
    const pa = await add(config(a, 1n));
    const pb = await add(config(b, 2n));
    await until(() => a.pub.subscribedPeers === 2 && b.pub.subscribedPeers === 2, "subscriptions");
    // Both sides ran a's connect probe (an empty ring) before anything is published.
    await a.waitForReplayRequests(2);
    await until(() => !pa.reference.sequencer.isDegraded && !pa.threaded.sequencer.isDegraded, "a exact");

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

    b.publish([cleared, stored([14n], tokens(1, 1), BS)]);
    await applied(pb, 3);
    await same();
    expect(pb.threaded.sequencer.isDegraded).toBe(false);

    await a.restart();
    await a.waitForReplayRequests(4);
    a.publish([stored([7n, 8n], tokens(1, 2), BS)]);
    await applied(pa, 0);
    await same();
    expect(pa.threaded.sequencer.counters.restarts).toBe(1);
  }, 30_000);

  test("a burst larger than the ring: drops counted, the stream recovers to the same index", async () => {
    const a = await new TestEngine({ replay: true }).start();
    started.push(a);
    const { writer, index, add, applied } = await setUp(4096);
    const pa = await add(config(a, 1n));
    await until(() => a.pub.subscribedPeers === 2, "subscriptions");
    await a.waitForReplayRequests(2);
    await until(() => !pa.threaded.sequencer.isDegraded, "exact");
    // 200 batches of ~100 bytes in one turn: far more than 4 KiB of ring.
    let last = 0n;
    for (let i = 0; i < 200; i++) last = a.publish([stored([BigInt(1000 + i)], tokens(1000 + 4 * i, 1), BS)]);
    await applied(pa, Number(last));
    expect(writer.producer.counters.droppedFull).toBeGreaterThan(0);
    const stream = pa.threaded.stream as unknown as { ringLosses: number };
    await until(() => stream.ringLosses > 0 && !pa.threaded.sequencer.isDegraded, "the loss seen and recovered");
    // The probe rebuilt the stream from the engine's ring: the same index, exact.
    expect(await writer.dump()).toEqual(index.dump());
    expect(pa.threaded.sequencer.counters.probes).toBeGreaterThan(pa.reference.sequencer.counters.probes);
  }, 30_000);
});
