/**
 * A map from (u32, u64 as hi/lo) to a non-zero u32, in one open-addressing table:
 * linear probing over (key, hi, lo, value) quads, value 0 = empty, backward-shift
 * deletion, the same sizing rules as the external lookups (power of two, doubles above
 * 3/4 load, halves below 3/16).
 *
 * The crtc keeps every parent -> child link of its tree here, keyed by (parent node,
 * local hash of the child's first block): no per-node map, and a node can keep its id
 * on a split (its children need no re-keying). The positional backend keys its entries
 * by (position, chain hash).
 */
import { fail } from "./assert";
import { PRIVATE_MEMORY, type PoolMemory } from "./crtc/shared-memory";
import { CONTROL, type SharedWriter } from "./crtc/shared-writer";

export const LINK_STRIDE = 4;
const STRIDE = LINK_STRIDE;
const BITS_MIN = 6;

/** The home slot of (key, hi, lo) among 2^(32 - shift) slots. */
export function homeSlot(key: number, hi: number, lo: number, shift: number): number {
  return (
    Math.imul(lo ^ Math.imul(hi, 0x85ebca6b) ^ Math.imul(key, 0xc2b2ae35), 0x9e3779b1) >>> shift
  );
}

/**
 * The slot where a probe for (key, hi, lo) ends in a table of 2^(32 - shift) quads: the
 * key's own slot, or the empty slot where it would go; -1 after `capacity` slots without
 * either (only a torn read of a shared table can be full). The one probe loop: the
 * table's own operations and the shared index's readers (crtc/shared.ts) both use it.
 */
export function probeSlot(
  table: Uint32Array,
  shift: number,
  key: number,
  hi: number,
  lo: number,
): number {
  const mask = 0xffff_ffff >>> shift;
  let slot = homeSlot(key, hi, lo, shift);
  for (let n = 0; n <= mask; n++) {
    const at = slot * STRIDE;
    if (table[at + 3] === 0 || (table[at + 2] === lo && table[at + 1] === hi && table[at] === key))
      return slot;
    slot = (slot + 1) & mask;
  }
  return -1;
}

export class LinkTable {
  table: Uint32Array;
  capacity: number;
  count = 0;
  private mask: number;
  private shift: number;
  private grow: number;
  private shrink: number;
  /** Where the last find ended (its key's slot, or the empty one it would take). */
  private lastProbe = 0;
  /**
   * Shared mode: the table alternates between two regions (a resize fills the other
   * one, publishes it and retires this one), and every change runs inside the control
   * buffer's link seqlock, so a reader that raced a backward shift or a resize knows.
   */
  private readonly control: Int32Array | null;
  private region = 0;
  private readonly regionRetiredAt = [0, 0];

  constructor(
    bits = BITS_MIN,
    private readonly memory: PoolMemory = PRIVATE_MEMORY,
    private readonly writer: SharedWriter | null = null,
  ) {
    this.control = writer === null ? null : writer.control;
    this.capacity = 1 << bits;
    this.mask = this.capacity - 1;
    this.shift = 32 - bits;
    this.grow = (this.capacity * 3) >> 2;
    this.shrink = -1;
    this.table = memory.u32("links.0", this.capacity * STRIDE, null, 0);
    this.publish();
  }

  /** The value of (key, hi, lo), or 0. */
  find(key: number, hi: number, lo: number): number {
    // The load limit keeps empty slots: the probe always ends at one (never -1 here).
    const slot = probeSlot(this.table, this.shift, key, hi, lo);
    this.lastProbe = slot;
    return this.table[slot * STRIDE + 3]!;
  }

  /** Adds (key, hi, lo) -> value; the key must be absent. */
  insert(key: number, hi: number, lo: number, value: number): void {
    if (value === 0 || this.find(key, hi, lo) !== 0)
      fail("link to the null value or link already present");
    const table = this.table;
    const at = this.lastProbe * STRIDE;
    if (this.control !== null) Atomics.add(this.control, CONTROL.linkVersion, 1);
    table[at] = key;
    table[at + 1] = hi;
    table[at + 2] = lo;
    table[at + 3] = value;
    if (this.control !== null) Atomics.add(this.control, CONTROL.linkVersion, 1);
    if (++this.count > this.grow) this.resize(this.shift - 1);
  }

