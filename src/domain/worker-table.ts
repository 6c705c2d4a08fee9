/**
 * The one worker numbering: (worker_id, dp_rank) -> a dense slot, shared by the index
 * (coverage, lookups, match results), the router (per-slot load arrays) and the core
 * (per-slot columns), so a match result is a router slot with no translation, on every
 * thread. README.md in this folder states the invariants; in short:
 *
 * - `acquire` gives a known pair its slot, else the most recently freed slot, else the
 *   next fresh one. Slots stay below `maxSlots` (u16 in the index).
 * - Each acquisition stamps the slot with a new `generation` (a table-wide counter), so a
 *   holder of (slot, generation) can tell its slot was recycled.
 * - A slot's life ends in two steps: `retire` (no longer live or found; its columns
 *   emptied) once nothing here names it, then `free` once nothing anywhere does (the
 *   writer thread's index); `release` is both at once. With no live or retired slot
 *   left, the arrays go back to their first size and numbering restarts at 0.
 * - A follower table (the writer thread's) allocates nothing: it `adopt`s the slots and
 *   generations its owner assigned, and `release` forgets one.
 *
 * `find` is called once per KV event: a one-entry cache catches runs of events from the
 * same worker, else one Map probe on the bigint id.
 */

/** Slots are u16 in the index's coverage. */
export const SLOT_LIMIT = 65_536;
const INITIAL_SLOTS = 16;
const U64_LIMIT = 1n << 64n;

/** Who numbers the slots: the table itself, or (a follower) another table it adopts from. */
export type TableRole = "owner" | "follower";

export class WorkerTable {
  readonly maxSlots: number;
  /** Slots handed out so far (live, retired or free); every per-slot array is at least this long. */
  highWater = 0;
  liveCount = 0;
  /** Retired slots: no longer live, not yet free (see `retire`). */
  retiredCount = 0;
  /** Live slots, densely packed (the routing loop's candidates), in no particular order. */
  liveSlots = new Int32Array(INITIAL_SLOTS);
  live = new Uint8Array(INITIAL_SLOTS);
  dpRanks = new Uint32Array(INITIAL_SLOTS);
  /** Stamp of the slot's current acquisition (0 = never acquired, or retired). */
  generation = new Float64Array(INITIAL_SLOTS);
  private retired = new Uint8Array(INITIAL_SLOTS);
  private livePosition = new Int32Array(INITIAL_SLOTS);
  private workerIds: bigint[] = [];
  /** The ids as decimal text, as answers carry them (a bigint's toString per answer adds up). */
  private workerIdTexts: string[] = [];
  private readonly byWorker = new Map<bigint, number[]>();
  private freeSlots: number[] = [];
  private generations = 0;
  private readonly columns: SlotColumn<unknown>[] = [];
  private cachedId = -1n;
  private cachedRank = -1;
  private cachedSlot = -1;

