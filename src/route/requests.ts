/**
 * The records of active requests: who each one is (its id), where its load sits, and
 * the order they were last touched in. `LoadTracker` (./load.ts) decides what a
 * lifecycle call does to a worker's load and when a request expires or is evicted;
 * this file only stores, finds and frees requests.
 *
 * Active requests are records in typed arrays (per record: worker slot, -1 = free;
 * leaf in the active-block tree, -1 = no blocks; prompt blocks; prefill tokens still
 * charged; output blocks; last touch; the id's key and check), not an object each: a
 * collection marks a chain of young objects one by one. Freed records are reused.
 * See docs/decisions.md#typed-array-records.
 *
 * Ids find their record through `byKey`, the id's 53-bit hash key -> the first record
 * with that key, the rest chained through `sameKey` and told apart by comparing the
 * ids themselves (exact, however rare two equal keys are). The ids are kept as UTF-16
 * code units in `idArena`, not as strings. Neither a Map<string, number> nor an array
 * of the id strings: churned by every request, each made young collections longer
 * (the same decision).
 *
 * The records are also a list in the order they were last touched (`add` and `touch`
 * put one at the newest end), so the due ones are at the oldest end. A list, not a
 * Map's insertion order: JSC walks deleted Map entries when an iteration starts.
 */
import { Arena, orderOf } from "./arena";
import { KeyTable } from "../util/tables";
import { assert } from "../util/verify";

export const NO_RECORD = -1;
/** Words of the id arena at first (two UTF-16 code units per word). */
const INITIAL_ID_WORDS = 1024;
/** Records allocated at first, and kept when no request is active. */
export const INITIAL_RECORDS = 64;

/** A 64-bit hash of a request id as two 32-bit lanes. */
export interface IdHash {
  hi: number;
  lo: number;
}

export class RequestRecords {
  // Per record (length = capacity). The owner reads and writes leaf, blocks, prefill
  // and output; the rest are kept by this class.
  slot = new Int32Array(0);
  leaf = new Int32Array(0);
  blocks = new Int32Array(0);
  prefill = new Float64Array(0);
  output = new Float64Array(0);
  /** A peer's request without a chain: the decode blocks its origin counted it adding. */
  flat = new Float64Array(0);
  /** The record's serial: the n-th record taken since the store began (mod 2^32); never 0. */
  serial = new Uint32Array(0);
  private serials = 0;
  touched = new Float64Array(0);
  key = new Float64Array(0);
  check = new Uint16Array(0);
  private sameKey = new Int32Array(0);
  private idAt = new Int32Array(0);
  private idLength = new Int32Array(0);
  private older = new Int32Array(0);
  private newerOf = new Int32Array(0);
  /** The least recently touched record, or NO_RECORD. */
  oldest = NO_RECORD;
  private newest = NO_RECORD;
  /** Records ever taken since the store last emptied (free ones among them). */
  top = 0;
  private freeList: number[] = [];
  private activeCount = 0;
  private readonly byKey = new KeyTable();
  private readonly idArena = new Arena(INITIAL_ID_WORDS);

  /** Records in use. */
  get count(): number {
    return this.activeCount;
  }

  /** Records allocated (0 before the first, INITIAL_RECORDS once none is in use after a burst). */
  get capacity(): number {
    return this.slot.length;
  }

  /** Bytes of the arena holding the ids. */
  get idArenaBytes(): number {
    return this.idArena.words.byteLength;
  }

  /** The next more recently touched record, or NO_RECORD. */
  newer(record: number): number {
    return this.newerOf[record]!;
  }

  /** The record of `id` (whose hashKey is `key`), or NO_RECORD. */
  find(id: string, key: number): number {
    let record = this.byKey.get(key);
    while (record >= 0 && !this.idIs(record, id)) record = this.sameKey[record]!;
    return record < 0 ? NO_RECORD : record;
  }

  /**
   * Takes a record for `id` on `slot`, last touched at `touched` (linked behind any
   * touched later: a restored request may be older than the newest). The caller sets
   * leaf, blocks, prefill and output.
   */
  add(id: string, key: number, check: number, slot: number, touched: number): number {
    const record = this.newRecord();
    this.serials = (this.serials + 1) >>> 0 || 1;
    this.serial[record] = this.serials;
    this.storeId(record, id);
    this.slot[record] = slot;
    this.touched[record] = touched;
    this.key[record] = key;
    this.check[record] = check;
    const first = this.byKey.get(key);
    this.sameKey[record] = first < 0 ? NO_RECORD : first;
    this.byKey.set(key, record);
    this.activeCount++;
    this.insertByTouch(record);
    return record;
  }

