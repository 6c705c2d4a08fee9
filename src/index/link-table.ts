/**
 * A map from (u32, u64 as hi/lo) to a non-zero u32, in one open-addressing table:
 * linear probing over (key, hi, lo, value) quads, value 0 = empty, backward-shift
 * deletion, the same sizing rules as the external lookups (grow 1.5x at 3/4 load,
 * shrink below 1/5).
 *
 * The crtc keeps every parent -> child link of its tree here, keyed by (parent node,
 * local hash of the child's first block): no per-node map, and a node can keep its id
 * on a split (its children need no re-keying). The positional backend keys its entries
 * by (position, chain hash).
 */
import { assert } from "./assert";

const STRIDE = 4;
const CAPACITY_MIN = 64;
const LOAD_MAX = 0.75;
const LOAD_SHRINK = 0.2;
const GROWTH = 1.5;
const TWO_POW_32 = 4294967296;

function mixLink(key: number, hi: number, lo: number): number {
  let h = (lo ^ Math.imul(hi, 0x9e3779b1) ^ Math.imul(key, 0x85ebca77)) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

export class LinkTable {
  table: Uint32Array;
  capacity: number;
  count = 0;
  private limit: number;
  private probeSlot = 0;

  constructor(capacity = CAPACITY_MIN) {
    this.capacity = capacity;
    this.limit = Math.floor(capacity * LOAD_MAX);
    this.table = new Uint32Array(capacity * STRIDE);
  }

  /** The value of (key, hi, lo), or 0. */
  find(key: number, hi: number, lo: number): number {
    const table = this.table;
    const capacity = this.capacity;
    let slot = Math.floor(mixLink(key, hi, lo) * capacity / TWO_POW_32);
    for (let probes = 0; probes < capacity; probes++) {
      const at = slot * STRIDE;
      const value = table[at + 3]!;
      if (value === 0 || (table[at + 2] === lo && table[at + 1] === hi && table[at] === key)) {
        this.probeSlot = slot;
        return value;
      }
      if (++slot === capacity) slot = 0;
    }
    throw new Error("link table has no empty slot");
  }

  /** Adds (key, hi, lo) -> value; the key must be absent. */
  insert(key: number, hi: number, lo: number, value: number): void {
    assert(value !== 0, "link to the null value");
    if (this.count + 1 > this.limit) this.resize(Math.ceil(this.capacity * GROWTH));
    assert(this.find(key, hi, lo) === 0, "link already present");
    const at = this.probeSlot * STRIDE;
    this.table[at] = key;
    this.table[at + 1] = hi;
    this.table[at + 2] = lo;
    this.table[at + 3] = value;
    this.count++;
  }

  /** Re-points (key, hi, lo) from `from` to `to` (identity-checked). */
  replace(key: number, hi: number, lo: number, from: number, to: number): void {
    assert(this.find(key, hi, lo) === from, "link replaced under a different value");
    this.table[this.probeSlot * STRIDE + 3] = to;
  }

  /**
   * Unlinks (key, hi, lo) if it still names `value`. A mismatch means a replacement
   * took that key (for the tree: a split's new prefix, a re-created branch); it must
   * survive, and with a single writer it can only be a bug, so it asserts.
   */
  remove(key: number, hi: number, lo: number, value: number): void {
    const found = this.find(key, hi, lo);
    assert(found === value, "unlinking a key that names another value");
    const table = this.table;
    const capacity = this.capacity;
    let hole = this.probeSlot;
    let slot = hole;
    for (let probes = 0; probes < capacity; probes++) {
      if (++slot === capacity) slot = 0;
      const at = slot * STRIDE;
      if (table[at + 3] === 0) break;
      const home = Math.floor(mixLink(table[at]!, table[at + 1]!, table[at + 2]!) * capacity / TWO_POW_32);
      if ((hole - home + capacity) % capacity < (slot - home + capacity) % capacity) {
        table.copyWithin(hole * STRIDE, at, at + STRIDE);
        hole = slot;
      }
    }
    table.fill(0, hole * STRIDE, hole * STRIDE + STRIDE);
    this.count--;
    if (this.capacity > CAPACITY_MIN && this.count < this.capacity * LOAD_SHRINK) {
      this.resize(Math.max(CAPACITY_MIN, Math.ceil(this.count * 2)));
    }
  }

  bytes(): number {
    return this.table.byteLength;
  }

  private resize(capacity: number): void {
    const old = this.table;
    const oldCapacity = this.capacity;
    const table = new Uint32Array(capacity * STRIDE);
    for (let i = 0; i < oldCapacity; i++) {
      const from = i * STRIDE;
      if (old[from + 3] === 0) continue;
      let slot = Math.floor(mixLink(old[from]!, old[from + 1]!, old[from + 2]!) * capacity / TWO_POW_32);
      while (table[slot * STRIDE + 3] !== 0) if (++slot === capacity) slot = 0;
      table.set(old.subarray(from, from + STRIDE), slot * STRIDE);
    }
    this.table = table;
    this.capacity = capacity;
    this.limit = Math.floor(capacity * LOAD_MAX);
  }
}
