/**
 * A hash map from a 64-bit hash, given as a (hi, lo) pair of u32 words, to a u32 value:
 * open addressing with linear probing and backward-shift deletion, in one Uint32Array
 * of (hi, lo, value, used) entries. No objects or BigInts per entry, which is what
 * makes the simulator's per-block bookkeeping (router load, approximate trees) cheap.
 * Grows by doubling (the only allocation site) and keeps load at most 1/2.
 */

const STRIDE = 4;
const MIN_BUCKETS = 64;
/** A probe run longer than this means the table is broken (load ≤ 1/2 keeps runs short). */
const PROBE_MAX = 1 << 16;
const U32_MAX = 0xffff_ffff;

export class PairTable {
  private entries: Uint32Array;
  private mask: number;
  private shift: number;
  private count = 0;

  constructor(initialBuckets = MIN_BUCKETS) {
    const buckets = 2 ** Math.max(Math.log2(MIN_BUCKETS), Math.ceil(Math.log2(initialBuckets)));
    this.entries = new Uint32Array(STRIDE * buckets);
    this.mask = buckets - 1;
    this.shift = 32 - Math.log2(buckets);
  }

  get size(): number {
    return this.count;
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
    if (2 * (this.count + 1) > this.mask + 1) this.grow();
    const entries = this.entries;
    const h = hi >>> 0;
    const l = lo >>> 0;
    for (let i = home(h, l, this.shift), probes = 0; probes < PROBE_MAX; i = (i + 1) & this.mask, probes++) {
      const e = STRIDE * i;
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
    throw new Error("pair table probe bound exceeded");
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

  private removeAt(at: number): void {
    const entries = this.entries;
    const mask = this.mask;
    let hole = at / STRIDE;
    for (let i = (hole + 1) & mask; entries[STRIDE * i + 3] === 1; i = (i + 1) & mask) {
      const want = home(entries[STRIDE * i]!, entries[STRIDE * i + 1]!, this.shift);
      // Move the entry back into the hole unless its home lies cyclically in (hole, i].
      if (((i - want) & mask) >= ((i - hole) & mask)) {
        entries[STRIDE * hole] = entries[STRIDE * i]!;
        entries[STRIDE * hole + 1] = entries[STRIDE * i + 1]!;
        entries[STRIDE * hole + 2] = entries[STRIDE * i + 2]!;
        entries[STRIDE * hole + 3] = 1;
        hole = i;
      }
    }
    entries[STRIDE * hole + 3] = 0;
    this.count--;
  }

  /** Calls `visit(hi, lo, value)` for every entry (do not mutate the table meanwhile). */
  forEach(visit: (hi: number, lo: number, value: number) => void): void {
    const entries = this.entries;
    for (let e = 0; e < entries.length; e += STRIDE) {
      if (entries[e + 3] === 1) visit(entries[e]!, entries[e + 1]!, entries[e + 2]!);
    }
  }

  /** Entry offset of (hi, lo), or -1. */
  private find(hi: number, lo: number): number {
    const entries = this.entries;
    const mask = this.mask;
    const h = hi >>> 0;
    const l = lo >>> 0;
    for (let i = home(h, l, this.shift), probes = 0; probes < PROBE_MAX; i = (i + 1) & mask, probes++) {
      const e = STRIDE * i;
      if (entries[e + 3] === 0) return -1;
      if (entries[e] === h && entries[e + 1] === l) return e;
    }
    throw new Error("pair table probe bound exceeded");
  }

  private grow(): void {
    const old = this.entries;
    const buckets = 2 * (this.mask + 1);
    this.entries = new Uint32Array(STRIDE * buckets);
    this.mask = buckets - 1;
    this.shift = 32 - Math.log2(buckets);
    this.count = 0;
    for (let e = 0; e < old.length; e += STRIDE) if (old[e + 3] === 1) this.set(old[e]!, old[e + 1]!, old[e + 2]!);
  }
}

/** Bucket of a hash: Fibonacci hashing of its mixed words (the top bits). */
export function home(hi: number, lo: number, shift: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85eb_ca6b), 0x9e37_79b1) >>> shift;
}
