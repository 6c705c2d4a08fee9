/**
 * The one worker numbering: (worker_id, dp_rank) -> a dense slot, shared by the index
 * (coverage, lookups, match results) and the router (per-slot load arrays), so a match
 * result is a router slot with no translation. README.md in this folder states the
 * invariants; in short:
 *
 * - `acquire` gives a known pair its slot, else the most recently freed slot, else the
 *   next fresh one. Slots stay below `maxSlots` (u16 in the index).
 * - Each acquisition stamps the slot with a new `generation` (a table-wide counter), so a
 *   holder of (slot, generation) can tell its slot was recycled.
 * - `release` is called by the table's owner once nothing names the slot any more (the
 *   index holds no block of it, the router no request). With no live slot left, the
 *   arrays go back to their first size and numbering restarts at 0.
 *
 * `find` is called once per KV event: a one-entry cache catches runs of events from the
 * same worker, else one Map probe on the bigint id.
 */

/** Slots are u16 in the index's coverage. */
export const SLOT_LIMIT = 65_536;
const INITIAL_SLOTS = 16;

export class WorkerTable {
  readonly maxSlots: number;
  /** Slots handed out so far (live or free); every per-slot array is at least this long. */
  highWater = 0;
  liveCount = 0;
  /** Live slots, densely packed (the routing loop's candidates), in no particular order. */
  liveSlots = new Int32Array(INITIAL_SLOTS);
  live = new Uint8Array(INITIAL_SLOTS);
  dpRanks = new Uint32Array(INITIAL_SLOTS);
  /** Stamp of the slot's current acquisition (0 = never acquired or released). */
  generation = new Float64Array(INITIAL_SLOTS);
  private livePosition = new Int32Array(INITIAL_SLOTS);
  private workerIds: bigint[] = [];
  /** The ids as decimal text, as answers carry them (a bigint's toString per answer adds up). */
  private workerIdTexts: string[] = [];
  private readonly byWorker = new Map<bigint, number[]>();
  private free: number[] = [];
  private generations = 0;
  private cachedId = -1n;
  private cachedRank = -1;
  private cachedSlot = -1;

  constructor(maxSlots = SLOT_LIMIT) {
    if (!Number.isInteger(maxSlots) || maxSlots < 1 || maxSlots > SLOT_LIMIT) {
      throw new RangeError(`maxWorkers must be an integer in [1, ${SLOT_LIMIT}], got ${maxSlots}`);
    }
    this.maxSlots = maxSlots;
  }

  /** Length of the per-slot arrays (grows by doubling, never below `highWater`). */
  get capacity(): number {
    return this.live.length;
  }

  /** The slot of (workerId, dpRank), or -1. */
  find(workerId: bigint, dpRank: number): number {
    if (workerId === this.cachedId && dpRank === this.cachedRank) return this.cachedSlot;
    const ranks = this.byWorker.get(workerId);
    if (ranks === undefined) return -1;
    for (let i = 0; i < ranks.length; i += 2) {
      if (ranks[i] !== dpRank) continue;
      const slot = ranks[i + 1]!;
      this.cachedId = workerId;
      this.cachedRank = dpRank;
      this.cachedSlot = slot;
      return slot;
    }
    return -1;
  }

  /** The slot of (workerId, dpRank), taking a new one if it has none; -1 when all are taken. */
  acquire(workerId: bigint, dpRank: number): number {
    const known = this.find(workerId, dpRank);
    if (known >= 0) return known;
    let slot: number;
    if (this.free.length > 0) {
      slot = this.free.pop()!;
    } else {
      if (this.highWater === this.maxSlots) return -1;
      slot = this.highWater++;
      if (slot >= this.capacity) this.grow(Math.min(2 * this.capacity, SLOT_LIMIT));
    }
    this.workerIds[slot] = workerId;
    this.workerIdTexts[slot] = workerId.toString();
    this.dpRanks[slot] = dpRank;
    this.generation[slot] = ++this.generations;
    this.live[slot] = 1;
    this.livePosition[slot] = this.liveCount;
    this.liveSlots[this.liveCount++] = slot;
    let ranks = this.byWorker.get(workerId);
    if (ranks === undefined) this.byWorker.set(workerId, (ranks = []));
    ranks.push(dpRank, slot);
    return slot;
  }

  /** Frees a live slot; the caller has already dropped every state that names it. */
  release(slot: number): void {
    this.assertLive(slot);
    const workerId = this.workerIds[slot]!;
    const ranks = this.byWorker.get(workerId)!;
    for (let i = 0; i < ranks.length; i += 2) {
      if (ranks[i + 1] !== slot) continue;
      ranks.splice(i, 2);
      break;
    }
    if (ranks.length === 0) this.byWorker.delete(workerId);
    const position = this.livePosition[slot]!;
    const last = this.liveSlots[--this.liveCount]!;
    this.liveSlots[position] = last;
    this.livePosition[last] = position;
    this.live[slot] = 0;
    this.generation[slot] = 0;
    this.workerIds[slot] = 0n;
    this.workerIdTexts[slot] = "";
    this.free.push(slot);
    this.cachedId = -1n;
    this.cachedSlot = -1;
    if (this.liveCount === 0) this.reset();
  }

  isLive(slot: number): boolean {
    return slot >= 0 && slot < this.highWater && this.live[slot] === 1;
  }

  /** Every live slot of `workerId` (a copy). */
  slotsOf(workerId: bigint): number[] {
    const ranks = this.byWorker.get(workerId);
    const slots: number[] = [];
    if (ranks !== undefined) for (let i = 1; i < ranks.length; i += 2) slots.push(ranks[i]!);
    return slots;
  }

  workerIdOf(slot: number): bigint {
    this.assertLive(slot);
    return this.workerIds[slot]!;
  }

  /** `workerIdOf` as a decimal string. */
  workerIdTextOf(slot: number): string {
    this.assertLive(slot);
    return this.workerIdTexts[slot]!;
  }

  dpRankOf(slot: number): number {
    this.assertLive(slot);
    return this.dpRanks[slot]!;
  }

  bytes(): number {
    return (
      this.live.byteLength +
      this.dpRanks.byteLength +
      this.generation.byteLength +
      this.liveSlots.byteLength +
      this.livePosition.byteLength
    );
  }

  private assertLive(slot: number): void {
    if (!this.isLive(slot)) throw new RangeError(`no worker in slot ${slot}`);
  }

  /** With no worker left, back to the first size (generations keep counting). */
  private reset(): void {
    this.highWater = 0;
    this.free = [];
    this.workerIds = [];
    this.workerIdTexts = [];
    this.grow(INITIAL_SLOTS);
  }

  /** The one allocation site for per-slot arrays: `size` slots, the first `highWater` kept. */
  private grow(size: number): void {
    const keep = <T extends Uint8Array | Uint32Array | Int32Array | Float64Array>(
      old: T,
      fresh: T,
    ): T => {
      fresh.set(old.subarray(0, Math.min(this.highWater, size)));
      return fresh;
    };
    this.live = keep(this.live, new Uint8Array(size));
    this.dpRanks = keep(this.dpRanks, new Uint32Array(size));
    this.generation = keep(this.generation, new Float64Array(size));
    this.liveSlots = keep(this.liveSlots, new Int32Array(size));
    this.livePosition = keep(this.livePosition, new Int32Array(size));
  }
}
