// Goal: routing follows Dynamo's cost model and selection rule (reference §5.2/§5.3)
// exactly: costs computed by hand, reservoir tie-breaking, softmax probabilities,
// per-request overrides, the degraded-worker discount; misses spread by load instead
// of landing on one worker, and a hot worker sheds load to cold ones.
// Method: a Router with real sequence hashes, injected RNG and clock; a randomized
// run compared with an independent reference computation of every candidate's cost.
import { describe, expect, test } from "bun:test";
import { xorshift32 as prng } from "../../src/util/random";
import { DEFAULT_SEED } from "../../src/hash";
import { KvedgeError } from "../../src/domain/errors";
import {
  CandidateList,
  type Overlaps,
  overlapsOf,
  promptHashes,
  type RouteDecision,
  type RouteRequest,
  Router,
  type RouterOptions,
} from "../../src/route";
import { removeWorker } from "../support/workers";

const BS = 4;

function request(tokens: readonly number[], extra: Partial<RouteRequest> = {}): RouteRequest {
  const p = promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
  return { chain: p.chain, blockCount: p.blockCount, tokenCount: tokens.length, ...extra };
}

function overlaps(entries: [slot: number, blocks: number][]): Overlaps {
  return {
    count: entries.length,
    slots: entries.map((e) => e[0]),
    blocks: entries.map((e) => e[1]),
  };
}

function routerWith(workers: number, options: Partial<RouterOptions> = {}): Router {
  const router = new Router({ blockSize: BS, now: () => 0, ...options });
  for (let i = 0; i < workers; i++) router.load.table.acquire(BigInt(100 + i), 0);
  return router;
}

/** Uniform [0, 1) from the shared xorshift PRNG. */
function seeded(seed: number): () => number {
  const next = prng(seed);
  return () => next() / 2 ** 32;
}

const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

