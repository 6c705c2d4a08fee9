/**
 * One worker's map from its external block hash (u64 as hi, lo) to a non-zero u32
 * (the block it names). Open addressing with linear probing over one Uint32Array of
 * (hi, lo, value) triples; value 0 marks an empty slot; deletion shifts the following
 * run back (no tombstones), so probe lengths never degrade under churn.
 *
 * The capacity is a power of two (the home slot is the top bits of a multiplicative
 * hash); it doubles above 3/4 load and halves below 3/16. Measured on Bun: masking
 * is about 2.5x faster per operation than a multiply-shift range reduction over an
 * arbitrary capacity, which would have saved about 2 bytes per entry on average.
 *
 * Keys are u32 words as read from a Uint32Array (callers normalize with `>>> 0`).
 */
import { assert, fail } from "./assert";

const STRIDE = 3;
const BITS_MIN = 4;

/** The home slot of (hi, lo) among 2^(32 - shift) slots. */
export function homeSlot(hi: number, lo: number, shift: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> shift;
}

export class ExternalLookup {
  table: Uint32Array;
  capacity: number;
  count = 0;
  /** After find(): the entry's slot if found, else the empty slot an insert would take. */
  probeSlot = 0;
  private mask: number;
  private shift: number;
  private grow: number;
  private shrink: number;

  constructor(bits = BITS_MIN) {
    this.capacity = 1 << bits;
    this.mask = this.capacity - 1;
    this.shift = 32 - bits;
    this.grow = (this.capacity * 3) >> 2;
    this.shrink = bits > BITS_MIN ? (this.capacity * 3) >> 4 : -1;
    this.table = new Uint32Array(this.capacity * STRIDE);
  }

  /** The value stored for (hi, lo), or 0. Sets probeSlot. */
  find(hi: number, lo: number): number {
    const table = this.table;
    const mask = this.mask;
    let slot = homeSlot(hi, lo, this.shift);
    // Bounded: the load limit keeps empty slots, so the probe ends within the table.
    for (;;) {
      const at = slot * STRIDE;
      const value = table[at + 2]!;
      if (value === 0 || (table[at + 1] === lo && table[at] === hi)) {
        this.probeSlot = slot;
        return value;
      }
      slot = (slot + 1) & mask;
    }
  }

  /** Inserts (hi, lo) -> value; find(hi, lo) must have just returned 0. */
  insertAtProbe(hi: number, lo: number, value: number): void {
    const table = this.table;
    const at = this.probeSlot * STRIDE;
    if (value === 0 || table[at + 2] !== 0) fail("lookup insert without a free probe slot");
    table[at] = hi;
    table[at + 1] = lo;
    table[at + 2] = value;
    if (++this.count > this.grow) this.resize(this.shift - 1);
  }

  /** Sets (hi, lo) -> value, inserting or overwriting. */
  set(hi: number, lo: number, value: number): void {
    if (this.find(hi, lo) === 0) this.insertAtProbe(hi, lo, value);
    else this.table[this.probeSlot * STRIDE + 2] = value;
  }

  /** Removes (hi, lo); returns its value, or 0 if absent. */
  remove(hi: number, lo: number): number {
    const value = this.find(hi, lo);
    if (value !== 0) this.removeAtProbe();
    return value;
  }

  /** Removes the entry find() just found, shifting its probe run back. */
  removeAtProbe(): void {
    const table = this.table;
    const mask = this.mask;
    const shift = this.shift;
    let hole = this.probeSlot;
    if (table[hole * STRIDE + 2] === 0) fail("lookup remove of an empty slot");
    let slot = hole;
    for (;;) {
      slot = (slot + 1) & mask;
      const at = slot * STRIDE;
      if (table[at + 2] === 0) break;
      const home = homeSlot(table[at]!, table[at + 1]!, shift);
      // The entry may move into the hole only if the hole lies on its probe path.
      if (((hole - home) & mask) < ((slot - home) & mask)) {
        const to = hole * STRIDE;
        table[to] = table[at]!;
        table[to + 1] = table[at + 1]!;
        table[to + 2] = table[at + 2]!;
        hole = slot;
      }
    }
    const to = hole * STRIDE;
    table[to] = 0;
    table[to + 1] = 0;
    table[to + 2] = 0;
    if (--this.count < this.shrink) this.resize(this.shift + 1);
  }

  /** Drops every entry and returns to the minimum size. */
  clear(): void {
    this.count = 0;
    if (this.capacity === 1 << BITS_MIN) this.table.fill(0);
    else this.resize(32 - BITS_MIN);
  }

  bytes(): number {
    return this.table.byteLength;
  }

  private resize(shift: number): void {
    const old = this.table;
    const bits = 32 - shift;
    this.capacity = 1 << bits;
    this.mask = this.capacity - 1;
    this.shift = shift;
    this.grow = (this.capacity * 3) >> 2;
    this.shrink = bits > BITS_MIN ? (this.capacity * 3) >> 4 : -1;
    assert(this.count <= this.grow, "lookup resized below its count");
    const table = new Uint32Array(this.capacity * STRIDE);
    this.table = table;
    if (this.count === 0) return;
    const mask = this.mask;
    for (let from = 0; from < old.length; from += STRIDE) {
      const value = old[from + 2]!;
      if (value === 0) continue;
      const hi = old[from]!;
      const lo = old[from + 1]!;
      let slot = homeSlot(hi, lo, shift);
      while (table[slot * STRIDE + 2] !== 0) slot = (slot + 1) & mask;
      const at = slot * STRIDE;
      table[at] = hi;
      table[at + 1] = lo;
      table[at + 2] = value;
    }
  }
}
