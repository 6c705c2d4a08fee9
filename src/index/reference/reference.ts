/**
 * The reference backend: the event semantics written as plainly as possible, with
 * Maps and strings, for obviousness over speed. It is the oracle of the differential
 * tests; nothing here is shared with the other backends except the interface.
 *
 * A block is its path: the local hashes from the root, joined into a string key.
 * Each (worker_id, dp_rank) has `lookup` (its external hash -> path) and `held`
 * (path -> its external hash), the two directions of one bijection.
 *
 * See docs/decisions.md#exact-oracle.
 */
import { dumpEvents } from "../dump";
import type { DumpSource } from "../pack";
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
  type WorkerInfo,
} from "../types";
import { SlotIndex } from "../slot-index";
import { u64 } from "../../util/u64";

interface Worker {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly handle: number;
  readonly lookup: Map<bigint, string>;
  readonly held: Map<string, bigint>;
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

export class ReferenceIndex extends SlotIndex implements KvIndex {
  readonly backend = "reference" as const;
  readonly blockSize: number;
  private readonly byKey = new Map<string, Worker>();
  /** slot -> worker (its handle is its slot in the worker table). */
  private readonly byHandle: (Worker | undefined)[] = [];
  /** path -> how many workers hold it (its size is the number of distinct held blocks). */
  private readonly holders = new Map<string, number>();

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
      const workerId = this.workerTable.workerIdOf(slot);
      const dpRank = this.workerTable.dpRankOf(slot);
      worker = { workerId, dpRank, handle: slot, lookup: new Map(), held: new Map() };
      this.byKey.set(`${workerId}/${dpRank}`, worker);
      this.byHandle[slot] = worker;
    }
    this.counters.storedEvents++;
    for (let i = first; i < first + count; i++) {
      const hash = u64(external[2 * i]!, external[2 * i + 1]!);
      path = childPath(path, u64(local[2 * i]!, local[2 * i + 1]!));
      const named = worker.lookup.get(hash);
      if (named === path) {
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
      worker.lookup.delete(hash);
      worker.held.delete(path);
      this.hold(path, -1);
    }
    this.counters.blocksUnknown += unknown;
    this.counters.blocksRemoved += count - unknown;
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
    for (const worker of this.byKey.values()) {
      blocks += worker.held.size;
      lookupEntries += worker.lookup.size;
    }
    return {
      workers: this.byKey.size,
      blocks,
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

  /** Each worker's blocks as "external hash -> path" lines, sorted (tests compare these). */
  canonical(): string[] {
    const lines: string[] = [];
    for (const worker of this.byKey.values()) {
      lines.push(`${worker.workerId}/${worker.dpRank} present`);
      for (const [hash, path] of worker.lookup)
        lines.push(`${worker.workerId}/${worker.dpRank} ${hash} -> ${path}`);
    }
    return lines.sort();
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
    return {
      blockKeyLimit: keys.size,
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
          let n = 0;
          for (const [path, hash] of worker.held) {
            external[2 * n] = Number(hash >> 32n);
            external[2 * n + 1] = Number(hash & 0xffff_ffffn);
            blockKeys[n++] = keys.get(path)!;
          }
          visit(worker.workerId, worker.dpRank, external, blockKeys, n);
        }
      },
    };
  }

  verify(): void {
    for (const worker of this.byKey.values()) {
      if (worker.lookup.size !== worker.held.size)
        throw new Error("reference: lookup and held sizes differ");
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
