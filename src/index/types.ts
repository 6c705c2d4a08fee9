/**
 * The contract every index backend meets (README.md in this folder states the
 * semantics in full). Hot-path methods take numbers and typed arrays: 64-bit hashes
 * are (hi, lo) u32 pairs, `count` is in blocks and `first` is the index of the
 * event's first block in those arrays. Worker ids are bigints at event granularity.
 */
import type { WorkerTable } from "../domain/worker-table";
import type { FreezeJob } from "./pack";
import type { IndexOp } from "./ops";

export type BackendName = "crtc" | "positional" | "reference";

/**
 * Storage tiers (docs/decisions.md#lower-tiers): the device (GPU) and the lower tiers an
 * engine offloads to. TIER_ANY names every tier at once: a removal whose medium kvedge
 * does not know.
 */
export const TIER_DEVICE = 0;
export const TIER_HOST = 1;
export const TIER_DISK = 2;
export const TIER_EXTERNAL = 3;
export const TIER_ANY = 255;
export const TIER_NAMES = ["device", "host_pinned", "disk", "external"] as const;
export type TierName = (typeof TIER_NAMES)[number];
export const BACKEND_NAMES: readonly BackendName[] = ["crtc", "positional", "reference"];

/** What became of a stored event. Rejected events change nothing (and are counted). */
export const StoreStatus = {
  Ok: 0,
  /** The parent is not a block this worker holds. */
  ParentNotFound: 1,
  /** The event's block size is not the index's (checked by the apply layer / ingest). */
  BlockSizeMismatch: 2,
  /** A new worker needs a slot and every slot is taken. */
  CapacityExhausted: 3,
  /** The event contradicts itself (e.g. token count vs block count). */
  Invalid: 4,
} as const;
export type StoreStatus = (typeof StoreStatus)[keyof typeof StoreStatus];

/** Plain numeric counters, read by the metrics layer. Only ever increase. */
export interface IndexCounters {
  /** Stored events applied (not rejected). */
  storedEvents: number;
  removedEvents: number;
  clearedEvents: number;
  workersRemoved: number;
  /** (block, worker) pairs that became held. */
  blocksStored: number;
  /** (block, worker) pairs that stopped being held (removed, cleared, remove_worker). */
  blocksRemoved: number;
  /**
   * Stored blocks the worker already held under the same hash: one more copy of the
   * block (vLLM keeps several physical copies of one block and announces each).
   */
  blocksDuplicate: number;
  /** Removed hashes of blocks the worker held in more than one copy: one copy fewer, still held. */
  copiesRemoved: number;
  /** Removed hashes the worker did not hold (skipped). */
  blocksUnknown: number;
  /**
   * Stored events cut short because the producer broke the engine-hash invariant:
   * a hash already naming another of the worker's blocks, or a block the worker
   * already holds under another hash. The event applies up to that block.
   */
  hashConflicts: number;
  rejectedParentNotFound: number;
  rejectedBlockSizeMismatch: number;
  rejectedCapacity: number;
  rejectedInvalid: number;
  /** The same for the lower tiers (host, disk, external), every tier together. */
  tierStoredEvents: number;
  tierRemovedEvents: number;
  tierBlocksStored: number;
  tierBlocksRemoved: number;
  tierBlocksDuplicate: number;
  tierCopiesRemoved: number;
  tierBlocksUnknown: number;
  tierHashConflicts: number;
  tierRejectedParentNotFound: number;
}

export function newCounters(): IndexCounters {
  return {
    storedEvents: 0,
    removedEvents: 0,
    clearedEvents: 0,
    workersRemoved: 0,
    blocksStored: 0,
    blocksRemoved: 0,
    blocksDuplicate: 0,
    copiesRemoved: 0,
    blocksUnknown: 0,
    hashConflicts: 0,
    rejectedParentNotFound: 0,
    rejectedBlockSizeMismatch: 0,
    rejectedCapacity: 0,
    rejectedInvalid: 0,
    tierStoredEvents: 0,
    tierRemovedEvents: 0,
    tierBlocksStored: 0,
    tierBlocksRemoved: 0,
    tierBlocksDuplicate: 0,
    tierCopiesRemoved: 0,
    tierBlocksUnknown: 0,
    tierHashConflicts: 0,
    tierRejectedParentNotFound: 0,
  };
}

