// Goal: the active-block tries count exactly what a naive model counts (distinct
// blocks per worker, each block refcounted by the requests covering it) and find the
// same shared-prefix depths, through random churn that forces the table to grow,
// shrink and compact; memory goes back to the initial size when everything is removed.
// Method: random add/remove of request chains built from shared prefix families,
// compared after every step with a Map-based model; verify() checks the internal links.
import { describe, expect, test } from "bun:test";
import { ActiveBlocks } from "../../src/route";
import { prng } from "../../bench/lib";

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

/** Removes the request whose chain is `chain` (by its last block, as the tracker does). */
function removeChain(blocks: ActiveBlocks, slot: number, chain: Uint32Array, count: number): number {
  return blocks.removeEnding(slot, chain[2 * count - 2]!, chain[2 * count - 1]!);
}

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
  test("counts distinct blocks per worker and refcounts shared ones", () => {
    const blocks = new ActiveBlocks();
    const a = chainOf([1, 2, 3, 4]);
    const b = chainOf([1, 2, 9]);
    expect(blocks.add(0, a, 4)).toBe(4);
    expect(blocks.add(0, b, 3)).toBe(1); // shares [1, 2]
    expect(blocks.add(1, b, 3)).toBe(3); // another worker counts its own
    expect(blocks.hashCount).toBe(5);
    expect(blocks.nodeCount).toBe(8);
    expect(removeChain(blocks, 0, a, 4)).toBe(2); // [1, 2] still held by b on slot 0
    expect(removeChain(blocks, 0, b, 3)).toBe(3);
    expect(removeChain(blocks, 1, b, 3)).toBe(3);
    expect(blocks.nodeCount).toBe(0);
    blocks.verify();
  });

  test("shared depths: per worker, the longest active prefix of the chain", () => {
    const blocks = new ActiveBlocks();
    blocks.add(3, chainOf([1, 2, 3, 4, 5]), 5);
    blocks.add(7, chainOf([1, 2, 3]), 3);
    blocks.add(9, chainOf([1, 8]), 2);
    blocks.add(4, chainOf([6, 2, 3]), 3); // different first block: shares nothing
    const depth = new Uint32Array(10);
    const query = chainOf([1, 2, 3, 4, 77, 78]);
    blocks.sharedDepths(query, 6, depth, new Int32Array(10));
    expect(Array.from(depth)).toEqual([0, 0, 0, 4, 0, 0, 0, 3, 0, 1]);
    depth.fill(0);
    blocks.sharedDepths(query, 0, depth, new Int32Array(10));
    expect(depth.every((d) => d === 0)).toBe(true);
  });

  test("a request that is a prefix of another keeps its blocks until both are gone", () => {
    const blocks = new ActiveBlocks();
    const long = chainOf([1, 2, 3]);
    const short = chainOf([1, 2]);
    expect(blocks.add(0, long, 3)).toBe(3);
    expect(blocks.add(0, short, 2)).toBe(0);
    expect(removeChain(blocks, 0, long, 3)).toBe(1);
    expect(blocks.nodeCount).toBe(2);
    expect(blocks.add(0, long, 3)).toBe(1);
    expect(removeChain(blocks, 0, short, 2)).toBe(0);
    expect(removeChain(blocks, 0, long, 3)).toBe(3);
    expect(blocks.nodeCount).toBe(0);
  });

  test("the depth and node found by sharedDepths are valid hints for add; wrong hints throw", () => {
    const random = prng(3);
    const hinted = new ActiveBlocks();
    const searched = new ActiveBlocks();
    const prefix = Array.from({ length: 20 }, (_, i) => i);
    const depth = new Uint32Array(8);
    const node = new Int32Array(8);
    for (let i = 0; i < 400; i++) {
      const words = [...prefix.slice(0, random() % 21), ...Array.from({ length: random() % 5 }, () => 100 + random())];
      const chain = chainOf(words);
      const slot = random() % 8;
      depth.fill(0);
      hinted.sharedDepths(chain, words.length, depth, node);
      const shared = depth[slot]!;
      expect(hinted.add(slot, chain, words.length, shared, shared === 0 ? 0 : node[slot]!))
        .toBe(searched.add(slot, chain, words.length));
    }
    expect(Object.fromEntries(hinted.verify())).toEqual(Object.fromEntries(searched.verify()));
    const chain = chainOf([0, 1, 2]);
    depth.fill(0);
    hinted.sharedDepths(chain, 3, depth, node);
    const holder = depth.findIndex((d) => d > 0);
    const other = (holder + 1) % 8;
    expect(() => hinted.add(other, chain, 3, depth[holder]!, node[holder]!)).toThrow(/node hint/);
    expect(() => hinted.add(holder, chain, 3, 0, node[holder]!)).toThrow(/bad depth hint/);
  });

  test("removing what was never added throws and changes nothing", () => {
    const blocks = new ActiveBlocks();
    const chain = chainOf([1, 2]);
    blocks.add(0, chain, 2);
    expect(() => removeChain(blocks, 1, chain, 2)).toThrow(/no request on slot 1/);
    expect(() => removeChain(blocks, 0, chain, 1)).toThrow(/no request on slot 0/); // [1] is not a request's end
    expect(blocks.nodeCount).toBe(2);
    blocks.verify();
  });

  test("random churn matches the model; memory returns to the initial size", () => {
    const random = prng(7);
    const blocks = new ActiveBlocks();
    const model = new Model();
    const initialBytes = blocks.bytes;
    const active: { slot: number; chain: Uint32Array; count: number }[] = [];
    const families = Array.from({ length: 12 }, (_, f) => Array.from({ length: 3 + (f % 5) * 6 }, (_, i) => f * 1000 + i));
    let peakBytes = 0;
    for (let step = 0; step < 6000; step++) {
      // Grow for the first half, then drain.
      const adding = step < 3000 ? random() % 3 !== 0 : random() % 3 === 0;
      if (adding || active.length === 0) {
        const family = families[random() % families.length]!;
        const shared = random() % (family.length + 1);
        const words = family.slice(0, shared);
        const tail = random() % 40;
        for (let i = 0; i < tail; i++) words.push(1_000_000 + random());
        const slot = random() % 16;
        const chain = chainOf(words);
        expect(blocks.add(slot, chain, words.length)).toBe(model.add(slot, chain, words.length));
        active.push({ slot, chain, count: words.length });
      } else {
        const index = random() % active.length;
        const { slot, chain, count } = active[index]!;
        active[index] = active[active.length - 1]!;
        active.pop();
        expect(count === 0 ? 0 : removeChain(blocks, slot, chain, count)).toBe(model.remove(slot, chain, count));
      }
      peakBytes = Math.max(peakBytes, blocks.bytes);
      if (step % 100 === 0) {
        const perSlot = blocks.verify();
        for (let slot = 0; slot < 16; slot++) expect(perSlot.get(slot) ?? 0).toBe(model.refs.get(slot)?.size ?? 0);
        const family = families[random() % families.length]!;
        const query = chainOf([...family, 5, 6, 7]);
        const depth = new Uint32Array(16);
        blocks.sharedDepths(query, family.length + 3, depth, new Int32Array(16));
        for (let slot = 0; slot < 16; slot++) expect(depth[slot]).toBe(model.depth(slot, query, family.length + 3));
      }
    }
    while (active.length > 0) {
      const { slot, chain, count } = active.pop()!;
      if (count > 0) removeChain(blocks, slot, chain, count);
    }
    expect(peakBytes).toBeGreaterThan(initialBytes * 8);
    expect(blocks.nodeCount).toBe(0);
    expect(blocks.hashCount).toBe(0);
    expect(blocks.bytes).toBe(initialBytes);
    blocks.verify();
  });

  test("depths with many workers sharing a prefix at different depths", () => {
    const blocks = new ActiveBlocks();
    const model = new Model();
    const prefix = Array.from({ length: 64 }, (_, i) => i);
    for (let slot = 0; slot < 300; slot++) {
      const words = [...prefix.slice(0, slot % 65), 9000 + slot];
      const chain = chainOf(words);
      blocks.add(slot, chain, words.length);
      model.add(slot, chain, words.length);
    }
    const query = chainOf([...prefix, 1, 2]);
    const depth = new Uint32Array(300);
    blocks.sharedDepths(query, 66, depth, new Int32Array(300));
    for (let slot = 0; slot < 300; slot++) expect(depth[slot]).toBe(model.depth(slot, query, 66));
    blocks.clear();
    expect(blocks.nodeCount).toBe(0);
  });
});
