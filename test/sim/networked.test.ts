// Goal: a networked mock engine's KV events, received over real ZMTP sockets, rebuild
// an index equal to the engine's real cache contents (every cached block, by external
// hash and token path) at every checkpoint: through our SUB + sequencer + normalizer
// into an index (array and map forms), with live messages dropped on purpose and
// recovered through the engine's replay ROUTER, and across a prefix-cache reset.
import { afterEach, beforeAll, describe, expect, test } from "bun:test";
import { createIndex } from "../../src/index";
import { EngineSource } from "../../src/ingest/source";
import { silentLogger } from "../../src/util/log";
import { DealerSocket } from "../../src/wire/zmtp";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { createPolicy } from "../../src/sim/policies";
import { engineSeeds } from "../../src/sim/simulator";
import { DEFAULT_TIME_MODEL, type TimeModel } from "../../src/sim/time-model";
import { transformTrace, type Trace } from "../../src/sim/trace";
import { until } from "../support/wait";
import { expectIndexEqualsEngines, VirtualRig } from "./fleet-rig";

let trace: Trace;
/** vLLM's long_prefill_token_threshold: twins leapfrog through their shared prompt. */
const TIME: TimeModel = { ...DEFAULT_TIME_MODEL, longPrefillTokens: 1024 };
const cleanup: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  // Twins: requests that arrive twice at once; with a long-prefill cap (TIME) they prefill
  // side by side, so engines keep duplicate copies (as vLLM).
  trace = transformTrace(await loadConversationTrace(), {
    requests: 150,
    timeScale: 0.5,
    twins: 0.1,
  });
});

afterEach(async () => {
  while (cleanup.length > 0) await cleanup.pop()!();
});

interface EngineSpec {
  readonly form: "array" | "map";
  readonly drop?: (seq: number) => boolean;
  /** A CPU offload tier of this many blocks (vLLM's CPU events); none if absent. */
  readonly cpu?: number;
}

async function startEngines(
  specs: readonly EngineSpec[],
  capacityBlocks: number,
): Promise<NetworkedEngine[]> {
  const seeds = engineSeeds(11, specs.length);
  const engines: NetworkedEngine[] = [];
  for (const [w, spec] of specs.entries()) {
    const engine = new NetworkedEngine({
      index: w,
      capacityBlocks,
      cpuCapacityBlocks: spec.cpu ?? 0,
      hashSeed: seeds[w]!,
      time: TIME,
      endpoint: "tcp://127.0.0.1:0",
      replayEndpoint: "tcp://127.0.0.1:0",
      form: spec.form,
      ...(spec.drop === undefined ? {} : { dropLive: spec.drop }),
    });
    cleanup.push(() => engine.close());
    engines.push(await engine.start());
  }
  return engines;
}

/** Our ingest path (SUB → sequencer → normalizer, replay over DEALER) into one index. */
function subscribe(engines: readonly NetworkedEngine[]) {
  const index = createIndex("crtc", 16);
  const sources = engines.map(
    (engine, w) =>
      new EngineSource(
        {
          workerId: BigInt(w),
          dpRank: 0,
          endpoint: engine.endpoint,
          replayEndpoint: engine.replayEndpoint,
          topic: "",
        },
        { blockSize: 16, sink: index, log: silentLogger },
      ),
  );
  for (const source of sources) cleanup.push(() => source.stop());
  return { index, sources };
}