/** Adds one rejection of `status` (not Ok) to `counters`. */
export function countRejection(counters: IndexCounters, status: StoreStatus): void {
  switch (status) {
    case StoreStatus.ParentNotFound:
      counters.rejectedParentNotFound++;
      break;
    case StoreStatus.BlockSizeMismatch:
      counters.rejectedBlockSizeMismatch++;
      break;
    case StoreStatus.CapacityExhausted:
      counters.rejectedCapacity++;
      break;
    case StoreStatus.Invalid:
      counters.rejectedInvalid++;
      break;
    default:
      throw new RangeError(`not a rejection: ${status}`);
  }
}

export interface RejectCounts {
  total: number;
  parentNotFound: number;
  blockSizeMismatch: number;
  capacity: number;
  invalid: number;
}

export function rejectCounts(counters: IndexCounters): RejectCounts {
  const parentNotFound = counters.rejectedParentNotFound;
  const blockSizeMismatch = counters.rejectedBlockSizeMismatch;
  const capacity = counters.rejectedCapacity;
  const invalid = counters.rejectedInvalid;
  return {
    total: parentNotFound + blockSizeMismatch + capacity + invalid,
    parentNotFound,
    blockSizeMismatch,
    capacity,
    invalid,
  };
}

/** Exact sizes of an index right now (README.md of each backend defines its terms). */
export interface IndexStats {
  /** (worker_id, dp_rank) pairs present. */
  workers: number;
  /** Held (block, worker) pairs. */
  blocks: number;
  /** Copies held beyond the first of each held pair (a block the engine holds twice counts 1). */
  copies: number;
  /** Held (block, worker) pairs of each lower tier, and their copies beyond the first. */
  lowerTiers: { host_pinned: number; disk: number; external: number; copies: number };
  /** Tree nodes without the root (crtc), index entries (positional), distinct held blocks (reference). */
  nodes: number;
  /** u32 words of local hashes in live edges (crtc), in live entries (positional); 0 for reference. */
  edgeWords: number;
  /** Entries in the per-worker external-hash lookups (equals `blocks`: one name per held block). */
  lookupEntries: number;
  rejected: RejectCounts;
  /** Bytes of typed arrays reserved (0 for reference, which uses plain Maps). */
  bytes: number;
}

export interface WorkerInfo {
  workerId: bigint;
  dpRank: number;
  /** Blocks this (worker, dp rank) holds. */
  blocks: number;
}

/**
 * A reusable result for `findMatches`: `count` entries of (worker handle, matched
 * blocks), in no particular order, zero scores omitted. Handles are valid until the
 * next mutating call; read them with `workerIdOf` / `dpRankOf`.
 */
export class MatchResult {
  count = 0;
  workers: Uint32Array;
  blocks: Uint32Array;

  constructor(capacity = 64) {
    this.workers = new Uint32Array(capacity);
    this.blocks = new Uint32Array(capacity);
  }

  /** Makes room for `capacity` entries (allocates only when it grows). */
  ensure(capacity: number): void {
    if (this.workers.length >= capacity) return;
    let size = this.workers.length * 2;
    while (size < capacity) size *= 2;
    this.workers = new Uint32Array(size);
    this.blocks = new Uint32Array(size);
  }
}

/**
 * A reusable result for `tierMatches`: `count` entries of (worker handle, blocks held
 * in the host, disk and external tiers right after what the tiers before matched), for
 * workers with a lower-tier hit only; handles as in MatchResult.
 */
export class TierMatches {
  count = 0;
  workers = new Uint32Array(16);
  host = new Uint32Array(16);
  disk = new Uint32Array(16);
  external = new Uint32Array(16);
  private at = new Int32Array(16);
  private stamp = new Uint32Array(16);
  private tick = 0;

  /** Empties the result and makes room for `slots` workers (allocates only when it grows). */
  reset(slots: number): void {
    this.count = 0;
    if (this.workers.length < slots) {
      const size = Math.max(slots, 2 * this.workers.length);
      this.workers = new Uint32Array(size);
      this.host = new Uint32Array(size);
      this.disk = new Uint32Array(size);
      this.external = new Uint32Array(size);
      this.at = new Int32Array(size);
      this.stamp = new Uint32Array(size);
      this.tick = 0;
    }
    if (++this.tick === 0xffff_ffff) {
      this.stamp.fill(0);
      this.tick = 1;
    }
  }

  /** The entry of worker `slot`, or -1. */
  indexOf(slot: number): number {
    return slot < this.stamp.length && this.stamp[slot] === this.tick ? this.at[slot]! : -1;
  }

  /** The entry of worker `slot`, made (all zeros) if it has none yet. */
  entryOf(slot: number): number {
    if (this.stamp[slot] === this.tick) return this.at[slot]!;
    const at = this.count++;
    this.stamp[slot] = this.tick;
    this.at[slot] = at;
    this.workers[at] = slot;
    this.host[at] = 0;
    this.disk[at] = 0;
    this.external[at] = 0;
    return at;
  }
}

