/**
 * The default backend: a compressed radix tree on typed arrays (README.md here).
 * This class resolves workers and routes each event to store.ts / remove.ts /
 * match.ts; the tree's shape lives in tree.ts.
 */
import { fail, VERIFY_BY_DEFAULT } from "../assert";
import { dumpEvents } from "../dump";
import {
  type FreezeJob,
  type FrozenIndex,
  type FrozenTierBlocks,
  freezeNow,
  SlicedCopy,
} from "../pack";
import type { ExternalLookup } from "../lookup";
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
import { TieredIndex } from "../tiered";
import { type PresentLookup, WorkerSlots } from "../workers";
import { MatchScratch, TreeReads, walkMatches } from "./match";
import { ROOT } from "./nodes";
import { clearSlot, RemoveScratch, removeHashes } from "./remove";
import { storeChain } from "./store";
import { CrtcTree } from "./tree";
import type { PoolMemory } from "./shared-memory";
import { CONTROL, IDENTITY_WORDS, type SharedWriter } from "./shared-writer";
import { verifyTree } from "./verify";

/** What a shared index's writer is built on (shared.ts makes it). */
export interface SharedParts {
  readonly memory: PoolMemory;
  readonly writer: SharedWriter;
  /** Per slot: worker id (hi, lo) and dp rank, for readers naming their matches. */
  readonly slotIdentity: Uint32Array;
}

export class CrtcIndex extends TieredIndex implements KvIndex {
  readonly backend = "crtc" as const;
  readonly blockSize: number;
  readonly tree: CrtcTree;
  readonly slots: WorkerSlots;
  private readonly verifyEach: boolean;
  private readonly matchScratch = new MatchScratch();
  private readonly matchReads = new TreeReads();
  private readonly removeScratch = new RemoveScratch();
  private readonly shared: SharedParts | null;

  constructor(blockSize: number, options: IndexOptions = {}, shared: SharedParts | null = null) {
    super(options);
    this.blockSize = blockSize;
    this.shared = shared;
    this.tree = shared === null ? new CrtcTree() : new CrtcTree(shared.memory, shared.writer);
    this.slots = new WorkerSlots(this.workerTable, this.ownsWorkers);
    this.verifyEach = options.verify ?? VERIFY_BY_DEFAULT;
  }

