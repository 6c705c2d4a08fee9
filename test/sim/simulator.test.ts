// Goal: whole-fleet replays keep their invariants (every request completes or is
// rejected, prompt tokens are conserved, hit rate in [0, 1], caches end unpinned and
// consistent), are deterministic per seed, publish per-engine event streams that
// rebuild each engine's cache exactly, and show KV-aware routing saving prefill work
// over round robin on the shipped conversation trace (direction only, no magic numbers).
import { beforeAll, describe, expect, test } from "bun:test";
import type { KvEventBatch } from "../../src/sim/engine-cache";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { POLICY_NAMES } from "../../src/sim/policies";
import { percentile, simulate } from "../../src/sim/simulator";
import { DEFAULT_TIME_MODEL } from "../../src/sim/time-model";
import { transformTrace, type Trace } from "../../src/sim/trace";

let conversation: Trace;
beforeAll(async () => {
  conversation = await loadConversationTrace();
});

describe("simulate", () => {
  test("every policy: requests complete, tokens are conserved, metrics are sane", () => {
    const trace = transformTrace(conversation, { requests: 300 });
    for (const policy of POLICY_NAMES) {
      const result = simulate(trace, { policy, workers: 4, capacityBlocks: 4096, verify: true });
      expect(result.completed + result.rejected).toBe(300);
      expect(result.cached_tokens + result.prefill_tokens).toBe(result.prompt_tokens);
      expect(result.hit_rate).toBeGreaterThanOrEqual(0);
      expect(result.hit_rate).toBeLessThanOrEqual(1);
      expect(result.worker_requests.reduce((a, b) => a + b, 0)).toBe(result.completed);
      expect(result.worker_prefill_tokens.reduce((a, b) => a + b, 0)).toBe(result.prefill_tokens);
      expect(result.ttft_p50_ms).toBeGreaterThan(0);
      expect(result.ttft_p99_ms).toBeGreaterThanOrEqual(result.ttft_p50_ms);
      expect(result.load_spread).toBeGreaterThanOrEqual(1);
      expect(result.makespan_ms).toBeGreaterThan(trace.arrivalMs[299]! - trace.arrivalMs[0]!);
    }
  });

  test("requests larger than an engine's cache are rejected and counted, the rest still run", () => {
    const trace = transformTrace(conversation, { requests: 200 });
    let large = 0;
    for (let i = 0; i < trace.count; i++) {
      if (Math.ceil((trace.inputLength[i]! + trace.outputLength[i]!) / 16) > 1024) large++;
    }
    expect(large).toBeGreaterThan(0);
    const result = simulate(trace, {
      policy: "kv_aware_model",
      workers: 2,
      capacityBlocks: 1024,
      verify: true,
    });
    expect(result.rejected).toBe(large);
    expect(result.completed).toBe(200 - large);
  });

  test("the same seed gives the same result; another seed changes seeded choices only", () => {
    const trace = transformTrace(conversation, { requests: 200 });
    const a = simulate(trace, { policy: "random", seed: 1, capacityBlocks: 8192 });
    expect(simulate(trace, { policy: "random", seed: 1, capacityBlocks: 8192 })).toEqual(a);
    expect(
      simulate(trace, { policy: "random", seed: 2, capacityBlocks: 8192 }).worker_requests,
    ).not.toEqual(a.worker_requests);
  });

  test("each engine's event stream is consistent and rebuilds the engine's final cache", () => {
    const trace = transformTrace(conversation, { requests: 150 });
    const models = new Map<number, Map<bigint, bigint | null>>();
    const lastTs = new Map<number, number>();
    let batches = 0;
    const onBatch = (worker: number, batch: KvEventBatch): void => {
      batches++;
      expect(batch.ts).toBeGreaterThanOrEqual(lastTs.get(worker) ?? 0);
      lastTs.set(worker, batch.ts);
      let model = models.get(worker);
      if (model === undefined) models.set(worker, (model = new Map()));
      for (const event of batch.events) {
        if (event.type === "AllBlocksCleared") {
          model.clear();
        } else if (event.type === "BlockRemoved") {
          for (const hash of event.block_hashes) expect(model.delete(hash)).toBe(true);
        } else {
          let parent = event.parent_block_hash;
          if (parent !== null) expect(model.has(parent)).toBe(true);
          for (const hash of event.block_hashes) {
            expect(model.has(hash)).toBe(false);
            model.set(hash, parent);
            parent = hash;
          }
        }
      }
    };
    const result = simulate(trace, {
      policy: "kv_aware_model",
      workers: 3,
      capacityBlocks: 2048,
      onBatch,
      verify: true,
    });
    expect(result.evicted_blocks).toBeGreaterThan(0);
    expect(batches).toBeGreaterThan(150);
    expect([0, 1, 2].map((worker) => models.get(worker)!.size)).toEqual(
      result.worker_cached_blocks,
    );
  });

  test("percentile is nearest-rank", () => {
    const sorted = Float64Array.from([10, 20, 30, 40]);
    expect(percentile(sorted, 0.5)).toBe(20);
    expect(percentile(sorted, 0.99)).toBe(40);
    expect(percentile(sorted, 0)).toBe(10);
    expect(percentile(new Float64Array(0), 0.5)).toBeNaN();
  });

  test("bad options fail before running", () => {
    const trace = transformTrace(conversation, { requests: 5 });
    expect(() => simulate(trace, { policy: "round_robin", workers: 0 })).toThrow("workers");
    expect(() =>
      simulate(trace, {
        policy: "round_robin",
        time: { ...DEFAULT_TIME_MODEL, prefillTokensPerSecond: 0 },
      }),
    ).toThrow("prefillTokensPerSecond");
  });
});

describe("KV-aware routing on the conversation trace", () => {
  test("kv_aware_model reuses more cache and computes fewer prefill tokens than round_robin", () => {
    const trace = transformTrace(conversation, { requests: 1000 });
    const options = { workers: 8, capacityBlocks: 32_768 };
    const kv = simulate(trace, { policy: "kv_aware_model", ...options });
    const rr = simulate(trace, { policy: "round_robin", ...options });
    expect(kv.hit_rate).toBeGreaterThan(rr.hit_rate);
    expect(kv.prefill_tokens).toBeLessThan(rr.prefill_tokens);
    expect(kv.ttft_p99_ms).toBeLessThan(rr.ttft_p99_ms);
  });
});
