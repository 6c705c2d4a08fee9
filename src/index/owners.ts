/**
 * Per-record owner lists: for each record (a tree node, a positional entry), the set
 * of worker slots that own it, each with a u32 value (the crtc stores how many of the
 * edge's blocks the slot holds; the positional backend stores 1).
 *
 * Most records have one owner (unique suffixes), so one owner lives inline in the
 * record's `a` (slot) and `b` (value) words. Two or more live in an arena of
 * (slot, value) word pairs: `a` is the list's word offset, `b` its size class (the
 * list holds 2^b entries). Freed lists go on a free list per class; when the arena is
 * full and at least half of it is free space, it is compacted (lists are referenced
 * only from `a`, so they can move) instead of grown. Order within a list is arbitrary.
 */
import { assert, fail } from "./assert";
import { PRIVATE_MEMORY, type PoolMemory } from "./crtc/shared-memory";
import { RETIRED_LIST } from "./crtc/shared-writer";

/** Shared mode (crtc/shared-writer.ts): told before a record changes; holds freed lists back. */
export interface OwnerListsWriter {
  touch(record: number): void;
  retire(kind: number, offset: number, sizeClass: number): void;
}

const CLASS_MAX = 17; // 131,072 entries: more than the 65,536 slots that exist
const ARENA_WORDS_MIN = 1024;

export class OwnerLists {
  count: Uint32Array;
  a: Uint32Array;
  b: Uint32Array;
  words: Uint32Array;
  /** Next free word of the arena (word 0 is never a list, so 0 can mean "none"). */
  private top = 2;
  private liveWords = 0;
  private readonly freeByClass = new Uint32Array(CLASS_MAX + 1);
  private pairs = new Uint32Array(64);
  /** Words of released lists still in limbo (shared mode); no compaction until they are back. */
  private retiredWords = 0;

  constructor(
    records: number,
    private readonly memory: PoolMemory = PRIVATE_MEMORY,
    private readonly writer: OwnerListsWriter | null = null,
  ) {
    this.count = this.a = this.b = this.words = new Uint32Array(0);
    this.resizeRecords(records, 0);
    this.words = memory.u32("owners.words", ARENA_WORDS_MIN, null, 0);
  }

  /** Grows the per-record arrays to `records` (called by the record pool's grow). */
  ensureRecords(records: number): void {
    if (this.count.length >= records) return;
    this.resizeRecords(records, this.count.length);
  }

  /** Back to a fresh state with `records` records (every list must be gone). */
  resetAll(records: number): void {
    assert(this.liveWords === 0, "owner lists reset while lists are live");
    this.resizeRecords(records, 0);
    this.words = this.memory.u32("owners.words", ARENA_WORDS_MIN, this.words, 0);
    this.top = 2;
    this.freeByClass.fill(0);
  }

  // See docs/decisions.md#plain-typed-arrays.
  private resizeRecords(records: number, keep: number): void {
    this.count = this.memory.u32("owners.count", records, this.count, keep);
    this.a = this.memory.u32("owners.a", records, this.a, keep);
    this.b = this.memory.u32("owners.b", records, this.b, keep);
  }

  /** The value of `slot` in `record`, or 0 if it is not an owner. */
  get(record: number, slot: number): number {
    const count = this.count[record]!;
    if (count === 0) return 0;
    if (count === 1) return this.a[record] === slot ? this.b[record]! : 0;
    const words = this.words;
    const offset = this.a[record]!;
    const end = offset + 2 * count;
    for (let at = offset; at < end; at += 2) if (words[at] === slot) return words[at + 1]!;
    return 0;
  }

  /** Sets the value (> 0) of `slot` in `record`, adding the slot if absent. */
  set(record: number, slot: number, value: number): void {
    if (value <= 0) fail("owner value must be positive");
    if (this.writer !== null) this.writer.touch(record);
    const count = this.count[record]!;
    if (count === 0) {
      this.count[record] = 1;
      this.a[record] = slot;
      this.b[record] = value;
      return;
    }
    if (count === 1) {
      if (this.a[record] === slot) {
        this.b[record] = value;
        return;
      }
      const offset = this.allocate(1);
      const words = this.words;
      words[offset] = this.a[record]!;
      words[offset + 1] = this.b[record]!;
      words[offset + 2] = slot;
      words[offset + 3] = value;
      this.a[record] = offset;
      this.b[record] = 1;
      this.count[record] = 2;
      return;
    }
    let offset = this.a[record]!;
    const end = offset + 2 * count;
    for (let at = offset; at < end; at += 2) {
      if (this.words[at] === slot) {
        this.words[at + 1] = value;
        return;
      }
    }
    const sizeClass = this.b[record]!;
    if (count === 1 << sizeClass) {
      assert(sizeClass < CLASS_MAX, "owner list too long");
      const moved = this.allocate(sizeClass + 1);
      offset = this.a[record]!; // allocate() may have compacted the arena
      this.words.copyWithin(moved, offset, offset + 2 * count);
      this.release(offset, sizeClass);
      offset = moved;
      this.a[record] = moved;
      this.b[record] = sizeClass + 1;
    }
    this.words[offset + 2 * count] = slot;
    this.words[offset + 2 * count + 1] = value;
    this.count[record] = count + 1;
  }

