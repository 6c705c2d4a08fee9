// Goal: predictions of approximate workers are index writes like any engine's: every
// backend equals the reference on seeded prediction streams (through the differential
// harness, dump/restore and exact emptiness included); each worker's predicted blocks
// stay within its capacity, evicted tail first (no holes); without a capacity they
// expire after the TTL on a fake clock; corrections purge what an LRU engine lost and
// shrink the capacity; predict_at decides when a request's blocks are written; and
// churn gives every byte back (the predictor's own arrays and the index's).
import { describe, expect, test } from "bun:test";
import { WorkerTable } from "../../src/domain/worker-table";
import { DEFAULT_SEED } from "../../src/hash";
import { createIndex } from "../../src/index";
import { MatchResult } from "../../src/index/types";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { promptHashes } from "../../src/route/input";
import { CAPACITY_FLOOR_BLOCKS, PredictedBlocks } from "../../src/route/predicted-blocks";
import { type PredictAt, type PredictionSettings, Predictions } from "../../src/route/predictions";
import type { KvEventSink } from "../../src/ingest/normalize";
import { replay } from "../harness/differential";
import type { HarnessOp } from "../harness/streams";
import { xorshift32 as prng } from "../../src/util/random";

const BS = 4;
const u64 = (hi: number, lo: number): bigint => (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
const list = (words: Uint32Array, first: number, count: number): bigint[] =>
  Array.from({ length: count }, (_, i) =>
    u64(words[2 * (first + i)]!, words[2 * (first + i) + 1]!),
  );

/** A sink that records what predictions write, as harness ops, and applies them to `index` too. */
function recorder(
  table: WorkerTable,
  ops: HarnessOp[],
  index?: ReferenceIndex,
): Pick<KvEventSink, "workerTable" | "storeAt" | "removeAt" | "clearAt"> {
  const at = (slot: number) => ({ worker: table.workerIdOf(slot), rank: table.dpRankOf(slot) });
  const push = (op: HarnessOp) => ops.push(op);
  return {
    workerTable: table,
    storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first) {
      push({
        kind: "stored",
        ...at(slot),
        parent: hasParent ? u64(parentHi, parentLo) : null,
        external: list(external, first, count),
        local: list(local, first, count),
      });
      index?.storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first);
    },
    removeAt(slot, external, count, first) {
      push({ kind: "removed", ...at(slot), external: list(external, first, count) });
      index?.removeAt(slot, external, count, first);
    },
    clearAt(slot) {
      push({ kind: "cleared", ...at(slot) });
      index?.clearAt(slot);
    },
  };
}

function settings(overrides: Partial<PredictionSettings> = {}): PredictionSettings {
  return {
    blockSize: BS,
    predictAt: "prefill_done",
    capacityBlocks: null,
    ttlMs: 120_000,
    maxBlocks: 1 << 20,
    requestTtlMs: 300_000,
    maxPending: 1 << 20,
    ...overrides,
  };
}

/** Prompts: one of a few shared prefixes (part of it), then a tail of its own. */
function prompt(next: () => number, families: Uint32Array[], id: number): Uint32Array {
  const family = families[next() % families.length]!;
  const shared = family.subarray(0, next() % (family.length + 1));
  const tokens = new Uint32Array(shared.length + (next() % 12) * BS + (next() % BS) + 1);
  tokens.set(shared);
  for (let t = shared.length; t < tokens.length; t++) tokens[t] = 1_000_000 * (id + 1) + t;
  return tokens;
}