  /**
   * The record was touched at `now`: it moves to the newest end, or behind records
   * touched later when the caller's clock is not monotonic (the simulator's model time).
   */
  touch(record: number, now: number): void {
    this.touched[record] = now;
    this.unlink(record);
    this.insertByTouch(record);
  }

  /**
   * Frees a record (read its fields first). Once none is in use, record arrays that
   * grew past their first size go back (memory after a burst); first-size ones are
   * kept, so a router that empties at every request does not allocate at every request.
   */
  remove(record: number): void {
    this.unindex(record);
    this.unlink(record);
    this.slot[record] = NO_RECORD;
    this.freeList.push(record);
    if (this.activeCount === 0) {
      this.top = 0;
      this.freeList.length = 0;
      this.idArena.reset();
      if (this.slot.length > INITIAL_RECORDS) this.growRecords(INITIAL_RECORDS);
    }
  }

  /** The record's id as a string (snapshots, verify). */
  idOf(record: number): string {
    const words = this.idArena.words;
    const at = this.idAt[record]!;
    let id = "";
    for (let i = 0; i < this.idLength[record]!; i++) {
      id += String.fromCharCode((words[at + (i >>> 1)]! >>> (16 * (i & 1))) & 0xffff);
    }
    return id;
  }

  /**
   * O(N) consistency check of the store itself: keys, chains, id words, free records
   * and the touch list, oldest first. `keyOf` recomputes an id's key.
   */
  verify(keyOf: (id: string) => number): void {
    let live = 0;
    let idWords = 0;
    for (let record = 0; record < this.top; record++) {
      if (this.slot[record] === NO_RECORD) continue;
      live++;
      const id = this.idOf(record);
      idWords += 1 << orderOf(wordsOf(id.length));
      assert(this.key[record] === keyOf(id), "a record's key is not its id's");
      assert(this.find(id, this.key[record]!) === record, "an id does not find its record");
    }
    assert(live === this.activeCount, "records and the active count differ");
    assert(this.idArena.live === idWords, "id arena words leaked");
    let chained = 0;
    for (let record = 0; record < this.top; record++) {
      if (this.slot[record] !== NO_RECORD && this.byKey.get(this.key[record]!) === record) {
        for (let r = record; r !== NO_RECORD; r = this.sameKey[r]!) chained++;
      }
    }
    assert(
      chained === live && this.byKey.size <= live,
      "the key table and its chains do not hold exactly the active requests",
    );
    assert(live + this.freeList.length === this.top, "records leaked");
    this.verifyTouchList();
  }

  private verifyTouchList(): void {
    let listed = 0;
    for (let record = this.oldest; record !== NO_RECORD; record = this.newerOf[record]!) {
      const newer = this.newerOf[record]!;
      assert(this.slot[record] !== NO_RECORD, "touch list holds a free record");
      assert(
        newer === NO_RECORD ? this.newest === record : this.older[newer] === record,
        "touch list links",
      );
      assert(
        newer === NO_RECORD || this.touched[record]! <= this.touched[newer]!,
        "touch list out of order",
      );
      assert(listed <= this.activeCount, "touch list loops");
      listed++;
    }
    assert(listed === this.activeCount, "touch list and active count differ");
  }

  /** Copies the id's code units into the arena, two per word. */
  private storeId(record: number, id: string): void {
    const count = id.length;
    const at = this.idArena.allocate(orderOf(wordsOf(count)));
    const words = this.idArena.words;
    for (let i = 0; i < count; i += 2) {
      words[at + (i >>> 1)] = id.charCodeAt(i) | ((i + 1 < count ? id.charCodeAt(i + 1) : 0) << 16);
    }
    this.idAt[record] = at;
    this.idLength[record] = count;
  }

  /** Whether the record's id is `id`. */
  private idIs(record: number, id: string): boolean {
    const count = this.idLength[record]!;
    if (id.length !== count) return false;
    const words = this.idArena.words;
    const at = this.idAt[record]!;
    for (let i = 0; i < count; i += 2) {
      const word = words[at + (i >>> 1)]!;
      if ((word & 0xffff) !== id.charCodeAt(i)) return false;
      if (i + 1 < count && word >>> 16 !== id.charCodeAt(i + 1)) return false;
    }
    return true;
  }

  /** Takes the record out of the key table (and its key's chain) and frees its id. */
  private unindex(record: number): void {
    const key = this.key[record]!;
    const next = this.sameKey[record]!;
    const first = this.byKey.get(key);
    if (first === record) {
      if (next === NO_RECORD) this.byKey.delete(key);
      else this.byKey.set(key, next);
    } else {
      let before = first;
      while (this.sameKey[before] !== record) before = this.sameKey[before]!;
      this.sameKey[before] = next;
    }
    this.activeCount--;
    this.idArena.release(this.idAt[record]!, orderOf(wordsOf(this.idLength[record]!)));
  }

