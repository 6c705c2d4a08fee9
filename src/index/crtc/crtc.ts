/**
 * The default backend: a compressed radix tree on typed arrays (README.md here).
 * This class resolves workers and routes each event to store.ts / remove.ts /
 * match.ts; the tree's shape lives in tree.ts.
 */
import { assert, fail, VERIFY_BY_DEFAULT } from "../assert";
import { type DumpSource, collectDump, type DumpStep, lazyDumpEvents } from "../dump";
import type { IndexOp } from "../ops";
import {
  countRejection, type IndexCounters, type IndexOptions, type IndexStats, type KvIndex, type MatchResult,
  newCounters, rejectCounts, StoreStatus, type WorkerInfo,
} from "../types";
import { WorkerSlots } from "../workers";
import { findMatches, MatchScratch } from "./match";
import { ROOT } from "./nodes";
import { clearSlot, RemoveScratch, removeHashes } from "./remove";
import { storeChain } from "./store";
import { CrtcTree } from "./tree";
import { verifyTree } from "./verify";

export class CrtcIndex implements KvIndex {
  readonly backend = "crtc" as const;
  readonly blockSize: number;
  readonly counters: IndexCounters = newCounters();
  readonly tree = new CrtcTree();
  readonly slots: WorkerSlots;
  private readonly verifyEach: boolean;
  private readonly matchScratch = new MatchScratch();
  private readonly removeScratch = new RemoveScratch();

  constructor(blockSize: number, options: IndexOptions = {}) {
    this.blockSize = blockSize;
    this.slots = new WorkerSlots(options.maxWorkers);
    this.verifyEach = options.verify ?? VERIFY_BY_DEFAULT;
  }

  applyStored(
    workerId: bigint, dpRank: number, hasParent: boolean, parentHi: number, parentLo: number,
    external: Uint32Array, local: Uint32Array, count: number, first = 0,
  ): StoreStatus {
    if (external.length < 2 * (first + count) || local.length < 2 * (first + count)) fail("stored arrays too short");
    let slot = this.slots.find(workerId, dpRank);
    let node = ROOT;
    let pos = 0;
    if (hasParent) {
      const parent = slot < 0 ? 0 : this.slots.lookup[slot]!.find(parentHi >>> 0, parentLo >>> 0);
      if (parent === 0) return this.reject(StoreStatus.ParentNotFound);
      node = this.tree.blocks.node[parent]!;
      pos = parent - this.tree.nodes.start[node]! + 1;
    }
    if (count === 0) {
      this.counters.storedEvents++;
      return StoreStatus.Ok;
    }
    if (slot < 0) {
      slot = this.slots.create(workerId, dpRank);
      if (slot < 0) return this.reject(StoreStatus.CapacityExhausted);
    }
    storeChain(this.tree, slot, this.slots.lookup[slot]!, node, pos, external, local, first, count, this.counters);
    this.counters.storedEvents++;
    if (this.verifyEach) this.verify();
    return StoreStatus.Ok;
  }

  applyRemoved(workerId: bigint, dpRank: number, external: Uint32Array, count: number, first = 0): number {
    if (external.length < 2 * (first + count)) fail("removed array too short");
    this.counters.removedEvents++;
    const slot = this.slots.find(workerId, dpRank);
    const unknown = slot < 0
      ? count
      : removeHashes(this.tree, slot, this.slots.lookup[slot]!, external, first, count, this.removeScratch);
    this.counters.blocksUnknown += unknown;
    this.counters.blocksRemoved += count - unknown;
    if (this.verifyEach) this.verify();
    return unknown;
  }

  applyCleared(workerId: bigint, dpRank: number): void {
    this.counters.clearedEvents++;
    const slot = this.slots.find(workerId, dpRank);
    if (slot < 0) return;
    this.counters.blocksRemoved += clearSlot(this.tree, slot, this.slots.lookup[slot]!, this.removeScratch);
    if (this.verifyEach) this.verify();
  }