describe("cost model", () => {
  // Request: 18 tokens = 4 complete blocks (+ 2 tokens).
  // A (slot 0): overlap 3, idle.
  // B (slot 1): overlap 0; one active request of 8 tokens sharing R's first 2 blocks.
  // C (slot 2): overlap 4 but degraded (x0.5 = 2), idle.
  function scenario(options: Partial<RouterOptions> = {}) {
    const router = routerWith(3, { random: () => 0.99, ...options });
    router.route(request(range(8)), overlaps([[1, 99]])); // lands on B (full overlap credit)
    router.load.setDegraded(2, true);
    return router;
  }
  const R = range(18);
  const costsOf = (decision: RouteDecision) =>
    Object.fromEntries(
      decision.candidates.toArray().map((c) => [Number(c.workerId) - 100, c.cost]),
    );

  test("defaults: prefill blocks minus credited overlap, plus new decode blocks", () => {
    const router = scenario();
    expect(router.load.activePrefillTokens[1]).toBe(0); // 8 tokens, all credited
    expect(router.load.activeDecodeBlocks[1]).toBe(2);
    const decision = router.route(
      request(R, { candidatesMax: 3 }),
      overlaps([
        [0, 3],
        [2, 4],
      ]),
    );
    // A: max(0, 18/4 - 3) + (0 + 4 - 0)    = 5.5
    // B: max(0, (0 + 18)/4 - 0) + (2 + 4 - 2) = 8.5
    // C: max(0, 18/4 - 0.5 * 4) + 4          = 6.5
    expect(costsOf(decision)).toEqual({ 0: 5.5, 1: 8.5, 2: 6.5 });
    expect(decision.workerId).toBe(100n);
    expect(decision.overlapBlocks).toBe(3);
    expect(decision.cost).toBe(5.5);
    expect(decision.candidates.toArray().map((c) => c.cost)).toEqual([5.5, 6.5, 8.5]);
    expect(decision.candidates.at(1)).toMatchObject({
      workerId: 102n,
      overlapBlocks: 4,
      degraded: true,
    });
    // Admission: 18 - 3 * 4 cached = 6 prefill tokens, 4 new blocks.
    expect(router.load.activePrefillTokens[0]).toBe(6);
    expect(router.load.activeDecodeBlocks[0]).toBe(4);
  });

  test("queued prefill tokens raise the prefill term", () => {
    const router = routerWith(2, { random: () => 0.99 });
    router.route(request(range(10, 500)), overlaps([])); // 10 uncached tokens on A (tie -> first)
    expect(router.load.activePrefillTokens[0]).toBe(10);
    const decision = router.route(request(R, { candidatesMax: 2 }), overlaps([[0, 4]]));
    // A: (10 + 18)/4 - 4 = 3, decode 2 + 4 = 6 -> 9; B: 4.5 + 4 = 8.5
    expect(costsOf(decision)).toEqual({ 0: 9, 1: 8.5 });
    expect(decision.workerId).toBe(101n);
  });

  test("per-request overrides of credit, prefill scale and temperature", () => {
    const noCredit = scenario().route(
      request(R, { candidatesMax: 3, overlapScoreCredit: 0 }),
      overlaps([
        [0, 3],
        [2, 4],
      ]),
    );
    expect(costsOf(noCredit)).toEqual({ 0: 8.5, 1: 8.5, 2: 8.5 });
    const scaled = scenario().route(
      request(R, { candidatesMax: 3, prefillLoadScale: 2 }),
      overlaps([
        [0, 3],
        [2, 4],
      ]),
    );
    expect(costsOf(scaled)).toEqual({ 0: 7, 1: 13, 2: 9 });
    // Temperature 1: p ∝ exp(-(c - 5.5) / 3) over A, B, C = 1, e^-1, e^-1/3; cumulative
    // 0.480, 0.656, 1. u = 0.6 picks the costliest worker, B.
    const warm = scenario({ random: () => 0.6 }).route(
      request(R, { temperature: 1 }),
      overlaps([
        [0, 3],
        [2, 4],
      ]),
    );
    expect(warm.workerId).toBe(101n);
  });

  test("decode_active_request_weight charges per active request", () => {
    const router = scenario({ weights: { decodeActiveRequestWeight: 10 } });
    const decision = router.route(
      request(R, { candidatesMax: 3 }),
      overlaps([
        [0, 3],
        [2, 4],
      ]),
    );
    expect(costsOf(decision)).toEqual({ 0: 5.5, 1: 18.5, 2: 6.5 });
  });

  test("overlap credit decays with prefill queued above the least busy worker", () => {
    const router = routerWith(2, { random: () => 0.99, weights: { overlapScoreCreditDecay: 1 } });
    router.route(request(range(8, 500)), overlaps([])); // A: 8 queued prefill tokens
    const decision = router.route(
      request(R, { candidatesMax: 2 }),
      overlaps([
        [0, 2],
        [1, 2],
      ]),
    );
    // A: decay = 1 / (1 + 1 * ((8 - 0) / 4) / ceil(18 / 4)) = 5/7;
    //    prefill = (8 + 18)/4 - 2 * 5/7; decode = 2 + 4. B: 18/4 - 2 + 4.
    const costs = costsOf(decision);
    expect(costs[0]).toBeCloseTo(6.5 - 10 / 7 + 6, 12);
    expect(costs[1]).toBe(6.5);
  });

  test("a degraded worker's overlap is discounted, never ignored, never excluded", () => {
    const router = routerWith(2, { random: () => 0.99 });
    router.load.setDegraded(0, true);
    // Same overlap: the healthy worker wins.
    expect(
      router.route(
        request(R),
        overlaps([
          [0, 4],
          [1, 4],
        ]),
      ).workerId,
    ).toBe(101n);
    // Degraded with overlap vs healthy without: the discounted credit still wins.
    const fresh = routerWith(2, { random: () => 0.99 });
    fresh.load.setDegraded(0, true);
    const d = fresh.route(request(R, { candidatesMax: 2 }), overlaps([[0, 4]]));
    expect(d.workerId).toBe(100n);
    expect(fresh.load.activePrefillTokens[0]).toBe(18 - 8); // 2 of 4 blocks counted as cached
    // Weight 0 treats the overlap as absent; the worker stays a candidate.
    const zero = routerWith(1, { weights: { degradedOverlapWeight: 0 } });
    zero.load.setDegraded(0, true);
    expect(zero.route(request(R, { candidatesMax: 1 }), overlaps([[0, 4]])).cost).toBe(4.5 + 4);
  });

  test("overlapsOf maps (worker_id, dp_rank) scores to slots and skips unknown workers", () => {
    const router = routerWith(3);
    const big = 2n ** 64n - 1n;
    router.load.table.acquire(big, 5);
    const input = overlapsOf(router.load.table, [
      { workerId: big, dpRank: 5, blocks: 3 },
      { workerId: 101n, dpRank: 0, blocks: 2 },
      { workerId: 101n, dpRank: 1, blocks: 4 },
    ]);
    expect(input.count).toBe(2);
    expect(Array.from(input.slots).slice(0, 2)).toEqual([3, 1]);
    expect(Array.from(input.blocks).slice(0, 2)).toEqual([3, 2]);
    expect(input.unknown).toBe(1);
    const decision = router.route(request(R, { candidatesMax: 4 }), input);
    expect(decision.workerId).toBe(big);
    expect(decision.dpRank).toBe(5);
  });

  test("overlaps of unknown slots are ignored and overlaps are clamped to the prompt", () => {
    const router = routerWith(2);
    removeWorker(router.load, 101n, 0);
    const decision = router.route(
      request(R, { candidatesMax: 5 }),
      overlaps([
        [1, 4],
        [7, 4],
        [-1, 4],
        [0, 50],
      ]),
    );
    expect(decision.candidates.count).toBe(1);
    expect(decision.overlapBlocks).toBe(4);
  });
});

