/**
 * The part of every backend that names workers: the (worker_id, dp_rank) methods of
 * KvIndex, each resolving the worker's slot in the worker table once and passing it
 * to the backend's slot methods. A slot is taken only by a stored event that will
 * hold blocks (no parent, at least one block), so rejected events leave no slot
 * behind; slot -1 tells the backend the worker has none (and could not get one).
 */
import { WorkerTable } from "../domain/worker-table";
import {
  countRejection,
  type IndexCounters,
  type IndexOptions,
  newCounters,
  type StoreStatus,
} from "./types";

export abstract class SlotIndex {
  readonly counters: IndexCounters = newCounters();
  /** The worker numbering this index's slots are in (shared, or its own). */
  readonly workerTable: WorkerTable;
  /** Whether this index numbers its own workers (then it also frees their slots). */
  protected readonly ownsWorkers: boolean;

  constructor(options: IndexOptions) {
    this.ownsWorkers = options.workers === undefined;
    this.workerTable = options.workers ?? new WorkerTable(options.maxWorkers);
  }

  abstract storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first?: number,
  ): StoreStatus;
  abstract removeAt(slot: number, external: Uint32Array, count: number, first?: number): number;
  abstract clearAt(slot: number): void;
  abstract storeTierAt(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first?: number,
  ): StoreStatus;
  abstract storeTierUnder(
    tier: number,
    slot: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first?: number,
  ): StoreStatus;
  abstract removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first?: number,
  ): number;

  applyStored(
    workerId: bigint,
    dpRank: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    let slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0 && !hasParent && count > 0) slot = this.workerTable.acquire(workerId, dpRank);
    return this.storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first);
  }

  applyRemoved(
    workerId: bigint,
    dpRank: number,
    external: Uint32Array,
    count: number,
    first = 0,
  ): number {
    return this.removeAt(this.workerTable.find(workerId, dpRank), external, count, first);
  }

  /** A lower tier's stored event (TIER_HOST .. TIER_EXTERNAL), its parent by external hash. */
  applyStoredTier(
    workerId: bigint,
    dpRank: number,
    tier: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    let slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0 && !hasParent && count > 0) slot = this.workerTable.acquire(workerId, dpRank);
    return this.storeTierAt(
      tier,
      slot,
      hasParent,
      parentHi,
      parentLo,
      external,
      local,
      count,
      first,
    );
  }

  /** A lower tier's stored event below a sequence hash (how a dump restores one). */
  applyStoredTierUnder(
    workerId: bigint,
    dpRank: number,
    tier: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    let slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0 && count > 0) slot = this.workerTable.acquire(workerId, dpRank);
    return this.storeTierUnder(tier, slot, hasBase, baseHi, baseLo, external, local, count, first);
  }

  /** A lower tier's removed event, or every lower tier's (TIER_ANY). */
  applyRemovedTier(
    workerId: bigint,
    dpRank: number,
    tier: number,
    external: Uint32Array,
    count: number,
    first = 0,
  ): number {
    return this.removeTierAt(tier, this.workerTable.find(workerId, dpRank), external, count, first);
  }

  applyCleared(workerId: bigint, dpRank: number): void {
    this.clearAt(this.workerTable.find(workerId, dpRank));
  }

  countRejected(status: StoreStatus): void {
    countRejection(this.counters, status);
  }
}
