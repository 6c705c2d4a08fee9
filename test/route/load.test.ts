// Goal: the request lifecycle (routed -> prefill done -> done) moves exactly the load
// Dynamo's ActiveSequences would; repeated and unknown calls are told apart; requests
// never finished expire after the TTL in one sweep; removing a worker drops its
// requests; every path gives memory back.
// Method: a LoadTracker with a fake clock, requests admitted directly with real
// sequence hashes (src/hash), counters and verify() checked after each step.
import { describe, expect, test } from "bun:test";
import { xorshift32 as prng } from "../../src/util/random";
import { DEFAULT_SEED } from "../../src/hash";
import {
  ActiveBlocks,
  EXPIRE_PER_DECISION,
  FINISHED_REMEMBERED_MAX,
  INITIAL_RECORDS,
  LoadTracker,
  promptHashes,
} from "../../src/route";
import { removeWorker } from "../support/workers";

const BS = 4;

function prompt(...tokens: number[]) {
  return promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
}

function tracker(
  options: { ttlMs?: number; trackOutputBlocks?: boolean; maxActive?: number } = {},
) {
  let nowMs = 1000;
  const load = new LoadTracker({
    blockSize: BS,
    requestTtlMs: options.ttlMs ?? 300_000,
    trackOutputBlocks: options.trackOutputBlocks ?? false,
    maxActiveRequests: options.maxActive,
    now: () => nowMs,
  });
  return { load, advance: (ms: number) => (nowMs += ms) };
}

describe("workers", () => {
  test("slots are dense, idempotent to add, reused after removal", () => {
    const { load } = tracker();
    const a = load.table.acquire(10n, 0);
    const b = load.table.acquire(10n, 1);
    const c = load.table.acquire(2n ** 64n - 1n, 0);
    expect([a, b, c]).toEqual([0, 1, 2]);
    expect(load.table.acquire(10n, 1)).toBe(b);
    expect(load.table.find(2n ** 64n - 1n, 0)).toBe(c);
    expect(load.table.find(10n, 2)).toBe(-1);
    expect(removeWorker(load, 10n, 1)).toBe(true);
    expect(removeWorker(load, 10n, 1)).toBe(false);
    expect(load.liveCount).toBe(2);
    expect(load.table.acquire(11n, 0)).toBe(b);
    expect(load.workers().map((w) => [w.workerId, w.dpRank])).toEqual([
      [10n, 0],
      [2n ** 64n - 1n, 0],
      [11n, 0],
    ]);
  });

  test("rejects ids that are not u64 and ranks that are not u32", () => {
    const { load } = tracker();
    expect(() => load.table.acquire(-1n, 0)).toThrow(/u64/);
    expect(() => load.table.acquire(2n ** 64n, 0)).toThrow(/u64/);
    expect(() => load.table.acquire(1n, -1)).toThrow(/u32/);
    expect(() => load.table.acquire(1n, 0.5)).toThrow(/u32/);
  });

  test("its arrays follow the table past their initial capacity", () => {
    const { load } = tracker();
    for (let i = 0; i < 300; i++) expect(load.table.acquire(BigInt(i), 0)).toBe(i);
    load.syncSlots();
    expect(load.slotCapacity).toBeGreaterThanOrEqual(300);
    expect(load.liveCount).toBe(300);
  });
});