describe("selection", () => {
  test("exact ties: reservoir sampling keeps the k-th tie with probability 1/k", () => {
    const neverReplace = routerWith(3, { random: () => 0.9 });
    expect(neverReplace.route(request(R3()), overlaps([])).slot).toBe(0);
    const alwaysReplace = routerWith(3, { random: () => 0 });
    expect(alwaysReplace.route(request(R3()), overlaps([])).slot).toBe(2);
    // Tie 2 kept if u < 1/2, tie 3 kept if u < 1/3.
    const draws = [0.4, 0.34];
    const middle = routerWith(3, { random: () => draws.shift()! });
    expect(middle.route(request(R3()), overlaps([])).slot).toBe(1);
  });

  test("ties are broken uniformly (4 idle workers, 8000 decisions)", () => {
    const router = routerWith(4, { random: seeded(11) });
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < 8000; i++) {
      const d = router.route(request(R3()), overlaps([]));
      counts[d.slot]!++;
      router.load.done(d.requestId);
    }
    for (const count of counts) expect(Math.abs(count - 2000)).toBeLessThan(150);
  });

  test("softmax: p ∝ exp(-(c - min) / ((max - min) T)); uniform when costs are equal", () => {
    // Costs 5.5 (A) and 6.5 (B), T = 1: p(A) = 1 / (1 + e^-1) = 0.7311.
    const pick = (u: number) => {
      const router = routerWith(2, { random: () => u, weights: { temperature: 1 } });
      return router.route(
        request(range(18)),
        overlaps([
          [0, 3],
          [1, 2],
        ]),
      ).slot;
    };
    expect(pick(0.731)).toBe(0);
    expect(pick(0.7312)).toBe(1);
    const uniform = (u: number) =>
      routerWith(4, { random: () => u, weights: { temperature: 2 } }).route(
        request(R3()),
        overlaps([]),
      ).slot;
    // The first index whose cumulative probability (k + 1) / 4 reaches u.
    expect([0, 0.25, 0.2501, 0.5, 0.7501, 0.9999].map(uniform)).toEqual([0, 0, 1, 1, 3, 3]);
  });

  test("softmax sampling frequencies match the distribution (T = 0.5, 3 workers)", () => {
    const router = routerWith(3, { random: seeded(5), weights: { temperature: 0.5 } });
    const counts = [0, 0, 0];
    const costs = [18 / 4 - 4 + 4, 18 / 4 - 2 + 4, 18 / 4 + 4]; // overlaps 4, 2, 0
    const n = 20_000;
    for (let i = 0; i < n; i++) {
      const d = router.route(
        request(range(18)),
        overlaps([
          [0, 4],
          [1, 2],
        ]),
      );
      counts[d.slot]!++;
      router.load.done(d.requestId);
    }
    const [min, max] = [Math.min(...costs), Math.max(...costs)];
    const weights = costs.map((c) => Math.exp(-(c - min) / ((max - min) * 0.5)));
    const total = weights.reduce((a, b) => a + b);
    for (let i = 0; i < 3; i++)
      expect(Math.abs(counts[i]! / n - weights[i]! / total)).toBeLessThan(0.015);
  });

  test("misses spread over all workers by load, never all to the first one", () => {
    const router = routerWith(8, { random: seeded(3) });
    const counts = new Array(8).fill(0);
    for (let i = 0; i < 800; i++)
      counts[router.route(request(range(64, 1000 * i)), overlaps([])).slot]++;
    expect(Math.max(...counts) - Math.min(...counts)).toBeLessThanOrEqual(1);
  });

  test("a hot worker sheds load: a shared prefix cached on one worker spills as it fills", () => {
    const router = routerWith(4, { random: seeded(9) });
    const prefix = range(128); // 32 blocks cached on slot 0
    const routed: number[] = [];
    for (let i = 0; i < 64; i++) {
      const tokens = [...prefix, ...range(32, 10_000 + 100 * i)]; // + 8 unique blocks
      routed.push(router.route(request(tokens), overlaps([[0, 32]])).slot);
    }
    // 1st: A 8 + 40 = 48 vs 80 elsewhere; 2nd: A 16 + 48 = 64; 3rd: A 24 + 56 = 80, a tie.
    expect(routed.slice(0, 2)).toEqual([0, 0]); // the cache wins at first
    const elsewhere = routed.filter((slot) => slot !== 0).length;
    expect(elsewhere).toBeGreaterThan(16); // then load pushes requests to cold workers
    expect(routed.filter((slot) => slot === 0).length).toBeGreaterThan(8); // but the hot one keeps its share
  });

  test("errors: no workers, duplicate id, bad overrides, bad shapes", () => {
    const empty = new Router({ blockSize: BS });
    expect(() => empty.route(request(R3()), overlaps([]))).toThrow(KvedgeError);
    const router = routerWith(1);
    router.route(request(R3(), { requestId: "x" }), overlaps([]));
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (error) {
        return error instanceof KvedgeError ? error.code : String(error);
      }
      return "no error";
    };
    expect(code(() => empty.route(request(R3()), overlaps([])))).toBe("no_workers");
    expect(code(() => router.route(request(R3(), { requestId: "x" }), overlaps([])))).toBe(
      "duplicate_request",
    );
    expect(code(() => router.route(request(R3(), { requestId: "" }), overlaps([])))).toBe(
      "bad_request",
    );
    expect(
      code(() => router.route(request(R3(), { requestId: "y".repeat(257) }), overlaps([]))),
    ).toBe("bad_request");
    expect(code(() => router.route(request(R3(), { temperature: -1 }), overlaps([])))).toBe(
      "bad_request",
    );
    expect(
      code(() => router.route(request(R3(), { overlapScoreCredit: Number.NaN }), overlaps([]))),
    ).toBe("bad_request");
    expect(
      code(() => router.route(request(R3(), { prefillLoadScale: Infinity }), overlaps([]))),
    ).toBe("bad_request");
    expect(
      code(() => router.route(request(R3(), { expectedOutputTokens: 1.5 }), overlaps([]))),
    ).toBe("bad_request");
    expect(code(() => router.route({ ...request(R3()), blockCount: 9 }, overlaps([])))).toBe(
      "bad_request",
    );
    expect(code(() => router.route({ ...request(R3()), tokenCount: 3 }, overlaps([])))).toBe(
      "bad_request",
    );
    expect(router.load.activeRequestCount).toBe(1); // refused requests leave no load
    expect(() => new Router({ blockSize: BS, weights: { degradedOverlapWeight: 2 } })).toThrow(
      /at most 1/,
    );
    expect(() => new Router({ blockSize: BS, weights: { temperature: -1 } })).toThrow(
      /temperature/,
    );
  });

  test("an empty prompt routes by load alone", () => {
    const router = routerWith(2, { random: () => 0.99 });
    const d = router.route(
      { chain: new Uint32Array(0), blockCount: 0, tokenCount: 0 },
      overlaps([]),
    );
    expect(d.cost).toBe(0);
    expect(router.load.done(d.requestId)).toBe("ok");
  });
});

