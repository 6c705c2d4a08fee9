// Goal: a tracker that applies its peers' facts, tagged by origin, holds the fleet's load:
// two trackers that relay each other's facts have equal per-worker load after every
// step (whatever their slot numbering), own and peers' parts add up (verify()), an
// origin's requests go at once when it is closed, every path gives memory back, and
// the own facts reported are exactly the own lifecycle (routed, prefill done, each end).
// Method: LoadTrackers on one fake clock; facts relayed synchronously by worker
// identity (as src/cluster does over the bus); randomized lifecycles on a seeded PRNG.
import { describe, expect, test } from "bun:test";
import { DEFAULT_SEED } from "../../src/hash";
import { INITIAL_RECORDS, LoadTracker, promptHashes } from "../../src/route";
import type { EndReason, OwnFacts } from "../../src/route/load";
import { xorshift32 } from "../../src/util/random";
import { removeWorker } from "../support/workers";

const BS = 4;

function prompt(...tokens: number[]) {
  return promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
}

const clock = { nowMs: 1000 };
/** Uniform in [0, 1), seeded. */
function prng(seed: number): () => number {
  const next = xorshift32(seed);
  return () => next() / 2 ** 32;
}

function tracker(options: { ttlMs?: number; maxActive?: number } = {}): LoadTracker {
  return new LoadTracker({
    blockSize: BS,
    requestTtlMs: options.ttlMs ?? 300_000,
    maxActiveRequests: options.maxActive,
    now: () => clock.nowMs,
  });
}

/**
 * `from`'s own facts applied to `to` as the requests of origin `origin`: with their
 * chains, or (`chains` false) with the decode blocks each added and freed.
 */
function relay(from: LoadTracker, to: LoadTracker, origin: number, chains: boolean): void {
  const slotThere = (slot: number) =>
    to.table.find(from.table.workerIdOf(slot), from.dpRanks[slot]!);
  const key = (handle: number) => `h${handle}`;
  from.facts = {
    routed: (handle, slot, chain, blocks, prefill, output, added) =>
      chains
        ? to.peerRouted(origin, key(handle), slotThere(slot), chain, blocks, prefill, output)
        : to.peerRouted(origin, key(handle), slotThere(slot), chain, 0, prefill, output, added),
    prefillDone: (handle) => void to.peerPrefillDone(origin, key(handle)),
    ended: (handle, _reason, freed) => void to.peerEnded(origin, key(handle), freed),
  };
}

function loadOf(load: LoadTracker): string[] {
  return load
    .workers()
    .map(
      (w) =>
        `${w.workerId}:${w.dpRank} ${w.activeRequests} ${w.activePrefillTokens} ${w.activeDecodeBlocks}`,
    )
    .sort();
}

describe("own facts", () => {
  test("every change of an own request is reported once, with the load it adds", () => {
    const load = tracker({ ttlMs: 1000, maxActive: 2 });
    const seen: string[] = [];
    load.facts = {
      routed: (handle, slot, _chain, blocks, prefill, output, added) =>
        seen.push(`routed ${handle} ${slot} ${blocks} ${prefill} ${output} +${added}`),
      prefillDone: (handle) => seen.push(`prefill ${handle}`),
      ended: (handle, reason: EndReason, freed) => seen.push(`ended ${handle} ${reason} -${freed}`),
    } satisfies OwnFacts;
    const w = load.table.acquire(1n, 0);
    const v = load.table.acquire(2n, 0);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8, 9);
    load.admit("a", w, p.chain, 2, 9, 4, 0);
    load.prefillDone("a");
    load.done("a");
    load.done("a"); // already done: nothing to report
    load.admit("b", w, p.chain, 2, 9, 0, 0);
    load.admit("c", v, p.chain, 2, 9, 0, 0);
    load.admit("d", v, p.chain, 2, 9, 0, 0); // over the limit of 2: b is evicted
    clock.nowMs += 1000;
    load.sweep(); // c and d expire
    load.admit("e", v, p.chain, 2, 9, 0, 0);
    removeWorker(load, 2n, 0);
    expect(load.restore("f", w, p.chain, 2, 9, 0, 10)).toBe(true);
    // Handles count requests: a = 1, …, f = 6; blocks shared with an active request add nothing.
    expect(seen).toEqual([
      "routed 1 0 2 5 0 +2",
      "prefill 1",
      "ended 1 done -2",
      "routed 2 0 2 9 0 +2",
      "routed 3 1 2 9 0 +2",
      "ended 2 evicted -2",
      "routed 4 1 2 9 0 +0",
      "ended 3 expired -0",
      "ended 4 expired -2",
      "routed 5 1 2 9 0 +2",
      "ended 5 worker_removed -2",
      "routed 6 0 2 9 0 +2",
    ]);
  });
});

