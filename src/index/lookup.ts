/**
 * One worker's map from its external block hash (u64 as hi, lo) to a non-zero u32
 * (the block it names). Open addressing with linear probing over one Uint32Array of
 * (hi, lo, value) triples; value 0 marks an empty slot; deletion shifts the following
 * run back (no tombstones), so probe lengths never degrade under churn.
 *
 * Sizing trades speed for bytes per entry (12 bytes / load):
 * - small tables (up to 1,024 slots, 12 KiB) have a power-of-two capacity, pick the
 *   home slot with a shift and double above 1/2 load: short probe runs and cheap home
 *   slots (on Bun a multiply-shift range reduction costs about 1.4x), where the bytes
 *   do not matter;
 * - large tables take any capacity, pick the home slot with a multiply-shift range
 *   reduction, grow by 1.25x above 4/5 load (or at once to fit the rest of the run
 *   being inserted) and shrink below 2/5: load stays in [0.6, 0.8] instead of
 *   doubling's [0.375, 0.75], 17 bytes per entry instead of 21 on average and 24 right
 *   after a doubling.
 *
 * Keys are u32 words as read from a Uint32Array (callers normalize with `>>> 0`).
 *
 * An event's removals (`removeMany`) and a run of inserts (`insertRun`) go through the
 * native library when it is loaded (native/kvedge.c: the same table, the same rules, in
 * one call per event; the loop below as the fallback): about half of a removal's time
 * was the backward shift's per-entry work (docs/decisions.md#native-lookup-calls).
 */
import { native } from "../native/library";
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
/** The native calls' in-out words: the entry count, then a resize threshold. */
const nativeLimits = new Uint32Array(2);

/** A multiplicative hash of (hi, lo); its high bits pick the home slot. */
export function mixKey(hi: number, lo: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> 0;
}

/** The slot of mix `h`: its top bits (small tables, `shift` > 0), else h * capacity / 2^32. */
function homeSlot(h: number, shift: number, scale: number): number {
  return shift !== 0 ? h >>> shift : (h * scale) | 0;
}

