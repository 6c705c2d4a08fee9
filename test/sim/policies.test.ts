// Goal: each routing policy decides as documented, on hand-worked cases: round robin,
// seeded random, least loaded, SGLang's cache_aware (threshold, smallest tree,
// imbalance switch, LRU trimming) and Dynamo's cost on exact overlaps.
import { describe, expect, test } from "bun:test";
import { createPolicy, type RouteQuery } from "../../src/sim/policies";

const BS = 4;

/** A query whose full blocks have path hashes (hi = 0, lo = ids[i]). */
function query(id: number, ids: number[], promptLength = ids.length * BS): RouteQuery {
  const path = new Uint32Array(2 * ids.length);
  ids.forEach((value, i) => {
    path[2 * i + 1] = value;
  });
  return {
    id,
    promptLength,
    path,
    promptBlocks: ids.length,
    tokens: new Uint32Array(promptLength),
  };
}

describe("round_robin and random", () => {
  test("round robin cycles through the workers", () => {
    const policy = createPolicy("round_robin", { workers: 3, blockSize: BS, seed: 1 });
    expect([0, 1, 2, 3, 4, 5, 6].map((id) => policy.route(query(id, [1]), 0))).toEqual([
      0, 1, 2, 0, 1, 2, 0,
    ]);
  });

  test("random is determined by the seed and uses every worker", () => {
    const picks = (seed: number): number[] => {
      const policy = createPolicy("random", { workers: 4, blockSize: BS, seed });
      return Array.from({ length: 200 }, (_, id) => policy.route(query(id, [1]), 0));
    };
    expect(picks(5)).toEqual(picks(5));
    expect(picks(5)).not.toEqual(picks(6));
    expect(new Set(picks(5)).size).toBe(4);
  });
});

describe("least_loaded", () => {
  test("picks the worker with the fewest in-flight requests; finishing frees it", () => {
    const policy = createPolicy("least_loaded", { workers: 3, blockSize: BS, seed: 1 });
    const first = [0, 1, 2].map((id) => policy.route(query(id, [1]), 0));
    expect(new Set(first).size).toBe(3);
    policy.finished(1, 1);
    expect(policy.route(query(3, [1]), 2)).toBe(first[1]!);
  });

  test("ties are broken at random, not always toward worker 0", () => {
    const seen = new Set<number>();
    for (let seed = 0; seed < 40; seed++) {
      seen.add(
        createPolicy("least_loaded", { workers: 4, blockSize: BS, seed }).route(query(0, [1]), 0),
      );
    }
    expect(seen.size).toBe(4);
  });

  test("a finish for a request never routed is a bug, reported loudly", () => {
    const policy = createPolicy("least_loaded", { workers: 2, blockSize: BS, seed: 1 });
    expect(() => policy.finished(9, 0)).toThrow("never routed");
  });
});