describe("peers' requests", () => {
  test("are load like own ones, split out, and leave with their origin", () => {
    const load = tracker();
    const w = load.table.acquire(1n, 0);
    const origin = load.openOrigin();
    expect(origin).toBe(1);
    const p = prompt(1, 2, 3, 4, 5, 6, 7, 8);
    load.admit("a", w, p.chain, 2, 8, 0, 0);
    load.peerRouted(origin, "a", w, p.chain, 2, 8, 0); // the same id, another origin
    expect(load.activeRequests[w]).toBe(2);
    expect(load.peerRequests[w]).toBe(1);
    expect(load.activePrefillTokens[w]).toBe(16);
    expect(load.peerPrefillTokens[w]).toBe(8);
    expect(load.activeDecodeBlocks[w]).toBe(2); // shared blocks count once
    expect(load.peerPrefillDone(origin, "a")).toBe(true);
    expect(load.activePrefillTokens[w]).toBe(8);
    expect(load.peerPrefillTokens[w]).toBe(0);
    expect(load.done("a")).toBe("ok"); // the own one
    expect(load.activeRequests[w]).toBe(1);
    expect(load.peerEnded(origin, "nope")).toBe(false);
    expect(load.closeOrigin(origin)).toBe(1);
    expect(load.activeRequests[w]).toBe(0);
    expect(load.activeDecodeBlocks[w]).toBe(0);
    expect(load.blocks.nodeCount).toBe(0);
    expect(load.peerCounters.droppedWithOrigin).toBe(1);
    expect(load.peerCounters.unknown).toBe(1);
    expect(load.openOrigin()).toBe(1); // numbers are reused
    load.verify();
  });

  test("a reused id replaces, the per-origin limit evicts, the TTL is a backstop", () => {
    const load = tracker({ ttlMs: 1000, maxActive: 2 });
    const w = load.table.acquire(1n, 0);
    const origin = load.openOrigin();
    const p = prompt(1, 2, 3, 4);
    load.peerRouted(origin, "a", w, p.chain, 1, 4, 0);
    load.peerRouted(origin, "a", w, p.chain, 1, 3, 0);
    expect(load.peerCounters.replaced).toBe(1);
    expect(load.activePrefillTokens[w]).toBe(3);
    load.peerRouted(origin, "b", w, p.chain, 1, 4, 0);
    load.peerRouted(origin, "c", w, p.chain, 1, 4, 0);
    expect(load.peerCounters.evicted).toBe(1);
    expect(load.originCount(origin)).toBe(2);
    load.admit("own", w, p.chain, 1, 4, 0, 0); // own requests have their own limit
    expect(load.activeRequestCount).toBe(1);
    clock.nowMs += 1000;
    load.sweep();
    expect(load.counters.expired).toBe(1);
    expect(load.peerCounters.expired).toBe(0); // peers' requests get twice the TTL
    clock.nowMs += 1000;
    load.sweep();
    expect(load.peerCounters.expired).toBe(2);
    expect(load.activeRequests[w]).toBe(0);
    load.verify();
  });

  test("removing a worker drops peers' requests on it too", () => {
    const load = tracker();
    const w = load.table.acquire(1n, 0);
    const origin = load.openOrigin();
    const p = prompt(1, 2, 3, 4);
    load.peerRouted(origin, "x", w, p.chain, 1, 4, 0);
    expect(removeWorker(load, 1n, 0)).toBe(true);
    expect(load.peerCounters.droppedWithWorker).toBe(1);
    expect(load.originCount(origin)).toBe(0);
    load.verify();
  });

  test("facts for an origin not open are refused", () => {
    const load = tracker();
    const w = load.table.acquire(1n, 0);
    const p = prompt(1, 2, 3, 4);
    expect(() => load.peerRouted(3, "x", w, p.chain, 1, 4, 0)).toThrow(/origin/);
    expect(() => load.peerEnded(0, "x")).toThrow(/origin/);
  });

  test("without a chain: decode blocks as the origin counts them, the rest with its last request", () => {
    const load = tracker({ ttlMs: 1000 });
    const w = load.table.acquire(1n, 0);
    const origin = load.openOrigin();
    const none = new Uint32Array(0);
    load.peerRouted(origin, "a", w, none, 0, 8, 0, 5);
    load.peerRouted(origin, "b", w, none, 0, 8, 0, 2); // 2 more blocks than "a" holds
    expect(load.activeDecodeBlocks[w]).toBe(7);
    expect(load.peerEnded(origin, "a", 0)).toBe(true); // "b" still holds a's blocks
    expect(load.activeDecodeBlocks[w]).toBe(7);
    load.peerDecodeTotal(origin, w, 6); // its snapshot: 6 on this worker
    expect(load.activeDecodeBlocks[w]).toBe(6);
    load.verify();
    clock.nowMs += 2000;
    load.sweep(); // "b" expires here (its end was lost): the origin's last, it takes the rest
    expect(load.activeDecodeBlocks[w]).toBe(0);
    load.peerDecodeTotal(origin, w, 9); // no request of it here: nothing to count
    expect(load.activeDecodeBlocks[w]).toBe(0);
    load.verify();
  });

  test("origins are bounded", () => {
    const load = tracker();
    const opened: number[] = [];
    for (;;) {
      const origin = load.openOrigin();
      if (origin < 0) break;
      opened.push(origin);
    }
    expect(opened.length).toBe(255);
    load.closeOrigin(7);
    expect(load.openOrigin()).toBe(7);
  });
});

