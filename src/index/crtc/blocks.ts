/**
 * The block pool: every block in the tree has a u32 id that never changes while the
 * block lives (lookups name blocks by id). Per id: the block's local hash (hi, lo) and
 * the node whose edge holds it (0 = none).
 *
 * Ids are handed out in runs of 2^order consecutive ids by a buddy allocator, so an
 * edge is a contiguous id range (position = id - edge start) that can grow in place
 * into the rest of its run, and freed runs merge with their buddies. The pool is
 * 2^k ids; it doubles when no run is big enough (the new upper half becomes one free
 * run) and halves when its upper three quarters are free. Id 0 is reserved (null).
 *
 * A free run keeps its bookkeeping in its own first id: node = FREE_TAG + order,
 * hi = next free run of that order, lo = previous (0 = none).
 */
import { assert, fail } from "../assert";

export const FREE_TAG = 0xffff_ff00;
const ORDER_MIN = 10;
const ORDER_MAX = 31;

export class BlockPool {
  hi: Uint32Array;
  lo: Uint32Array;
  node: Uint32Array;
  order: number;
  /** Ids in allocated runs (used or spare), including the reserved id 0. */
  allocated = 0;
  private readonly freeHead = new Uint32Array(ORDER_MAX + 1);

  constructor(order = ORDER_MIN) {
    this.order = order;
    const size = 2 ** order;
    this.hi = new Uint32Array(size);
    this.lo = new Uint32Array(size);
    this.node = new Uint32Array(size);
    // Id 0 is reserved; the rest of [0, 2^order) splits into runs [2^j, 2^(j+1)).
    for (let j = 0; j < order; j++) this.push(2 ** j, j);
    this.allocated = 1;
  }

  get capacity(): number {
    return this.hi.length;
  }

  /** A run of 2^order ids; returns its first id. */
  allocate(order: number): number {
    if (order < 0 || order >= ORDER_MAX) fail("run order out of range");
    let j = order;
    while (j <= this.order && this.freeHead[j] === 0) j++;
    while (j > this.order) {
      this.grow();
      j = order;
      while (j <= this.order && this.freeHead[j] === 0) j++;
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

  /** Returns the run [start, start + 2^order) to the pool, merging buddies. */
  free(start: number, order: number): void {
    if (start === 0 || (start & (2 ** order - 1)) !== 0) fail("freeing a misaligned run");
    if (this.node[start]! >= FREE_TAG) fail("double free of a block run");
    this.allocated -= 2 ** order;
    while (order < this.order) {
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

  /** Whether [start, start + 2^order) is a free run head (for verify). */
  isFreeRun(start: number, order: number): boolean {
    return this.node[start] === FREE_TAG + order;
  }

  bytes(): number {
    return this.hi.byteLength + this.lo.byteLength + this.node.byteLength;
  }

  /** Walks the free lists; returns the number of free ids (verify). */
  freeIds(): number {
    let total = 0;
    for (let order = 0; order <= this.order; order++) {
      let previous = 0;
      let bound = this.capacity;
      for (let run = this.freeHead[order]!; run !== 0; run = this.hi[run]!) {
        assert(bound-- > 0, "block free list cycles");
        assert(this.node[run] === FREE_TAG + order, "free run head lost its tag");
        assert(this.lo[run] === previous, "free run back link broken");
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

  /** Doubles the pool; the new upper half is one free run. */
  private grow(): void {
    assert(this.order < ORDER_MAX, "block pool exhausted (2^31 ids)");
    const half = this.capacity;
    this.resize(half * 2);
    this.push(half, this.order);
    this.order++;
  }

  /** Halves the pool while its upper three quarters are free (hysteresis against regrowth). */
  private maybeShrink(): void {
    while (this.order > ORDER_MIN) {
      const half = 2 ** (this.order - 1);
      const quarter = half / 2;
      if (this.node[half] !== FREE_TAG + this.order - 1 || this.node[quarter] !== FREE_TAG + this.order - 2) return;
      this.unlink(half, this.order - 1);
      this.order--;
      this.resize(half);
    }
  }

  private resize(size: number): void {
    const keep = Math.min(size, this.capacity);
    const hi = new Uint32Array(size);
    hi.set(this.hi.subarray(0, keep));
    const lo = new Uint32Array(size);
    lo.set(this.lo.subarray(0, keep));
    const node = new Uint32Array(size);
    node.set(this.node.subarray(0, keep));
    this.hi = hi;
    this.lo = lo;
    this.node = node;
  }
}