describe("request lifecycle", () => {
  test("prefill tokens until prefill_done, blocks until done", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8, 9, 10); // 2 complete blocks, 10 tokens
    load.admit("a", w, p.chain, p.blockCount, 10, 4, 0); // 4 tokens cached
    expect(load.activePrefillTokens[w]).toBe(6);
    expect(load.activeDecodeBlocks[w]).toBe(2);
    expect(load.activeRequests[w]).toBe(1);
    expect(load.prefillDone("a")).toBe("ok");
    expect(load.prefillDone("a")).toBe("ok"); // idempotent
    expect(load.activePrefillTokens[w]).toBe(0);
    expect(load.activeDecodeBlocks[w]).toBe(2);
    expect(load.done("a")).toBe("ok");
    expect(load.activeDecodeBlocks[w]).toBe(0);
    expect(load.activeRequests[w]).toBe(0);
    expect(load.routedTotal[w]).toBe(1);
    load.verify();
  });

  test("cached tokens beyond the prompt never make prefill load negative", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    load.admit("a", w, p.chain, 1, 4, 400, 0);
    expect(load.activePrefillTokens[w]).toBe(0);
  });

  test("shared prompt blocks count once per worker", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p1 = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    const p2 = prompt(1, 2, 3, 4, 9, 9, 9, 9, 7, 7, 7, 7);
    load.admit("a", w, p1.chain, 2, 8, 0, 0);
    load.admit("b", w, p2.chain, 3, 12, 0, 0);
    expect(load.activeDecodeBlocks[w]).toBe(4);
    load.done("a");
    expect(load.activeDecodeBlocks[w]).toBe(3);
    load.done("b");
    expect(load.activeDecodeBlocks[w]).toBe(0);
    expect(load.blocks.nodeCount).toBe(0);
  });

  test("repeated, late and unknown calls are told apart", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    load.admit("a", w, p.chain, 1, 4, 0, 0);
    expect(load.done("a")).toBe("ok");
    expect(load.done("a")).toBe("already_done");
    expect(load.prefillDone("a")).toBe("already_done");
    expect(load.done("never")).toBe("unknown");
    expect(load.prefillDone("never")).toBe("unknown");
    expect(load.counters).toEqual({
      admitted: 1,
      prefillDone: 0,
      done: 1,
      expired: 0,
      evicted: 0,
      droppedWithWorker: 0,
      unknown: 2,
    });
  });

  test("a clock that goes back keeps the touch list in order (the simulator's model time)", () => {
    const { load, advance } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    load.admit("a", w, p.chain, 1, 4, 0, 0);
    advance(10);
    load.admit("b", w, p.chain, 1, 4, 0, 0);
    advance(-5); // "a"'s prefill_done lands between the two admissions
    expect(load.prefillDone("a")).toBe("ok");
    load.verify();
    advance(1_000_000); // past the TTL: both expire in one sweep, nothing left behind
    load.expireDue();
    expect(load.counters.expired).toBe(2);
    load.verify();
  });

  test("the chain is copied: the caller may reuse its buffer", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    load.admit("a", w, p.chain, 2, 8, 0, 0);
    p.chain.fill(0);
    expect(load.done("a")).toBe("ok");
    expect(load.blocks.nodeCount).toBe(0);
    load.verify();
  });

  test("expected output blocks count as decode load only when tracking is on", () => {
    for (const trackOutputBlocks of [false, true]) {
      const { load } = tracker({ trackOutputBlocks });
      const w = load.table.acquire(1n, 0);
      const p = prompt(1, 2, 3, 4);
      load.admit("a", w, p.chain, 1, 4, 0, 9); // 9 tokens = 3 blocks of 4
      expect(load.activeDecodeBlocks[w]).toBe(trackOutputBlocks ? 4 : 1);
      load.verify();
      load.done("a");
      expect(load.activeDecodeBlocks[w]).toBe(0);
    }
  });

  test("generated ids are unique and unguessable: 128 random bits each, no counter", () => {
    const { load } = tracker();
    const list = Array.from({ length: 1000 }, () => load.newRequestId());
    expect(new Set(list).size).toBe(1000);
    for (const id of list) expect(id).toMatch(/^r-[A-Za-z0-9_-]{22}$/);
    // Consecutive ids share nothing a caller could extrapolate: about half of the 128
    // bits differ between neighbours (a counter would differ in a few low bits).
    // base64url as Buffer reads it: the characters carry the bits in order.
    const bits = (id: string) => Buffer.from(id.slice(2), "base64url");
    for (const id of list) expect(bits(id).toString("base64url")).toBe(id.slice(2));
    let differing = 0;
    for (let i = 1; i < list.length; i++) {
      const [a, b] = [bits(list[i - 1]!), bits(list[i]!)];
      for (let j = 0; j < 16; j++) differing += popcount(a[j]! ^ b[j]!);
    }
    const mean = differing / (list.length - 1);
    expect(mean).toBeGreaterThan(56);
    expect(mean).toBeLessThan(72);
  });

  test("request records are reused under churn and given back to the first size once none is active", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const v = load.table.acquire(2n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    expect(load.recordCapacity).toBe(0);
    for (let i = 0; i < 1000; i++) load.admit(`a${i}`, i % 2 === 0 ? w : v, p.chain, 2, 8, 0, 0);
    const burst = load.recordCapacity;
    expect(burst).toBeGreaterThanOrEqual(1000);
    // Steady churn at 1000 active: no new records.
    for (let i = 0; i < 5000; i++) {
      expect(load.done(`a${i}`)).toBe("ok");
      load.admit(`a${i + 1000}`, i % 2 === 0 ? w : v, p.chain, 2, 8, 0, 0);
    }
    expect(load.recordCapacity).toBe(burst);
    load.verify();
    removeWorker(load, 2n, 0); // half of them, through worker removal
    expect(load.activeRequestCount).toBe(500);
    for (let i = 5000; i < 6000; i += 2) expect(load.done(`a${i}`)).toBe("ok");
    expect(load.activeRequestCount).toBe(0);
    expect(load.recordCapacity).toBe(INITIAL_RECORDS);
    expect(load.idArenaBytes).toBe(tracker().load.idArenaBytes);
    expect(load.blocks.nodeCount).toBe(0);
    expect(load.blocks.reservedBytes).toBe(new ActiveBlocks().reservedBytes);
    load.verify();
  });

  test("past the active-request limit the least recently touched request is evicted", () => {
    const { load, advance } = tracker({ maxActive: 3 });
    const w = load.table.acquire(1n, 0);
    const v = load.table.acquire(2n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    load.admit("a", w, p.chain, 2, 8, 0, 0);
    advance(1);
    load.admit("b", v, p.chain, 2, 8, 0, 0);
    advance(1);
    load.admit("c", w, p.chain, 2, 8, 0, 0);
    advance(1);
    expect(load.prefillDone("a")).toBe("ok"); // touched: "b" is now the oldest
    load.admit("d", v, p.chain, 2, 8, 0, 0);
    expect(load.activeRequestCount).toBe(3);
    expect(load.isActive("b")).toBe(false);
    expect(load.done("b")).toBe("evicted");
    expect(load.prefillDone("b")).toBe("evicted");
    expect(load.counters.evicted).toBe(1);
    expect([load.activeRequests[w], load.activeRequests[v]]).toEqual([2, 1]);
    load.verify();
    // Churn far past the limit: never more than 3 active, and nothing left behind.
    for (let i = 0; i < 1000; i++) load.admit(`x${i}`, i % 2 === 0 ? w : v, p.chain, 2, 8, 0, 0);
    expect(load.activeRequestCount).toBe(3);
    expect(load.counters.evicted).toBe(1001);
    for (const id of ["x997", "x998", "x999"]) expect(load.done(id)).toBe("ok");
    expect(load.activeRequestCount).toBe(0);
    expect(load.blocks.nodeCount).toBe(0);
    expect(load.recordCapacity).toBe(INITIAL_RECORDS);
    load.verify();
    expect(() => tracker({ maxActive: 0 })).toThrow(RangeError);
  });

  test("ids whose keys collide are still told apart, in any order of removal", () => {
    // A hash that gives every id one of two keys: chains of many requests per key.
    const load = new LoadTracker({
      blockSize: BS,
      idHash: (id) => ({ hi: 0, lo: (id.length % 2) << 11 }),
    });
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    const random = prng(11);
    const active = new Set<string>();
    let next = 0;
    for (let step = 0; step < 3000; step++) {
      if (active.size === 0 || random() % 3 !== 0) {
        // Lengths odd and even, and code units above 0xff (ids are kept as UTF-16 units).
        const id = `q${next++}${"é€".repeat(next % 3)}${"x".repeat(next % 40)}`;
        load.admit(id, w, p.chain, 1, 4, 0, 0);
        active.add(id);
      } else {
        const ids = [...active];
        const id = ids[random() % ids.length]!;
        if (random() % 2 !== 0) load.prefillDone(id);
        expect(load.done(id)).toBe("ok");
        active.delete(id);
      }
      if (step % 100 === 0) {
        load.verify();
        for (const id of active) expect(load.isActive(id)).toBe(true);
        expect(load.activeRequestCount).toBe(active.size);
      }
    }
    expect(() => load.admit([...active][0]!, w, p.chain, 1, 4, 0, 0)).toThrow("admitted twice");
    for (const id of active) expect(load.done(id)).toBe("ok");
    expect(load.activeRequestCount).toBe(0);
    load.verify();
  });

  test("a tracker that empties at every request reuses its arrays instead of allocating", () => {
    // A gateway that calls done at once empties the tracker after each request; fresh
    // arrays each time made young collections several times slower.
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    load.admit("first", w, p.chain, 2, 8, 0, 0);
    load.done("first");
    // Every typed array of the tracker and its block tree (the tree's arenas hold theirs in `words`).
    const arrays = (owner: object) =>
      Object.values(owner).flatMap((value: unknown) =>
        ArrayBuffer.isView(value)
          ? [value]
          : typeof value === "object" &&
              value !== null &&
              ArrayBuffer.isView((value as { words?: unknown }).words)
            ? [(value as { words: unknown }).words]
            : [],
      );
    const before = [...arrays(load), ...arrays(load.blocks)];
    for (let i = 0; i < 100; i++) {
      load.admit(`r${i}`, w, p.chain, 2, 8, 0, 0);
      expect(load.done(`r${i}`)).toBe("ok");
    }
    const after = [...arrays(load), ...arrays(load.blocks)];
    expect(after.length).toBe(before.length);
    for (let i = 0; i < before.length; i++) expect(after[i]).toBe(before[i]);
    expect(load.recordCapacity).toBe(INITIAL_RECORDS);
    expect(load.blocks.nodeCount).toBe(0);
    load.verify();
  });

  test("the memory of finished ids is bounded", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    for (let i = 0; i < FINISHED_REMEMBERED_MAX + 10; i++) {
      load.admit(`r${i}`, w, p.chain, 1, 4, 0, 0);
      load.done(`r${i}`);
    }
    expect(load.done("r0")).toBe("unknown"); // forgotten, oldest first
    expect(load.done(`r${FINISHED_REMEMBERED_MAX + 9}`)).toBe("already_done");
    load.verify();
  });

  test("remembered finished ids (kept as 64-bit hashes) answer only for themselves", () => {
    const { load } = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    // Ids a gateway might send: near-identical counters, UUIDs, and ids differing in one character.
    const ids = Array.from({ length: FINISHED_REMEMBERED_MAX }, (_, i) =>
      i % 3 === 0
        ? `req-${i}`
        : i % 3 === 1
          ? `chatcmpl-${crypto.randomUUID()}`
          : `x${"a".repeat(i % 50)}${String.fromCharCode(97 + (i % 26))}${i}`,
    );
    ids.forEach((id, i) => {
      load.admit(id, w, p.chain, 1, 4, 0, 0);
      if (i % 2 === 0) load.done(id);
      else removeWorker(load, 1n, 0) && load.table.acquire(1n, 0);
    });
    for (const [i, id] of ids.entries())
      expect(load.done(id)).toBe(i % 2 === 0 ? "already_done" : "worker_removed");
    // Never-seen ids (including each remembered id with one character changed) stay unknown.
    let unknown = 0;
    for (let i = 0; i < 50_000; i++) {
      const id = i % 2 === 0 ? `req-${FINISHED_REMEMBERED_MAX + i}` : `${ids[i]!.slice(0, -1)}~`;
      if (load.done(id) === "unknown") unknown++;
    }
    expect(unknown).toBe(50_000);
    // Admitting a finished id again makes it active; its memory as finished is dropped.
    load.table.acquire(1n, 0);
    load.admit(ids[0]!, w, p.chain, 1, 4, 0, 0);
    expect(load.prefillDone(ids[0]!)).toBe("ok");
    expect(load.done(ids[0]!)).toBe("ok");
    expect(load.done(ids[0]!)).toBe("already_done");
    load.verify();
  });
});

