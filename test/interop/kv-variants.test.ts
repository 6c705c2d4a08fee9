// Goal: every producer's KV-event wire variant (vLLM V1-V9, SGLang S1-S5, the forks F1
// and F2; src/wire/kv-events/README.md) is read as the producer means it, end to end:
// published by a real libzmq peer (test/interop/engine.mjs, the `zeromq` addon under
// node), received by kvedge's own ZMTP SUB, decoded, normalized and applied to an index
// whose holdings are then what the engine holds: matched blocks per query (salted,
// LoRA, base model) and the worker's block count. Each variant is also read a second
// time through the replay protocol (the connect probe), in the reply shape of its
// producer (vLLM from #45177 with the topic frame, the others without).
// Method: the fixtures are the producers' bytes (test/fixtures/kv-events/variants.json,
// written by Python msgpack from the producers' declared layouts and checked there
// against msgspec's own bytes); kvedge's encoder must reproduce each one byte for byte.
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import fixtures from "../fixtures/kv-events/variants.json";
import msgspec from "../fixtures/kv-events/msgspec-variants.json";
import { WorkerTable } from "../../src/domain/worker-table";
import { hashTokens, LoraAdapters } from "../../src/hash";
import { createIndex, type KvIndex, MatchResult } from "../../src/index";
import { EngineSource } from "../../src/ingest/source";
import { silentLogger } from "../../src/util/log";
import {
  encodeKvBatch,
  type KvBatch,
  type KvHash,
  WIRE_VARIANTS,
  type WireVariant,
} from "../../src/wire/kv-events";
import { until } from "../support/wait";
import { NodeEngine } from "./libzmq";

// Subprocesses and real sockets on a shared, loaded machine: be generous.
setDefaultTimeout(30_000);

interface Query {
  tokens: number[];
  blocks: number;
  cache_salt?: string;
  lora_name?: string;
  lora_id?: number;
}
interface Fixture {
  variant: WireVariant;
  blockSize: number;
  batches: { seq: number; hex: string; batch: unknown }[];
  queries: Query[];
  held: number;
}

const cases = fixtures as unknown as Fixture[];
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const hexBytes = (hex: string) => Uint8Array.from(Buffer.from(hex, "hex"));

/** Fixture hashes are "u:<u64>", "i:<i64>" or "b:<hex digest>". */
function batchOf(raw: unknown): KvBatch {
  const hash = (text: string): KvHash =>
    text.startsWith("b:") ? hexBytes(text.slice(2)) : BigInt(text.slice(2));
  return JSON.parse(JSON.stringify(raw), (key, value) => {
    if (key === "blockHashes") return (value as string[]).map(hash);
    if (key === "parentBlockHash") return value === null ? null : hash(value as string);
    return value;
  }) as KvBatch;
}

/** vLLM's replay replies carry the topic frame from #45177 (in the V9 era); SGLang's never did. */
const replayTopic = (variant: WireVariant) => variant === "vllm-v9";

/** A source of worker 1 into a fresh index: its holdings after the batches. */
async function listen(
  engine: NodeEngine,
  blockSize: number,
  replay: boolean,
): Promise<{ source: EngineSource; index: KvIndex }> {
  const index = createIndex("crtc", blockSize, { workers: new WorkerTable() });
  const source = new EngineSource(
    {
      workerId: 1n,
      dpRank: 0,
      endpoint: engine.endpoint,
      replayEndpoint: replay ? engine.replayEndpoint : null,
      topic: "",
    },
    { blockSize, sink: index, log: silentLogger },
  );
  cleanups.push(() => source.stop());
  await source.start();
  return { source, index };
}

function expectHoldings(index: KvIndex, fixture: Fixture): void {
  const lora = new LoraAdapters();
  const result = new MatchResult();
  for (const query of fixture.queries) {
    const identity = lora.identity(query.lora_name ?? null, query.lora_id ?? null);
    const local = hashTokens(query.tokens, fixture.blockSize, {
      loraName: identity,
      cacheSalt: query.cache_salt ?? null,
    }).local;
    const words = new Uint32Array(2 * local.length);
    local.forEach((hash, i) => {
      words[2 * i] = Number(hash >> 32n);
      words[2 * i + 1] = Number(hash & 0xffff_ffffn);
    });
    index.findMatches(words, local.length, result);
    const matched = result.count === 0 ? 0 : result.blocks[0]!;
    expect({ query, matched }).toEqual({ query, matched: query.blocks });
  }
  expect(index.workers()).toEqual([{ workerId: 1n, dpRank: 0, blocks: fixture.held }]);
}

test("a scenario for every variant, each checked against msgspec where msgspec wrote one", () => {
  expect(cases.map((fixture) => fixture.variant)).toEqual([...WIRE_VARIANTS]);
  // The generator stops unless its bytes equal msgspec's; the reference is kept beside it.
  expect(Object.keys(msgspec).length).toBe(15);
});

describe("kvedge's encoder writes each producer's bytes", () => {
  for (const fixture of cases) {
    test(fixture.variant, () => {
      for (const batch of fixture.batches) {
        const bytes = encodeKvBatch(batchOf(batch.batch), { variant: fixture.variant });
        expect(Buffer.from(bytes).toString("hex")).toBe(batch.hex);
      }
    });
  }
});

describe("every variant through a real libzmq publisher", () => {
  for (const fixture of cases) {
    test(`${fixture.variant}: live through the SUB, then again through the replay protocol`, async () => {
      const engine = await NodeEngine.start({
        pub: "tcp://127.0.0.1:0",
        router: "tcp://127.0.0.1:0",
        replayTopic: replayTopic(fixture.variant),
      });
      cleanups.push(() => engine.kill());
      const payloads = fixture.batches.map((batch) => hexBytes(batch.hex));

      // Live: a libzmq PUB drops until our subscription reaches it, so batch 0 goes out
      // again until it lands (later copies are duplicates, skipped by seq).
      const live = await listen(engine, fixture.blockSize, false);
      let sent = 0;
      await until(() => {
        if (live.source.sequencer.counters.applied > 0) return true;
        engine.publish(0, payloads[0]!);
        sent++;
        return false;
      }, "batch 0 through the SUB");
      for (let seq = 1; seq < payloads.length; seq++) engine.publish(seq, payloads[seq]!);
      await until(
        () => live.source.sequencer.counters.applied === payloads.length,
        "every batch applied",
      );
      expect(live.source.normalizer.counters.batchesDropped).toBe(0);
      const skipped = Object.entries(live.source.normalizer.counters.skippedEvents);
      expect(skipped.filter(([, count]) => count > 0)).toEqual([]);
      expect(live.source.normalizer.counters.unknownFields).toBe(0);
      expect(live.source.degraded).toBe(false);
      expectHoldings(live.index, fixture);

      // Replay: a second listener's connect probe reads the ring from 0 (the whole
      // history: rebuilt).
      await engine.done(sent + payloads.length - 1);
      const replayed = await listen(engine, fixture.blockSize, true);
      await until(
        () =>
          replayed.source.sequencer.counters.replaysCompleted > 0 &&
          !replayed.source.sequencer.isDegraded,
        "the connect probe's replay",
      );
      expect(replayed.source.sequencer.counters.rebuilds).toBe(1);
      expectHoldings(replayed.index, fixture);
    });
  }
});
