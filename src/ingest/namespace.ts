/**
 * Cache-namespace (salt) memory per (dp rank, external block hash), for one event
 * stream (reference §1.4 step 6). vLLM writes the salt only into the first block of
 * a chain, so a child store learns its namespace from its parent's entry.
 *
 * Entries exist only for salted blocks, and go away when the block is removed
 * (unless ambiguous) or its rank is cleared; the table shrinks as it empties.
 * Open addressing with linear probing over typed arrays, backward-shift deletion.
 */

/** Recorded when one hash was stored under two different namespaces. */
export const AMBIGUOUS = "\u0000ambiguous";

const CAPACITY_MIN = 64;

export class NamespaceTable {
  private capacity = CAPACITY_MIN;
  private used = new Uint8Array(CAPACITY_MIN);
  private ranks = new Uint32Array(CAPACITY_MIN);
  private his = new Uint32Array(CAPACITY_MIN);
  private los = new Uint32Array(CAPACITY_MIN);
  private values: string[] = new Array<string>(CAPACITY_MIN).fill("");
  size = 0;
  /** Records refused because the table was at `entriesMax`. */
  refused = 0;

  constructor(readonly entriesMax: number) {
    if (entriesMax < 1) throw new RangeError("entriesMax must be positive");
  }

  /** The namespace recorded for a block (AMBIGUOUS possibly), or undefined. */
  get(rank: number, hi: number, lo: number): string | undefined {
    if (this.size === 0) return undefined;
    const slot = this.find(rank, hi, lo);
    return slot < 0 ? undefined : this.values[slot];
  }

  /** Records `namespace` for a block; a different earlier one makes it AMBIGUOUS. */
  record(rank: number, hi: number, lo: number, namespace: string): void {
    const slot = this.find(rank, hi, lo);
    if (slot >= 0) {
      if (this.values[slot] !== namespace) this.values[slot] = AMBIGUOUS;
      return;
    }
    if (this.size >= this.entriesMax) {
      this.refused++;
      return;
    }
    if (2 * (this.size + 1) > this.capacity) this.rehash(this.capacity * 2);
    this.insert(rank, hi, lo, namespace);
  }

  /** Forgets a removed block, unless it is ambiguous (then it stays until its rank is cleared). */
  forget(rank: number, hi: number, lo: number): void {
    if (this.size === 0) return;
    const slot = this.find(rank, hi, lo);
    if (slot < 0 || this.values[slot] === AMBIGUOUS) return;
    this.delete(slot);
    this.shrinkIfSparse();
  }

  /** Forgets every block of a rank (AllBlocksCleared). */
  forgetRank(rank: number): void {
    if (this.size === 0) return;
    const { used, ranks, his, los, values } = this;
    const capacity = this.capacity;
    this.reset(capacity);
    for (let slot = 0; slot < capacity; slot++) {
      if (used[slot] === 1 && ranks[slot] !== rank) this.insert(ranks[slot]!, his[slot]!, los[slot]!, values[slot]!);
    }
    this.shrinkIfSparse();
  }

  clear(): void {
    this.reset(CAPACITY_MIN);
  }

  /** Bytes held by the table's arrays (the strings are shared with the decoder). */
  get bytes(): number {
    return this.capacity * (1 + 4 + 4 + 4 + 8);
  }

  private slotOf(rank: number, hi: number, lo: number): number {
    let h = Math.imul(lo ^ Math.imul(hi, 0x9e3779b1) ^ Math.imul(rank, 0x85ebca6b), 0xc2b2ae35);
    h ^= h >>> 15;
    return h & (this.capacity - 1);
  }

  private find(rank: number, hi: number, lo: number): number {
    const mask = this.capacity - 1;
    let slot = this.slotOf(rank, hi, lo);
    // Bounded: the load factor is at most 1/2, so an empty slot exists.
    for (let probe = 0; probe < this.capacity; probe++) {
      if (this.used[slot] === 0) return -1;
      if (this.los[slot] === lo && this.his[slot] === hi && this.ranks[slot] === rank) return slot;
      slot = (slot + 1) & mask;
    }
    return -1;
  }

  private insert(rank: number, hi: number, lo: number, namespace: string): void {
    const mask = this.capacity - 1;
    let slot = this.slotOf(rank, hi, lo);
    while (this.used[slot] === 1) slot = (slot + 1) & mask;
    this.used[slot] = 1;
    this.ranks[slot] = rank;
    this.his[slot] = hi;
    this.los[slot] = lo;
    this.values[slot] = namespace;
    this.size++;
  }

  private delete(slot: number): void {
    const mask = this.capacity - 1;
    let hole = slot;
    let next = (hole + 1) & mask;
    // Backward shift: move later entries of the probe run into the hole when their
    // home slot does not lie between the hole and where they sit.
    while (this.used[next] === 1) {
      const home = this.slotOf(this.ranks[next]!, this.his[next]!, this.los[next]!);
      const between = hole <= next ? home > hole && home <= next : home > hole || home <= next;
      if (!between) {
        this.used[hole] = 1;
        this.ranks[hole] = this.ranks[next]!;
        this.his[hole] = this.his[next]!;
        this.los[hole] = this.los[next]!;
        this.values[hole] = this.values[next]!;
        hole = next;
      }
      next = (next + 1) & mask;
    }
    this.used[hole] = 0;
    this.values[hole] = "";
    this.size--;
  }

  private shrinkIfSparse(): void {
    if (this.capacity <= CAPACITY_MIN || 8 * this.size >= this.capacity) return;
    let capacity = CAPACITY_MIN;
    while (capacity < 4 * this.size) capacity *= 2;
    this.rehash(capacity);
  }

  private rehash(capacity: number): void {
    const { used, ranks, his, los, values } = this;
    const old = this.capacity;
    this.reset(capacity);
    for (let slot = 0; slot < old; slot++) {
      if (used[slot] === 1) this.insert(ranks[slot]!, his[slot]!, los[slot]!, values[slot]!);
    }
  }

  private reset(capacity: number): void {
    this.capacity = capacity;
    this.used = new Uint8Array(capacity);
    this.ranks = new Uint32Array(capacity);
    this.his = new Uint32Array(capacity);
    this.los = new Uint32Array(capacity);
    this.values = new Array<string>(capacity).fill("");
    this.size = 0;
  }
}
