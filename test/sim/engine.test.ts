// Goal: the mock engine's scheduler and time model (hand-worked timelines: chunked
// prefill, decode batching, KV-read cost, queueing for KV blocks, FCFS, rejection), and that its KV event stream, applied in
// order to a clean-room model of a consumer, equals the engine's real cache contents
// after every batch of a randomized workload.
import { describe, expect, test } from "bun:test";
import {
  type BlockStoredEvent,
  EngineCache,
  type KvEvent,
  type KvEventBatch,
} from "../../src/sim/engine-cache";
import { MockEngine, type EngineRequest } from "../../src/sim/engine";
import { createRng, randomInt } from "../../src/sim/random";
import {
  checkTimeModel,
  DEFAULT_TIME_MODEL,
  soloDurations,
  stepMs,
  type TimeModel,
} from "../../src/sim/time-model";
import { hashTokens } from "../../src/hash";

const BS = 4;
/**
 * 1 ms per step + 1 ms per prefilled token, 8 tokens per step, no KV-read cost:
 * timelines are easy to work by hand.
 */
const TIME: TimeModel = {
  stepBaseMs: 1,
  prefillTokensPerSecond: 1000,
  kvReadMsPerMillionTokens: 0,
  maxBatchedTokens: 8,
  maxRunning: 4,
};

interface Log {
  ttft: Map<number, number>;
  cached: Map<number, number>;
  finished: Map<number, number>;
}

function engineOf(capacityBlocks: number, time = TIME): { engine: MockEngine; log: Log } {
  const log: Log = { ttft: new Map(), cached: new Map(), finished: new Map() };
  const cache = new EngineCache({ capacityBlocks, blockSize: BS, hashSeed: 99n });
  const engine = new MockEngine(0, cache, time, {
    prefillDone: (request, nowMs, cachedTokens) => {
      log.ttft.set(request.id, nowMs);
      log.cached.set(request.id, cachedTokens);
    },
    finished: (request, nowMs) => log.finished.set(request.id, nowMs),
  });
  return { engine, log };
}

function request(id: number, prompt: number[], outputLength: number): EngineRequest {
  const tokens = Uint32Array.from([
    ...prompt,
    ...Array.from({ length: outputLength }, (_, i) => 9000 + 100 * id + i),
  ]);
  return { id, tokens, promptLength: prompt.length };
}

function runUntil(engine: MockEngine, untilMs = Infinity): void {
  for (let steps = 0; engine.nextEventMs() <= untilMs && engine.nextEventMs() < Infinity; steps++) {
    if (steps > 10_000) throw new Error("engine did not settle");
    engine.step();
  }
}

const runUntilIdle = (engine: MockEngine): void => runUntil(engine);

const range = (from: number, count: number): number[] =>
  Array.from({ length: count }, (_, i) => from + i);

describe("time model", () => {
  test("a step costs its base, its prefill tokens and the KV its decodes read", () => {
    expect(stepMs(DEFAULT_TIME_MODEL, 0, 0)).toBe(5);
    expect(stepMs(DEFAULT_TIME_MODEL, 15_000, 0)).toBe(1005);
    // A full 512k-token cache read by the decode batch: about 20 ms on top of the base.
    expect(stepMs(DEFAULT_TIME_MODEL, 0, 524_288)).toBeCloseTo(5 + 20.4, 1);
    expect(stepMs(TIME, 8, 0)).toBe(9);
  });

  test("solo durations: prefill in chunks of the step budget, one decode step per token after the first", () => {
    expect(soloDurations(TIME, 16, 0, 4)).toEqual({ ttftMs: 18, decodeMs: 3 });
    expect(soloDurations(TIME, 16, 12, 1)).toEqual({ ttftMs: 5, decodeMs: 0 });
    const kv: TimeModel = { ...TIME, stepBaseMs: 0, kvReadMsPerMillionTokens: 1e6 };
    expect(soloDurations(kv, 4, 0, 3)).toEqual({ ttftMs: 4, decodeMs: 5 + 6 });
    // A long-prefill cap of 4 tokens: four prefill steps of 1 + 4 ms.
    expect(soloDurations({ ...TIME, longPrefillTokens: 4 }, 16, 0, 1).ttftMs).toBe(20);
  });

  test("bad constants are refused with the field named", () => {
    expect(() => checkTimeModel({ ...TIME, prefillTokensPerSecond: 0 })).toThrow(
      "prefillTokensPerSecond",
    );
    expect(() => checkTimeModel({ ...TIME, maxBatchedTokens: 0.5 })).toThrow("maxBatchedTokens");
    expect(() => checkTimeModel({ ...TIME, longPrefillTokens: -1 })).toThrow("longPrefillTokens");
    expect(() => checkTimeModel({ ...TIME, stepBaseMs: 0, kvReadMsPerMillionTokens: 0 })).toThrow(
      "both be 0",
    );
  });
});