function R3(): number[] {
  return range(12);
}

describe("randomized run against a reference cost computation", () => {
  // The reference keeps each worker's active requests as lists of block keys and
  // computes every term from its definition: distinct blocks by Set, shared depth by
  // longest common prefix with any active request.
  interface RefRequest {
    id: string;
    slot: number;
    keys: string[];
    prefill: number;
    outputBlocks: number;
  }

  test("every candidate's cost and the pick agree through churn", () => {
    const random = seeded(2024);
    const next = prng(77);
    const trackOutputBlocks = true;
    const weights = {
      overlapScoreCreditDecay: 0.5,
      decodeActiveRequestWeight: 0.25,
      degradedOverlapWeight: 0.5,
    };
    const router = new Router({ blockSize: BS, now: () => 0, random, trackOutputBlocks, weights });
    const refs = new Map<string, RefRequest>();
    const families = range(6).map((f) => range(4 * (2 + f * 3), 100_000 * (f + 1)));
    const workerIds: bigint[] = [];
    const addWorker = () => {
      const id = BigInt(next());
      workerIds.push(id);
      router.load.table.acquire(id, next() % 2);
    };
    for (let i = 0; i < 12; i++) addWorker();
    for (let step = 0; step < 1500; step++) {
      const action = next() % 20;
      if (action === 0 && router.load.liveCount > 2) {
        const w = router.load.workers()[next() % router.load.liveCount]!;
        removeWorker(router.load, w.workerId, w.dpRank);
        for (const [id, r] of refs) if (r.slot === w.slot) refs.delete(id);
        continue;
      }
      if (action === 1) {
        addWorker();
        continue;
      }
      if (action === 2) {
        const w = router.load.workers()[next() % router.load.liveCount]!;
        router.load.setDegraded(w.slot, !w.degraded);
        continue;
      }
      if (action < 8 && refs.size > 0) {
        const ids = [...refs.keys()];
        const id = ids[next() % ids.length]!;
        if (action < 5) {
          expect(router.load.prefillDone(id)).toBe("ok");
          refs.get(id)!.prefill = 0;
        } else {
          expect(router.load.done(id)).toBe("ok");
          refs.delete(id);
        }
        continue;
      }
      // Route: a family prefix (partly) plus a unique tail and a ragged end.
      const family = families[next() % families.length]!;
      const tokens = [
        ...family.slice(0, next() % (family.length + 1)),
        ...range(next() % 24, 1_000_000 + step * 100),
      ];
      const req = request(tokens, { candidatesMax: 1000, expectedOutputTokens: next() % 50 });
      const live = router.load.workers();
      const entries: [number, number][] = live
        .filter(() => next() % 3 === 0)
        .map((w) => [w.slot, next() % (req.blockCount + 1)]);
      const decision = router.route(req, overlaps(entries));

      const keys = range(req.blockCount).map((i) => `${req.chain[2 * i]}:${req.chain[2 * i + 1]}`);
      const overlapOf = new Map(entries.map(([slot, blocks]) => [slot, blocks]));
      const active = live.map((w) => [...refs.values()].filter((r) => r.slot === w.slot));
      const prefillOf = active.map((rs) => rs.reduce((sum, r) => sum + r.prefill, 0));
      const minPrefill = Math.min(...prefillOf);
      const expected = live.map((w, i) => {
        const distinct = new Set(active[i]!.flatMap((r) => r.keys)).size;
        const output = active[i]!.reduce((sum, r) => sum + r.outputBlocks, 0);
        const depth = Math.max(
          0,
          ...active[i]!.map((r) => {
            let d = 0;
            while (d < keys.length && d < r.keys.length && r.keys[d] === keys[d]) d++;
            return d;
          }),
        );
        const held = (overlapOf.get(w.slot) ?? 0) * (w.degraded ? 0.5 : 1);
        const requestBlocks = Math.ceil(tokens.length / BS);
        const decay =
          requestBlocks > 0
            ? 1 / (1 + (0.5 * ((prefillOf[i]! - minPrefill) / BS)) / requestBlocks)
            : 1;
        const prefill = Math.max(0, (prefillOf[i]! + tokens.length) / BS - decay * held);
        return {
          slot: w.slot,
          cost: prefill + distinct + output + (keys.length - depth) + 0.25 * active[i]!.length,
          held,
          depth,
        };
      });
      expect(decision.candidates.count).toBe(live.length);
      const bySlot = new Map(expected.map((e) => [e.slot, e]));
      for (const c of decision.candidates.toArray()) {
        const slot = router.load.table.find(c.workerId, c.dpRank);
        expect(c.cost).toBeCloseTo(bySlot.get(slot)!.cost, 9);
      }
      const minCost = Math.min(...expected.map((e) => e.cost));
      expect(decision.cost).toBeCloseTo(minCost, 9);
      // Admitted with what counts as cached: the trusted overlap or, pending credit on
      // (the default), the blocks the worker's active requests cover, if more.
      const chosen = bySlot.get(decision.slot)!;
      const held = Math.max(chosen.held, chosen.depth);
      expect(decision.creditedBlocks).toBe(held);
      expect(decision.pendingBlocks).toBe(chosen.depth);
      refs.set(decision.requestId, {
        id: decision.requestId,
        slot: decision.slot,
        keys,
        prefill: Math.max(0, tokens.length - Math.min(tokens.length, Math.round(held * BS))),
        outputBlocks: Math.ceil((req.expectedOutputTokens ?? 0) / BS),
      });
      if (step % 50 === 0) router.load.verify();
    }
    for (const id of refs.keys()) router.load.done(id);
    router.load.verify();
    expect(router.load.blocks.nodeCount).toBe(0);
    for (const w of router.load.workers()) {
      expect([w.activeRequests, w.activePrefillTokens, w.activeDecodeBlocks]).toEqual([0, 0, 0]);
    }
  });
});