/** A seeded run of the request lifecycle over 3 approximate workers; the writes as ops. */
function predictionStream(seed: number, steps: number) {
  const next = prng(seed);
  const table = new WorkerTable();
  const oracle = new ReferenceIndex(1, { workers: table });
  const ops: HarnessOp[] = [];
  let now = 0;
  const predictAt: PredictAt = seed % 2 === 0 ? "prefill_done" : "route";
  const predictions = new Predictions(
    recorder(table, ops, oracle),
    settings({ predictAt, ttlMs: 5_000 }),
    () => now,
  );
  const slots = [0, 1, 2].map((w) => table.acquire(BigInt(40 + w), w % 2));
  const capacities = [24, 40, null];
  for (let w = 0; w < slots.length; w++) predictions.enable(slots[w]!, capacities[w]!);
  const families = Array.from({ length: 4 }, (_, f) =>
    Uint32Array.from({ length: (3 + 4 * f) * BS }, (_, t) => 7_000 * (f + 1) + t),
  );
  const queries: bigint[][] = [];
  const active: string[] = [];
  const out = new MatchResult();
  for (let step = 0; step < steps; step++) {
    now += next() % 400;
    const action = next() % 10;
    if (action < 4 || active.length === 0) {
      const id = `r${step}`;
      const tokens = prompt(next, families, step);
      const p = promptHashes(tokens, BS, DEFAULT_SEED);
      queries.push(list(p.local, 0, p.blockCount));
      const slot = slots[next() % slots.length]!;
      oracle.findMatches(p.local, p.blockCount, out);
      let overlap = 0;
      for (let i = 0; i < out.count; i++) if (out.workers[i] === slot) overlap = out.blocks[i]!;
      const pending = next() % 3 === 0 ? p.blockCount : overlap;
      predictions.routed(id, slot, p.local, p.chain, p.blockCount, tokens.length, overlap, pending);
      active.push(id);
    } else if (action < 6) {
      const id = active[next() % active.length]!;
      const cached = next() % 2 === 0 ? null : (next() % 40) * BS;
      predictions.prefillDone(id, cached);
    } else if (action < 7) {
      predictions.observed(active[next() % active.length]!, (next() % 40) * BS);
    } else if (action < 9) {
      predictions.done(active.splice(next() % active.length, 1)[0]!);
    } else {
      const w = next() % slots.length;
      // A worker leaves approximate mode and comes back (an endpoint added, then removed).
      predictions.disable(slots[w]!);
      if (next() % 2 === 0) predictions.enable(slots[w]!, capacities[w]!);
    }
    predictions.tick();
  }
  predictions.blocks.verify();
  return { ops, queries, predictions, table, slots, capacities, oracle };
}

describe("prediction streams on every backend", () => {
  for (const name of ["crtc", "positional"] as const) {
    test(`${name} equals the reference on 120 seeded prediction streams`, () => {
      const seen = { stored: 0, removed: 0, cleared: 0, shortfalls: 0, expired: 0 };
      for (let seed = 1; seed <= 120; seed++) {
        const { ops, queries, predictions } = predictionStream(seed, 160);
        // Predictions write the device tier only.
        for (const op of ops) {
          if (op.kind === "tier_stored" || op.kind === "tier_removed")
            throw new Error(`predictions wrote a lower tier: ${op.kind}`);
          if (op.kind !== "remove_worker") seen[op.kind]++;
        }
        seen.shortfalls += predictions.counters.shortfalls;
        seen.expired += predictions.blocks.counters.expired;
        const divergence = replay(
          { ops, queries },
          { name, create: (options) => createIndex(name, 1, options) },
        );
        if (divergence !== null)
          throw new Error(`seed ${seed}, step ${divergence.step}: ${divergence.message}`);
      }
      // The streams store, evict, clear, correct and expire.
      for (const count of Object.values(seen)) expect(count).toBeGreaterThan(0);
    });
  }

  test("the index holds exactly the predicted blocks, each worker within its capacity", () => {
    for (let seed = 1; seed <= 40; seed++) {
      const { predictions, slots, capacities, table, oracle } = predictionStream(seed, 200);
      const held = new Map(oracle.workers().map((w) => [`${w.workerId}:${w.dpRank}`, w.blocks]));
      slots.forEach((slot, w) => {
        const blocks = predictions.blocks.heldBy(slot);
        expect(held.get(`${table.workerIdOf(slot)}:${table.dpRankOf(slot)}`) ?? 0).toBe(blocks);
        const capacity = predictions.blocks.capacityOf(slot);
        if (capacities[w] !== null && predictions.isApproximate(slot))
          expect(capacity).not.toBeNull();
        if (capacity !== null) expect(blocks).toBeLessThanOrEqual(capacity);
      });
    }
  });
});