  /**
   * Every event is one call here; its end is the boundary readers see. A call that
   * throws (bad arrays, or a broken invariant mid-change) is no event: in shared mode
   * the nodes it touched stay odd, so readers fail loudly instead of reading half of it.
   */
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
    const status = this.store(slot, hasParent, parentHi, parentLo, external, local, count, first);
    this.tree.endEvent();
    return status;
  }

  private store(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): StoreStatus {
    if (external.length < 2 * (first + count) || local.length < 2 * (first + count))
      fail("stored arrays too short");
    let lookup = this.slots.lookupOf(slot);
    let node = ROOT;
    let pos = 0;
    if (hasParent) {
      const parent = lookup === null ? 0 : lookup.find(parentHi >>> 0, parentLo >>> 0);
      if (parent === 0) return this.reject(StoreStatus.ParentNotFound);
      node = this.tree.blocks.node[parent]!;
      pos = parent - this.tree.nodes.start[node]! + 1;
    }
    if (count === 0) {
      this.counters.storedEvents++;
      return StoreStatus.Ok;
    }
    if (lookup === null) {
      if (slot < 0) return this.reject(StoreStatus.CapacityExhausted);
      lookup = this.attachSlot(slot);
    }
    // Any growth of the lookup now, before the first node opens: readers that meet an open
    // node wait for the event's end (see docs/decisions.md#reserve-before-open).
    lookup.reserve(count);
    storeChain(
      this.tree,
      slot,
      lookup,
      node,
      pos,
      external,
      local,
      first,
      count,
      this.counters,
      this.slots.copies,
    );
    this.counters.storedEvents++;
    if (this.verifyEach) this.verify();
    return StoreStatus.Ok;
  }

  protected attachSlot(slot: number): ExternalLookup {
    const lookup = this.slots.attach(slot);
    if (this.shared !== null) this.publishSlot(slot);
    return lookup;
  }

  /** The sequence hash of the block `slot` names (hi, lo): from its edge's last mark (tree.ts). */
  protected sequenceOf(slot: number, hi: number, lo: number, out: Uint32Array): boolean {
    const block = this.slots.lookupOf(slot)?.find(hi, lo) ?? 0;
    if (block === 0) return false;
    const tree = this.tree;
    const node = tree.blocks.node[block]!;
    tree.sequenceAt(node, block - tree.nodes.start[node]! + 1, out);
    return true;
  }

  /**
   * A new slot's identity and generation stamp, written before any coverage names it:
   * readers on other threads check with the stamp that a slot still names the worker
   * it named when they looked it up.
   */
  private publishSlot(slot: number): void {
    const { slotIdentity, writer } = this.shared!;
    const table = this.workerTable;
    const id = table.workerIdOf(slot);
    const at = IDENTITY_WORDS * slot;
    slotIdentity[at] = table.stampOf(slot);
    slotIdentity[at + 1] = Number(id >> 32n);
    slotIdentity[at + 2] = Number(id & 0xffff_ffffn);
    slotIdentity[at + 3] = table.dpRankOf(slot);
    if (slot >= Atomics.load(writer.control, CONTROL.slotHighWater)) {
      Atomics.store(writer.control, CONTROL.slotHighWater, slot + 1);
    }
  }

  removeAt(slot: number, external: Uint32Array, count: number, first = 0): number {
    const unknown = this.remove(slot, external, count, first);
    this.tree.endEvent();
    return unknown;
  }

  private remove(slot: number, external: Uint32Array, count: number, first: number): number {
    if (external.length < 2 * (first + count)) fail("removed array too short");
    this.counters.removedEvents++;
    const lookup = this.slots.lookupOf(slot);
    let hashes = external;
    let from = first;
    let going = count;
    if (this.slots.copies.of(slot) !== null) {
      // Blocks held in more than one copy lose a copy and stay; the rest go as usual.
      hashes = this.removeScratch.ensureHashes(count);
      going = this.slots.copies.take(slot, external, first, count, hashes);
      from = 0;
      this.counters.copiesRemoved += count - going;
    }
    const unknown =
      lookup === null
        ? going
        : removeHashes(this.tree, slot, lookup, hashes, from, going, this.removeScratch);
    this.counters.blocksUnknown += unknown;
    this.counters.blocksRemoved += going - unknown;
    if (this.verifyEach) this.verify();
    return unknown;
  }

  clearAt(slot: number): void {
    this.counters.clearedEvents++;
    const lookup = this.slots.lookupOf(slot);
    if (lookup !== null) {
      this.slots.copies.drop(slot);
      this.tiers.clear(slot);
      this.counters.blocksRemoved += clearSlot(this.tree, slot, lookup, this.removeScratch);
      if (this.verifyEach) this.verify();
    }
    this.tree.endEvent();
  }

  removeWorker(workerId: bigint): void {
    this.counters.workersRemoved++;
    for (const slot of this.slots.slotsOf(workerId)) this.drop(slot);
    this.tree.endEvent();
    if (this.verifyEach) this.verify();
  }

  dropSlot(slot: number): void {
    if (this.slots.lookupOf(slot) === null) return;
    this.drop(slot);
    this.tree.endEvent();
    if (this.verifyEach) this.verify();
  }

  /** A present slot's blocks, copies and lower tiers go, then its lookup (one event's part). */
  private drop(slot: number): void {
    this.slots.copies.drop(slot);
    this.tiers.clear(slot);
    const lookup = this.slots.lookup[slot]!;
    this.counters.blocksRemoved += clearSlot(this.tree, slot, lookup, this.removeScratch);
    this.slots.release(slot);
  }

  findMatches(local: Uint32Array, count: number, out: MatchResult, chain?: Uint32Array): void {
    if (local.length < 2 * count) fail("query array too short");
    const slots = this.slots.highWater;
    out.ensure(slots);
    this.matchScratch.ensure(slots);
    const sequence = chain ?? this.matchScratch.chain.of(local, count);
    if (sequence.length < 2 * count) fail("query chain array too short");
    walkMatches(this.matchReads.of(this.tree), local, sequence, count, out, this.matchScratch);
  }

  workerIdOf(handle: number): bigint {
    return this.slots.workerIdOf(handle);
  }

  dpRankOf(handle: number): number {
    return this.slots.dpRankOf(handle);
  }

  stats(): IndexStats {
    const entries = this.slots.lookupEntries();
    return {
      workers: this.slots.live,
      blocks: entries,
      copies: this.slots.copies.extra,
      lowerTiers: this.tiers.stats(),
      nodes: this.tree.nodes.live,
      edgeWords: 2 * this.tree.edgeBlocks,
      lookupEntries: entries,
      rejected: rejectCounts(this.counters),
      bytes: this.tree.bytes() + this.slots.bytes() + this.tiers.bytes(),
    };
  }

  workers(): WorkerInfo[] {
    return this.slots.workers();
  }

  dump(): IndexOp[] {
    return dumpEvents(freezeNow(this.freeze()), this.blockSize);
  }

  verify(): void {
    verifyTree(this.tree, this.slots);
    this.tiers.verify((slot) => this.slots.isLive(slot));
  }

  private reject(status: StoreStatus): StoreStatus {
    countRejection(this.counters, status);
    return status;
  }

  /** A copy of the node and block arrays and the lookups, in slices (the packer reads it by nodes). */
  freeze(): FreezeJob {
    const nodes = this.tree.nodes;
    const top = nodes.highWater;
    const blocks = this.tree.blocks;
    const lookups = this.slots.presentLookups();
    const copy = new SlicedCopy(
      [nodes.parent, nodes.start, nodes.len, blocks.hi, blocks.lo, ...lookups.map((e) => e.table)],
      [top, top, top, blocks.hi.length, blocks.lo.length, ...lookups.map((e) => e.table.length)],
    );
    const tiers = this.tiers.freeze(this.workerTable);
    let frozen: FrozenIndex | null = null;
    return {
      step: (words) => copy.step(words),
      result: () => (frozen ??= frozenTree(top, copy.copies, lookups, tiers)),
    };
  }
}

