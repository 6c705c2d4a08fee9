/**
 * Dense worker slots for the typed-array backends. Each (worker_id, dp_rank) that
 * stores gets the most recently freed slot, else the next fresh one; slots are u16
 * (at most 65,536), so they stay dense. A slot owns its external-hash lookup.
 * It is freed only by `release`, which callers invoke after every coverage entry
 * naming the slot is gone (remove_worker clears first): nothing names a freed slot, so
 * a recycled one inherits nothing and needs no generation. Match results name slots
 * only until the next mutating call.
 *
 * Worker resolution happens once per event: a one-entry cache catches runs of events
 * from the same worker, else one Map probe on the bigint id.
 */
import { assert } from "./assert";
import { ExternalLookup } from "./lookup";

export const SLOT_LIMIT = 65_536;

export class WorkerSlots {
  readonly maxSlots: number;
  /** Slots handed out so far (live or free); arrays are sized to this. */
  highWater = 0;
  live = 0;
  readonly workerId: bigint[] = [];
  dpRank: Uint32Array;
  readonly lookup: (ExternalLookup | null)[] = [];
  private readonly byWorker = new Map<bigint, number[]>();
  private readonly free: number[] = [];
  private cachedId = -1n;
  private cachedRank = -1;
  private cachedSlot = -1;

  constructor(maxSlots = SLOT_LIMIT) {
    if (!Number.isInteger(maxSlots) || maxSlots < 1 || maxSlots > SLOT_LIMIT) {
      throw new RangeError(`maxWorkers must be an integer in [1, ${SLOT_LIMIT}], got ${maxSlots}`);
    }
    this.maxSlots = maxSlots;
    this.dpRank = new Uint32Array(16);
  }

  /** The slot of (workerId, dpRank), or -1. */
  find(workerId: bigint, dpRank: number): number {
    if (workerId === this.cachedId && dpRank === this.cachedRank) return this.cachedSlot;
    const ranks = this.byWorker.get(workerId);
    if (ranks === undefined) return -1;
    for (let i = 0; i < ranks.length; i += 2) {
      if (ranks[i] === dpRank) {
        const slot = ranks[i + 1]!;
        this.cachedId = workerId;
        this.cachedRank = dpRank;
        this.cachedSlot = slot;
        return slot;
      }
    }
    return -1;
  }

  /** A new slot for (workerId, dpRank), which must be absent; -1 when all are taken. */
  create(workerId: bigint, dpRank: number): number {
    let slot: number;
    if (this.free.length > 0) {
      slot = this.free.pop()!;
    } else {
      if (this.highWater === this.maxSlots) return -1;
      slot = this.highWater++;
      if (slot >= this.dpRank.length) this.growArrays();
    }
    this.workerId[slot] = workerId;
    this.dpRank[slot] = dpRank;
    this.lookup[slot] = new ExternalLookup();
    let ranks = this.byWorker.get(workerId);
    if (ranks === undefined) {
      ranks = [];
      this.byWorker.set(workerId, ranks);
    }
    ranks.push(dpRank, slot);
    this.live++;
    return slot;
  }

  /** Every slot of `workerId` (a copy). */
  slotsOf(workerId: bigint): number[] {
    const ranks = this.byWorker.get(workerId);
    const slots: number[] = [];
    if (ranks !== undefined) for (let i = 1; i < ranks.length; i += 2) slots.push(ranks[i]!);
    return slots;
  }

  /** Frees a slot whose state is already gone (its lookup must be empty). */
  release(slot: number): void {
    const lookup = this.lookup[slot];
    assert(lookup !== null && lookup !== undefined, "release of a free slot");
    assert(lookup.count === 0, "release of a slot that still holds blocks");
    const workerId = this.workerId[slot]!;
    const ranks = this.byWorker.get(workerId)!;
    for (let i = 0; i < ranks.length; i += 2) {
      if (ranks[i + 1] === slot) {
        ranks.splice(i, 2);
        break;
      }
    }
    if (ranks.length === 0) this.byWorker.delete(workerId);
    this.lookup[slot] = null;
    this.free.push(slot);
    this.live--;
    this.cachedId = -1n;
    this.cachedSlot = -1;
    if (this.live === 0) this.reset();
  }

  /** With no worker left, back to the initial size (slot numbering restarts at 0). */
  private reset(): void {
    this.highWater = 0;
    this.free.length = 0;
    this.workerId.length = 0;
    this.lookup.length = 0;
    this.dpRank = new Uint32Array(16);
  }

  isLive(slot: number): boolean {
    return slot < this.highWater && this.lookup[slot] !== null && this.lookup[slot] !== undefined;
  }

  /** Total entries over every slot's lookup. */
  lookupEntries(): number {
    let total = 0;
    for (let slot = 0; slot < this.highWater; slot++) total += this.lookup[slot]?.count ?? 0;
    return total;
  }

  bytes(): number {
    let total = this.dpRank.byteLength;
    for (let slot = 0; slot < this.highWater; slot++) total += this.lookup[slot]?.bytes() ?? 0;
    return total;
  }

  private growArrays(): void {
    const size = Math.min(this.dpRank.length * 2, SLOT_LIMIT);
    const dpRank = new Uint32Array(size);
    dpRank.set(this.dpRank);
    this.dpRank = dpRank;
  }
}
