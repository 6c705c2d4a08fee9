/**
 * One worker's map from its external block hash (u64 as hi, lo) to a non-zero u32
 * (the block it names). Open addressing with linear probing over one Uint32Array of
 * (hi, lo, value) triples; value 0 marks an empty slot. The table is kept ordered
 * (Robin Hood with linear probing, Amble and Knuth's ordered hashing): along a run,
 * entries sit in the order of their home slots, so a probe for an absent key stops at
 * the first entry whose home lies past its own (not at the run's end), an insert
 * shifts the rest of the run forward by one, and a removal shifts the following
 * entries back only up to the first one that sits at its home (no tombstones): probe
 * lengths never degrade under churn, and neither operation walks the whole run.
 *
 * Sizing trades speed for bytes per entry (12 bytes / load):
 * - small tables (up to 1,024 slots, 12 KiB) have a power-of-two capacity, pick the
 *   home slot with a shift and double above 1/2 load: short probe runs and cheap home
 *   slots (on Bun a multiply-shift range reduction costs about 1.4x), where the bytes
 *   do not matter;
 * - large tables take any capacity, pick the home slot with a multiply-shift range
 *   reduction, grow by 1.25x above 4/5 load and shrink below 2/5: load stays in
 *   [0.6, 0.8] instead of doubling's [0.375, 0.75], 17 bytes per entry instead of 21
 *   on average and 24 right after a doubling.
 *
 * Keys are u32 words as read from a Uint32Array (callers normalize with `>>> 0`).
 */
import { assert, fail } from "./assert";

const STRIDE = 3;
const SMALL_BITS_MIN = 4;
const SMALL_BITS_MAX = 10;
const SMALL_CAPACITY_MAX = 1 << SMALL_BITS_MAX;
const LARGE_LOAD_MAX = 0.8;
const LARGE_LOAD_MIN = 0.4;
const LARGE_LOAD_TARGET = 0.6;
const LARGE_GROWTH = 1.25;
const INV_2_POW_32 = 1 / 4294967296;

/** A multiplicative hash of (hi, lo); its high bits pick the home slot. */
export function mixKey(hi: number, lo: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> 0;
}

export class ExternalLookup {
  table: Uint32Array;
  capacity: number;
  count = 0;
  /** After find(): the entry's slot if found, else the empty slot an insert would take. */
  probeSlot = 0;
  /** 32 - log2(capacity) for a small table; 0 for a large one. */
  private shift: number;
  private grow: number;
  private shrink: number;

  constructor() {
    this.capacity = 0;
    this.shift = 0;
    this.grow = 0;
    this.shrink = 0;
    this.table = this.sized(1 << SMALL_BITS_MIN);
  }

  /** The home slot of (hi, lo). */
  private home(hi: number, lo: number): number {
    const h = mixKey(hi, lo);
    return this.shift !== 0 ? h >>> this.shift : (h * this.capacity * INV_2_POW_32) | 0;
  }

  /** How far the entry at `slot` sits past its home slot. */
  private distance(slot: number): number {
    const at = slot * STRIDE;
    const d = slot - this.home(this.table[at]!, this.table[at + 1]!);
    return d < 0 ? d + this.capacity : d;
  }

  /** The value stored for (hi, lo), or 0. Sets probeSlot. */
  find(hi: number, lo: number): number {
    const table = this.table;
    const capacity = this.capacity;
    let slot = this.home(hi, lo);
    // Bounded: the load limit keeps empty slots, so the probe ends within the table.
    for (let probed = 0; ; probed++) {
      const at = slot * STRIDE;
      const value = table[at + 2]!;
      if (value === 0 || (table[at + 1] === lo && table[at] === hi)) {
        this.probeSlot = slot;
        return value;
      }
      // An entry homed past (hi, lo)'s home: (hi, lo) would sit before it, so it is absent.
      if (probed !== 0 && this.distance(slot) < probed) {
        this.probeSlot = slot;
        return 0;
      }
      if (++slot === capacity) slot = 0;
    }
  }

  /** Inserts (hi, lo) -> value; find(hi, lo) must have just returned 0. */
  insertAtProbe(hi: number, lo: number, value: number): void {
    if (value === 0) fail("lookup insert of the null value");
    this.place(this.probeSlot, hi, lo, value);
    if (++this.count > this.grow) this.resize(this.grownCapacity());
  }

