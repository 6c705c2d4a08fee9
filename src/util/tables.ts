/**
 * Open-addressing hash tables in typed arrays, for keys that are hash values: linear
 * probing, backward-shift deletion (no tombstones, so no rebuild while the size is
 * steady), load at most 1/2, and memory given back as they empty. Three key shapes:
 *
 *   KeyTable     a number in [0, 2^53) (53 bits of a hash) -> int32
 *   PairTable    a 64-bit hash as (hi, lo) u32 words      -> u32
 *   TripleTable  (u32 owner, hi, lo)                        -> int32 >= 0
 *
 * One mix (`mix`) places the keys of every table but KeyTable (whose keys are hash
 * bits already); one rule (`capacityFor`) grows and shrinks every table.
 * test/util/tables.test.ts runs one conformance suite against each of them (and
 * against the index's own tables through adapters).
 *
 * Why not a Map: JSC's Map leaves deleted entries behind and rebuilds its table when
 * they pile up, which under steady churn stalls one operation in every few tens of
 * thousands, ~5 ms at 65k entries (bench/lifecycle-stalls.bench.ts), and a Map keyed
 * by strings or BigInts is rescanned by every young collection.
 * See docs/decisions.md#typed-array-records.
 */

/** Smallest capacity (entries) of a table. */
export const TABLE_CAPACITY_MIN = 64;

/** Bucket hash of two u32 words (multiply, xor-shift, as murmur3's finalizer). */
export function mix(a: number, b: number): number {
  let h = Math.imul(b ^ Math.imul(a, 0x9e37_79b1), 0x85eb_ca6b);
  h ^= h >>> 15;
  h = Math.imul(h, 0xc2b2_ae35);
  return h ^ (h >>> 13);
}

/**
 * The capacity (a power of two) for `count` entries, from the current one: doubled
 * past load 1/2, a quarter under load 1/8 (the gap keeps a steady size from
 * flipping), never below `min`.
 */
export function capacityFor(count: number, capacity: number, min: number): number {
  while (2 * count > capacity) capacity *= 2;
  while (capacity > min && 8 * count < capacity) capacity = Math.max(min, capacity / 4);
  return capacity;
}

/** `requested` rounded up to a power of two, at least TABLE_CAPACITY_MIN. */
function powerOfTwo(requested: number): number {
  let capacity = TABLE_CAPACITY_MIN;
  while (capacity < requested) capacity *= 2;
  return capacity;
}

/**
 * Whether the entry at bucket `j`, whose home is `home`, moves back into the hole at
 * `hole` (its home does not lie cyclically in (hole, j]).
 */
function movesBack(home: number, hole: number, j: number, mask: number): boolean {
  return ((j - home) & mask) >= ((j - hole) & mask);
}

const EMPTY_KEY = -1;

/** Number keys in [0, 2^53) (53 bits of a hash) to int32 values. */
export class KeyTable {
  private keys = new Float64Array(TABLE_CAPACITY_MIN).fill(EMPTY_KEY);
  private values = new Int32Array(TABLE_CAPACITY_MIN);
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** Bytes held by the table's arrays. */
  get bytes(): number {
    return this.keys.byteLength + this.values.byteLength;
  }

  /** The key's value, or -1. */
  get(key: number): number {
    const keys = this.keys;
    const mask = keys.length - 1;
    for (let i = keyHome(key) & mask; ; i = (i + 1) & mask) {
      const at = keys[i]!;
      if (at === key) return this.values[i]!;
      if (at === EMPTY_KEY) return -1;
    }
  }

  /** Sets the key's value (adding the key if it is new). */
  set(key: number, value: number): void {
    if (!(key >= 0 && key <= Number.MAX_SAFE_INTEGER && Math.floor(key) === key)) {
      throw new RangeError(`bad key ${key}`);
    }
    if (2 * (this.count + 1) > this.keys.length) {
      this.resize(capacityFor(this.count + 1, this.keys.length, TABLE_CAPACITY_MIN));
    }
    const keys = this.keys;
    const mask = keys.length - 1;
    let i = keyHome(key) & mask;
    while (keys[i] !== EMPTY_KEY && keys[i] !== key) i = (i + 1) & mask;
    if (keys[i] === EMPTY_KEY) {
      keys[i] = key;
      this.count++;
    }
    this.values[i] = value;
  }