describe("MockEngine timeline (continuous batching, chunked prefill)", () => {
  test("one request: prefill in two 8-token chunks, then one step per output token", () => {
    const { engine, log } = engineOf(16);
    expect(engine.submit(request(0, range(1, 16), 4), 0)).toBe(true);
    expect(engine.nextEventMs()).toBe(9); // 1 + 8 prefill tokens
    runUntilIdle(engine);
    expect(log.ttft.get(0)).toBe(18);
    expect(log.finished.get(0)).toBe(21); // 3 decode steps of 1 ms
    expect(engine.idle).toBe(true);
    expect(engine.counters.steps).toBe(5);
    expect(engine.counters.decodeTokens).toBe(4);
  });

  test("decode steps slow down with the KV their batch reads", () => {
    const kv: TimeModel = { ...TIME, stepBaseMs: 0, kvReadMsPerMillionTokens: 1e6 }; // 1 ms per context token
    const { engine, log } = engineOf(16, kv);
    engine.submit(request(0, range(1, 4), 3), 0);
    runUntilIdle(engine);
    expect(log.ttft.get(0)).toBe(4);
    expect(log.finished.get(0)).toBe(4 + 5 + 6); // contexts of 5, then 6 tokens
  });

  test("a request arriving mid-step joins the next step and shares its budget with running ones", () => {
    const { engine, log } = engineOf(64);
    engine.submit(request(0, range(1, 12), 2), 0); // step [0, 9): 8 of its 12 tokens
    engine.submit(request(1, range(100, 6), 1), 1); // waits for the step at 9
    runUntilIdle(engine);
    // Step [9, 18): request 0's last 4 tokens + request 1's first 4 (budget 8).
    expect(log.ttft.get(0)).toBe(18);
    // Step [18, 21): request 0 decodes 1 token, request 1 prefills its last 2.
    expect(log.ttft.get(1)).toBe(21);
    expect(log.finished.get(0)).toBe(21);
  });

  test("a cached prefix shortens prefill by exactly the reused tokens", () => {
    const { engine, log } = engineOf(16);
    engine.submit(request(0, range(1, 16), 1), 0);
    runUntilIdle(engine);
    engine.submit(request(1, [...range(1, 12), 77, 78, 79, 80, 81], 1), 100);
    runUntilIdle(engine);
    expect(log.cached.get(1)).toBe(12);
    expect(log.ttft.get(1)! - 100).toBe(1 + 5);
    expect(engine.counters.cachedTokens).toBe(12);
    expect(engine.counters.computedTokens).toBe(16 + 5);
  });

  test("blocks become cached chunk by chunk, so a request can reuse a prefix still being computed", () => {
    const { engine, log } = engineOf(64);
    engine.submit(request(0, range(1, 16), 1), 0); // first chunk (2 blocks) cached at 9
    runUntil(engine, 9);
    engine.submit(request(1, [...range(1, 8), 50], 1), 9);
    runUntilIdle(engine);
    expect(log.cached.get(1)).toBe(8);
  });

  test("a request whose blocks do not fit waits for a finish, then runs (TTFT includes the wait)", () => {
    const { engine, log } = engineOf(6);
    engine.submit(request(0, range(1, 16), 4), 0); // 5 blocks until it finishes at 21
    engine.submit(request(1, range(100, 8), 1), 1); // 3 blocks: only 1 free until then
    runUntilIdle(engine);
    expect(log.finished.get(0)).toBe(21);
    expect(log.ttft.get(1)).toBe(21 + 9);
    // The steps at 18, 19 and 20 had budget left and found no room (the one at 9 had none).
    expect(engine.counters.blockedAdmissions).toBe(3);
    expect(engine.cache.freeBlocks).toBe(6);
  });

  test("the head of the queue blocks those behind it (FCFS)", () => {
    const { engine, log } = engineOf(6);
    engine.submit(request(0, range(1, 16), 4), 0); // holds 5 blocks until 21
    engine.submit(request(1, range(100, 8), 1), 1); // needs 3: waits; runs [21, 30)
    engine.submit(request(2, range(200, 3), 1), 2); // needs 1 and would fit, but queues behind 1
    runUntilIdle(engine);
    expect(log.ttft.get(1)).toBe(30);
    expect(log.ttft.get(2)).toBe(34); // the step at 21 had no budget left: [30, 34)
  });

  test("at most maxRunning requests run; the next is admitted when one finishes", () => {
    const { engine, log } = engineOf(64, { ...TIME, maxRunning: 1 });
    engine.submit(request(0, range(1, 4), 3), 0); // [0, 5) prefill, decodes end at 6, 7
    engine.submit(request(1, range(100, 4), 1), 0);
    runUntilIdle(engine);
    expect(log.finished.get(0)).toBe(7);
    expect(log.ttft.get(1)).toBe(12);
  });

  test("a request larger than the whole cache is rejected at submit", () => {
    const { engine } = engineOf(4);
    expect(engine.submit(request(0, range(1, 17), 1), 0)).toBe(false);
    expect(engine.counters.rejected).toBe(1);
    expect(engine.idle).toBe(true);
  });

  test("batches: a step's blocks are cached when it is planned, published when it has run", () => {
    const { engine } = engineOf(16);
    engine.submit(request(0, range(1, 8), 4), 0);
    // The step that computes the prompt is planned at once: its full blocks are cached
    // then (vLLM V1's allocate_slots), but published when the step has run.
    expect(engine.takeBatch(0)).toBeNull();
    expect(engine.cache.visiblePrefixBlocks(Uint32Array.from(range(1, 9)), 9)).toBe(0);
    let at = engine.step(); // prefill, and the first output token
    const planned = engine.takeBatch(at)!;
    expect(planned.ts).toBe(at / 1000);
    expect(planned.events.map((event) => event.type)).toEqual(["BlockStored"]);
    expect((planned.events[0] as BlockStoredEvent).block_hashes.length).toBe(2);
    expect(engine.cache.visiblePrefixBlocks(Uint32Array.from(range(1, 9)), 9)).toBe(2);
    for (let step = 0; step < 3; step++) at = engine.step();
    // The fourth output token fills the third block: announced at that step's end.
    const filled = engine.takeBatch(at)!;
    expect(filled.ts).toBe(at / 1000);
    expect(filled.events.map((event) => event.type)).toEqual(["BlockStored"]);
  });

  test("a request admitted into the same step as a sibling reuses the sibling's planned blocks", () => {
    const { engine, log } = engineOf(64, { ...TIME, maxBatchedTokens: 64 });
    const shared = range(1, 16);
    engine.submit(request(0, [...range(100, 104)], 1), 0); // keeps the engine busy for a step
    engine.submit(request(1, [...shared, 50], 1), 0.5);
    engine.submit(request(2, [...shared, 60], 1), 0.5);
    while (!engine.idle) engine.step();
    // Both siblings were admitted into the second step; the second reuses the first's
    // 4 prompt blocks although they were computed in the same step.
    expect(log.cached.get(1)).toBe(0);
    expect(log.cached.get(2)).toBe(16);
  });

  test("a long-prefill cap: twins prefill side by side, the earlier computes again what the later ran ahead with (two copies)", () => {
    const twins = (cap: number) => {
      const { engine, log } = engineOf(64, {
        ...TIME,
        maxBatchedTokens: 64,
        longPrefillTokens: cap,
      });
      const prompt = [...range(1, 24), 50]; // 6 full prompt blocks
      engine.submit(request(0, range(100, 104), 1), 0); // keeps the engine busy for a step
      engine.submit(request(1, prompt, 1), 0.5);
      engine.submit(request(2, prompt, 1), 0.5);
      while (!engine.idle) engine.step();
      engine.cache.verify();
      return { engine, log };
    };
    // No cap: the first computes the whole prompt in one step, the second reuses it all.
    const whole = twins(0);
    expect(whole.log.cached.get(2)).toBe(24);
    expect(whole.engine.cache.counters.duplicateBlocks).toBe(0);
    // 8 tokens (2 blocks) per request per step: the second reuses the first's planned
    // blocks 0-1, then runs a chunk ahead (2-3, 4-5); the first, which looked the cache up
    // only when admitted, computes 2-3 and 4-5 again, and the engine keeps both copies.
    const capped = twins(8);
    expect(capped.log.cached.get(1)).toBe(0);
    expect(capped.log.cached.get(2)).toBe(8);
    expect(capped.engine.cache.counters.duplicateBlocks).toBe(4);
    const copies = capped.engine.cache
      .snapshot()
      .filter((block) => block.copies > 1)
      .map((block) => [block.position, block.copies]);
    expect(copies.sort()).toEqual([
      [2, 2],
      [3, 2],
      [4, 2],
      [5, 2],
    ]);
  });
});