/** One predictor over a real crtc, one worker, a fake clock. */
function single(capacity: number | null, overrides: Partial<PredictionSettings> = {}) {
  const table = new WorkerTable();
  const index = createIndex("crtc", BS, { workers: table });
  const clock = { now: 0 };
  const predictions = new Predictions(index, settings(overrides), () => clock.now);
  const slot = table.acquire(7n, 0);
  predictions.enable(slot, capacity);
  const held = (tokens: Uint32Array): number => {
    const p = promptHashes(tokens, BS, DEFAULT_SEED);
    const out = new MatchResult();
    index.findMatches(p.local, p.blockCount, out, p.chain);
    return out.count === 0 ? 0 : out.blocks[0]!;
  };
  const route = (id: string, tokens: Uint32Array, overlap = 0, credited = overlap) => {
    const p = promptHashes(tokens, BS, DEFAULT_SEED);
    predictions.routed(id, slot, p.local, p.chain, p.blockCount, tokens.length, overlap, credited);
  };
  return { table, index, clock, predictions, slot, held, route };
}

const tokensOf = (from: number, blocks: number): Uint32Array =>
  Uint32Array.from({ length: blocks * BS }, (_, t) => from + t);

describe("bounds", () => {
  test("at most the capacity, the oldest chain's tail evicted first: no holes", () => {
    const { predictions, slot, held, route, index } = single(300, { predictAt: "route" });
    const chains = Array.from({ length: 6 }, (_, c) => tokensOf(10_000 * (c + 1), 80));
    for (let c = 0; c < chains.length; c++) route(`r${c}`, chains[c]!);
    expect(predictions.blocks.heldBy(slot)).toBe(300);
    expect(index.stats().blocks).toBe(300);
    // 480 predicted, 180 evicted: chains 0 and 1 wholly (160), then chain 2's last 20.
    expect(chains.map(held)).toEqual([0, 0, 60, 80, 80, 80]);
    // A hit refreshes a chain: chain 2 is now the newest, chain 3 the oldest.
    route("again", chains[2]!.subarray(0, 60 * BS));
    route("more", tokensOf(900_000, 40));
    expect(chains.map(held)).toEqual([0, 0, 60, 40, 80, 80]);
    predictions.blocks.verify();
  });

  test("no capacity known: blocks unused for the TTL expire (fake clock)", () => {
    const { predictions, slot, clock, held, route } = single(null, {
      predictAt: "route",
      ttlMs: 120_000,
    });
    route("a", tokensOf(1, 10));
    clock.now = 60_000;
    route("b", tokensOf(5_000, 10));
    clock.now = 119_000;
    predictions.tick();
    expect(predictions.blocks.heldBy(slot)).toBe(20);
    clock.now = 120_001;
    predictions.tick();
    expect([held(tokensOf(1, 10)), held(tokensOf(5_000, 10))]).toEqual([0, 10]);
    clock.now = 180_001;
    predictions.tick();
    expect(predictions.blocks.heldBy(slot)).toBe(0);
  });

  test("churn gives every byte back: the index's and the predictor's own", () => {
    const { predictions, slot, index, route } = single(1_000, { predictAt: "prefill_done" });
    const freshIndex = createIndex("crtc", BS, { workers: new WorkerTable() }).stats().bytes;
    const fresh = new PredictedBlocks({
      sink: index,
      ttlMs: 1,
      maxBlocks: 1,
      now: () => 0,
    });
    fresh.enable(slot, 1); // the same per-slot arrays
    for (let round = 0; round < 50; round++) {
      for (let r = 0; r < 40; r++) {
        const id = `q${round}-${r}`;
        route(id, tokensOf(100 * (round * 40 + r), 30));
        predictions.prefillDone(id, null);
        predictions.done(id);
      }
    }
    expect(predictions.blocks.heldBy(slot)).toBe(1_000);
    expect(index.stats().blocks).toBe(1_000);
    expect(predictions.records).toBe(0);
    predictions.disable(slot);
    const stats = index.stats();
    expect([stats.blocks, stats.nodes, stats.lookupEntries, stats.edgeWords]).toEqual([0, 0, 0, 0]);
    index.removeWorker(7n);
    expect(index.stats().bytes).toBe(freshIndex);
    expect(predictions.blocks.size).toBe(0);
    expect(predictions.blocks.bytes).toBe(fresh.bytes);
  });
});