  /** Links a record in touch order (a new one goes last; a restored one behind newer ones). */
  private insertByTouch(record: number): void {
    const touched = this.touched[record]!;
    let after = this.newest;
    while (after !== NO_RECORD && this.touched[after]! > touched) after = this.older[after]!;
    if (after === this.newest) {
      this.append(record);
      return;
    }
    const before = after === NO_RECORD ? this.oldest : this.newerOf[after]!;
    this.older[record] = after;
    this.newerOf[record] = before;
    this.older[before] = record;
    if (after === NO_RECORD) this.oldest = record;
    else this.newerOf[after] = record;
  }

  private append(record: number): void {
    this.older[record] = this.newest;
    this.newerOf[record] = NO_RECORD;
    if (this.newest === NO_RECORD) this.oldest = record;
    else this.newerOf[this.newest] = record;
    this.newest = record;
  }

  private unlink(record: number): void {
    const older = this.older[record]!;
    const newer = this.newerOf[record]!;
    if (older === NO_RECORD) this.oldest = newer;
    else this.newerOf[older] = newer;
    if (newer === NO_RECORD) this.newest = older;
    else this.older[newer] = older;
    this.older[record] = NO_RECORD;
    this.newerOf[record] = NO_RECORD;
  }

  private newRecord(): number {
    const reused = this.freeList.pop();
    if (reused !== undefined) return reused;
    const record = this.top++;
    if (record >= this.slot.length) {
      this.growRecords(Math.max(INITIAL_RECORDS, 2 * this.slot.length));
    }
    return record;
  }

  /** The one allocation site for record arrays: `capacity` records, the live ones kept. */
  private growRecords(capacity: number): void {
    const resize = <T extends TypedArray>(old: T, make: (n: number) => T) =>
      resized(old, capacity, make);
    this.slot = resize(this.slot, (n) => new Int32Array(n));
    this.leaf = resize(this.leaf, (n) => new Int32Array(n));
    this.blocks = resize(this.blocks, (n) => new Int32Array(n));
    this.prefill = resize(this.prefill, (n) => new Float64Array(n));
    this.output = resize(this.output, (n) => new Float64Array(n));
    this.flat = resize(this.flat, (n) => new Float64Array(n));
    this.serial = resize(this.serial, (n) => new Uint32Array(n));
    this.touched = resize(this.touched, (n) => new Float64Array(n));
    this.key = resize(this.key, (n) => new Float64Array(n));
    this.check = resize(this.check, (n) => new Uint16Array(n));
    this.sameKey = resize(this.sameKey, (n) => new Int32Array(n));
    this.idAt = resize(this.idAt, (n) => new Int32Array(n));
    this.idLength = resize(this.idLength, (n) => new Int32Array(n));
    this.older = resize(this.older, (n) => new Int32Array(n));
    this.newerOf = resize(this.newerOf, (n) => new Int32Array(n));
  }
}

/**
 * A 64-bit hash of an id's UTF-16 code units as two 32-bit lanes (murmur-style steps,
 * each finished with murmur3's fmix32), returned as hi * 2^32 + lo split by `hashKey`
 * (the high 53 bits, a table key that stays a number) and `hashCheck` (the low 11 bits).
 */
export function idHash(id: string): IdHash {
  let a = 0x9747b28c ^ id.length;
  let b = 0x3c6ef372;
  for (let i = 0; i < id.length; i++) {
    const c = id.charCodeAt(i);
    a = Math.imul(a ^ c, 0x5bd1e995);
    a ^= a >>> 15;
    b = Math.imul(b + c, 0x27d4eb2f) ^ (b >>> 17);
  }
  return { hi: fmix32(a), lo: fmix32(b ^ a) };
}

export function hashKey(hash: IdHash): number {
  return hash.hi * 2 ** 21 + (hash.lo >>> 11);
}

export function hashCheck(hash: IdHash): number {
  return hash.lo & 0x7ff;
}

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

export type TypedArray = Float64Array | Uint32Array | Int32Array | Uint16Array | Uint8Array;

/** A new array of `capacity` elements holding the first ones of `old`. */
export function resized<T extends TypedArray>(old: T, capacity: number, make: (n: number) => T): T {
  const fresh = make(capacity);
  fresh.set(old.subarray(0, Math.min(capacity, old.length)));
  return fresh;
}

/** Arena words that hold `units` UTF-16 code units. */
function wordsOf(units: number): number {
  return (units + 1) >>> 1;
}
