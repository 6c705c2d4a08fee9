/**
 * The reference backend: the event semantics written as plainly as possible, with
 * Maps and strings, for obviousness over speed. It is the oracle of the differential
 * tests; nothing here is shared with the other backends except the interface.
 *
 * A block is its path: the local hashes from the root, joined into a string key.
 * Each (worker_id, dp_rank) has `lookup` (its external hash -> path) and `held`
 * (path -> its external hash), the two directions of one bijection, and `extra`
 * (external hash -> how many copies beyond the first the engine holds: each store of a
 * held block is one more, each removal one fewer; the block goes with its last).
 *
 * See docs/decisions.md#exact-oracle.
 */
import { dumpEvents } from "../dump";
import type { DumpSource, FrozenTierBlocks } from "../pack";
import { type FreezeJob, freezeByWalk, frozenAtOnce } from "../pack";
import type { IndexOp } from "../ops";
import {
  countRejection,
  type IndexOptions,
  type IndexStats,
  type KvIndex,
  type MatchResult,
  rejectCounts,
  StoreStatus,
  TIER_ANY,
  TIER_EXTERNAL,
  TIER_HOST,
  type TierMatches,
  type WorkerInfo,
} from "../types";
import { SlotIndex } from "../slot-index";
import { parseU64, u64 } from "../../util/u64";
import { chainStep, emptyTiers, ReferenceTiers, type WorkerTiers } from "./tiers";

interface Worker {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly handle: number;
  readonly lookup: Map<bigint, string>;
  readonly held: Map<string, bigint>;
  /** External hash (decimal) -> copies of its block held beyond the first (absent: none). */
  readonly extra: Record<string, number>;
  /** Copies beyond the first over all its blocks (0: `extra` is empty). */
  extraCount: number;
  /** The lower tiers (./tiers.ts), index = tier. */
  readonly tiers: WorkerTiers;
}

const ROOT_PATH = "";

function childPath(parent: string, local: bigint): string {
  return `${parent}/${local}`;
}

/** The local hash of a path's last block. */
function lastLocal(path: string): bigint {
  return BigInt(path.slice(path.lastIndexOf("/") + 1));
}

function parentPath(path: string): string {
  return path.slice(0, path.lastIndexOf("/"));
}

function checkLowerTier(tier: number): void {
  if (!(tier >= TIER_HOST && tier <= TIER_EXTERNAL))
    throw new RangeError(`not a lower tier: ${tier}`);
}

export class ReferenceIndex extends SlotIndex implements KvIndex {
  readonly backend = "reference" as const;
  readonly blockSize: number;
  private readonly byKey = new Map<string, Worker>();
  /** slot -> worker (its handle is its slot in the worker table). */
  private readonly byHandle: (Worker | undefined)[] = [];
  /** path -> how many workers hold it (its size is the number of distinct held blocks). */
  private readonly holders = new Map<string, number>();
  private readonly tierModel = new ReferenceTiers(this.counters);

  constructor(blockSize: number, options: IndexOptions = {}) {
    super(options);
    this.blockSize = blockSize;
  }

  private worker(workerId: bigint, dpRank: number): Worker | undefined {
    return this.byKey.get(`${workerId}/${dpRank}`);
  }

  storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    let worker = slot < 0 ? undefined : this.byHandle[slot];
    let path = ROOT_PATH;
    if (hasParent) {
      const parent = worker?.lookup.get(u64(parentHi, parentLo));
      if (parent === undefined) return this.reject(StoreStatus.ParentNotFound);
      path = parent;
    }
    if (count === 0) {
      this.counters.storedEvents++;
      return StoreStatus.Ok;
    }
    if (worker === undefined) {
      if (slot < 0) return this.reject(StoreStatus.CapacityExhausted);
      worker = this.present(slot);
    }
    this.counters.storedEvents++;
    for (let i = first; i < first + count; i++) {
      const hash = u64(external[2 * i]!, external[2 * i + 1]!);
      path = childPath(path, u64(local[2 * i]!, local[2 * i + 1]!));
      const named = worker.lookup.get(hash);
      if (named === path) {
        worker.extra[`${hash}`] = (worker.extra[`${hash}`] ?? 0) + 1;
        worker.extraCount++;
        this.counters.blocksDuplicate++;
        continue;
      }
      if (named !== undefined || worker.held.has(path)) {
        // The hash names another block, or this block has another name: the producer
        // broke the engine-hash invariant. Keep what came before, drop the rest.
        this.counters.hashConflicts++;
        break;
      }
      worker.lookup.set(hash, path);
      worker.held.set(path, hash);
      this.hold(path, 1);
      this.counters.blocksStored++;
    }
    return StoreStatus.Ok;
  }

  /** A new worker in `slot`, holding nothing. */
  private present(slot: number): Worker {
    const workerId = this.workerTable.workerIdOf(slot);
    const dpRank = this.workerTable.dpRankOf(slot);
    const worker: Worker = {
      workerId,
      dpRank,
      handle: slot,
      lookup: new Map(),
      held: new Map(),
      extra: {},
      extraCount: 0,
      tiers: emptyTiers(),
    };
    this.byKey.set(`${workerId}/${dpRank}`, worker);
    this.byHandle[slot] = worker;
    return worker;
  }

  storeTierAt(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    checkLowerTier(tier);
    const worker = this.tierWorker(slot, hasParent, count);
    if (worker === null || typeof worker === "number") return worker ?? StoreStatus.Ok;
    let base: bigint | null = null;
    if (hasParent) {
      base = this.resolve(worker, tier, u64(parentHi, parentLo));
      if (base === null) {
        this.counters.tierRejectedParentNotFound++;
        return StoreStatus.ParentNotFound;
      }
    }
    this.tierModel.store(worker.tiers, tier, base, external, local, count, first);
    return StoreStatus.Ok;
  }

  storeTierUnder(
    tier: number,
    slot: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    checkLowerTier(tier);
    const worker = this.tierWorker(slot, false, count);
    if (worker === null || typeof worker === "number") return worker ?? StoreStatus.Ok;
    const base = hasBase ? u64(baseHi, baseLo) : null;
    this.tierModel.store(worker.tiers, tier, base, external, local, count, first);
    return StoreStatus.Ok;
  }

  /**
   * The worker a lower-tier store goes to: one not present has no parent to name, no slot
   * to get, or nothing to store (null: counted, done); else it becomes present.
   */
  private tierWorker(slot: number, hasParent: boolean, count: number): Worker | StoreStatus | null {
    const worker = slot < 0 ? undefined : this.byHandle[slot];
    if (worker !== undefined) return worker;
    if (hasParent) {
      this.counters.tierRejectedParentNotFound++;
      return StoreStatus.ParentNotFound;
    }
    if (count === 0) {
      this.counters.tierStoredEvents++;
      return null;
    }
    if (slot < 0) return this.reject(StoreStatus.CapacityExhausted);
    return this.present(slot);
  }

  /** A parent's sequence hash: its name in this tier, on the device, in the other lower tiers. */
  private resolve(worker: Worker, tier: number, hash: bigint): bigint | null {
    const own = this.tierModel.sequenceIn(worker.tiers, tier, hash);
    if (own !== null) return own;
    const path = worker.lookup.get(hash);
    if (path !== undefined) {
      let seq: bigint | null = null;
      for (const part of path.split("/").slice(1)) seq = chainStep(seq, parseU64(part)!);
      return seq;
    }
    for (let other = TIER_HOST; other <= TIER_EXTERNAL; other++) {
      const seq = other === tier ? null : this.tierModel.sequenceIn(worker.tiers, other, hash);
      if (seq !== null) return seq;
    }
    return null;
  }

  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first = 0,
  ): number {
    if (tier !== TIER_ANY) checkLowerTier(tier);
    const worker = slot < 0 ? undefined : this.byHandle[slot];
    return this.tierModel.remove(worker?.tiers, tier, external, count, first);
  }

  tierMatches(chain: Uint32Array, count: number, device: MatchResult, out: TierMatches): void {
    out.reset(this.workerTable.highWater);
    const sequence: bigint[] = [];
    for (let i = 0; i < count; i++) sequence.push(u64(chain[2 * i]!, chain[2 * i + 1]!));
    for (const worker of this.byKey.values()) {
      let blocks = 0;
      for (let i = 0; i < device.count; i++)
        if (device.workers[i] === worker.handle) blocks = device.blocks[i]!;
      const [host, disk, external] = this.tierModel.hits(worker.tiers, sequence, blocks);
      if (host! + disk! + external! === 0) continue;
      const at = out.entryOf(worker.handle);
      out.host[at] = host!;
      out.disk[at] = disk!;
      out.external[at] = external!;
    }
  }

  removeAt(slot: number, external: Uint32Array, count: number, first = 0): number {
    this.counters.removedEvents++;
    const worker = slot < 0 ? undefined : this.byHandle[slot];
    let unknown = 0;
    for (let i = first; i < first + count; i++) {
      const hash = u64(external[2 * i]!, external[2 * i + 1]!);
      const path = worker?.lookup.get(hash);
      if (worker === undefined || path === undefined) {
        unknown++;
        continue;
      }
      const extra = worker.extraCount === 0 ? undefined : worker.extra[`${hash}`];
      if (extra !== undefined) {
        if (extra > 1) worker.extra[`${hash}`] = extra - 1;
        else delete worker.extra[`${hash}`];
        worker.extraCount--;
        this.counters.copiesRemoved++;
        continue;
      }
      worker.lookup.delete(hash);
      worker.held.delete(path);
      this.hold(path, -1);
      this.counters.blocksRemoved++;
    }
    this.counters.blocksUnknown += unknown;
    return unknown;
  }

  clearAt(slot: number): void {
    this.counters.clearedEvents++;
    const worker = slot < 0 ? undefined : this.byHandle[slot];
    if (worker === undefined) return;
    this.counters.blocksRemoved += worker.held.size;
    for (const path of worker.held.keys()) this.hold(path, -1);
    worker.lookup.clear();
    worker.held.clear();
    for (const hash of Object.keys(worker.extra)) delete worker.extra[hash];
    worker.extraCount = 0;
    this.tierModel.clear(worker.tiers);
  }

  private hold(path: string, delta: number): void {
    const holders = (this.holders.get(path) ?? 0) + delta;
    if (holders === 0) this.holders.delete(path);
    else this.holders.set(path, holders);
  }

  removeWorker(workerId: bigint): void {
    this.counters.workersRemoved++;
    for (const worker of [...this.byKey.values()])
      if (worker.workerId === workerId) this.dropSlot(worker.handle);
  }

  dropSlot(slot: number): void {
    const worker = slot < 0 ? undefined : this.byHandle[slot];
    if (worker === undefined) return;
    this.counters.blocksRemoved += worker.held.size;
    for (const path of worker.held.keys()) this.hold(path, -1);
    this.tierModel.clear(worker.tiers);
    this.byKey.delete(`${worker.workerId}/${worker.dpRank}`);
    this.byHandle[slot] = undefined;
    if (this.ownsWorkers) this.workerTable.release(slot);
  }

  findMatches(local: Uint32Array, count: number, out: MatchResult): void {
    const prefixes: string[] = [];
    let path = ROOT_PATH;
    for (let i = 0; i < count; i++) {
      path = childPath(path, u64(local[2 * i]!, local[2 * i + 1]!));
      prefixes.push(path);
    }
    out.count = 0;
    out.ensure(this.byKey.size);
    for (const worker of this.byKey.values()) {
      let blocks = 0;
      while (blocks < count && worker.held.has(prefixes[blocks]!)) blocks++;
      if (blocks === 0) continue;
      out.workers[out.count] = worker.handle;
      out.blocks[out.count] = blocks;
      out.count++;
    }
  }

  workerIdOf(handle: number): bigint {
    return this.live(handle).workerId;
  }

  dpRankOf(handle: number): number {
    return this.live(handle).dpRank;
  }

  private live(handle: number): Worker {
    const worker = this.byHandle[handle];
    if (worker === undefined) throw new RangeError(`no worker with handle ${handle}`);
    return worker;
  }

  stats(): IndexStats {
    let blocks = 0;
    let lookupEntries = 0;
    let copies = 0;
    const lower = [0, 0, 0, 0];
    for (const worker of this.byKey.values()) {
      blocks += worker.held.size;
      lookupEntries += worker.lookup.size;
      for (const n of Object.values(worker.extra)) copies += n;
      this.tierModel.count(worker.tiers, lower);
    }
    return {
      workers: this.byKey.size,
      blocks,
      copies,
      lowerTiers: {
        host_pinned: lower[1]!,
        disk: lower[2]!,
        external: lower[3]!,
        copies: lower[0]!,
      },
      nodes: this.holders.size,
      edgeWords: 0,
      lookupEntries,
      rejected: rejectCounts(this.counters),
      bytes: 0,
    };
  }

  workers(): WorkerInfo[] {
    return [...this.byKey.values()].map((worker) => ({
      workerId: worker.workerId,
      dpRank: worker.dpRank,
      blocks: worker.held.size,
    }));
  }

  /**
   * Each worker's blocks as "external hash -> path" lines (with " x<copies>" for a block
   * held in more than one copy), sorted (tests compare these).
   */
  canonical(): string[] {
    const lines: string[] = [];
    for (const worker of this.byKey.values()) {
      lines.push(`${worker.workerId}/${worker.dpRank} present`);
      for (const [hash, path] of worker.lookup) {
        const extra = worker.extra[`${hash}`];
        const times = extra === undefined ? "" : ` x${extra + 1}`;
        lines.push(`${worker.workerId}/${worker.dpRank} ${hash} -> ${path}${times}`);
      }
      lines.push(...this.tierModel.lines(worker.tiers, `${worker.workerId}/${worker.dpRank}`));
    }
    return lines.sort();
  }

  /** Whether the worker holds the block named `hash` in lower tier `tier` (stream generators). */
  tierHolds(workerId: bigint, dpRank: number, tier: number, hash: bigint): boolean {
    const tiers = this.worker(workerId, dpRank)?.tiers;
    return tiers !== undefined && tiers[tier]!.lookup[`${hash}`] !== undefined;
  }

  /** The external hashes the worker holds in lower tier `tier` (stream generators). */
  tierHashes(workerId: bigint, dpRank: number, tier: number): bigint[] {
    const tiers = this.worker(workerId, dpRank)?.tiers;
    return Object.keys(tiers?.[tier]?.lookup ?? {}).map((hash) => parseU64(hash)!);
  }

  /** How many copies of the block named `hash` the worker holds (0: none). */
  copiesOf(workerId: bigint, dpRank: number, hash: bigint): number {
    const worker = this.worker(workerId, dpRank);
    if (worker?.lookup.get(hash) === undefined) return 0;
    return 1 + (worker.extra[`${hash}`] ?? 0);
  }

  /** The worker's held blocks, path -> external hash (for stream generators and tests). */
  heldPaths(workerId: bigint, dpRank: number): ReadonlyMap<string, bigint> {
    return this.worker(workerId, dpRank)?.held ?? new Map();
  }

  /** Every present worker's handle and held blocks (for tests). */
  heldByHandle(): Map<number, ReadonlyMap<string, bigint>> {
    const result = new Map<number, ReadonlyMap<string, bigint>>();
    for (const worker of this.byKey.values()) result.set(worker.handle, worker.held);
    return result;
  }

  dump(): IndexOp[] {
    return dumpEvents(freezeByWalk(this.dumpSource()), this.blockSize);
  }

  /** The copy is one walk of the blocks: done in the first step. */
  freeze(): FreezeJob {
    return frozenAtOnce(() => freezeByWalk(this.dumpSource()));
  }

  private dumpSource(): DumpSource {
    // Keys for every held path and all its ancestors (holes need their local hashes).
    const keys = new Map<string, number>();
    const add = (path: string): number => {
      let key = keys.get(path);
      if (key === undefined) {
        const parent = parentPath(path);
        if (parent !== ROOT_PATH) add(parent);
        key = keys.size;
        keys.set(path, key);
      }
      return key;
    };
    for (const worker of this.byKey.values()) for (const path of worker.held.keys()) add(path);
    const workers = [...this.byKey.values()];
    const tiers: FrozenTierBlocks[] = [];
    for (const worker of workers) {
      for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
        const words = this.tierModel.words(worker.tiers, tier);
        if (words.length > 0)
          tiers.push({ workerId: worker.workerId, dpRank: worker.dpRank, tier, words });
      }
    }
    return {
      blockKeyLimit: keys.size,
      tiers,
      forEachBlock(visit) {
        // Map order is insertion order, and add() inserts a path after its parent.
        for (const [path, key] of keys) {
          const parent = parentPath(path);
          const local = lastLocal(path);
          visit(
            key,
            parent === ROOT_PATH ? -1 : keys.get(parent)!,
            Number(local >> 32n),
            Number(local & 0xffff_ffffn),
          );
        }
      },
      forEachWorker(visit) {
        for (const worker of workers) {
          const external = new Uint32Array(2 * worker.held.size);
          const blockKeys = new Uint32Array(worker.held.size);
          const copies: number[] = [];
          let n = 0;
          for (const [path, hash] of worker.held) {
            external[2 * n] = Number(hash >> 32n);
            external[2 * n + 1] = Number(hash & 0xffff_ffffn);
            blockKeys[n++] = keys.get(path)!;
            const extra = worker.extra[`${hash}`];
            if (extra !== undefined) copies.push(keys.get(path)!, extra);
          }
          visit(worker.workerId, worker.dpRank, external, blockKeys, n, Uint32Array.from(copies));
        }
      },
    };
  }

  verify(): void {
    for (const worker of this.byKey.values()) {
      if (worker.lookup.size !== worker.held.size)
        throw new Error("reference: lookup and held sizes differ");
      for (const [hash, extra] of Object.entries(worker.extra))
        if (!worker.lookup.has(parseU64(hash)!) || !(extra >= 1))
          throw new Error("reference: extra copies of a block not held");
      this.tierModel.verify(worker.tiers);
      for (const [hash, path] of worker.lookup) {
        if (worker.held.get(path) !== hash) throw new Error("reference: lookup and held disagree");
      }
    }
  }

  private reject(status: StoreStatus): StoreStatus {
    countRejection(this.counters, status);
    return status;
  }
}