describe("expiry", () => {
  test("one sweep expires requests idle for the TTL; prefill_done keeps a request alive", () => {
    const { load, advance } = tracker({ ttlMs: 10_000 });
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    load.admit("old", w, p.chain, 1, 4, 0, 0);
    advance(4000);
    load.admit("young", w, p.chain, 1, 4, 0, 0);
    load.admit("refreshed", w, p.chain, 1, 4, 0, 0);
    advance(4000);
    load.prefillDone("old"); // touched at 8 s: now the newest
    advance(4000); // 12 s: "young" and "refreshed" idle for 8 s, "old" for 4 s
    expect(load.sweep()).toBe(0);
    advance(2001); // young/refreshed idle 10.001 s
    expect(load.sweep()).toBe(2);
    expect(load.isActive("old")).toBe(true);
    expect(load.done("young")).toBe("expired");
    expect(load.activeRequests[w]).toBe(1);
    expect(load.counters.expired).toBe(2);
    advance(10_000);
    load.expireDue();
    expect(load.activeRequestCount).toBe(0);
    expect(load.blocks.nodeCount).toBe(0);
    load.verify();
  });

  test("randomized touches: a sweep expires exactly the requests idle for the TTL (against a plain model)", () => {
    const { load, advance } = tracker({ ttlMs: 1000 });
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    const touched = new Map<string, number>(); // the model: id -> last touch
    let now = 1000;
    let seed = 12345;
    const random = () => (seed = (seed * 1_103_515_245 + 12_345) >>> 0) / 2 ** 32;
    for (let step = 0; step < 3000; step++) {
      const r = random();
      if (r < 0.4) {
        const id = `q${step}`;
        load.admit(id, w, p.chain, 2, 8, 0, 0);
        touched.set(id, now);
      } else if (r < 0.7 && touched.size > 0) {
        const ids = [...touched.keys()];
        const id = ids[Math.floor(random() * ids.length)]!;
        expect(load.prefillDone(id)).toBe("ok");
        touched.set(id, now);
      } else if (r < 0.8 && touched.size > 0) {
        const id = [...touched.keys()][0]!;
        expect(load.done(id)).toBe("ok");
        touched.delete(id);
      } else if (r < 0.95) {
        const ms = Math.floor(random() * 300);
        advance(ms);
        now += ms;
      } else {
        const expected = [...touched].filter(([, at]) => now - at >= 1000).map(([id]) => id);
        expect(load.sweep()).toBe(expected.length);
        for (const id of expected) touched.delete(id);
        expect(load.activeRequestCount).toBe(touched.size);
        for (const id of touched.keys()) expect(load.isActive(id)).toBe(true);
      }
    }
    load.verify();
  });

  test("expireDue releases at most EXPIRE_PER_DECISION due requests per call, oldest first", () => {
    const { load, advance } = tracker({ ttlMs: 10_000 });
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    const total = 2 * EXPIRE_PER_DECISION + 5;
    for (let i = 0; i < total; i++) load.admit(`r${i}`, w, p.chain, 1, 4, 0, 0);
    advance(9999);
    load.expireDue(); // nothing due yet
    expect(load.activeRequestCount).toBe(total);
    load.admit("fresh", w, p.chain, 1, 4, 0, 0);
    advance(1);
    load.expireDue();
    expect(load.activeRequestCount).toBe(total + 1 - EXPIRE_PER_DECISION);
    expect(load.isActive("r0")).toBe(false);
    expect(load.isActive(`r${EXPIRE_PER_DECISION}`)).toBe(true); // the next ones wait for the next call
    load.expireDue();
    load.expireDue();
    expect(load.activeRequestCount).toBe(1);
    expect(load.isActive("fresh")).toBe(true);
    expect(load.counters.expired).toBe(total);
    load.verify();
  });

  test("finished ids are forgotten after the TTL", () => {
    const { load, advance } = tracker({ ttlMs: 1000 });
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    load.admit("a", w, p.chain, 1, 4, 0, 0);
    load.done("a");
    advance(1000);
    load.sweep();
    expect(load.done("a")).toBe("unknown");
  });
});

describe("worker removal", () => {
  test("drops the worker's requests and all their load, leaves others alone", () => {
    const { load } = tracker();
    const a = load.table.acquire(1n, 0);
    const b = load.table.acquire(2n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    load.admit("a1", a, p.chain, 2, 8, 0, 0);
    load.admit("a2", a, p.chain, 2, 8, 0, 0);
    load.admit("b1", b, p.chain, 2, 8, 0, 0);
    expect(removeWorker(load, 1n, 0)).toBe(true);
    expect(load.done("a1")).toBe("worker_removed");
    expect(load.counters.droppedWithWorker).toBe(2);
    expect(load.activeRequestCount).toBe(1);
    expect(load.blocks.blockCount).toBe(2);
    expect(load.activeDecodeBlocks[b]).toBe(2);
    const again = load.table.acquire(1n, 0);
    expect(again).toBe(a);
    expect(load.activeRequests[again]).toBe(0);
    expect(load.routedTotal[again]).toBe(0);
    load.verify();
    load.done("b1");
    expect(load.blocks.nodeCount).toBe(0);
  });
});

function popcount(byte: number): number {
  let count = 0;
  for (let b = byte; b !== 0; b &= b - 1) count++;
  return count;
}