  /** Removes the key; false if it was not there. */
  delete(key: number): boolean {
    const keys = this.keys;
    const values = this.values;
    const mask = keys.length - 1;
    let i = keyHome(key) & mask;
    while (keys[i] !== key) {
      if (keys[i] === EMPTY_KEY) return false;
      i = (i + 1) & mask;
    }
    for (let j = (i + 1) & mask; keys[j] !== EMPTY_KEY; j = (j + 1) & mask) {
      if (movesBack(keyHome(keys[j]!) & mask, i, j, mask)) {
        keys[i] = keys[j]!;
        values[i] = values[j]!;
        i = j;
      }
    }
    keys[i] = EMPTY_KEY;
    this.count--;
    if (8 * this.count < keys.length && keys.length > TABLE_CAPACITY_MIN) {
      this.resize(capacityFor(this.count, keys.length, TABLE_CAPACITY_MIN));
    }
    return true;
  }

  private resize(capacity: number): void {
    const keys = this.keys;
    const values = this.values;
    this.keys = new Float64Array(capacity).fill(EMPTY_KEY);
    this.values = new Int32Array(capacity);
    this.count = 0;
    for (let i = 0; i < keys.length; i++) if (keys[i] !== EMPTY_KEY) this.set(keys[i]!, values[i]!);
  }
}

/**
 * A key is 53 bits of a hash already: its low 32 bits place it, unmixed. (Mixing cost
 * ~20 ns per get + delete + set on the request lifecycle path, 3-4% of a routing
 * decision at 8 workers; bench/RESULTS.md, "Shared tables".)
 */
function keyHome(key: number): number {
  return key | 0;
}

const U32_MAX = 0xffff_ffff;
/** PairTable entry: hi, lo, value, used (0/1). */
const PAIR_STRIDE = 4;

/** 64-bit hashes as (hi, lo) u32 words to u32 values, in one Uint32Array of entries. */
export class PairTable {
  private entries: Uint32Array;
  private mask: number;
  private count = 0;
  /** The capacity it was made with: it never shrinks below. */
  private readonly capacityMin: number;

  /** `initialCapacity` entries (a power of two at least TABLE_CAPACITY_MIN). */
  constructor(initialCapacity = TABLE_CAPACITY_MIN) {
    this.capacityMin = powerOfTwo(initialCapacity);
    this.entries = new Uint32Array(PAIR_STRIDE * this.capacityMin);
    this.mask = this.capacityMin - 1;
  }

  get size(): number {
    return this.count;
  }

  /** Bytes held by the table's array. */
  get bytes(): number {
    return this.entries.byteLength;
  }

  /** The value for (hi, lo), or -1 when absent. */
  get(hi: number, lo: number): number {
    const at = this.find(hi, lo);
    return at < 0 ? -1 : this.entries[at + 2]!;
  }

  has(hi: number, lo: number): boolean {
    return this.find(hi, lo) >= 0;
  }

  /** Sets the value for (hi, lo); returns true if the key is new. */
  set(hi: number, lo: number, value: number): boolean {
    if (!(value >= 0 && value <= U32_MAX)) throw new RangeError(`value ${value} is not a u32`);
    if (2 * (this.count + 1) > this.mask + 1) {
      this.resize(capacityFor(this.count + 1, this.mask + 1, this.capacityMin));
    }
    const entries = this.entries;
    const mask = this.mask;
    const h = hi >>> 0;
    const l = lo >>> 0;
    for (let i = mix(h, l) & mask; ; i = (i + 1) & mask) {
      const e = PAIR_STRIDE * i;
      if (entries[e + 3] === 0) {
        entries[e] = h;
        entries[e + 1] = l;
        entries[e + 2] = value;
        entries[e + 3] = 1;
        this.count++;
        return true;
      }
      if (entries[e] === h && entries[e + 1] === l) {
        entries[e + 2] = value;
        return false;
      }
    }
  }

  /**
   * Adds `delta` to the value of (hi, lo) (absent = 0) and returns the result; an
   * entry whose value becomes 0 is removed. One probe for a reference count.
   */
  adjust(hi: number, lo: number, delta: number): number {
    const at = this.find(hi, lo);
    const value = (at < 0 ? 0 : this.entries[at + 2]!) + delta;
    if (!(value >= 0 && value <= U32_MAX)) throw new RangeError(`value ${value} is not a u32`);
    if (at < 0) {
      if (value !== 0) this.set(hi, lo, value);
    } else if (value === 0) {
      this.removeAt(at);
    } else {
      this.entries[at + 2] = value;
    }
    return value;
  }

