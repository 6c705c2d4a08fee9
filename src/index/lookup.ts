/**
 * One worker's map from its external block hash (u64 as hi, lo) to a non-zero u32
 * (the block it names). Open addressing with linear probing over one Uint32Array of
 * (hi, lo, value) triples; value 0 marks an empty slot; deletion shifts the following
 * run back (no tombstones), so probe lengths never degrade under churn.
 *
 * Capacity is not a power of two: the home slot is a multiply-shift of a mixed hash,
 * and the table grows by 1.5x (load between 1/2 and 3/4 after growth) and shrinks
 * below 1/5, so bytes per entry stay near 12 / 0.62 instead of doubling's swings.
 */
import { assert } from "./assert";

const STRIDE = 3;
const CAPACITY_MIN = 16;
const LOAD_MAX = 0.75;
const LOAD_SHRINK = 0.2;
const GROWTH = 1.5;
const TWO_POW_32 = 4294967296;

/** Mixes a u64 (hi, lo) into a well-spread u32 (murmur3's finalizer). */
export function mixHash(hi: number, lo: number): number {
  let h = (lo ^ Math.imul(hi, 0x9e3779b1)) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

export class ExternalLookup {
  table: Uint32Array;
  capacity: number;
  count = 0;
  /** After find(): the entry's slot if found, else the empty slot an insert would take. */
  probeSlot = 0;
  private limit: number;

  constructor(capacity = CAPACITY_MIN) {
    this.capacity = capacity;
    this.limit = Math.floor(capacity * LOAD_MAX);
    this.table = new Uint32Array(capacity * STRIDE);
  }

  private home(hi: number, lo: number): number {
    return Math.floor(mixHash(hi, lo) * this.capacity / TWO_POW_32);
  }

  /** The value stored for (hi, lo), or 0. Sets probeSlot. */
  find(hi: number, lo: number): number {
    const table = this.table;
    const capacity = this.capacity;
    let slot = this.home(hi, lo);
    // Bounded: the load limit keeps at least one empty slot.
    for (let probes = 0; probes < capacity; probes++) {
      const at = slot * STRIDE;
      const value = table[at + 2]!;
      if (value === 0) {
        this.probeSlot = slot;
        return 0;
      }
      if (table[at] === hi && table[at + 1] === lo) {
        this.probeSlot = slot;
        return value;
      }
      if (++slot === capacity) slot = 0;
    }
    throw new Error("lookup table has no empty slot");
  }

  /** Inserts (hi, lo) -> value; find(hi, lo) must have just returned 0. */
  insertAtProbe(hi: number, lo: number, value: number): void {
    assert(value !== 0, "lookup value must be non-zero");
    if (this.count + 1 > this.limit) {
      this.resize(Math.ceil(this.capacity * GROWTH));
      assert(this.find(hi, lo) === 0, "lookup insert of a present key");
    }
    const at = this.probeSlot * STRIDE;
    assert(this.table[at + 2] === 0, "lookup insert into a used slot");
    this.table[at] = hi;
    this.table[at + 1] = lo;
    this.table[at + 2] = value;
    this.count++;
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
    const capacity = this.capacity;
    let hole = this.probeSlot;
    assert(table[hole * STRIDE + 2] !== 0, "lookup remove of an empty slot");
    let slot = hole;
    for (let probes = 0; probes < capacity; probes++) {
      if (++slot === capacity) slot = 0;
      const at = slot * STRIDE;
      if (table[at + 2] === 0) break;
      const home = this.home(table[at]!, table[at + 1]!);
      // The entry may move into the hole only if the hole lies on its probe path.
      if ((hole - home + capacity) % capacity < (slot - home + capacity) % capacity) {
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
    this.count--;
    if (this.capacity > CAPACITY_MIN && this.count < this.capacity * LOAD_SHRINK) {
      this.resize(Math.max(CAPACITY_MIN, Math.ceil(this.count * 2)));
    }
  }

  /** Drops every entry and returns to the minimum size. */
  clear(): void {
    this.count = 0;
    if (this.capacity === CAPACITY_MIN) {
      this.table.fill(0);
      return;
    }
    this.capacity = CAPACITY_MIN;
    this.limit = Math.floor(CAPACITY_MIN * LOAD_MAX);
    this.table = new Uint32Array(CAPACITY_MIN * STRIDE);
  }

  bytes(): number {
    return this.table.byteLength;
  }

  private resize(capacity: number): void {
    assert(capacity * LOAD_MAX >= this.count, "lookup resize below its count");
    const old = this.table;
    const oldCapacity = this.capacity;
    this.table = new Uint32Array(capacity * STRIDE);
    this.capacity = capacity;
    this.limit = Math.floor(capacity * LOAD_MAX);
    const table = this.table;
    for (let i = 0; i < oldCapacity; i++) {
      const from = i * STRIDE;
      const value = old[from + 2]!;
      if (value === 0) continue;
      const hi = old[from]!;
      const lo = old[from + 1]!;
      let slot = this.home(hi, lo);
      while (table[slot * STRIDE + 2] !== 0) if (++slot === capacity) slot = 0;
      const at = slot * STRIDE;
      table[at] = hi;
      table[at + 1] = lo;
      table[at + 2] = value;
    }
  }
}