// ---- The event stream as a consumer sees it ----

interface ModelBlock {
  parent: bigint | null;
  tokens: number[];
  /** kvedge's path hash, derived by the consumer from the parent's path and the tokens. */
  path: bigint;
  position: number;
  /** Physical copies announced and not yet removed. */
  copies: number;
}

/**
 * A clean-room consumer: applies events to a map of cached blocks (and of the CPU tier's,
 * each held once, its parent found in either tier), checking each against the stream so far.
 */
class ConsumerModel {
  readonly blocks = new Map<bigint, ModelBlock>();
  readonly host = new Map<bigint, { parent: bigint | null; path: bigint }>();
  declare applyHost: (event: KvEvent) => void;

  apply(event: KvEvent): void {
    if (event.type === "AllBlocksCleared") {
      this.blocks.clear();
      this.host.clear();
      return;
    }
    if (event.medium === "CPU") return this.applyHost(event);
    if (event.type === "BlockRemoved") {
      for (const hash of event.block_hashes) {
        const block = this.blocks.get(hash);
        if (block === undefined) throw new Error(`removal of unknown block ${hash}`);
        if (--block.copies === 0) this.blocks.delete(hash);
      }
      return;
    }
    expect(event.block_size).toBe(BS);
    expect(event.token_ids.length).toBe(event.block_hashes.length * BS);
    let parent = event.parent_block_hash;
    const parentBlock = parent === null ? null : this.blocks.get(parent);
    if (parentBlock === undefined) throw new Error(`store with unknown parent ${parent}`);
    // Recompute the path hashes through hashTokens on (parent path, tokens) by chaining.
    let path = parentBlock?.path ?? null;
    let position = parentBlock === null ? 0 : parentBlock.position + 1;
    event.block_hashes.forEach((hash, i) => {
      const tokens = event.token_ids.slice(i * BS, (i + 1) * BS);
      const local = hashTokens(tokens, BS).local[0]!;
      path = path === null ? local : chain(path, local);
      const known = this.blocks.get(hash);
      if (known !== undefined) {
        // Another copy of a cached block (vLLM's duplicates): the same block in every way.
        expect([known.parent, known.tokens, known.path, known.position]).toEqual([
          parent,
          tokens,
          path,
          position,
        ]);
        known.copies++;
      } else this.blocks.set(hash, { parent, tokens, path, position, copies: 1 });
      parent = hash;
      position++;
    });
  }
}