  /** Writes (hi, lo, value) at `slot`, shifting the entries from there to the next empty slot forward. */
  private place(slot: number, hi: number, lo: number, value: number): void {
    const table = this.table;
    const capacity = this.capacity;
    let empty = slot;
    while (table[empty * STRIDE + 2] !== 0) if (++empty === capacity) empty = 0;
    if (empty < slot) {
      // The run wraps: shift the part at the table's start, then carry the last entry over.
      table.copyWithin(STRIDE, 0, empty * STRIDE);
      table.copyWithin(0, (capacity - 1) * STRIDE, capacity * STRIDE);
      empty = capacity - 1;
    }
    table.copyWithin((slot + 1) * STRIDE, slot * STRIDE, empty * STRIDE);
    const at = slot * STRIDE;
    table[at] = hi;
    table[at + 1] = lo;
    table[at + 2] = value;
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

  /**
   * Removes the entry find() just found (it must have returned non-zero), shifting the
   * following entries back up to the first one at its home. Unchecked on purpose: a
   * check here measured 25% of a store+remove cycle on Bun, and both callers have just
   * seen the entry.
   */
  removeAtProbe(): void {
    const table = this.table;
    const capacity = this.capacity;
    let hole = this.probeSlot;
    for (;;) {
      const next = hole + 1 === capacity ? 0 : hole + 1;
      if (table[next * STRIDE + 2] === 0 || this.distance(next) === 0) break;
      const to = hole * STRIDE;
      const at = next * STRIDE;
      table[to] = table[at]!;
      table[to + 1] = table[at + 1]!;
      table[to + 2] = table[at + 2]!;
      hole = next;
    }
    const to = hole * STRIDE;
    table[to] = 0;
    table[to + 1] = 0;
    table[to + 2] = 0;
    if (--this.count < this.shrink) this.resize(this.shrunkCapacity());
  }

  /** Drops every entry and returns to the minimum size. */
  clear(): void {
    this.count = 0;
    if (this.capacity === 1 << SMALL_BITS_MIN) this.table.fill(0);
    else this.table = this.sized(1 << SMALL_BITS_MIN);
  }

  bytes(): number {
    return this.table.byteLength;
  }

  private grownCapacity(): number {
    if (this.capacity < SMALL_CAPACITY_MAX) return this.capacity * 2;
    return Math.max(Math.ceil(this.count / LARGE_LOAD_TARGET), Math.ceil(this.capacity * LARGE_GROWTH));
  }

  private shrunkCapacity(): number {
    if (this.capacity <= SMALL_CAPACITY_MAX) return this.capacity / 2;
    const capacity = Math.ceil(this.count / LARGE_LOAD_TARGET);
    if (capacity > SMALL_CAPACITY_MAX) return capacity;
    // Small tables stay at most half full; until the count allows that, stay large.
    return this.count <= SMALL_CAPACITY_MAX >> 1 ? SMALL_CAPACITY_MAX : SMALL_CAPACITY_MAX + 1;
  }

  /** Sets capacity and thresholds; returns an empty table of that size. */
  private sized(capacity: number): Uint32Array {
    this.capacity = capacity;
    if (capacity <= SMALL_CAPACITY_MAX) {
      const bits = 31 - Math.clz32(capacity);
      assert(capacity === 1 << bits, "small lookup capacity must be a power of two");
      this.shift = 32 - bits;
      this.grow = capacity >> 1;
      this.shrink = bits > SMALL_BITS_MIN ? capacity >> 3 : -1;
    } else {
      this.shift = 0;
      this.grow = Math.floor(capacity * LARGE_LOAD_MAX);
      this.shrink = Math.floor(capacity * LARGE_LOAD_MIN);
    }
    return new Uint32Array(capacity * STRIDE);
  }

  private resize(capacity: number): void {
    const old = this.table;
    const table = this.sized(capacity);
    assert(this.count <= this.grow, "lookup resized below its count");
    this.table = table;
    for (let from = 0; from < old.length; from += STRIDE) {
      const value = old[from + 2]!;
      if (value === 0) continue;
      const hi = old[from]!;
      const lo = old[from + 1]!;
      this.find(hi, lo);
      this.place(this.probeSlot, hi, lo, value);
    }
  }
}
