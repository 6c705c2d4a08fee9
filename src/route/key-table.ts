/**
 * A map from integer keys (0 <= key < 2^53, uniformly spread: hash values) to int32
 * values, in typed arrays: open addressing with linear probing and backward-shift
 * deletion, so there are no tombstones and no rebuild while the size is steady.
 *
 * Why not a Map: JSC's Map leaves deleted entries behind and rebuilds its table when
 * they pile up, which under steady churn (an entry in, an entry out) stalls one
 * operation in every few tens of thousands, ~5 ms at 65k entries
 * (bench/lifecycle-stalls.bench.ts). This table only rebuilds when it grows or shrinks
 * by a factor of 4.
 *
 * See docs/decisions.md#typed-array-records.
 */
const EMPTY = -1;
const INITIAL_CAPACITY = 64;

export class KeyTable {
  private keys = new Float64Array(INITIAL_CAPACITY).fill(EMPTY);
  private values = new Int32Array(INITIAL_CAPACITY);
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** The key's value, or -1. */
  get(key: number): number {
    const keys = this.keys;
    const mask = keys.length - 1;
    for (let i = (key | 0) & mask; ; i = (i + 1) & mask) {
      const at = keys[i]!;
      if (at === key) return this.values[i]!;
      if (at === EMPTY) return -1;
    }
  }

  /** Sets the key's value (adding the key if it is new). */
  set(key: number, value: number): void {
    if (!(key >= 0 && key <= Number.MAX_SAFE_INTEGER && Math.floor(key) === key)) throw new RangeError(`bad key ${key}`);
    if (2 * (this.count + 1) > this.keys.length) this.resize(this.keys.length * 2);
    const keys = this.keys;
    const mask = keys.length - 1;
    let i = (key | 0) & mask;
    while (keys[i] !== EMPTY && keys[i] !== key) i = (i + 1) & mask;
    if (keys[i] === EMPTY) {
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
    let i = (key | 0) & mask;
    while (keys[i] !== key) {
      if (keys[i] === EMPTY) return false;
      i = (i + 1) & mask;
    }
    // Backward shift: move up each later entry of the probe run whose home is not in (i, j].
    for (let j = (i + 1) & mask; keys[j] !== EMPTY; j = (j + 1) & mask) {
      const home = (keys[j]! | 0) & mask;
      if (((j - home) & mask) >= ((j - i) & mask)) {
        keys[i] = keys[j]!;
        values[i] = values[j]!;
        i = j;
      }
    }
    keys[i] = EMPTY;
    this.count--;
    // Give memory back after a burst, with room to spare so a steady size never flips.
    if (this.keys.length > INITIAL_CAPACITY && 8 * this.count < this.keys.length) this.resize(Math.max(INITIAL_CAPACITY, this.keys.length / 4));
    return true;
  }

  /** Bytes held by the table's arrays. */
  get bytes(): number {
    return this.keys.byteLength + this.values.byteLength;
  }

  private resize(capacity: number): void {
    const keys = this.keys;
    const values = this.values;
    this.keys = new Float64Array(capacity).fill(EMPTY);
    this.values = new Int32Array(capacity);
    this.count = 0;
    for (let i = 0; i < keys.length; i++) if (keys[i] !== EMPTY) this.set(keys[i]!, values[i]!);
  }
}