/** A CPU tier event: one block, held at most once, its parent in either tier. */
ConsumerModel.prototype.applyHost = function (this: ConsumerModel, event: KvEvent): void {
  if (event.type === "BlockRemoved") {
    for (const hash of event.block_hashes)
      if (!this.host.delete(hash)) throw new Error(`CPU removal of unknown block ${hash}`);
    return;
  }
  if (event.type !== "BlockStored" || event.block_hashes.length !== 1)
    throw new Error("a CPU store holds one block");
  const [hash] = event.block_hashes as [bigint];
  if (this.host.has(hash)) throw new Error(`CPU store of a block the tier holds: ${hash}`);
  const parent = event.parent_block_hash;
  const base =
    parent === null ? null : (this.blocks.get(parent)?.path ?? this.host.get(parent)?.path);
  if (base === undefined) throw new Error(`CPU store under a parent no tier holds: ${parent}`);
  const local = hashTokens(event.token_ids, BS).local[0]!;
  this.host.set(hash, { parent, path: base === null ? local : chain(base, local) });
};

function chain(previous: bigint, local: bigint): bigint {
  const pair = new DataView(new ArrayBuffer(16));
  pair.setBigUint64(0, previous, true);
  pair.setBigUint64(8, local, true);
  return BigInt(Bun.hash.xxHash3(new Uint8Array(pair.buffer), 1337n));
}