  /** Removes `slot` from `record`; false if it was not an owner. */
  remove(record: number, slot: number): boolean {
    const count = this.count[record]!;
    if (count === 0) return false;
    if (this.writer !== null) this.writer.touch(record);
    if (count === 1) {
      if (this.a[record] !== slot) return false;
      this.count[record] = 0;
      this.a[record] = 0;
      this.b[record] = 0;
      return true;
    }
    const words = this.words;
    const offset = this.a[record]!;
    const last = offset + 2 * (count - 1);
    let at = offset;
    while (at <= last && words[at] !== slot) at += 2;
    if (at > last) return false;
    words[at] = words[last]!;
    words[at + 1] = words[last + 1]!;
    const remaining = count - 1;
    const sizeClass = this.b[record]!;
    if (remaining === 1) {
      this.a[record] = words[offset]!;
      this.b[record] = words[offset + 1]!;
      this.release(offset, sizeClass);
    } else if (sizeClass > 1 && remaining <= 1 << (sizeClass - 2)) {
      const moved = this.allocate(sizeClass - 1);
      const from = this.a[record]!; // allocate() may have compacted the arena
      this.words.copyWithin(moved, from, from + 2 * remaining);
      this.release(from, sizeClass);
      this.a[record] = moved;
      this.b[record] = sizeClass - 1;
    }
    this.count[record] = remaining;
    return true;
  }

  /** Largest value among the owners of `record` (0 when it has none). */
  max(record: number): number {
    const count = this.count[record]!;
    if (count === 0) return 0;
    if (count === 1) return this.b[record]!;
    const words = this.words;
    const offset = this.a[record]!;
    let best = 0;
    for (let at = offset + 1; at < offset + 2 * count; at += 2)
      if (words[at]! > best) best = words[at]!;
    return best;
  }

  /** Copies the (slot, value) pairs of `record` into a scratch array owned by this object. */
  snapshot(record: number): Uint32Array {
    const count = this.count[record]!;
    if (this.pairs.length < 2 * count) this.pairs = new Uint32Array(2 * count * 2);
    const pairs = this.pairs;
    if (count === 1) {
      pairs[0] = this.a[record]!;
      pairs[1] = this.b[record]!;
    } else if (count > 1) {
      const offset = this.a[record]!;
      pairs.set(this.words.subarray(offset, offset + 2 * count));
    }
    return pairs;
  }

  /** Drops every owner of `record`. */
  reset(record: number): void {
    const count = this.count[record]!;
    if (this.writer !== null) this.writer.touch(record);
    if (count > 1) this.release(this.a[record]!, this.b[record]!);
    this.count[record] = 0;
    this.a[record] = 0;
    this.b[record] = 0;
  }

  bytes(): number {
    return this.count.byteLength + this.a.byteLength + this.b.byteLength + this.words.byteLength;
  }

  /** Words in live lists (for verify). */
  liveArenaWords(): number {
    return this.liveWords;
  }

  private allocate(sizeClass: number): number {
    const size = 2 << sizeClass;
    const head = this.freeByClass[sizeClass]!;
    if (head !== 0) {
      this.freeByClass[sizeClass] = this.words[head]!;
      this.liveWords += size;
      return head;
    }
    if (this.top + size > this.words.length) this.makeRoom(size);
    const offset = this.top;
    this.top += size;
    this.liveWords += size;
    return offset;
  }

  private release(offset: number, sizeClass: number): void {
    if (this.writer === null) {
      this.releaseList(offset, sizeClass);
      return;
    }
    this.retiredWords += 2 << sizeClass;
    this.writer.retire(RETIRED_LIST, offset, sizeClass);
  }

  /** Puts a freed list on its class's free list (at once, or when it leaves limbo). */
  releaseList(offset: number, sizeClass: number): void {
    if (this.writer !== null) this.retiredWords -= 2 << sizeClass;
    this.words[offset] = this.freeByClass[sizeClass]!;
    this.freeByClass[sizeClass] = offset;
    this.liveWords -= 2 << sizeClass;
  }

  /** Compacts when at least half the used arena is free lists, else doubles it. */
  private makeRoom(size: number): void {
    const used = this.top - 2;
    let length = this.words.length;
    const compact = used - this.liveWords >= used / 2 && this.retiredWords === 0;
    const needed = (compact ? this.liveWords : used) + size + 2;
    while (length < needed) length *= 2;
    if (compact) {
      while (length / 4 >= Math.max(ARENA_WORDS_MIN, needed)) length /= 2;
      this.compact(length);
    } else {
      this.words = this.memory.u32("owners.words", length, this.words, this.top);
    }
  }

  /** Moves every list to the front of a (smaller) arena; in shared memory, in place. */
  private compact(length: number): void {
    const old = this.memory.shared ? this.words.slice(0, this.top) : this.words;
    const records = this.count.length;
    if (this.writer !== null) {
      for (let record = 0; record < records; record++) {
        if (this.count[record]! >= 2) this.writer.touch(record);
      }
    }
    const words = this.memory.u32("owners.words", length, this.words, 0);
    let top = 2;
    for (let record = 0; record < records; record++) {
      if (this.count[record]! < 2) continue;
      const size = 2 << this.b[record]!;
      const from = this.a[record]!;
      words.set(old.subarray(from, from + size), top);
      this.a[record] = top;
      top += size;
    }
    assert(top - 2 === this.liveWords, "owner arena compaction lost lists");
    this.words = words;
    this.top = top;
    this.freeByClass.fill(0);
  }
}