export interface IndexOptions {
  /** Most (worker_id, dp_rank) pairs present at once (1..65536, default 65536); ignored with `workers`. */
  maxWorkers?: number;
  /**
   * The worker numbering to share (the core's, so match results are router slots).
   * Without it the index numbers its own workers.
   */
  workers?: WorkerTable;
  /** Run the O(N) `verify()` after every mutation (default: KVEDGE_VERIFY=1). */
  verify?: boolean;
}

export interface KvIndex {
  readonly backend: BackendName;
  readonly blockSize: number;
  readonly counters: IndexCounters;
  /** The worker numbering: `findMatches` and the slot methods name workers by its slots. */
  readonly workerTable: WorkerTable;

  /**
   * Applies a stored event: blocks `first .. first+count` of `external` / `local`
   * (pairs), placed under the parent (`hasParent` false = the root). `parentHi` and
   * `parentLo` are the parent's external hash words (signed or unsigned 32-bit).
   */
  applyStored(
    workerId: bigint,
    dpRank: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first?: number,
  ): StoreStatus;
  /** Applies a removed event; returns how many hashes were unknown (skipped). */
  applyRemoved(
    workerId: bigint,
    dpRank: number,
    external: Uint32Array,
    count: number,
    first?: number,
  ): number;
  /** The worker holds nothing, in no tier (it stays present). */
  applyCleared(workerId: bigint, dpRank: number): void;
  /** The lower-tier events for a (worker_id, dp_rank): storeTierAt, storeTierUnder, removeTierAt. */
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
    first?: number,
  ): StoreStatus;
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
    first?: number,
  ): StoreStatus;
  applyRemovedTier(
    workerId: bigint,
    dpRank: number,
    tier: number,
    external: Uint32Array,
    count: number,
    first?: number,
  ): number;
  /** Every dp rank of the worker goes, as if cleared, and its slots are freed. */
  removeWorker(workerId: bigint): void;
  /**
   * The slot's worker is gone: its blocks and per-slot state go, as `removeWorker` for
   * one (worker, dp rank); a table the index does not own is left to its owner to free.
   */
  dropSlot(slot: number): void;
  /**
   * The three events for a worker already resolved to its slot in `workerTable` (what
   * ingest writes): slot -1 means the worker has no slot and cannot get one (the table
   * is full). The methods above resolve the worker, then call these.
   */
  storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first?: number,
  ): StoreStatus;
  removeAt(slot: number, external: Uint32Array, count: number, first?: number): number;
  clearAt(slot: number): void;
  /** Counts an event rejected before it reached the index (block size, invalid). */
  countRejected(status: StoreStatus): void;

  /**
   * A stored event of a lower tier (TIER_HOST, TIER_DISK, TIER_EXTERNAL): the parent is
   * resolved by the worker's external hash in that tier, the device, the other lower
   * tiers (README.md, "Lower tiers").
   */
  storeTierAt(
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
  /** The same below a given sequence hash (`hasBase` false: the root): how a dump restores one. */
  storeTierUnder(
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
  /** A removed event of a lower tier, or of every lower tier (TIER_ANY); returns the unknown count. */
  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first?: number,
  ): number;
  /**
   * For a query whose device matches are `device` (this index's findMatches of it), each
   * worker's lower-tier hits right after them. `chain`: the query's sequence hashes.
   */
  tierMatches(chain: Uint32Array, count: number, device: MatchResult, out: TierMatches): void;

  /**
   * For each worker, the largest k such that it holds every block of `local[0..k)`.
   * `chain`: the query's sequence hashes (src/hash chainHashes of `local`) when the
   * caller has them (a route does); else the index computes them if it needs them.
   */
  findMatches(local: Uint32Array, count: number, out: MatchResult, chain?: Uint32Array): void;
  workerIdOf(handle: number): bigint;
  dpRankOf(handle: number): number;

  stats(): IndexStats;
  workers(): WorkerInfo[];
  /** Events (kvedge apply format) that rebuild an equal index in a fresh one. */
  dump(): IndexOp[];
  /**
   * A copy of the index taken in slices, for packing later in slices (GET /v1/dump,
   * snapshots); consistent when no write reaches the index from its first step to its
   * last (src/index/write-pause.ts).
   */
  freeze(): FreezeJob;
  /** O(N) check of every internal invariant; throws IndexInvariantError. */
  verify(): void;
}