describe("candidates", () => {
  test("the k cheapest are the first k of a stable sort by cost over the live slots, ties included", () => {
    const random = seeded(11);
    // 40 workers with coarse loads, so many costs tie; a removed and re-added worker
    // makes the live-slot order differ from the slot order.
    const router = routerWith(40, { random });
    removeWorker(router.load, 105n, 0);
    router.load.table.acquire(205n, 0);
    for (let step = 0; step < 300; step++) {
      const tokens = range(8 + 4 * Math.floor(random() * 6), 1000 * Math.floor(random() * 5));
      const hits = overlaps([[Math.floor(random() * 40), Math.floor(random() * 3)]]);
      const all = router.route(
        request(tokens, { candidatesMax: 64, requestId: `all-${step}` }),
        hits,
      );
      router.load.done(all.requestId);
      const liveOrder = Array.from(router.load.liveSlots.subarray(0, router.load.liveCount));
      const slotOf = (c: { workerId: bigint; dpRank: number }) =>
        router.load.table.find(c.workerId, c.dpRank);
      const expected = all.candidates
        .toArray()
        .sort(
          (a, b) => a.cost - b.cost || liveOrder.indexOf(slotOf(a)) - liveOrder.indexOf(slotOf(b)),
        );
      expect(all.candidates.toArray().map(slotOf)).toEqual(expected.map(slotOf));
      const k = 1 + Math.floor(random() * 6);
      const some = router.route(
        request(tokens, { candidatesMax: k, requestId: `some-${step}` }),
        hits,
      );
      expect(some.candidates.toArray().map(slotOf)).toEqual(
        all.candidates.toArray().slice(0, k).map(slotOf),
      );
      if (random() < 0.5) router.load.done(some.requestId);
    }
  });

  test("a list reused for every decision holds exactly what a fresh list would, and the load before admission", () => {
    // Two routers fed the same requests and tie-breaks: one fills a fresh list per
    // decision, the other one list, reused (as the core does). Counts go up and down.
    const fresh = routerWith(12, { random: seeded(5) });
    const reusing = routerWith(12, { random: seeded(5) });
    const list = new CandidateList();
    const random = seeded(6);
    for (let step = 0; step < 200; step++) {
      const tokens = range(4 + Math.floor(random() * 40), 1000 * Math.floor(random() * 4));
      const hits = overlaps([[Math.floor(random() * 12), Math.floor(random() * 4)]]);
      const req = request(tokens, {
        candidatesMax: Math.floor(random() * 14),
        requestId: `r-${step}`,
      });
      const before = fresh.load.workers();
      const a = fresh.route(req, hits);
      const b = reusing.route(req, hits, list);
      expect(b.candidates).toBe(list);
      expect(list.count).toBe(Math.min(req.candidatesMax!, 12));
      expect(list.toArray()).toEqual(a.candidates.toArray());
      for (const c of list.toArray()) {
        const load = before.find((w) => w.slot === c.slot)!;
        expect([c.activeRequests, c.activePrefillTokens, c.activeDecodeBlocks]).toEqual([
          load.activeRequests,
          load.activePrefillTokens,
          load.activeDecodeBlocks,
        ]);
      }
      if (random() < 0.6) {
        fresh.load.done(a.requestId);
        reusing.load.done(b.requestId);
      }
    }
    expect(() => list.at(list.count)).toThrow(RangeError);
  });
});
