/**
 * The index as the main thread sees it when the writer thread owns it
 * (runtime.index_threads = 1): lookups read the writer's crtc in shared memory without
 * locks (src/index/crtc/shared.ts), and the answer's worker handles are turned into
 * this thread's worker slots (the router's numbering) by (worker id, dp rank); counts
 * and per-worker blocks are the writer's, as of its last drain (status messages).
 * Writes go through the event ring, never through here; a dump or a freeze of the
 * writer's index is not available on this thread (serve refuses state.dir with it).
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
  MatchResult,
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
}

const ON_WRITER = "the index is written on the writer thread (runtime.index_threads = 1)";

export class ThreadedIndex implements KvIndex {
  readonly backend = "crtc" as const;
  readonly counters: IndexCounters = newCounters();
  private statsNow: IndexStats;
  private workersNow: WorkerInfo[] = [];
  private readonly scratch = new MatchResult(64);
  /**
   * Per writer handle, the slot here it mapped to last, with what proves it still holds:
   * the reader's id object for the handle (the same object while the handle names the
   * same worker), the dp rank, and the slot's generation here (changed if recycled).
   */
  private handleIds: (bigint | undefined)[] = [];
  private handleRanks = new Int32Array(64);
  private handleSlots = new Int32Array(64);
  private handleGenerations = new Float64Array(64);
  refusedEvents = 0;
  refusedBlocks = 0;

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
  }

  /** One event boundary's answer, in this thread's slots; workers not known here are left out. */
  findMatches(local: Uint32Array, count: number, out: MatchResult, chain?: Uint32Array): void {
    const reader = this.reader;
    const found = this.scratch;
    reader.findMatches(local, count, found, chain);
    out.ensure(found.count);
    let n = 0;
    for (let i = 0; i < found.count; i++) {
      const slot = this.slotOf(found.workers[i]!);
      if (slot < 0) continue;
      out.workers[n] = slot;
      out.blocks[n] = found.blocks[i]!;
      n++;
    }
    out.count = n;
  }

  /** This thread's slot of a writer handle in the last answer, or -1 (a worker not known here). */
  private slotOf(handle: number): number {
    const reader = this.reader;
    const table = this.workerTable;
    const id = reader.workerIdOf(handle);
    const rank = reader.dpRankOf(handle);
    const known = handle < this.handleSlots.length && this.handleIds[handle] === id;
    if (known && this.handleRanks[handle] === rank) {
      const cached = this.handleSlots[handle]!;
      if (cached >= 0 && table.generation[cached] === this.handleGenerations[handle]) return cached;
    }
    const slot = table.find(id, rank);
    if (slot < 0) return -1;
    if (handle >= this.handleSlots.length) this.growHandles(handle + 1);
    this.handleIds[handle] = id;
    this.handleRanks[handle] = rank;
    this.handleSlots[handle] = slot;
    this.handleGenerations[handle] = table.generation[slot]!;
    return slot;
  }

  private growHandles(size: number): void {
    let length = this.handleSlots.length;
    while (length < size) length *= 2;
    const grow = <T extends Int32Array | Float64Array>(old: T, make: (n: number) => T): T => {
      const next = make(length);
      next.set(old);
      return next;
    };
    this.handleRanks = grow(this.handleRanks, (n) => new Int32Array(n));
    this.handleSlots = grow(this.handleSlots, (n) => new Int32Array(n));
    this.handleGenerations = grow(this.handleGenerations, (n) => new Float64Array(n));
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

  /** The writer removes the worker's blocks when its record arrives (WriterThread.removeWorker). */
  removeWorker(): void {}

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