describe("two trackers relaying their facts", () => {
  test.each([
    ["with chains", true],
    ["with the decode blocks each adds", false],
  ])("%s: hold equal load after every step, and empty memory at the end", (_name, chains) => {
    for (let seed = 1; seed <= 20; seed++) {
      const random = prng(seed);
      const a = tracker({ ttlMs: 5000, maxActive: 40 });
      const b = tracker({ ttlMs: 5000, maxActive: 40 });
      // Different slot numbering on each side, as two processes may have.
      for (const id of [3n, 1n, 2n]) a.table.acquire(id, 0);
      for (const id of [2n, 3n, 1n]) b.table.acquire(id, 0);
      relay(a, b, b.openOrigin(), chains);
      relay(b, a, a.openOrigin(), chains);
      const live: [LoadTracker, string][] = [];
      for (let step = 0; step < 400; step++) {
        const side = random() < 0.5 ? a : b;
        const roll = random();
        if (roll < 0.45 || live.length === 0) {
          const id = `r${step}`;
          const tokens = Array.from({ length: 1 + Math.floor(random() * 12) }, () =>
            Math.floor(random() * 3),
          );
          const p = promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
          const slot = side.liveSlots[Math.floor(random() * side.liveCount)]!;
          side.admit(id, slot, p.chain, p.blockCount, tokens.length, Math.floor(random() * 4), 0);
          live.push([side, id]);
        } else if (roll < 0.7) {
          const [owner, id] = live[Math.floor(random() * live.length)]!;
          owner.prefillDone(id);
        } else if (roll < 0.95) {
          const [owner, id] = live.splice(Math.floor(random() * live.length), 1)[0]!;
          owner.done(id);
        } else {
          clock.nowMs += 2000 * random();
          a.sweep();
          b.sweep();
        }
        expect(loadOf(a)).toEqual(loadOf(b));
      }
      a.verify();
      b.verify();
      for (const [owner, id] of live) owner.done(id);
      expect(loadOf(a)).toEqual(loadOf(b));
      for (const load of [a, b]) {
        expect(load.activeRequestCount + load.peerRequestCount).toBe(0);
        expect(load.blocks.nodeCount).toBe(0);
        expect(load.recordCapacity).toBeLessThanOrEqual(INITIAL_RECORDS);
        load.verify();
      }
    }
  });
});