  /** Removes (hi, lo); returns false if it was absent. */
  delete(hi: number, lo: number): boolean {
    const at = this.find(hi, lo);
    if (at < 0) return false;
    this.removeAt(at);
    return true;
  }

  /** Empties the table, sized for `expected` entries (a set reused per batch). */
  clear(expected = 0): void {
    const capacity = capacityFor(expected, this.mask + 1, this.capacityMin);
    if (capacity === this.mask + 1) this.entries.fill(0);
    else this.entries = new Uint32Array(PAIR_STRIDE * capacity);
    this.mask = capacity - 1;
    this.count = 0;
  }

  /** Calls `visit(hi, lo, value)` for every entry (do not change the table meanwhile). */
  forEach(visit: (hi: number, lo: number, value: number) => void): void {
    const entries = this.entries;
    for (let e = 0; e < entries.length; e += PAIR_STRIDE) {
      if (entries[e + 3] === 1) visit(entries[e]!, entries[e + 1]!, entries[e + 2]!);
    }
  }

  /** Entry offset of (hi, lo), or -1. */
  private find(hi: number, lo: number): number {
    const entries = this.entries;
    const mask = this.mask;
    const h = hi >>> 0;
    const l = lo >>> 0;
    for (let i = mix(h, l) & mask; ; i = (i + 1) & mask) {
      const e = PAIR_STRIDE * i;
      if (entries[e + 3] === 0) return -1;
      if (entries[e] === h && entries[e + 1] === l) return e;
    }
  }

  private removeAt(at: number): void {
    const entries = this.entries;
    const mask = this.mask;
    let hole = at >>> 2; // PAIR_STRIDE words per entry
    for (let j = (hole + 1) & mask; entries[PAIR_STRIDE * j + 3] === 1; j = (j + 1) & mask) {
      const e = PAIR_STRIDE * j;
      if (movesBack(mix(entries[e]!, entries[e + 1]!) & mask, hole, j, mask)) {
        entries.copyWithin(PAIR_STRIDE * hole, e, e + PAIR_STRIDE);
        hole = j;
      }
    }
    entries[PAIR_STRIDE * hole + 3] = 0;
    this.count--;
    if (8 * this.count < mask + 1 && mask + 1 > this.capacityMin) {
      this.resize(capacityFor(this.count, mask + 1, this.capacityMin));
    }
  }

  private resize(capacity: number): void {
    const old = this.entries;
    this.entries = new Uint32Array(PAIR_STRIDE * capacity);
    this.mask = capacity - 1;
    this.count = 0;
    for (let e = 0; e < old.length; e += PAIR_STRIDE) {
      if (old[e + 3] === 1) this.set(old[e]!, old[e + 1]!, old[e + 2]!);
    }
  }
}

/** TripleTable entry: owner, hi, lo, value + 1 (0 = empty). */
const TRIPLE_STRIDE = 4;
/** Entry index to word offset and back: `<< 2`, `>>> 2` (integer shifts, not divisions). */
const TRIPLE_SHIFT = 2;
const TRIPLE_VALUE_MAX = 0x7fff_fffe;

/**
 * (owner, hi, lo) to int32 values >= 0: a 64-bit hash qualified by a u32 (a parent
 * node, a dp rank). Placed by (owner, lo): the hashes are uniform, lo suffices.
 */
export class TripleTable {
  private entries = new Int32Array(TRIPLE_STRIDE * TABLE_CAPACITY_MIN);
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** Bytes held by the table's array. */
  get bytes(): number {
    return this.entries.byteLength;
  }

  /** The value of (owner, hi, lo), or -1. */
  get(owner: number, hi: number, lo: number): number {
    const at = this.find(owner | 0, hi | 0, lo | 0);
    return at < 0 ? -1 : this.entries[at + 3]! - 1;
  }

  /** Sets the value of (owner, hi, lo), adding the key if it is new; true if it was new. */
  set(owner: number, hi: number, lo: number, value: number): boolean {
    if (!(value >= 0 && value <= TRIPLE_VALUE_MAX)) {
      throw new RangeError(`bad table value ${value}`);
    }
    const at = this.find(owner | 0, hi | 0, lo | 0);
    if (at >= 0) {
      this.entries[at + 3] = value + 1;
      return false;
    }
    const capacity = this.entries.length >>> TRIPLE_SHIFT;
    if (2 * (this.count + 1) > capacity) {
      this.resize(capacityFor(this.count + 1, capacity, TABLE_CAPACITY_MIN));
    }
    this.insert(owner | 0, hi | 0, lo | 0, value + 1);
    return true;
  }