/** The FrozenIndex over crtc's copied arrays (parent, start, len, hi, lo, then one lookup each). */
function frozenTree(
  top: number,
  copies: readonly Uint32Array[],
  lookups: readonly PresentLookup[],
  tiers: readonly FrozenTierBlocks[],
): FrozenIndex {
  const [parent, start, len, hi, lo] = copies as [
    Uint32Array,
    Uint32Array,
    Uint32Array,
    Uint32Array,
    Uint32Array,
  ];
  return {
    blockKeyLimit: hi.length,
    units: top,
    tiers,
    forEachBlockFrom(from, budget, visit) {
      let node = Math.max(from, ROOT + 1);
      for (let visited = 0; node < top && visited < budget; node++) {
        const n = len[node]!;
        if (n === 0) continue; // a free id
        const first = start[node]!;
        const up = parent[node]!;
        let previous = up === ROOT ? -1 : start[up]! + len[up]! - 1;
        for (let block = first; block < first + n; block++) {
          visit(block, previous, hi[block]!, lo[block]!);
          previous = block;
        }
        visited += n;
      }
      return node;
    },
    workers: lookups.map(({ workerId, dpRank, count, copies: extra }, i) => {
      const table = copies[5 + i]!;
      const slots = table.length / 3;
      return {
        workerId,
        dpRank,
        count,
        copies: extra,
        readHeld(from, budget, visit) {
          const to = Math.min(slots, from + budget);
          for (let at = 3 * from; at < 3 * to; at += 3) {
            if (table[at + 2] !== 0) visit(table[at]!, table[at + 1]!, table[at + 2]!);
          }
          return to === slots ? -1 : to;
        },
      };
    }),
  };
}
