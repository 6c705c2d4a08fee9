/**
 * One publisher's dp ranks and their worker slots. A stream names its worker once
 * (the source's worker id) and each batch its dp rank; the slot of (worker, rank) is
 * resolved in the worker table when the rank is first written, then kept with its
 * generation, so the sink is handed a plain slot number per operation. A rank new to
 * the table gets its slot from `acquire`: the table's own, or, on the writer thread,
 * the main thread's (src/runtime/writer.ts), which owns the numbering.
 */
import type { WorkerTable } from "../domain/worker-table";

/** The slot of (workerId, dpRank), taken if it has none; -1 when none can be had. */
export type SlotAcquire = (workerId: bigint, dpRank: number) => number;

export class RankSlots {
  /** Ranks this publisher has written for (the configured one from the start). */
  readonly ranks = new Set<number>();
  private cachedRank = -1;
  private cachedSlot = -1;
  private cachedGeneration = 0;

  constructor(
    private readonly table: WorkerTable,
    readonly workerId: bigint,
    configuredRank: number,
    private readonly acquire: SlotAcquire = (workerId, dpRank) => table.acquire(workerId, dpRank),
  ) {
    this.ranks.add(configuredRank);
  }

  /** The slot of (workerId, dpRank), taken if it has none; -1 when every slot is taken. */
  slotOf(dpRank: number): number {
    const table = this.table;
    if (dpRank === this.cachedRank && table.generation[this.cachedSlot] === this.cachedGeneration)
      return this.cachedSlot;
    this.ranks.add(dpRank);
    const slot = this.acquire(this.workerId, dpRank);
    if (slot < 0) return -1;
    this.cachedRank = dpRank;
    this.cachedSlot = slot;
    this.cachedGeneration = table.generation[slot]!;
    return slot;
  }
}
