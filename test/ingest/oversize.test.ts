// Goal: a batch over --max-message-bytes costs that batch, never the connection: it is
// skipped on the wire (counted), the next batch arrives on the same connection, the
// loss is a sequence gap (replay asked; a replay reply over the bound is skipped too),
// and the worker is degraded rather than exact: one batch lost, put down to the size
// limit, degraded through later batches until a clear makes its state known again.
// Real PUB/ROUTER engine on loopback.
import { afterEach, expect, test } from "bun:test";
import { createIndex } from "../../src/index";
import { EngineSource } from "../../src/ingest/source";
import { memoryLogger } from "../../src/util/log";
import { cleared, stored, TestEngine } from "../support/engine";
import { eventually } from "../support/wait";

const BS = 4;
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const until = (condition: () => boolean, what: string, timeoutMs = 10_000) =>
  eventually(() => condition() || undefined, timeoutMs, what);

test("an oversize batch, its replay too: skipped, connection kept; lost, degraded until a clear", async () => {
  const engine = await new TestEngine({ replay: true }).start();
  cleanups.push(() => engine.stop());
  const index = createIndex("crtc", BS);
  const held = (): number => index.workers()[0]?.blocks ?? 0;
  const log = memoryLogger();
  const source = new EngineSource(
    {
      workerId: 1n,
      dpRank: 0,
      endpoint: engine.endpoint,
      replayEndpoint: engine.replayEndpoint,
      topic: "",
    },
    {
      blockSize: BS,
      sink: index,
      log,
      zmtp: { maxMessageBytes: 4096 },
      sequencer: { replayTimeoutMs: 500 },
    },
  );
  cleanups.push(() => source.stop());
  await source.start();
  await engine.waitForSubscriber();

  engine.publish([stored([1n], [1, 2, 3, 4], BS)]);
  await until(() => held() === 1, "the first batch");
  // ~2,000 blocks: far over 4 KiB of msgpack.
  const bigHashes = Array.from({ length: 2000 }, (_, i) => BigInt(100 + i));
  engine.publish([
    stored(
      bigHashes,
      Array.from({ length: 4 * 2000 }, (_, i) => i % 50),
      BS,
      1n,
    ),
  ]);
  engine.publish([stored([7n], [9, 9, 9, 9], BS)]);
  await until(() => held() === 2, "the batch after the oversize one");
  await until(() => source.sequencer.counters.lost === 1, "the oversize batch counted lost");

  expect(held()).toBe(2); // the first and the last batch: the oversize one is not there
  expect(source.socketCounters.sub.oversizeSkipped).toBe(1);
  expect(source.socketCounters.sub.disconnects).toBe(0);
  expect(source.counters.connects).toBe(1);
  expect(source.state).toBe("connected");
  expect(source.degraded).toBe(true);
  // The live copy and the replayed one were both skipped; the loss is put down to the size.
  expect(source.sequencer.counters.oversize).toBe(2);
  expect(source.sequencer.counters.replaysCompleted).toBe(2); // the connect probe, the gap's replay
  const losses = log.records.filter((r) => r.message === "loss").map((r) => r.fields.reason);
  expect(losses).toEqual(["a batch over ingest.max_message_bytes was skipped"]);

  // Later batches apply, the worker stays degraded: the skipped batch's blocks are unknown.
  engine.publish([stored([8n], [5, 5, 5, 5], BS)]);
  await until(() => held() === 3, "a later batch");
  expect(source.degraded).toBe(true);
  expect(source.sequencer.counters.lost).toBe(1);
  // A clear makes the state known again: exact, holding what the engine holds.
  engine.publish([cleared, stored([9n], [6, 6, 6, 6], BS)]);
  await until(() => !source.degraded, "exact after the clear");
  expect(held()).toBe(1);
  expect(source.socketCounters.sub.disconnects).toBe(0);
});