describe("when blocks are predicted", () => {
  test("prefill_done: not before the prefill, and never for a request that ended before it", () => {
    const { predictions, held, route } = single(1_000);
    const a = tokensOf(1, 8);
    route("a", a);
    expect(held(a)).toBe(0);
    predictions.prefillDone("a", null);
    expect(held(a)).toBe(8);
    const b = tokensOf(500, 8);
    route("b", b);
    predictions.done("b");
    predictions.prefillDone("b", null);
    expect(held(b)).toBe(0);
    expect(predictions.records).toBe(1);
  });

  test("route: at once", () => {
    const { held, route } = single(1_000, { predictAt: "route" });
    route("a", tokensOf(1, 8));
    expect(held(tokensOf(1, 8))).toBe(8);
  });

  test("an exact worker's requests predict nothing", () => {
    const { predictions, table, index } = single(1_000, { predictAt: "route" });
    const exact = table.acquire(8n, 0);
    const p = promptHashes(tokensOf(1, 8), BS, DEFAULT_SEED);
    predictions.routed("x", exact, p.local, p.chain, p.blockCount, 32, 0, 0);
    expect(index.stats().blocks).toBe(0);
    expect(predictions.records).toBe(0);
  });
});

describe("corrections", () => {
  test("a shortfall purges every block used no later than the deepest predicted one, and shrinks the capacity", () => {
    const { predictions, slot, held, route } = single(2_000, { predictAt: "route" });
    const old = [tokensOf(1, 400), tokensOf(100_000, 400)];
    route("o1", old[0]!);
    route("o2", old[1]!);
    const recent = tokensOf(200_000, 400);
    route("r", recent);
    // A follow-up of o2 predicted to hit 400 blocks; the engine served 100 (it evicted the rest).
    route("f", old[1]!, 400);
    predictions.prefillDone("f", null);
    predictions.observed("f", 100 * BS);
    // Everything used before o2's deepest block went (o1 whole); f's own refresh stays.
    expect(held(old[0]!)).toBe(0);
    expect(held(old[1]!)).toBe(400);
    expect(held(recent)).toBe(400);
    expect(predictions.blocks.capacityOf(slot)).toBe(1_800);
    expect(predictions.counters.shortfalls).toBe(1);
    predictions.observed("f", 0); // one correction per answer
    expect(predictions.counters.shortfalls).toBe(1);
  });

  test("persistent shortfalls shrink the capacity step by step, never below the floor; a surplus grows it back", () => {
    const { predictions, slot, route } = single(4_000, { predictAt: "route" });
    for (let i = 0; i < 60; i++) {
      route(`s${i}`, tokensOf(1, 8), 8);
      predictions.observed(`s${i}`, 0);
      predictions.done(`s${i}`);
    }
    expect(predictions.blocks.capacityOf(slot)).toBe(CAPACITY_FLOOR_BLOCKS);
    route("g", tokensOf(1, 8), 0, 0);
    predictions.prefillDone("g", 8 * BS);
    expect(predictions.counters.surpluses).toBe(1);
    expect(predictions.blocks.capacityOf(slot)).toBe(Math.ceil(CAPACITY_FLOOR_BLOCKS * 1.01));
  });

  test("a shortfall teaches a worker without a capacity one", () => {
    const { predictions, slot, route } = single(null, { predictAt: "route" });
    for (let c = 0; c < 4; c++) route(`c${c}`, tokensOf(10_000 * (c + 1), 100));
    route("f", tokensOf(20_000, 100), 100);
    predictions.observed("f", 0);
    // Chain 1 was not held: chain 0, used before it, went too; 300 blocks are left.
    expect(predictions.blocks.capacityOf(slot)).toBe(300);
  });
});