  removeWorker(workerId: bigint): void {
    this.counters.workersRemoved++;
    for (const slot of this.slots.slotsOf(workerId)) {
      this.counters.blocksRemoved += clearSlot(this.tree, slot, this.slots.lookup[slot]!, this.removeScratch);
      this.slots.release(slot);
    }
    if (this.verifyEach) this.verify();
  }

  countRejected(status: StoreStatus): void {
    countRejection(this.counters, status);
  }

  findMatches(local: Uint32Array, count: number, out: MatchResult): void {
    if (local.length < 2 * count) fail("query array too short");
    const slots = this.slots.highWater;
    out.ensure(slots);
    this.matchScratch.ensure(slots);
    findMatches(this.tree, local, count, out, this.matchScratch);
  }

  workerIdOf(handle: number): bigint {
    assert(this.slots.isLive(handle), "worker handle is not live");
    return this.slots.workerId[handle]!;
  }

  dpRankOf(handle: number): number {
    assert(this.slots.isLive(handle), "worker handle is not live");
    return this.slots.dpRank[handle]!;
  }

  stats(): IndexStats {
    const entries = this.slots.lookupEntries();
    return {
      workers: this.slots.live,
      blocks: entries,
      nodes: this.tree.nodes.live,
      edgeWords: 2 * this.tree.edgeBlocks,
      lookupEntries: entries,
      rejected: rejectCounts(this.counters),
      bytes: this.tree.bytes() + this.slots.bytes(),
    };
  }

  workers(): WorkerInfo[] {
    const list: WorkerInfo[] = [];
    for (let slot = 0; slot < this.slots.highWater; slot++) {
      const lookup = this.slots.lookup[slot];
      if (lookup) list.push({ workerId: this.slots.workerId[slot]!, dpRank: this.slots.dpRank[slot]!, blocks: lookup.count });
    }
    return list;
  }

  dump(): IndexOp[] {
    return collectDump(this.dumpLazy());
  }

  dumpLazy(): IterableIterator<DumpStep> {
    return lazyDumpEvents(this.dumpSource(), this.blockSize);
  }

  verify(): void {
    verifyTree(this.tree, this.slots);
  }

  private reject(status: StoreStatus): StoreStatus {
    countRejection(this.counters, status);
    return status;
  }

  private dumpSource(): DumpSource {
    const tree = this.tree;
    const slots = this.slots;
    return {
      blockKeyLimit: tree.blocks.capacity,
      forEachBlock(visit) {
        // Depth-first from the root; child lists come from one scan of the child table.
        const stack = [ROOT];
        const kids = tree.childLists();
        while (stack.length > 0) {
          const node = stack.pop()!;
          if (node !== ROOT) {
            const start = tree.nodes.start[node]!;
            const parent = tree.nodes.parent[node]!;
            let previous = parent === ROOT ? -1 : tree.nodes.start[parent]! + tree.nodes.len[parent]! - 1;
            for (let block = start; block < start + tree.nodes.len[node]!; block++) {
              visit(block, previous, tree.blocks.hi[block]!, tree.blocks.lo[block]!);
              previous = block;
            }
          }
          for (const child of kids.get(node) ?? []) stack.push(child);
        }
      },
      forEachWorker(visit) {
        for (let slot = 0; slot < slots.highWater; slot++) {
          const lookup = slots.lookup[slot];
          if (!lookup) continue;
          const external = new Uint32Array(2 * lookup.count);
          const keys = new Uint32Array(lookup.count);
          let n = 0;
          for (let at = 0; at < lookup.table.length; at += 3) {
            if (lookup.table[at + 2] === 0) continue;
            external[2 * n] = lookup.table[at]!;
            external[2 * n + 1] = lookup.table[at + 1]!;
            keys[n++] = lookup.table[at + 2]!;
          }
          visit(slots.workerId[slot]!, slots.dpRank[slot]!, external, keys, n);
        }
      },
    };
  }
}