describe("networked mock engine → our SUB socket → index", () => {
  for (const form of ["array", "map"] as const) {
    test(`${form} form: the index equals the engines' caches at every checkpoint`, async () => {
      // A CPU tier on every engine: spills on eviction, loads back, vLLM's CPU events.
      const engines = await startEngines(
        [
          { form, cpu: 4096 },
          { form, cpu: 4096 },
          { form, cpu: 4096 },
        ],
        1024,
      );
      const { index, sources } = subscribe(engines);
      for (const source of sources) await source.start();
      for (const engine of engines) await engine.waitForSubscriber(10_000);
      // Prefix-aware routing sends twins to one engine: two copies of their blocks there.
      const policy = createPolicy("approx_prefix", {
        workers: engines.length,
        blockSize: 16,
        seed: 1,
      });
      const rig = new VirtualRig(engines, trace, policy);
      const ids = engines.map((_, w) => String(w));
      let checked = 0;
      for (const checkpoint of [40, 80, 120, 150, Infinity]) {
        if (checkpoint === Infinity) rig.drain();
        else rig.runTo(checkpoint);
        await until(
          () => sources.every((source, w) => source.sequencer.lastSeq === engines[w]!.lastSeq),
          "the subscriber to catch up",
        );
        checked += expectIndexEqualsEngines(index.dump(), engines, ids);
      }
      expect(checked).toBeGreaterThan(10_000);
      const evicted = engines.reduce(
        (sum, engine) => sum + engine.engine.cache.counters.evictedBlocks,
        0,
      );
      expect(evicted).toBeGreaterThan(0); // removals were part of the stream
      // vLLM's duplicate copies were part of it too (announced, and counted by the index).
      const copies = engines.reduce(
        (sum, engine) => sum + engine.engine.cache.counters.duplicateBlocks,
        0,
      );
      expect(copies).toBeGreaterThan(0);
      expect(index.counters.blocksDuplicate).toBeGreaterThan(0);
      expect(index.counters.copiesRemoved).toBeGreaterThan(0);
      // The CPU tier took spills and gave blocks back (checked above block for block).
      const cpu = (key: "spilledBlocks" | "hostHitBlocks"): number =>
        engines.reduce((sum, engine) => sum + engine.engine.cache.counters[key], 0);
      expect(cpu("spilledBlocks")).toBeGreaterThan(0);
      expect(cpu("hostHitBlocks")).toBeGreaterThan(0);
      for (const source of sources) {
        expect(source.sequencer.counters.gaps).toBe(0);
        expect(source.normalizer.counters.events.stored).toBeGreaterThan(0);
      }
      // Reset: AllBlocksCleared empties the engine and, through the stream, its worker.
      expect(engines[1]!.reset()).toBe(true);
      await until(
        () => sources[1]!.sequencer.lastSeq === engines[1]!.lastSeq,
        "the clear to arrive",
      );
      expect(engines[1]!.engine.cache.cachedBlocks).toBe(0);
      expectIndexEqualsEngines(index.dump(), engines, ids);
      expect(sources[1]!.normalizer.counters.events.cleared).toBe(1);
    });
  }

  test("live messages dropped on purpose are recovered through the replay ROUTER", async () => {
    const dropped = (seq: number): boolean => seq % 7 === 3 || (seq >= 40 && seq < 44);
    const engines = await startEngines(
      [
        { form: "array", drop: dropped },
        { form: "map", drop: dropped },
      ],
      2048,
    );
    const { index, sources } = subscribe(engines);
    for (const source of sources) await source.start();
    for (const engine of engines) await engine.waitForSubscriber(10_000);
    const rig = new VirtualRig(engines, trace);
    const ids = ["0", "1"];
    for (const checkpoint of [50, 100, 150, Infinity]) {
      if (checkpoint === Infinity) rig.drain();
      else rig.runTo(checkpoint);
      rig.settleDrops(dropped);
      await until(
        () => sources.every((source, w) => source.sequencer.lastSeq === engines[w]!.lastSeq),
        "replays to complete",
      );
      expectIndexEqualsEngines(index.dump(), engines, ids);
    }
    for (const [w, source] of sources.entries()) {
      const c = source.sequencer.counters;
      expect(engines[w]!.counters.droppedLive).toBeGreaterThan(5);
      expect(c.gaps).toBeGreaterThan(0);
      expect(c.replaysCompleted).toBeGreaterThan(0);
      expect(c.replayed).toBeGreaterThanOrEqual(engines[w]!.counters.droppedLive);
      expect(c.lost).toBe(0);
      expect(source.degraded).toBe(false);
      expect(engines[w]!.counters.replayRequests).toBe(c.replaysRequested);
    }
  });

  test("the replay ring keeps the last buffer_steps batches and ends with seq −1", async () => {
    const engine = new NetworkedEngine({
      index: 0,
      capacityBlocks: 2048,
      hashSeed: 5n,
      endpoint: "tcp://127.0.0.1:0",
      replayEndpoint: "tcp://127.0.0.1:0",
      bufferSteps: 4,
    });
    cleanup.push(() => engine.close());
    await engine.start();
    const rig = new VirtualRig([engine], transformTrace(trace, { requests: 3 }));
    rig.runTo(3);
    rig.drain();
    expect(engine.lastSeq).toBeGreaterThan(6);
    const dealer = new DealerSocket();
    cleanup.push(() => dealer.close());
    const replies: { frames: number; seq: bigint; payload: number }[] = [];
    dealer.onMessage = (frames) => {
      const seq = new DataView(frames[2]!.buffer, frames[2]!.byteOffset, 8).getBigUint64(0);
      replies.push({ frames: frames.length, seq, payload: frames[3]!.length });
    };
    dealer.connect(engine.replayEndpoint!);
    const start = new Uint8Array(8); // from seq 0: only the last 4 are still kept
    dealer.send([new Uint8Array(0), start]);
    await until(() => replies.length === 5, "5 replies");
    const last = engine.lastSeq;
    expect(replies.map((reply) => reply.seq)).toEqual(
      [last - 3, last - 2, last - 1, last, 0xffff_ffff_ffff_ffffn].map(BigInt),
    );
    expect(replies.every((reply) => reply.frames === 4)).toBe(true);
    expect(replies[4]!.payload).toBe(0);
    // A malformed request is counted and ignored.
    dealer.send([new Uint8Array(0), new Uint8Array(3)]);
    await until(
      () => engine.counters.malformedReplayRequests === 1,
      "the malformed request to be counted",
    );
    expect(engine.counters.replayRequests).toBe(1);
  });
});
