/**
 * An arena of u32 words for variable-length records that come and go (edge and holder
 * lists of the active-block tree, request ids of the load tracker): no object per
 * record, nothing for the collector to trace.
 */
const NONE = -1;

/**
 * Blocks of 2^k words carved from one growable Uint32Array, a free list per k (a free
 * block's first word links to the next, 0xffffffff = end).
 */
export class Arena {
  words: Uint32Array;
  /** Words in blocks handed out and not freed. */
  live = 0;
  private top = 0;
  private readonly free = new Int32Array(32).fill(NONE);

  constructor(private readonly initialWords: number) {
    this.words = new Uint32Array(initialWords);
  }

  allocate(order: number): number {
    const head = this.free[order]!;
    this.live += 1 << order;
    if (head !== NONE) {
      const next = this.words[head]!;
      this.free[order] = next === 0xffff_ffff ? NONE : next;
      return head;
    }
    const at = this.top;
    this.top += 1 << order;
    if (this.top > this.words.length) {
      let capacity = this.words.length * 2;
      while (capacity < this.top) capacity *= 2;
      const grown = new Uint32Array(capacity);
      grown.set(this.words.subarray(0, at));
      this.words = grown;
    }
    return at;
  }

  release(at: number, order: number): void {
    const head = this.free[order]!;
    this.words[at] = head === NONE ? 0xffff_ffff : head;
    this.free[order] = at;
    this.live -= 1 << order;
  }

  /** Empties the arena; the words go back only if it grew (reused as they are otherwise). */
  reset(): void {
    if (this.words.length > this.initialWords) this.words = new Uint32Array(this.initialWords);
    else this.words.fill(0, 0, this.top);
    this.top = 0;
    this.live = 0;
    this.free.fill(NONE);
  }
}

/** The size class holding `words` words: the smallest k with 2^k >= words. */
export const orderOf = (words: number): number => (words <= 1 ? 0 : 32 - Math.clz32(words - 1));