function expectModelEqualsEngine(model: ConsumerModel, cache: EngineCache): void {
  const host = cache.hostSnapshot();
  expect(model.host.size).toBe(host.length);
  for (const block of host)
    expect(model.host.get(block.hash)).toEqual({ parent: block.parent, path: block.path });
  const actual = cache.snapshot();
  expect(model.blocks.size).toBe(actual.length);
  for (const block of actual) {
    const seen = model.blocks.get(block.hash);
    if (seen === undefined)
      throw new Error(`engine caches ${block.hash}, the stream never said so`);
    expect(seen.parent).toBe(block.parent);
    expect(seen.tokens).toEqual(Array.from(block.tokens));
    expect(seen.path).toBe(block.path);
    expect(seen.position).toBe(block.position);
    expect(seen.copies).toBe(block.copies);
  }
}

describe("MockEngine event stream", () => {
  test("randomized workload: after every batch the consumer's view equals the real cache (seeds 4-6 with a CPU tier)", () => {
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const rng = createRng(seed);
      const cache = new EngineCache({
        capacityBlocks: 48,
        blockSize: BS,
        hashSeed: BigInt(seed) * 0x9e37_79b9n,
        cpuCapacityBlocks: seed > 3 ? 24 : 0,
      });
      const model = new ConsumerModel();
      let batches = 0;
      const apply = (batch: KvEventBatch | null): void => {
        if (batch === null) return;
        batches++;
        for (const event of batch.events) model.apply(event);
        expectModelEqualsEngine(model, cache);
      };
      const engine = new MockEngine(0, cache, TIME, { prefillDone() {}, finished() {} });
      // Prompts share prefixes: a few "system prompts" of 0–3 blocks, then random turns.
      const prefixes = [[], range(1, 4), range(1, 12), range(50, 8)];
      const prompts: number[][] = [];
      let now = 0;
      for (let id = 0; id < 400; id++) {
        now += randomInt(rng, 6);
        while (engine.nextEventMs() <= now) {
          const at = engine.step();
          apply(engine.takeBatch(at));
        }
        if (id % 97 === 96) {
          runUntilIdle(engine);
          apply(engine.takeBatch(now));
          if (engine.cache.reset()) apply(engine.takeBatch(now));
        }
        // Some requests repeat an earlier prompt exactly (block-aligned ones then recompute
        // their cached last block: the duplicate path).
        let prompt = [...prefixes[randomInt(rng, prefixes.length)]!];
        for (let n = 1 + randomInt(rng, 14); n > 0; n--) prompt.push(randomInt(rng, 6));
        if (prompts.length > 0 && randomInt(rng, 4) === 0)
          prompt = prompts[randomInt(rng, prompts.length)]!;
        prompts.push(prompt);
        engine.submit(request(id, prompt, randomInt(rng, 9)), now);
        apply(engine.takeBatch(now));
      }
      while (engine.nextEventMs() < Infinity) apply(engine.takeBatch(engine.step()));
      cache.verify();
      expect(cache.freeBlocks).toBe(48);
      expect(batches).toBeGreaterThan(100);
      expect(cache.counters.evictedBlocks).toBeGreaterThan(0);
      expect(cache.counters.hitBlocks).toBeGreaterThan(0);
      expect(cache.counters.duplicateBlocks).toBeGreaterThan(0);
      expect(cache.counters.clears).toBeGreaterThan(0);
      if (seed > 3) {
        expect(cache.counters.spilledBlocks).toBeGreaterThan(0);
        expect(cache.counters.hostEvictedBlocks).toBeGreaterThan(0);
        expect(cache.counters.hostHitBlocks).toBeGreaterThan(0);
      }
    }
  });

  test("a consumer that drops removals diverges (the check above can fail)", () => {
    const cache = new EngineCache({ capacityBlocks: 4, blockSize: BS, hashSeed: 5n });
    const engine = new MockEngine(0, cache, TIME, { prefillDone() {}, finished() {} });
    const model = new ConsumerModel();
    for (let id = 0; id < 4; id++) {
      engine.submit(request(id, range(100 * id, 8), 1), 10 * id);
      runUntilIdle(engine);
      for (const event of cache.takeEvents()) if (event.type !== "BlockRemoved") model.apply(event);
    }
    expect(cache.counters.evictedBlocks).toBeGreaterThan(0);
    expect(() => expectModelEqualsEngine(model, cache)).toThrow();
  });
});