  constructor(
    maxSlots = SLOT_LIMIT,
    readonly role: TableRole = "owner",
  ) {
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

  /**
   * The slot of (workerId, dpRank), taking a new one if it has none; -1 when all are
   * taken. Throws on an id that is not a u64 or a rank that is not a u32.
   */
  acquire(workerId: bigint, dpRank: number): number {
    const known = this.find(workerId, dpRank);
    if (known >= 0) return known;
    if (this.role === "follower") throw new Error("a follower table adopts its slots");
    checkIdentity(workerId, dpRank);
    let slot: number;
    if (this.freeSlots.length > 0) {
      slot = this.freeSlots.pop()!;
    } else {
      if (this.highWater === this.maxSlots) return -1;
      slot = this.highWater++;
      if (slot >= this.capacity) this.grow(Math.min(2 * this.capacity, SLOT_LIMIT));
    }
    this.link(slot, workerId, dpRank, ++this.generations);
    return slot;
  }

  /** A follower takes the slot and generation its owner gave (workerId, dpRank). */
  adopt(slot: number, workerId: bigint, dpRank: number, generation: number): void {
    if (this.role !== "follower") throw new Error("only a follower table adopts slots");
    if (!(Number.isInteger(slot) && slot >= 0 && slot < this.maxSlots) || this.live[slot] === 1)
      throw new RangeError(`slot ${slot} cannot be adopted`);
    if (this.find(workerId, dpRank) >= 0)
      throw new RangeError(`worker ${workerId} dp_rank ${dpRank} has a slot already`);
    checkIdentity(workerId, dpRank);
    if (slot >= this.capacity) {
      let size = this.capacity;
      while (size <= slot) size *= 2;
      this.grow(Math.min(size, SLOT_LIMIT));
    }
    this.highWater = Math.max(this.highWater, slot + 1);
    this.link(slot, workerId, dpRank, generation);
  }

  /** Frees a live slot at once: `retire`, then `free` (a follower just forgets it). */
  release(slot: number): void {
    this.unlink(slot);
    if (this.role === "owner") this.freeSlots.push(slot);
    this.resetIfEmpty();
  }

  /**
   * Ends a live slot's life here: it is no longer live, found or named by its columns,
   * but not yet given to another worker (`free` does, once nothing elsewhere names it).
   */
  retire(slot: number): void {
    if (this.role !== "owner") throw new Error("a follower table forgets slots with release");
    this.unlink(slot);
    this.retired[slot] = 1;
    this.retiredCount++;
  }

  /** A retired slot may go to the next new worker. */
  free(slot: number): void {
    if (!(slot >= 0 && slot < this.highWater && this.retired[slot] === 1))
      throw new RangeError(`slot ${slot} is not retired`);
    this.retired[slot] = 0;
    this.retiredCount--;
    this.freeSlots.push(slot);
    this.resetIfEmpty();
  }

  isLive(slot: number): boolean {
    return slot >= 0 && slot < this.highWater && this.live[slot] === 1;
  }

  isRetired(slot: number): boolean {
    return slot >= 0 && slot < this.highWater && this.retired[slot] === 1;
  }

  /** The slot's generation as a u32 (what crosses threads in shared memory). */
  stampOf(slot: number): number {
    return this.generation[slot]! >>> 0;
  }

  /** Whether `slot` is live at the acquisition `stamp` (a `stampOf` read earlier) names. */
  isCurrent(slot: number, stamp: number): boolean {
    return this.live[slot] === 1 && this.generation[slot]! >>> 0 === stamp;
  }

  /** A per-slot column of values that the table empties when a slot's life ends. */
  column<T>(): SlotColumn<T> {
    const column = new SlotColumn<T>(this);
    this.columns.push(column as SlotColumn<unknown>);
    return column;
  }

  /** Values held in the table's columns, over every slot (tests of bounded state). */
  get columnEntries(): number {
    let entries = 0;
    for (const column of this.columns) entries += column.size;
    return entries;
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
      this.retired.byteLength +
      this.dpRanks.byteLength +
      this.generation.byteLength +
      this.liveSlots.byteLength +
      this.livePosition.byteLength
    );
  }

  private link(slot: number, workerId: bigint, dpRank: number, generation: number): void {
    this.workerIds[slot] = workerId;
    this.workerIdTexts[slot] = workerId.toString();
    this.dpRanks[slot] = dpRank;
    this.generation[slot] = generation;
    this.live[slot] = 1;
    this.livePosition[slot] = this.liveCount;
    this.liveSlots[this.liveCount++] = slot;
    let ranks = this.byWorker.get(workerId);
    if (ranks === undefined) this.byWorker.set(workerId, (ranks = []));
    ranks.push(dpRank, slot);
  }

  /** Takes a live slot out of the numbering (not found, not live) and empties its columns. */
  private unlink(slot: number): void {
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
    this.cachedId = -1n;
    this.cachedSlot = -1;
    for (const column of this.columns) column.delete(slot);
  }

  private assertLive(slot: number): void {
    if (!this.isLive(slot)) throw new RangeError(`no worker in slot ${slot}`);
  }

  /** With no worker left (none retired either), back to the first size (generations keep counting). */
  private resetIfEmpty(): void {
    if (this.liveCount > 0 || this.retiredCount > 0) return;
    this.highWater = 0;
    this.freeSlots = [];
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
    this.retired = keep(this.retired, new Uint8Array(size));
    this.dpRanks = keep(this.dpRanks, new Uint32Array(size));
    this.generation = keep(this.generation, new Float64Array(size));
    this.liveSlots = keep(this.liveSlots, new Int32Array(size));
    this.livePosition = keep(this.livePosition, new Int32Array(size));
  }
}

/**
 * Values per live slot beside the table's own arrays (an engine's endpoint, its saved
 * position, observed hits...): set only on a live slot, emptied by the table when the
 * slot's life ends, so no state outlives its worker or passes to the next one.
 */
export class SlotColumn<T> {
  private values: (T | undefined)[] = [];
  /** Slots holding a value. */
  size = 0;

  constructor(private readonly table: WorkerTable) {}

  get(slot: number): T | undefined {
    return slot >= 0 ? this.values[slot] : undefined;
  }

  set(slot: number, value: T): void {
    if (!this.table.isLive(slot)) throw new RangeError(`no worker in slot ${slot}`);
    if (this.values[slot] === undefined) this.size++;
    this.values[slot] = value;
  }

  delete(slot: number): void {
    if (slot < 0 || this.values[slot] === undefined) return;
    this.values[slot] = undefined;
    if (--this.size === 0) this.values = [];
  }
}

function checkIdentity(workerId: bigint, dpRank: number): void {
  if (workerId < 0n || workerId >= U64_LIMIT)
    throw new RangeError(`worker id ${workerId} is not a u64`);
  if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank > 0xffff_ffff)
    throw new RangeError(`dp rank ${dpRank} is not a u32`);
}