describe("approx_prefix (SGLang cache_aware)", () => {
  const config = {
    cacheThreshold: 0.5,
    balanceAbsThreshold: 64,
    balanceRelThreshold: 1.5,
    evictionIntervalMs: 1000,
    maxTreeTokens: 2 ** 26,
  };

  test("misses go to the smallest tree; a match above the threshold goes to its holder", () => {
    const policy = createPolicy("approx_prefix", {
      workers: 3,
      blockSize: BS,
      seed: 1,
      approxPrefix: config,
    });
    expect(policy.route(query(0, [1, 2, 3, 4]), 0)).toBe(0); // all trees empty: the first
    expect(policy.route(query(1, [9, 9, 9]), 0)).toBe(1); // worker 0 now has 16 tokens
    expect(policy.route(query(2, [1, 2, 3, 5]), 0)).toBe(0); // 3/4 matched on worker 0
    expect(policy.route(query(3, [1, 2, 7, 7]), 0)).toBe(2); // 2/4 = 0.5, not above 0.5
    expect(policy.route(query(4, [9, 9, 9, 9]), 0)).toBe(1); // worker 1 holds 3/4
  });

  test("the most recent holder wins when several hold the longest match", () => {
    const policy = createPolicy("approx_prefix", {
      workers: 3,
      blockSize: BS,
      seed: 1,
      approxPrefix: config,
    });
    policy.route(query(0, [1, 2, 3]), 0); // worker 0
    expect(policy.route(query(1, [8]), 0)).toBe(1); // trees 12, 0, 0 tokens
    expect(policy.route(query(2, [20, 21]), 0)).toBe(2); // trees 12, 4, 0
    // 3 of 6 blocks matched is not above 0.5: the smallest tree (worker 1, 4 tokens).
    expect(policy.route(query(3, [1, 2, 3, 4, 5, 6]), 0)).toBe(1);
    expect(policy.route(query(4, [1, 2, 3, 9]), 0)).toBe(1); // workers 0 and 1 hold [1,2,3]; 1 is newer
  });

  test("imbalance (max − min > abs and max > rel × min in-flight requests) routes to the least loaded", () => {
    const policy = createPolicy("approx_prefix", {
      workers: 2,
      blockSize: BS,
      seed: 1,
      approxPrefix: { ...config, balanceAbsThreshold: 2 },
    });
    // The check runs before each decision on loads (0,0), (1,0), (2,0): balanced, the
    // prefix sticks to worker 0; at (3,0) 3 − 0 > 2 and 3 > 1.5 × 0: least loaded.
    expect([0, 1, 2, 3].map((id) => policy.route(query(id, [1, 2]), 0))).toEqual([0, 0, 0, 1]);
    policy.finished(0, 1);
    policy.finished(1, 1);
    // Loads (1,1): balanced again. The imbalanced decision was inserted too, so both
    // trees hold [1,2]; the more recent holder (worker 1) wins.
    expect(policy.route(query(4, [1, 2]), 1)).toBe(1);
  });

  test("trees above maxTreeTokens are trimmed at the eviction interval, leaves first", () => {
    const policy = createPolicy("approx_prefix", {
      workers: 2,
      blockSize: BS,
      seed: 1,
      approxPrefix: { ...config, maxTreeTokens: 3 * BS },
    }) as ReturnType<typeof createPolicy> & { treeBlocks(worker: number): number };
    policy.route(query(0, [1, 2, 3, 4, 5]), 0); // worker 0: 5 blocks
    expect(policy.treeBlocks(0)).toBe(5);
    policy.route(query(1, [7]), 500); // before the interval: nothing trimmed
    expect(policy.treeBlocks(0)).toBe(5);
    policy.route(query(2, [8]), 1000); // due: worker 0 keeps 3 blocks, losing its leaves [4, 5]
    expect(policy.treeBlocks(0)).toBe(3);
    expect(policy.route(query(3, [1, 2, 3, 6]), 1000)).toBe(0); // [1,2,3] survived: 3/4 matched
  });
});

describe("kv_aware_model with route policy dynamo (Dynamo's cost on exact overlaps, through the real Router)", () => {
  const dynamo = { policy: "dynamo" } as const;
  test("hand-worked costs: overlap credit, then prefill and decode load", () => {
    const overlaps = new Map<number, number[]>([
      [0, [3, 0]],
      [1, [0, 0]],
      [2, [0, 0]],
    ]);
    const policy = createPolicy("kv_aware_model", {
      workers: 2,
      blockSize: BS,
      seed: 1,
      probe: (worker, q) => overlaps.get(q.id)![worker]!,
      kvAware: dynamo,
    });
    // Request 0 (16 tokens): w0 = max(0, 16/4 − 3) + (0 + 4) = 5; w1 = 4 + 4 = 8.
    expect(policy.route(query(0, [1, 2, 3, 4]), 0)).toBe(0);
    // Request 1 (16 tokens, no overlap): w0 = (4 + 16)/4 + (4 + 4) = 13; w1 = 4 + 4 = 8.
    expect(policy.route(query(1, [5, 6, 7, 8]), 0)).toBe(1);
    // Request 2 shares [1,2] with request 0's active blocks on w0:
    // w0 = (4 + 8)/4 + (4 + 2 − 2) = 7; w1 = (16 + 8)/4 + (4 + 2) = 12.
    expect(policy.route(query(2, [1, 2], 8), 0)).toBe(0);
  });

  test("prefill completion and finish release the load they added", () => {
    const policy = createPolicy("kv_aware_model", {
      workers: 2,
      blockSize: BS,
      seed: 3,
      probe: () => 0,
      kvAware: dynamo,
    });
    const first = policy.route(query(0, [1, 2, 3, 4]), 0); // tie 8 vs 8: broken at random
    expect(policy.route(query(1, [5, 6, 7, 8]), 0)).toBe(1 - first); // (4+16)/4 + 8 = 13 vs 8
    policy.prefillDone(0, 1);
    policy.finished(0, 2);
    policy.prefillDone(1, 1);
    // The first worker is empty again (cost 8); the other still decodes 4 blocks (cost 12).
    expect(policy.route(query(2, [9, 10, 11, 12]), 3)).toBe(first);
    expect(() => policy.finished(7, 0)).toThrow("never routed");
  });
});
