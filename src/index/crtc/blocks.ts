/**
 * The block pool: every block in the tree has a u32 id that never changes while the
 * block lives (lookups name blocks by id). Per id: the block's local hash (hi, lo) and
 * the node whose edge holds it (0 = none).
 *
 * Ids are handed out in runs of 2^order consecutive ids by a buddy allocator, so an
 * edge is a contiguous id range (position = id - edge start) that can grow in place
 * into the rest of its run, and freed runs merge with their buddies. Up to 2^17 ids
 * the pool is one buddy tree that doubles when no run is big enough; beyond that it is
 * a row of 2^17-id chunks (each its own buddy tree) grown by a quarter at a time, so
 * reserved ids stay within about 25% of the ids in use instead of doubling's 100%. It
 * shrinks (trailing free chunks, then halving) once at most half of what would remain
 * is in use. Runs are at most one chunk (RUN_ORDER_MAX). Id 0 is reserved.
 *
 * A free run keeps its bookkeeping in its own first id: node = FREE_TAG + order,
 * hi = next free run of that order, lo = previous (0 = none).
 *
 * `marks` holds the sequence hash of every live block whose id is 15 mod 16, written
 * when the block is placed (tree.ts): the chain at any position of an edge is then at
 * most 16 hashes from a mark or from the edge's start. The writer's alone (private
 * memory in every mode); entries of free ids are stale and never read.
 */
import { assert, fail } from "../assert";
import { PRIVATE_MEMORY, type PoolMemory } from "./shared-memory";
import { RETIRED_RUN, type SharedWriter } from "./shared-writer";

export const FREE_TAG = 0xffff_ff00;
/** One mark per 2^MARK_SHIFT ids: the last id of each group of 16. */
export const MARK_SHIFT = 4;
/** Largest run: 2^17 ids (a chunk). Longer edges are split over several nodes. */
export const RUN_ORDER_MAX = 17;
const CHUNK = 2 ** RUN_ORDER_MAX;
const ORDER_MIN = 10;

export class BlockPool {
  hi: Uint32Array;
  lo: Uint32Array;
  node: Uint32Array;
  /** (hi, lo) sequence hash of block id (g << MARK_SHIFT) + 15 at [2g, 2g + 1]. */
  marks: Uint32Array;
  /** Largest buddy order in the pool: log2(capacity) up to RUN_ORDER_MAX. */
  private topOrder: number;
  /** Ids in allocated runs (used or spare), including the reserved id 0. */
  allocated = 0;
  private readonly freeHead = new Uint32Array(RUN_ORDER_MAX + 1);
  private readonly memory: PoolMemory;
  /** Shared mode: freed runs wait here until no reader can follow their ids. */
  private readonly writer: SharedWriter | null;

  constructor(
    order = ORDER_MIN,
    memory: PoolMemory = PRIVATE_MEMORY,
    writer: SharedWriter | null = null,
  ) {
    this.topOrder = order;
    this.memory = memory;
    this.writer = writer;
    this.hi = this.lo = this.node = this.marks = new Uint32Array(0);
    this.resize(2 ** order);
    // Id 0 is reserved; the rest of [0, 2^order) splits into runs [2^j, 2^(j+1)).
    for (let j = 0; j < order; j++) this.push(2 ** j, j);
    this.allocated = 1;
  }

  get capacity(): number {
    return this.hi.length;
  }

  /** A run of 2^order ids; returns its first id. */
  allocate(order: number): number {
    if (order < 0 || order > RUN_ORDER_MAX) fail("run order out of range");
    let j = order;
    while (j <= this.topOrder && this.freeHead[j] === 0) j++;
    while (j > this.topOrder) {
      this.grow();
      j = order;
      while (j <= this.topOrder && this.freeHead[j] === 0) j++;
    }
    const start = this.freeHead[j]!;
    this.unlink(start, j);
    while (j > order) {
      j--;
      this.push(start + 2 ** j, j);
    }
    this.node[start] = 0;
    this.allocated += 2 ** order;
    return start;
  }

