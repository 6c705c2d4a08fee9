// Goal: the tree of active chains counts exactly what a naive model counts (distinct
// blocks per worker, each block refcounted by the requests covering it) and finds the
// same shared-prefix depths, through random churn with splits and merges; it stays
// compressed, and holds nothing once every request is removed.
// Method: random add/remove of request chains built from shared prefix families,
// compared after every step with a Map-based model; verify() checks the structure.
import { describe, expect, test } from "bun:test";
import { ActiveBlocks, type ChainHolder } from "../../src/route";
import { xorshift32 as prng } from "../../src/util/random";

/** A chain of (hi, lo) words; equal prefixes give equal words, like sequence hashes. */
function chainOf(words: readonly number[]): Uint32Array {
  const out = new Uint32Array(2 * words.length);
  let hi = 0x811c9dc5;
  let lo = 0x1234567;
  for (let i = 0; i < words.length; i++) {
    hi = Math.imul(hi ^ words[i]!, 0x01000193) >>> 0;
    lo = Math.imul((lo ^ words[i]!) + 0x7f4a7c15, 0x2c1b3c6d) >>> 0;
    lo = (lo ^ (lo >>> 15) ^ hi) >>> 0;
    out[2 * i] = hi;
    out[2 * i + 1] = lo;
  }
  return out;
}

const key = (chain: Uint32Array, i: number) => `${chain[2 * i]}:${chain[2 * i + 1]}`;

const holder = (): ChainHolder => ({ leaf: null });

class Model {
  readonly refs = new Map<number, Map<string, number>>();

  add(slot: number, chain: Uint32Array, count: number): number {
    let map = this.refs.get(slot);
    if (map === undefined) this.refs.set(slot, (map = new Map()));
    let added = 0;
    for (let i = 0; i < count; i++) {
      const k = key(chain, i);
      const seen = map.get(k) ?? 0;
      if (seen === 0) added++;
      map.set(k, seen + 1);
    }
    return added;
  }

  remove(slot: number, chain: Uint32Array, count: number): number {
    const map = this.refs.get(slot)!;
    let removed = 0;
    for (let i = 0; i < count; i++) {
      const k = key(chain, i);
      const left = map.get(k)! - 1;
      if (left === 0) {
        map.delete(k);
        removed++;
      } else {
        map.set(k, left);
      }
    }
    return removed;
  }

  /** Longest prefix of the chain whose blocks are all active on the slot. */
  depth(slot: number, chain: Uint32Array, count: number): number {
    const map = this.refs.get(slot);
    let depth = 0;
    while (depth < count && (map?.get(key(chain, depth)) ?? 0) > 0) depth++;
    return depth;
  }
}