export class ExternalLookup {
  table: Uint32Array;
  capacity: number;
  count = 0;
  /** After find(): the entry's slot if found, else the empty slot an insert would take. */
  probeSlot = 0;
  /** What touch() read (kept so the loads are not optimized away). */
  touched = 0;
  /** 32 - log2(capacity) for a small table; 0 for a large one. */
  private shift: number;
  /** capacity / 2^32 (a large table's range reduction). */
  private scale = 0;
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
    return this.shift !== 0 ? h >>> this.shift : (h * this.scale) | 0;
  }

  /** The value stored for (hi, lo), or 0. Sets probeSlot. */
  find(hi: number, lo: number): number {
    const table = this.table;
    const capacity = this.capacity;
    let slot = this.home(hi, lo);
    // Bounded: the load limit keeps empty slots, so the probe ends within the table.
    for (;;) {
      const at = slot * STRIDE;
      const value = table[at + 2]!;
      if (value === 0 || (table[at + 1] === lo && table[at] === hi)) {
        this.probeSlot = slot;
        return value;
      }
      if (++slot === capacity) slot = 0;
    }
  }

  /**
   * Inserts (hi, lo) -> value; find(hi, lo) must have just returned 0. `pending`: keys
   * the caller's run may still insert, room for which a growth makes at once.
   */
  insertAtProbe(hi: number, lo: number, value: number, pending = 0): void {
    const table = this.table;
    const at = this.probeSlot * STRIDE;
    if (value === 0 || table[at + 2] !== 0) fail("lookup insert without a free probe slot");
    table[at] = hi;
    table[at + 1] = lo;
    table[at + 2] = value;
    if (++this.count > this.grow) this.resize(this.grownCapacity(pending));
  }

  /** Sets (hi, lo) -> value, inserting or overwriting. */
  set(hi: number, lo: number, value: number): void {
    if (this.find(hi, lo) === 0) this.insertAtProbe(hi, lo, value);
    else this.table[this.probeSlot * STRIDE + 2] = value;
  }

  /**
   * Reads the home slot of each key first..first+count of `keys` ((hi, lo) pairs), so
   * that the finds that follow hit the cache: this loop's loads do not depend on each
   * other and the core overlaps their misses, where a find's miss stalls its caller.
   * See docs/decisions.md#lookup-memory-bound. A small table (12 KiB at most) stays in
   * the cache and the extra loop is pure cost (about 20% of the shared-prompt churn), so
   * only large tables are touched.
   */
  touch(keys: Uint32Array, first: number, count: number): void {
    if (this.shift !== 0) return;
    const table = this.table;
    let sum = 0;
    const shift = this.shift;
    const scale = this.scale;
    for (let i = first; i < first + count; i++) {
      sum ^= table[homeSlot(mixKey(keys[2 * i]!, keys[2 * i + 1]!), shift, scale) * STRIDE + 2]!;
    }
    this.touched = sum;
  }

  /** Removes (hi, lo); returns its value, or 0 if absent. */
  remove(hi: number, lo: number): number {
    const value = this.find(hi, lo);
    if (value !== 0) this.removeAtProbe();
    return value;
  }

  /**
   * Removes keys first..first+count of `keys` ((hi, lo) pairs) in order; out[i] = the
   * value removed for key first + i, or 0 if it was absent.
   */
  removeMany(keys: Uint32Array, first: number, count: number, out: Uint32Array): void {
    // The native call trusts these bounds: check them once per event.
    const keysShort = keys.length < 2 * (first + count);
    if (keysShort || out.length < count) fail("lookup removal past its arrays");
    if (native === null) {
      this.touch(keys, first, count);
      for (let i = 0; i < count; i++) {
        const at = 2 * (first + i);
        out[i] = this.remove(keys[at]!, keys[at + 1]!);
      }
      return;
    }
    // Bounded: every call takes at least one key; it stops early only to shrink.
    for (let done = 0; done < count; ) {
      done += native.kv_lookup_remove(
        this.table,
        this.capacity,
        this.shift,
        this.scale,
        keys,
        first + done,
        count - done,
        out,
        done,
        this.limitsWith(Math.max(this.shrink, 0)),
      );
      this.count = nativeLimits[0]!;
      if (this.count < this.shrink) this.resize(this.shrunkCapacity());
    }
  }

  /**
   * Inserts keys[first + i] -> value + i for i = 0 .. count - 1 in order, up to the first
   * key already present; returns how many it inserted.
   */
  insertRun(keys: Uint32Array, first: number, count: number, value: number): number {
    if (value === 0) fail("lookup insert of the null value");
    if (keys.length < 2 * (first + count)) fail("lookup insert out of range");
    let done = 0;
    if (native === null) {
      this.touch(keys, first, count);
      for (; done < count; done++) {
        const at = 2 * (first + done);
        if (this.find(keys[at]!, keys[at + 1]!) !== 0) break;
        this.insertAtProbe(keys[at]!, keys[at + 1]!, value + done, count - done - 1);
      }
      this.settleRun();
      return done;
    }
    // Bounded: a call that inserts nothing stopped at a present key, and so do we.
    while (done < count) {
      done += native.kv_lookup_insert_run(
        this.table,
        this.capacity,
        this.shift,
        this.scale,
        keys,
        first + done,
        count - done,
        value + done,
        this.limitsWith(this.grow),
      );
      this.count = nativeLimits[0]!;
      if (this.count > this.grow) this.resize(this.grownCapacity(count - done));
      else if (done < count) break;
    }
    this.settleRun();
    return done;
  }

  /**
   * Grows now, if need be, so that `keys` more inserts take no resize: a store calls it
   * before it changes anything a reader of the shared index can see, so a reader that
   * meets the event's open nodes never waits out a resize.
   */
  reserve(keys: number): void {
    // Bounded: every step at least doubles a small table or grows a large one past the need.
    while (this.count + keys > this.grow) this.resize(this.grownCapacity(keys));
  }

  /**
   * After a run of inserts: one that stopped early (at a key already present) may have
   * grown the table for keys it never inserted; it shrinks back as a removal would.
   */
  settleRun(): void {
    if (this.count < this.shrink) this.resize(this.shrunkCapacity());
  }

  /** nativeLimits filled with this table's count and `threshold`. */
  private limitsWith(threshold: number): Uint32Array {
    nativeLimits[0] = this.count;
    nativeLimits[1] = threshold;
    return nativeLimits;
  }

  /**
   * Removes the entry find() just found (it must have returned non-zero), shifting its
   * probe run back. Unchecked on purpose: a check here measured 25% of a store+remove
   * cycle on Bun, and both callers have just seen the entry.
   */
  removeAtProbe(): void {
    const table = this.table;
    const capacity = this.capacity;
    let hole = this.probeSlot;
    let slot = hole;
    for (;;) {
      if (++slot === capacity) slot = 0;
      const at = slot * STRIDE;
      if (table[at + 2] === 0) break;
      const home = this.home(table[at]!, table[at + 1]!);
      // The entry may move into the hole only if the hole lies on its probe path.
      let toHole = hole - home;
      if (toHole < 0) toHole += capacity;
      let toSlot = slot - home;
      if (toSlot < 0) toSlot += capacity;
      if (toHole < toSlot) {
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

  /**
   * The capacity after a growth, with room for `pending` more keys of the run being
   * inserted: a page-1 prompt of 100k blocks grows its table once, not a dozen times.
   */
  private grownCapacity(pending: number): number {
    if (this.capacity < SMALL_CAPACITY_MAX) return this.capacity * 2;
    const wanted = Math.ceil((this.count + pending) / LARGE_LOAD_TARGET);
    return Math.max(wanted, Math.ceil(this.capacity * LARGE_GROWTH));
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
      this.scale = 0;
      this.grow = capacity >> 1;
      this.shrink = bits > SMALL_BITS_MIN ? capacity >> 3 : -1;
    } else {
      this.shift = 0;
      this.scale = capacity * INV_2_POW_32;
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
    const shift = this.shift;
    const scale = this.scale;
    if (native !== null) {
      native.kv_lookup_rehash(old, old.length / STRIDE, table, capacity, shift, scale);
      return;
    }
    for (let from = 0; from < old.length; from += STRIDE) {
      const value = old[from + 2]!;
      if (value === 0) continue;
      const hi = old[from]!;
      const lo = old[from + 1]!;
      let slot = homeSlot(mixKey(hi, lo), shift, scale);
      while (table[slot * STRIDE + 2] !== 0) if (++slot === capacity) slot = 0;
      const at = slot * STRIDE;
      table[at] = hi;
      table[at + 1] = lo;
      table[at + 2] = value;
    }
  }
}
