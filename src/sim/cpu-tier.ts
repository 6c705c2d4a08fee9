/**
 * A mock engine's CPU offload tier (vLLM's OffloadingConnector with a CPU backend, as
 * seen from outside): a fixed number of block slots in host memory, least recently used
 * first out. The engine cache (./engine-cache.ts) spills a block here when it evicts
 * the block's last device copy, and loads it back (cheaper than computing it again:
 * ./time-model.ts) when a request's prefix continues past its device hit. Each hash is
 * here at most once. Events are vLLM's, with medium "CPU" and the block's tokens
 * (vLLM's `self_describing_kv_events`).
 *
 * Like the device tier, the tier's stores and removals reach a consumer when the engine
 * publishes its step (`publish()`); until then its *published view* lacks the blocks
 * stored since the last publish and still holds the published ones evicted since
 * (ghosts, with their data when `recordGhosts`). `hasPublished` and `snapshot` answer
 * from that view.
 */
import { u64 } from "../util/u64";
import { PairTable } from "../util/tables";

const NONE = -1;

/** A block the tier holds, as introspection reports it. */
export interface HostBlock {
  readonly hash: bigint;
  readonly parent: bigint | null;
  readonly position: number;
  readonly path: bigint;
}

export class CpuTier {
  private readonly extHi: Uint32Array;
  private readonly extLo: Uint32Array;
  private readonly parentHi: Uint32Array;
  private readonly parentLo: Uint32Array;
  private readonly pathHi: Uint32Array;
  private readonly pathLo: Uint32Array;
  private readonly position: Int32Array;
  private readonly used: Uint8Array;
  /** LRU list of used slots: head = least recently used; free slots chain through `next`. */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private head = NONE;
  private tail = NONE;
  private freeHead = NONE;
  private count = 0;
  private table: PairTable;
  /**
   * Per slot: 1 when listed in `hiddenSlots` (stored since the last publish; a slot
   * evicted meanwhile stays listed, so a slot is listed once).
   */
  private readonly hidden: Uint8Array;
  private readonly hiddenSlots: number[] = [];
  /** Published blocks evicted since the last publish (hash -> 1), and their data. */
  private readonly ghosts = new PairTable();
  private ghostBlocks: HostBlock[] = [];

  constructor(
    readonly capacityBlocks: number,
    private readonly recordGhosts = true,
  ) {
    if (!Number.isSafeInteger(capacityBlocks) || capacityBlocks < 1)
      throw new RangeError(`cpu capacity must be a positive integer, got ${capacityBlocks}`);
    const n = capacityBlocks;
    this.extHi = new Uint32Array(n);
    this.extLo = new Uint32Array(n);
    this.parentHi = new Uint32Array(n);
    this.parentLo = new Uint32Array(n);
    this.pathHi = new Uint32Array(n);
    this.pathLo = new Uint32Array(n);
    this.position = new Int32Array(n);
    this.used = new Uint8Array(n);
    this.hidden = new Uint8Array(n);
    this.prev = new Int32Array(n).fill(NONE);
    this.next = new Int32Array(n).fill(NONE);
    for (let slot = n - 1; slot >= 0; slot--) {
      this.next[slot] = this.freeHead;
      this.freeHead = slot;
    }
    this.table = new PairTable(2 * n);
  }

  /** Blocks held. */
  get size(): number {
    return this.count;
  }

  has(hi: number, lo: number): boolean {
    return this.table.has(hi, lo);
  }

  /** Whether the published view holds (hi, lo): held and not hidden, or a ghost. */
  hasPublished(hi: number, lo: number): boolean {
    const slot = this.table.get(hi, lo);
    return (slot !== NONE && this.hidden[slot] === 0) || this.ghosts.has(hi, lo);
  }

  /** What the tier did since the last call becomes the published view. */
  publish(): void {
    for (const slot of this.hiddenSlots) this.hidden[slot] = 0;
    this.hiddenSlots.length = 0;
    if (this.ghosts.size > 0) this.ghosts.clear();
    if (this.ghostBlocks.length > 0) this.ghostBlocks = [];
  }

  /** Marks a held block most recently used. */
  touch(hi: number, lo: number): void {
    const slot = this.table.get(hi, lo);
    if (slot === NONE) return;
    this.unlink(slot);
    this.append(slot);
  }