describe("ActiveBlocks", () => {
  test("counts distinct blocks per worker; blocks shared by requests count once", () => {
    const blocks = new ActiveBlocks();
    const a = holder();
    const b = holder();
    const c = holder();
    expect(blocks.add(0, chainOf([1, 2, 3, 4]), 4, a)).toBe(4);
    expect(blocks.add(0, chainOf([1, 2, 9]), 3, b)).toBe(1); // shares [1, 2]
    expect(blocks.add(1, chainOf([1, 2, 9]), 3, c)).toBe(3); // another worker counts its own
    expect(blocks.blockCount).toBe(5);
    expect(blocks.nodeCount).toBe(3); // [1 2] -> [3 4], [9]
    expect(blocks.remove(0, a)).toBe(2); // [1, 2] still held by b on worker 0
    expect(blocks.remove(0, b)).toBe(3);
    expect(blocks.remove(1, c)).toBe(3);
    expect(blocks.nodeCount).toBe(0);
    expect(blocks.blockCount).toBe(0);
    blocks.verify();
  });

  test("shared depths: per worker, the longest active prefix of the chain", () => {
    const blocks = new ActiveBlocks();
    blocks.add(3, chainOf([1, 2, 3, 4, 5]), 5, holder());
    blocks.add(7, chainOf([1, 2, 3]), 3, holder());
    blocks.add(9, chainOf([1, 8]), 2, holder());
    blocks.add(4, chainOf([6, 2, 3]), 3, holder()); // different first block: shares nothing
    const depth = new Uint32Array(10);
    const query = chainOf([1, 2, 3, 4, 77, 78]);
    blocks.sharedDepths(query, 6, depth);
    expect(Array.from(depth)).toEqual([0, 0, 0, 4, 0, 0, 0, 3, 0, 1]);
    depth.fill(0);
    blocks.sharedDepths(query, 2, depth); // a query shorter than the edges
    expect(Array.from(depth)).toEqual([0, 0, 0, 2, 0, 0, 0, 2, 0, 1]);
    depth.fill(0);
    blocks.sharedDepths(query, 0, depth);
    expect(depth.every((d) => d === 0)).toBe(true);
  });

  test("a request that is a prefix of another splits the edge; removing it merges back", () => {
    const blocks = new ActiveBlocks();
    const long = holder();
    const short = holder();
    expect(blocks.add(0, chainOf([1, 2, 3]), 3, long)).toBe(3);
    expect(blocks.add(0, chainOf([1, 2]), 2, short)).toBe(0);
    expect(blocks.nodeCount).toBe(2);
    expect(blocks.remove(0, short)).toBe(0);
    expect(blocks.nodeCount).toBe(1); // merged again
    const again = holder();
    expect(blocks.add(0, chainOf([1, 2]), 2, again)).toBe(0);
    expect(blocks.remove(0, long)).toBe(1); // block 3 freed, [1 2] still held
    expect(blocks.remove(0, again)).toBe(2);
    expect(blocks.nodeCount).toBe(0);
    blocks.verify();
  });

  test("stays compressed: a shared prefix with many tails, then one tail left", () => {
    const blocks = new ActiveBlocks();
    const prefix = Array.from({ length: 50 }, (_, i) => i);
    const holders = Array.from({ length: 100 }, () => holder());
    holders.forEach((h, i) => {
      blocks.add(0, chainOf([...prefix, 1000 + i, 2000 + i]), 52, h);
    });
    expect(blocks.nodeCount).toBe(101);
    expect(blocks.blockCount).toBe(50 + 200);
    for (const h of holders.slice(1)) blocks.remove(0, h);
    expect(blocks.nodeCount).toBe(1);
    expect(blocks.blockCount).toBe(52);
    blocks.verify();
  });

  test("blocks whose hashes share the low word are kept apart", () => {
    const blocks = new ActiveBlocks();
    // Root children keyed by the low word 5: (1, 5) and (2, 5); under (1, 5) again two.
    const a = Uint32Array.of(1, 5, 7, 9);
    const b = Uint32Array.of(2, 5, 7, 9);
    const c = Uint32Array.of(1, 5, 8, 9);
    const [ha, hb, hc] = [holder(), holder(), holder()];
    expect(blocks.add(0, a, 2, ha)).toBe(2);
    expect(blocks.add(0, b, 2, hb)).toBe(2);
    expect(blocks.add(0, c, 2, hc)).toBe(1); // shares (1, 5) with a
    blocks.verify();
    const depth = new Uint32Array(2);
    blocks.sharedDepths(Uint32Array.of(2, 5, 8, 9), 2, depth);
    expect(depth[0]).toBe(1);
    expect(blocks.remove(0, hc)).toBe(1); // (1, 5) is left with one child: merged
    expect(blocks.nodeCount).toBe(2);
    blocks.verify();
    expect(blocks.remove(0, ha)).toBe(2);
    expect(blocks.remove(0, hb)).toBe(2);
    expect(blocks.nodeCount).toBe(0);
  });

  test("removing a request twice throws; an empty chain is a no-op", () => {
    const blocks = new ActiveBlocks();
    const h = holder();
    blocks.add(0, chainOf([1, 2]), 2, h);
    const copy = { ...h };
    blocks.remove(0, h);
    expect(h.leaf).toBeNull();
    expect(() => blocks.remove(0, copy)).toThrow(/no request on slot 0/);
    const other = holder();
    blocks.add(1, chainOf([1, 2]), 2, other);
    expect(() => blocks.remove(2, other)).toThrow(/no request on slot 2/);
    const empty = holder();
    expect(blocks.add(0, new Uint32Array(0), 0, empty)).toBe(0);
    expect(blocks.remove(0, empty)).toBe(0);
    expect(blocks.nodeCount).toBe(1);
    blocks.verify();
  });

  // 40 workers: holder lists longer than 16 are searched by bisection, and shrink again.
  test.each([16, 40])(
    "random churn over %p workers matches the model; nothing is left at the end",
    (workers) => {
      const random = prng(7);
      const blocks = new ActiveBlocks();
      const model = new Model();
      const active: { slot: number; chain: Uint32Array; count: number; h: ChainHolder }[] = [];
      const families = Array.from({ length: 12 }, (_, f) =>
        Array.from({ length: 3 + (f % 5) * 6 }, (_, i) => f * 1000 + i),
      );
      let peakNodes = 0;
      for (let step = 0; step < 6000; step++) {
        // Grow for the first half, then drain.
        const adding = step < 3000 ? random() % 3 !== 0 : random() % 3 === 0;
        if (adding || active.length === 0) {
          const family = families[random() % families.length]!;
          const shared = random() % (family.length + 1);
          const words = family.slice(0, shared);
          const tail = random() % 40;
          for (let i = 0; i < tail; i++) words.push(1_000_000 + (random() % 64)); // tails also collide
          const slot = random() % workers;
          const chain = chainOf(words);
          const h = holder();
          // Like the router: usually the depths of this very chain first (add then reuses
          // that walk), sometimes of another chain (it must not).
          const walk = random() % 3;
          if (walk > 0) {
            const query = walk === 1 ? chain : chainOf([...words.slice(0, words.length >> 1), 77]);
            const queryCount = walk === 1 ? words.length : (words.length >> 1) + 1;
            const depth = new Uint32Array(workers);
            blocks.sharedDepths(query, queryCount, depth);
            for (let s = 0; s < workers; s++)
              expect(depth[s]).toBe(model.depth(s, query, queryCount));
            if (random() % 8 === 0 && active.length > 0) {
              // A change in between: the walk is stale and must not be reused.
              const other = active.pop()!;
              expect(blocks.remove(other.slot, other.h)).toBe(
                model.remove(other.slot, other.chain, other.count),
              );
            }
          }
          expect(blocks.add(slot, chain, words.length, h)).toBe(
            model.add(slot, chain, words.length),
          );
          active.push({ slot, chain, count: words.length, h });
        } else {
          const index = random() % active.length;
          const { slot, chain, count, h } = active[index]!;
          active[index] = active[active.length - 1]!;
          active.pop();
          expect(blocks.remove(slot, h)).toBe(model.remove(slot, chain, count));
        }
        peakNodes = Math.max(peakNodes, blocks.nodeCount);
        if (step % 100 === 0) {
          const perSlot = blocks.verify();
          for (let slot = 0; slot < workers; slot++)
            expect(perSlot.get(slot) ?? 0).toBe(model.refs.get(slot)?.size ?? 0);
          const family = families[random() % families.length]!;
          const query = chainOf([...family, 5, 6, 7]);
          const depth = new Uint32Array(workers);
          blocks.sharedDepths(query, family.length + 3, depth);
          for (let slot = 0; slot < workers; slot++)
            expect(depth[slot]).toBe(model.depth(slot, query, family.length + 3));
        }
      }
      while (active.length > 0) {
        const { slot, h } = active.pop()!;
        blocks.remove(slot, h);
      }
      expect(peakNodes).toBeGreaterThan(500);
      expect(blocks.nodeCount).toBe(0);
      expect(blocks.blockCount).toBe(0);
      expect(blocks.bytes).toBe(0);
      blocks.verify();
    },
  );

  test("thousands of nested request ends (each a prefix of the next), removed in random order", () => {
    const blocks = new ActiveBlocks();
    const words = Array.from({ length: 3000 }, (_, i) => i);
    const full = chainOf(words);
    const holders = words.map((_, i) => {
      const h = holder();
      blocks.add(0, full, i + 1, h);
      return h;
    });
    expect(blocks.nodeCount).toBe(3000);
    expect(blocks.blockCount).toBe(3000);
    blocks.verify();
    const random = prng(5);
    const order = words.map((i) => i).sort(() => (random() & 1) - 0.5);
    let freed = 0;
    for (const i of order) freed += blocks.remove(0, holders[i]!);
    expect(freed).toBe(3000);
    expect(blocks.nodeCount).toBe(0);
  });

  test("depths with many workers sharing a prefix at different depths", () => {
    const blocks = new ActiveBlocks();
    const model = new Model();
    const prefix = Array.from({ length: 64 }, (_, i) => i);
    for (let slot = 0; slot < 300; slot++) {
      const words = [...prefix.slice(0, slot % 65), 9000 + slot];
      const chain = chainOf(words);
      blocks.add(slot, chain, words.length, holder());
      model.add(slot, chain, words.length);
    }
    const query = chainOf([...prefix, 1, 2]);
    const depth = new Uint32Array(300);
    blocks.sharedDepths(query, 66, depth);
    for (let slot = 0; slot < 300; slot++) expect(depth[slot]).toBe(model.depth(slot, query, 66));
    blocks.verify();
    blocks.clear();
    expect(blocks.nodeCount).toBe(0);
  });
});
