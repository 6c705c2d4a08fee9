/**
 * The index as the main thread sees it when the writer thread owns it
 * (runtime.index_threads = 1): lookups read the writer's crtc in shared memory without
 * locks (src/index/crtc/shared.ts). The writer writes in this thread's slots (its table
 * adopts the ones this table assigns: src/runtime/writer.ts), so an answer's slots are
 * the router's as they are; only slots whose worker is gone here, or whose slot went to
 * another worker since (a stale generation stamp), are left out. Counts and per-worker
 * blocks are the writer's, as of its last drain (status messages). Writes go through the
 * event ring, never through here; a dump or a freeze of the writer's index is not
 * available on this thread (serve refuses state.dir with it).
 */
import { KvedgeError } from "../domain/errors";
import type { WorkerTable } from "../domain/worker-table";
import type { IndexOp } from "./ops";
import type { FreezeJob } from "./pack";
import type { SharedIndexReader } from "./crtc/shared";
import {
  type IndexCounters,
  type IndexStats,
  type KvIndex,
  type MatchResult,
  newCounters,
  type StoreStatus,
  type TierMatches,
  type WorkerInfo,
} from "./types";

/** What the writer posts of its index after a drain that changed it. */
export interface IndexStatus {
  readonly counters: IndexCounters;
  readonly stats: IndexStats;
  readonly workers: WorkerInfo[];
  readonly refusedEvents: number;
  readonly refusedBlocks: number;
  /** Slots the writer's table holds (it adopts them from this thread's, forgets them when told). */
  readonly slots: number;
}

const ON_WRITER = "the index is written on the writer thread (runtime.index_threads = 1)";

export class ThreadedIndex implements KvIndex {
  readonly backend = "crtc" as const;
  readonly counters: IndexCounters = newCounters();
  private statsNow: IndexStats;
  private workersNow: WorkerInfo[] = [];
  refusedEvents = 0;
  refusedBlocks = 0;
  /** Slots the writer's table holds, as of its last drain. */
  writerSlots = 0;

  constructor(
    readonly blockSize: number,
    readonly workerTable: WorkerTable,
    private readonly reader: SharedIndexReader,
  ) {
    this.statsNow = {
      workers: 0,
      blocks: 0,
      copies: 0,
      lowerTiers: { host_pinned: 0, disk: 0, external: 0, copies: 0 },
      nodes: 0,
      edgeWords: 0,
      lookupEntries: 0,
      rejected: { total: 0, parentNotFound: 0, blockSizeMismatch: 0, capacity: 0, invalid: 0 },
      bytes: 0,
    };
  }

  /** The writer's latest view of its index. */
  mirror(status: IndexStatus): void {
    Object.assign(this.counters, status.counters);
    this.statsNow = status.stats;
    this.workersNow = status.workers;
    this.refusedEvents = status.refusedEvents;
    this.refusedBlocks = status.refusedBlocks;
    this.writerSlots = status.slots;
  }

  /** One event boundary's answer; slots no longer naming the worker they named then are left out. */
  findMatches(local: Uint32Array, count: number, out: MatchResult, chain?: Uint32Array): void {
    const reader = this.reader;
    const table = this.workerTable;
    reader.findMatches(local, count, out, chain);
    let n = 0;
    for (let i = 0; i < out.count; i++) {
      const slot = out.workers[i]!;
      if (!table.isCurrent(slot, reader.stampOf(slot))) continue;
      out.workers[n] = slot;
      out.blocks[n++] = out.blocks[i]!;
    }
    out.count = n;
  }

  workerIdOf(handle: number): bigint {
    return this.workerTable.workerIdOf(handle);
  }

  dpRankOf(handle: number): number {
    return this.workerTable.dpRankOf(handle);
  }

  stats(): IndexStats {
    return this.statsNow;
  }

  workers(): WorkerInfo[] {
    return this.workersNow;
  }

  /** The writer removes the worker's blocks when its record arrives (WriterThread.release). */
  removeWorker(): void {}

  /** The writer drops the slot's blocks when its record arrives (WriterThread.release). */
  dropSlot(): void {}

  applyStored(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  applyRemoved(): number {
    throw new Error(ON_WRITER);
  }

  applyCleared(): void {
    throw new Error(ON_WRITER);
  }

  storeAt(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  removeAt(): number {
    throw new Error(ON_WRITER);
  }

  clearAt(): void {
    throw new Error(ON_WRITER);
  }

  countRejected(): void {
    throw new Error(ON_WRITER);
  }

  applyStoredTier(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  applyStoredTierUnder(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  applyRemovedTier(): number {
    throw new Error(ON_WRITER);
  }

  storeTierAt(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  storeTierUnder(): StoreStatus {
    throw new Error(ON_WRITER);
  }

  removeTierAt(): number {
    throw new Error(ON_WRITER);
  }

  /**
   * The lower tiers live in the writer's private memory: this thread sees none, so routes
   * with a writer thread count the device tier only (docs/decisions.md#lower-tiers).
   */
  tierMatches(_chain: Uint32Array, _count: number, _device: MatchResult, out: TierMatches): void {
    out.reset(0);
  }

  dump(): IndexOp[] {
    throw new KvedgeError("unsupported", `a dump is not available when ${ON_WRITER.slice(4)}`);
  }

  dumpLazy(): IterableIterator<IndexOp | null> {
    return this.dump()[Symbol.iterator]();
  }

  freeze(): FreezeJob {
    throw new KvedgeError("unsupported", `snapshots are not available when ${ON_WRITER.slice(4)}`);
  }

  /** The writer's index checks itself (KVEDGE_VERIFY=1 applies on its thread). */
  verify(): void {}
}