  /**
   * Makes room for one block: evicts the least recently used one if the tier is full;
   * returns its slot's hash as (hi, lo) through `out`, or false if nothing was evicted.
   */
  makeRoom(out: Uint32Array): boolean {
    if (this.freeHead !== NONE) return false;
    const slot = this.head;
    out[0] = this.extHi[slot]!;
    out[1] = this.extLo[slot]!;
    if (this.hidden[slot] === 0) {
      // A published block: the published view keeps it until the next publish.
      this.ghosts.set(out[0]!, out[1]!, 1);
      if (this.recordGhosts) this.ghostBlocks.push(this.blockAt(slot));
    }
    this.table.delete(this.extHi[slot]!, this.extLo[slot]!);
    this.unlink(slot);
    this.used[slot] = 0;
    this.next[slot] = this.freeHead;
    this.freeHead = slot;
    this.count--;
    return true;
  }

  /** Stores a block (there must be room: `makeRoom` first); it becomes the most recent. */
  store(
    hi: number,
    lo: number,
    parentHi: number,
    parentLo: number,
    pathHi: number,
    pathLo: number,
    position: number,
  ): void {
    const slot = this.freeHead;
    if (slot === NONE) throw new Error("cpu tier store without room");
    this.freeHead = this.next[slot]!;
    this.extHi[slot] = hi;
    this.extLo[slot] = lo;
    this.parentHi[slot] = parentHi;
    this.parentLo[slot] = parentLo;
    this.pathHi[slot] = pathHi;
    this.pathLo[slot] = pathLo;
    this.position[slot] = position;
    this.used[slot] = 1;
    if (this.hidden[slot] === 0) {
      this.hidden[slot] = 1;
      this.hiddenSlots.push(slot);
    }
    this.table.set(hi, lo, slot);
    this.append(slot);
    this.count++;
  }

  /** Drops everything (the engine's cache reset, which publishes before and after). */
  clear(): void {
    this.publish();
    for (let slot = this.head; slot !== NONE; ) {
      const after = this.next[slot]!;
      this.used[slot] = 0;
      this.prev[slot] = NONE;
      this.next[slot] = this.freeHead;
      this.freeHead = slot;
      slot = after;
    }
    this.head = this.tail = NONE;
    this.count = 0;
    this.table = new PairTable(2 * this.capacityBlocks);
  }

  /**
   * Every block of the published view, least recently used first, then the ghosts
   * (those only when `recordGhosts`).
   */
  snapshot(): HostBlock[] {
    const blocks: HostBlock[] = [];
    for (let slot = this.head; slot !== NONE; slot = this.next[slot]!)
      if (this.hidden[slot] === 0) blocks.push(this.blockAt(slot));
    for (const ghost of this.ghostBlocks) blocks.push(ghost);
    return blocks;
  }

  private blockAt(slot: number): HostBlock {
    const position = this.position[slot]!;
    return {
      hash: u64(this.extHi[slot]!, this.extLo[slot]!),
      parent: position === 0 ? null : u64(this.parentHi[slot]!, this.parentLo[slot]!),
      position,
      path: u64(this.pathHi[slot]!, this.pathLo[slot]!),
    };
  }

  /** O(capacity): the LRU list, the free list and the table agree. */
  verify(): void {
    let listed = 0;
    let previous = NONE;
    for (let slot = this.head; slot !== NONE; slot = this.next[slot]!) {
      if (++listed > this.capacityBlocks) throw new Error("cpu tier list has a cycle");
      if (this.used[slot] !== 1 || this.prev[slot] !== previous)
        throw new Error(`cpu tier list broken at slot ${slot}`);
      if (this.table.get(this.extHi[slot]!, this.extLo[slot]!) !== slot)
        throw new Error(`cpu tier slot ${slot} missing from its table`);
      previous = slot;
    }
    let free = 0;
    for (let slot = this.freeHead; slot !== NONE; slot = this.next[slot]!) free++;
    if (
      listed !== this.count ||
      this.table.size !== this.count ||
      listed + free !== this.capacityBlocks
    )
      throw new Error(`cpu tier counts differ: ${listed} listed, ${this.count}, ${free} free`);
    let hidden = 0;
    for (let slot = 0; slot < this.capacityBlocks; slot++) hidden += this.hidden[slot]!;
    if (hidden !== this.hiddenSlots.length)
      throw new Error(`cpu tier: ${hidden} slots hidden, ${this.hiddenSlots.length} listed`);
    this.ghosts.forEach((hi, lo) => {
      const slot = this.table.get(hi, lo);
      if (slot !== NONE && this.hidden[slot] === 0)
        throw new Error("cpu tier: a ghost is also held in the published view");
    });
  }

  private append(slot: number): void {
    this.prev[slot] = this.tail;
    this.next[slot] = NONE;
    if (this.tail === NONE) this.head = slot;
    else this.next[this.tail] = slot;
    this.tail = slot;
  }

  private unlink(slot: number): void {
    const before = this.prev[slot]!;
    const after = this.next[slot]!;
    if (before === NONE) this.head = after;
    else this.next[before] = after;
    if (after === NONE) this.tail = before;
    else this.prev[after] = before;
  }
}