  /** Re-points (key, hi, lo) from `from` to `to` (identity-checked). */
  replace(key: number, hi: number, lo: number, from: number, to: number): void {
    if (this.find(key, hi, lo) !== from) fail("link replaced under a different value");
    // One aligned word: a reader sees the old child or the new one, never a mix.
    if (this.control !== null) Atomics.store(this.table, this.lastProbe * STRIDE + 3, to);
    else this.table[this.lastProbe * STRIDE + 3] = to;
  }

  /**
   * Unlinks (key, hi, lo) if it still names `value`. A mismatch means a replacement
   * took that key (for the tree: a split's new prefix, a re-created branch); it must
   * survive, and with a single writer it can only be a bug, so it asserts.
   */
  remove(key: number, hi: number, lo: number, value: number): void {
    if (this.find(key, hi, lo) !== value) fail("unlinking a key that names another value");
    if (this.control !== null) Atomics.add(this.control, CONTROL.linkVersion, 1);
    const table = this.table;
    const mask = this.mask;
    const shift = this.shift;
    let hole = this.lastProbe;
    let slot = hole;
    for (;;) {
      slot = (slot + 1) & mask;
      const at = slot * STRIDE;
      if (table[at + 3] === 0) break;
      const home = homeSlot(table[at]!, table[at + 1]!, table[at + 2]!, shift);
      if (((hole - home) & mask) < ((slot - home) & mask)) {
        const to = hole * STRIDE;
        table[to] = table[at]!;
        table[to + 1] = table[at + 1]!;
        table[to + 2] = table[at + 2]!;
        table[to + 3] = table[at + 3]!;
        hole = slot;
      }
    }
    const to = hole * STRIDE;
    table[to] = 0;
    table[to + 1] = 0;
    table[to + 2] = 0;
    table[to + 3] = 0;
    if (this.control !== null) Atomics.add(this.control, CONTROL.linkVersion, 1);
    if (--this.count < this.shrink) this.resize(this.shift + 1);
  }

  bytes(): number {
    return this.table.byteLength;
  }

  /**
   * Shared mode: the new table is built in the other region while readers keep probing
   * this one (the single writer changes nothing meanwhile), so the seqlock is odd only
   * while the region and size are published, not for the whole rebuild.
   */
  private resize(shift: number): void {
    const old = this.table;
    const bits = 32 - shift;
    const table = this.takeRegion(bits);
    const mask = (1 << bits) - 1;
    for (let from = 0; from < old.length; from += STRIDE) {
      const value = old[from + 3]!;
      if (value === 0) continue;
      const key = old[from]!,
        hi = old[from + 1]!,
        lo = old[from + 2]!;
      let slot = homeSlot(key, hi, lo, shift);
      while (table[slot * STRIDE + 3] !== 0) slot = (slot + 1) & mask;
      const at = slot * STRIDE;
      table[at] = key;
      table[at + 1] = hi;
      table[at + 2] = lo;
      table[at + 3] = value;
    }
    const control = this.control;
    if (control !== null) Atomics.add(control, CONTROL.linkVersion, 1);
    this.capacity = 1 << bits;
    this.mask = mask;
    this.shift = shift;
    this.grow = (this.capacity * 3) >> 2;
    this.shrink = bits > BITS_MIN ? (this.capacity * 3) >> 4 : -1;
    this.table = table;
    if (control === null) return;
    this.publish();
    Atomics.add(control, CONTROL.linkVersion, 1);
    // The old region's pages go back; a reader still probing it saw the seqlock move.
    this.memory.u32(`links.${1 - this.region}`, 0, old, 0);
  }

  /**
   * The next table of 2^bits slots: private memory, or the other shared region once no
   * reader can still be probing it. This one is retired at a fresh epoch, so readers
   * that start from now on never hold up the resize after this one.
   */
  private takeRegion(bits: number): Uint32Array {
    const words = (1 << bits) * STRIDE;
    if (this.writer === null) return new Uint32Array(words);
    const next = 1 - this.region;
    this.writer.waitForReaders(this.regionRetiredAt[next]!);
    this.regionRetiredAt[this.region] = this.writer.advanceEpoch();
    this.region = next;
    return this.memory.u32(`links.${next}`, words, null, 0);
  }

  private publish(): void {
    if (this.control === null) return;
    Atomics.store(this.control, CONTROL.linkRegion, this.region);
    Atomics.store(this.control, CONTROL.linkBits, 32 - this.shift);
  }
}