  /** Returns the run [start, start + 2^order) to the pool (at once, or after limbo). */
  free(start: number, order: number): void {
    if (start === 0 || (start & (2 ** order - 1)) !== 0 || start + 2 ** order > this.capacity)
      fail("freeing a run outside the pool");
    if (this.node[start]! >= FREE_TAG) fail("double free of a block run");
    if (this.writer === null) this.release(start, order);
    else this.writer.retire(RETIRED_RUN, start, order);
  }

  /** Puts a freed run back, merging buddies, and shrinks the pool if it can. */
  release(start: number, order: number): void {
    this.allocated -= 2 ** order;
    while (order < this.topOrder) {
      const buddy = start ^ (2 ** order);
      if (this.node[buddy] !== FREE_TAG + order) break;
      this.unlink(buddy, order);
      this.node[buddy] = 0;
      if (buddy < start) start = buddy;
      order++;
    }
    this.push(start, order);
    this.maybeShrink();
  }

  bytes(): number {
    return this.hi.byteLength + this.lo.byteLength + this.node.byteLength + this.marks.byteLength;
  }

  /** Walks the free lists; returns the number of free ids (verify). */
  freeIds(): number {
    let total = 0;
    for (let order = 0; order <= this.topOrder; order++) {
      let previous = 0;
      let bound = this.capacity;
      for (let run = this.freeHead[order]!; run !== 0; run = this.hi[run]!) {
        assert(bound-- > 0, "block free list cycles");
        assert(this.node[run] === FREE_TAG + order, "free run head lost its tag");
        assert(this.lo[run] === previous, "free run back link broken");
        assert(run + 2 ** order <= this.capacity, "free run past the pool");
        previous = run;
        total += 2 ** order;
      }
    }
    return total;
  }

  private push(start: number, order: number): void {
    const head = this.freeHead[order]!;
    this.node[start] = FREE_TAG + order;
    this.hi[start] = head;
    this.lo[start] = 0;
    if (head !== 0) this.lo[head] = start;
    this.freeHead[order] = start;
  }

  private unlink(start: number, order: number): void {
    const next = this.hi[start]!;
    const previous = this.lo[start]!;
    if (previous !== 0) this.hi[previous] = next;
    else this.freeHead[order] = next;
    if (next !== 0) this.lo[next] = previous;
  }

  /** Doubles a small pool (the new half is one free run), else adds chunks. */
  private grow(): void {
    const old = this.capacity;
    if (old < CHUNK) {
      this.resize(old * 2);
      this.push(old, this.topOrder);
      this.topOrder++;
      return;
    }
    const chunks = Math.max(1, Math.floor(old / CHUNK / 4));
    assert(old + chunks * CHUNK <= 2 ** 31, "block pool exhausted (2^31 ids)");
    this.resize(old + chunks * CHUNK);
    for (let chunk = old; chunk < this.capacity; chunk += CHUNK) this.push(chunk, RUN_ORDER_MAX);
  }

  /**
   * Gives memory back once at most half of what would remain is in use (hysteresis:
   * the pool grows only when full): trailing free chunks go one by one, then a small
   * pool halves while its upper half is one free run.
   */
  private maybeShrink(): void {
    while (this.capacity > CHUNK) {
      const last = this.capacity - CHUNK;
      if (this.node[last] !== FREE_TAG + RUN_ORDER_MAX || this.allocated > last / 2) return;
      this.unlink(last, RUN_ORDER_MAX);
      this.resize(last);
    }
    while (this.topOrder > ORDER_MIN) {
      const half = 2 ** (this.topOrder - 1);
      if (this.node[half] !== FREE_TAG + this.topOrder - 1 || this.allocated > half / 2) return;
      this.unlink(half, this.topOrder - 1);
      this.topOrder--;
      this.resize(half);
    }
  }

  private resize(size: number): void {
    const keep = Math.min(size, this.capacity);
    this.hi = this.memory.u32("blocks.hi", size, this.hi, keep);
    this.lo = this.memory.u32("blocks.lo", size, this.lo, keep);
    this.node = this.memory.u32("blocks.node", size, this.node, keep);
    const marks = (ids: number) => ids >>> (MARK_SHIFT - 1); // two words per 2^MARK_SHIFT ids
    this.marks = PRIVATE_MEMORY.u32("blocks.marks", marks(size), this.marks, marks(keep));
  }
}