  /** Removes (owner, hi, lo); false if it was absent. */
  delete(owner: number, hi: number, lo: number): boolean {
    const at = this.find(owner | 0, hi | 0, lo | 0);
    if (at < 0) return false;
    const entries = this.entries;
    const mask = (entries.length >>> TRIPLE_SHIFT) - 1;
    let hole = at >>> TRIPLE_SHIFT;
    for (let j = (hole + 1) & mask; entries[TRIPLE_STRIDE * j + 3] !== 0; j = (j + 1) & mask) {
      const e = TRIPLE_STRIDE * j;
      if (movesBack(mix(entries[e]!, entries[e + 2]!) & mask, hole, j, mask)) {
        entries.copyWithin(TRIPLE_STRIDE * hole, e, e + TRIPLE_STRIDE);
        hole = j;
      }
    }
    entries.fill(0, TRIPLE_STRIDE * hole, TRIPLE_STRIDE * hole + TRIPLE_STRIDE);
    this.count--;
    if (8 * this.count < mask + 1 && mask + 1 > TABLE_CAPACITY_MIN) {
      this.resize(capacityFor(this.count, mask + 1, TABLE_CAPACITY_MIN));
    }
    return true;
  }

  /** Keeps only the entries `keep` accepts (one rebuild), then shrinks if sparse. */
  retain(keep: (owner: number, hi: number, lo: number, value: number) => boolean): void {
    const old = this.entries;
    this.entries = new Int32Array(old.length);
    this.count = 0;
    for (let e = 0; e < old.length; e += TRIPLE_STRIDE) {
      const stored = old[e + 3]!;
      if (stored !== 0 && keep(old[e]! >>> 0, old[e + 1]! >>> 0, old[e + 2]! >>> 0, stored - 1)) {
        this.insert(old[e]!, old[e + 1]!, old[e + 2]!, stored);
      }
    }
    const capacity = this.entries.length >>> TRIPLE_SHIFT;
    if (capacityFor(this.count, capacity, TABLE_CAPACITY_MIN) !== capacity) {
      this.resize(capacityFor(this.count, capacity, TABLE_CAPACITY_MIN));
    }
  }

  /** Empties the table and gives its memory back. */
  clear(): void {
    if (this.entries.length > TRIPLE_STRIDE * TABLE_CAPACITY_MIN) {
      this.entries = new Int32Array(TRIPLE_STRIDE * TABLE_CAPACITY_MIN);
    } else {
      this.entries.fill(0);
    }
    this.count = 0;
  }

  /** Entry offset of the key (words as int32), or -1. */
  private find(owner: number, hi: number, lo: number): number {
    const entries = this.entries;
    const mask = (entries.length >>> TRIPLE_SHIFT) - 1;
    for (let i = mix(owner, lo) & mask; ; i = (i + 1) & mask) {
      const e = TRIPLE_STRIDE * i;
      if (entries[e + 3] === 0) return -1;
      if (entries[e + 2] === lo && entries[e] === owner && entries[e + 1] === hi) return e;
    }
  }

  /** Puts a new key's entry (stored = value + 1) in the first free bucket of its run. */
  private insert(owner: number, hi: number, lo: number, stored: number): void {
    const entries = this.entries;
    const mask = (entries.length >>> TRIPLE_SHIFT) - 1;
    let i = mix(owner, lo) & mask;
    while (entries[TRIPLE_STRIDE * i + 3] !== 0) i = (i + 1) & mask;
    const e = TRIPLE_STRIDE * i;
    entries[e] = owner;
    entries[e + 1] = hi;
    entries[e + 2] = lo;
    entries[e + 3] = stored;
    this.count++;
  }

  private resize(capacity: number): void {
    const old = this.entries;
    this.entries = new Int32Array(TRIPLE_STRIDE * capacity);
    this.count = 0;
    for (let e = 0; e < old.length; e += TRIPLE_STRIDE) {
      if (old[e + 3] !== 0) this.insert(old[e]!, old[e + 1]!, old[e + 2]!, old[e + 3]!);
    }
  }
}
