/**
 * The positional backend (README.md here): one entry per distinct block, keyed by
 * (position, chain hash), where the chain hash is the sequence hash of the block's
 * whole local-hash path, computed by the index itself (src/hash chainHashes, the
 * Dynamo sequence hash). Keying by the chain, not by (position, local hash) alone,
 * keeps two blocks with the same content at the same position after different
 * prefixes apart; the local hash is compared as well.
 *
 * A query computes its own chain once and probes position by position. Each entry
 * keeps its parent and a child count, so an entry nobody holds lives exactly as long
 * as a held descendant needs it (for dump), then goes, cascading upward.
 */
import { ChainBuffer, chainHashes } from "../../hash";
import { assert, VERIFY_BY_DEFAULT } from "../assert";
import { dumpEvents } from "../dump";
import type { DumpSource } from "../pack";
import { type FreezeJob, freezeByWalk, frozenAtOnce } from "../pack";
import { LinkTable } from "../link-table";
import type { ExternalLookup } from "../lookup";
import type { IndexOp } from "../ops";
import { OwnerLists } from "../owners";
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
import { WorkerSlots } from "../workers";

const CAPACITY_MIN = 64;
const NO_PARENT = 0;
const STAMP_LIMIT = 0xffff_fff0;
/** `kids` of a free entry id. */
const FREE = 0xffff_ffff;

/** Entries, structure of arrays; id 0 is null (the root, which has no entry). */
class EntryPool {
  position: Uint32Array;
  localHi: Uint32Array;
  localLo: Uint32Array;
  chainHi: Uint32Array;
  chainLo: Uint32Array;
  /** Parent entry (0 = the root); for a free id, the next free id. */
  parent: Uint32Array;
  /** Child entries; 0xffffffff marks a free id. */
  kids: Uint32Array;
  live = 0;
  private next = 1;
  private freeHead = 0;

  constructor(private readonly owners: OwnerLists) {
    this.position = new Uint32Array(CAPACITY_MIN);
    this.localHi = new Uint32Array(CAPACITY_MIN);
    this.localLo = new Uint32Array(CAPACITY_MIN);
    this.chainHi = new Uint32Array(CAPACITY_MIN);
    this.chainLo = new Uint32Array(CAPACITY_MIN);
    this.parent = new Uint32Array(CAPACITY_MIN);
    this.kids = new Uint32Array(CAPACITY_MIN).fill(FREE);
    owners.ensureRecords(CAPACITY_MIN);
  }

  /** Back to the initial size once no entry is left (memory returns to baseline). */
  reset(): void {
    assert(this.live === 0, "entry pool reset while entries are live");
    this.position = new Uint32Array(CAPACITY_MIN);
    this.localHi = new Uint32Array(CAPACITY_MIN);
    this.localLo = new Uint32Array(CAPACITY_MIN);
    this.chainHi = new Uint32Array(CAPACITY_MIN);
    this.chainLo = new Uint32Array(CAPACITY_MIN);
    this.parent = new Uint32Array(CAPACITY_MIN);
    this.kids = new Uint32Array(CAPACITY_MIN).fill(FREE);
    this.next = 1;
    this.freeHead = 0;
    this.owners.resetAll(CAPACITY_MIN);
  }

  get highWater(): number {
    return this.next;
  }

  allocate(): number {
    let id = this.freeHead;
    if (id !== 0) {
      this.freeHead = this.parent[id]!;
    } else {
      if (this.next === this.position.length) this.grow();
      id = this.next++;
    }
    this.kids[id] = 0;
    this.live++;
    return id;
  }

  free(id: number): void {
    assert(this.kids[id] === 0, "freeing an entry that has children or is free");
    assert(this.owners.count[id] === 0, "freeing an entry that has owners");
    this.kids[id] = FREE;
    this.parent[id] = this.freeHead;
    this.freeHead = id;
    this.live--;
  }

  isLive(id: number): boolean {
    return id > 0 && id < this.next && this.kids[id] !== FREE;
  }

  bytes(): number {
    return 7 * this.position.byteLength;
  }

  private grow(): void {
    const size = this.position.length * 2;
    const grow = (array: Uint32Array, fill = 0): Uint32Array => {
      const next = new Uint32Array(size).fill(fill);
      next.set(array);
      return next;
    };
    this.position = grow(this.position);
    this.localHi = grow(this.localHi);
    this.localLo = grow(this.localLo);
    this.chainHi = grow(this.chainHi);
    this.chainLo = grow(this.chainLo);
    this.parent = grow(this.parent);
    this.kids = grow(this.kids, FREE);
    this.owners.ensureRecords(size);
  }
}

export class PositionalIndex extends TieredIndex implements KvIndex {
  readonly backend = "positional" as const;
  readonly blockSize: number;
  readonly slots: WorkerSlots;
  readonly owners = new OwnerLists(CAPACITY_MIN);
  readonly entries = new EntryPool(this.owners);
  /** (position, chain hi, chain lo) -> entry. */
  readonly index = new LinkTable();
  private readonly verifyEach: boolean;
  private chain = new Uint32Array(256);
  /** The sequence hashes of a query whose caller passed none. */
  private readonly queryChain = new ChainBuffer();
  private active = new Uint32Array(64);
  private stamp = new Uint32Array(64);
  private tick = 2;
  private touched = new Uint32Array(64);
  /** A removal's hashes whose last copy goes, when some blocks have several copies. */
  private going = new Uint32Array(128);

  constructor(blockSize: number, options: IndexOptions = {}) {
    super(options);
    this.blockSize = blockSize;
    this.slots = new WorkerSlots(this.workerTable, this.ownsWorkers);
    this.verifyEach = options.verify ?? VERIFY_BY_DEFAULT;
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
    assert(
      external.length >= 2 * (first + count) && local.length >= 2 * (first + count),
      "stored arrays too short",
    );
    let lookup = this.slots.lookupOf(slot);
    let parent = NO_PARENT;
    if (hasParent) {
      parent = lookup === null ? 0 : lookup.find(parentHi >>> 0, parentLo >>> 0);
      if (parent === 0) return this.reject(StoreStatus.ParentNotFound);
    }
    if (count === 0) {
      this.counters.storedEvents++;
      return StoreStatus.Ok;
    }
    if (lookup === null) {
      if (slot < 0) return this.reject(StoreStatus.CapacityExhausted);
      lookup = this.attachSlot(slot);
    }
    this.counters.storedEvents++;
    this.storeChain(slot, lookup, parent, external, local, first, count);
    if (this.verifyEach) this.verify();
    return StoreStatus.Ok;
  }

  protected attachSlot(slot: number): ExternalLookup {
    return this.slots.attach(slot);
  }

  /** An entry keeps its chain hash: the sequence hash of the block. */
  protected sequenceOf(slot: number, hi: number, lo: number, out: Uint32Array): boolean {
    const entry = this.slots.lookupOf(slot)?.find(hi, lo) ?? 0;
    if (entry === 0) return false;
    out[0] = this.entries.chainHi[entry]!;
    out[1] = this.entries.chainLo[entry]!;
    return true;
  }

  /** Chain hashes of the event's blocks, continuing the parent's chain. */
  private chainOf(parent: number, local: Uint32Array, first: number, count: number): Uint32Array {
    const words = 2 * (count + 1);
    if (this.chain.length < words) this.chain = new Uint32Array(words * 2);
    const chain = this.chain;
    if (parent === NO_PARENT) {
      chain.set(local.subarray(2 * first, 2 * (first + count)));
      chainHashes(chain, count, chain);
      return chain;
    }
    // seq(parent, x) = H(parent's chain, x): prepend the parent's chain and skip it.
    chain[0] = this.entries.chainHi[parent]!;
    chain[1] = this.entries.chainLo[parent]!;
    chain.set(local.subarray(2 * first, 2 * (first + count)), 2);
    chainHashes(chain, count + 1, chain);
    return chain.subarray(2);
  }

  private storeChain(
    slot: number,
    lookup: ExternalLookup,
    parent: number,
    external: Uint32Array,
    local: Uint32Array,
    first: number,
    count: number,
  ): void {
    const chain = this.chainOf(parent, local, first, count);
    const entries = this.entries;
    const owners = this.owners;
    let position = parent === NO_PARENT ? 0 : entries.position[parent]! + 1;
    for (let k = 0; k < count; k++, position++) {
      const i = first + k;
      const chainHi = chain[2 * k]!;
      const chainLo = chain[2 * k + 1]!;
      let entry = this.index.find(position, chainHi, chainLo);
      if (
        entry !== 0 &&
        (entries.localHi[entry] !== local[2 * i] || entries.localLo[entry] !== local[2 * i + 1])
      ) {
        // Same position and chain hash, different block: a 64-bit chain collision.
        this.counters.hashConflicts++;
        return;
      }
      const found = lookup.find(external[2 * i]!, external[2 * i + 1]!);
      if (entry !== 0 && owners.get(entry, slot) !== 0) {
        if (found !== entry) {
          this.counters.hashConflicts++;
          return;
        }
        this.slots.copies.add(slot, external[2 * i]!, external[2 * i + 1]!);
        this.counters.blocksDuplicate++;
        parent = entry;
        continue;
      }
      if (found !== 0) {
        this.counters.hashConflicts++;
        return;
      }
      if (entry === 0)
        entry = this.newEntry(parent, position, local[2 * i]!, local[2 * i + 1]!, chainHi, chainLo);
      owners.set(entry, slot, 1);
      lookup.insertAtProbe(external[2 * i]!, external[2 * i + 1]!, entry);
      this.counters.blocksStored++;
      parent = entry;
    }
  }

  private newEntry(
    parent: number,
    position: number,
    hi: number,
    lo: number,
    chainHi: number,
    chainLo: number,
  ): number {
    const id = this.entries.allocate();
    const entries = this.entries;
    entries.position[id] = position;
    entries.localHi[id] = hi;
    entries.localLo[id] = lo;
    entries.chainHi[id] = chainHi;
    entries.chainLo[id] = chainLo;
    entries.parent[id] = parent;
    if (parent !== NO_PARENT) entries.kids[parent]!++;
    this.index.insert(position, chainHi, chainLo, id);
    return id;
  }

  /** Drops entries nobody holds and nothing hangs below, from `entry` upward. */
  private reclaim(entry: number): void {
    const entries = this.entries;
    // Bounded by the entry's position: each round moves one step toward the root.
    while (entry !== NO_PARENT && entries.kids[entry] === 0 && this.owners.count[entry] === 0) {
      const parent = entries.parent[entry]!;
      this.index.remove(
        entries.position[entry]!,
        entries.chainHi[entry]!,
        entries.chainLo[entry]!,
        entry,
      );
      entries.free(entry);
      if (parent !== NO_PARENT) entries.kids[parent]!--;
      entry = parent;
    }
    if (entries.live === 0 && entries.highWater > 1) entries.reset();
  }

  removeAt(slot: number, external: Uint32Array, count: number, first = 0): number {
    assert(external.length >= 2 * (first + count), "removed array too short");
    this.counters.removedEvents++;
    const lookup = this.slots.lookupOf(slot);
    let hashes = external;
    let from = first;
    let going = count;
    if (this.slots.copies.of(slot) !== null) {
      // Blocks held in more than one copy lose a copy and stay; the rest go as usual.
      if (this.going.length < 2 * count) this.going = new Uint32Array(4 * count);
      hashes = this.going;
      going = this.slots.copies.take(slot, external, first, count, hashes);
      from = 0;
      this.counters.copiesRemoved += count - going;
    }
    let unknown = 0;
    if (lookup === null) {
      unknown = going;
    } else {
      for (let i = from; i < from + going; i++) {
        const entry = lookup.remove(hashes[2 * i]!, hashes[2 * i + 1]!);
        if (entry === 0) {
          unknown++;
          continue;
        }
        this.owners.remove(entry, slot);
        this.reclaim(entry);
      }
    }
    this.counters.blocksUnknown += unknown;
    this.counters.blocksRemoved += going - unknown;
    if (this.verifyEach) this.verify();
    return unknown;
  }

  private clearSlot(slot: number): void {
    this.slots.copies.drop(slot);
    this.tiers.clear(slot);
    const lookup = this.slots.lookup[slot]!;
    if (this.touched.length < lookup.count) this.touched = new Uint32Array(lookup.count * 2);
    const touched = this.touched;
    let count = 0;
    const table = lookup.table;
    for (let at = 2; at < table.length; at += 3) {
      const entry = table[at]!;
      if (entry !== 0 && this.owners.remove(entry, slot)) touched[count++] = entry;
    }
    this.counters.blocksRemoved += lookup.count;
    lookup.clear();
    for (let j = 0; j < count; j++) if (this.entries.isLive(touched[j]!)) this.reclaim(touched[j]!);
  }

  clearAt(slot: number): void {
    this.counters.clearedEvents++;
    if (this.slots.lookupOf(slot) === null) return;
    this.clearSlot(slot);
    if (this.verifyEach) this.verify();
  }

  removeWorker(workerId: bigint): void {
    this.counters.workersRemoved++;
    for (const slot of this.slots.slotsOf(workerId)) {
      this.clearSlot(slot);
      this.slots.release(slot);
    }
    if (this.verifyEach) this.verify();
  }

  dropSlot(slot: number): void {
    if (this.slots.lookupOf(slot) === null) return;
    this.clearSlot(slot);
    this.slots.release(slot);
    if (this.verifyEach) this.verify();
  }

  findMatches(local: Uint32Array, count: number, out: MatchResult, given?: Uint32Array): void {
    const fits = local.length >= 2 * count && (given === undefined || given.length >= 2 * count);
    assert(fits, "query arrays too short");
    out.count = 0;
    if (count === 0) return;
    const slots = this.slots.highWater;
    out.ensure(slots);
    if (this.stamp.length < slots) {
      this.stamp = new Uint32Array(slots);
      this.active = new Uint32Array(slots);
    }
    const chain = given ?? this.queryChain.of(local, count);
    const first = this.entryAt(0, chain, local);
    if (first === 0) return;
    const owners = this.owners;
    const active = this.active;
    const stamp = this.stamp;
    let activeTick = this.nextTick();
    let activeCount = 0;
    const firstOwners = owners.snapshot(first);
    for (let k = 0; k < owners.count[first]!; k++) {
      const slot = firstOwners[2 * k]!;
      active[activeCount++] = slot;
      stamp[slot] = activeTick;
    }
    let depth = 1;
    let scored = 0;
    // Bounded by the query length.
    while (depth < count && activeCount > 0) {
      const entry = this.entryAt(depth, chain, local);
      if (entry === 0) break;
      const keep = this.nextTick();
      const ownerCount = owners.count[entry]!;
      let stayed = 0;
      if (ownerCount === 1) {
        const slot = owners.a[entry]!;
        if (stamp[slot] === activeTick) {
          stamp[slot] = keep;
          stayed = 1;
        }
      } else {
        const words = owners.words;
        const offset = owners.a[entry]!;
        for (let k = 0; k < ownerCount; k++) {
          const slot = words[offset + 2 * k]!;
          if (stamp[slot] === activeTick) {
            stamp[slot] = keep;
            stayed++;
          }
        }
      }
      let kept = activeCount;
      if (stayed !== activeCount) {
        // Some active slots do not hold this block: they stop here.
        kept = 0;
        for (let k = 0; k < activeCount; k++) {
          const slot = active[k]!;
          if (stamp[slot] === keep) {
            active[kept++] = slot;
          } else {
            out.workers[scored] = slot;
            out.blocks[scored++] = depth;
          }
        }
      }
      activeCount = kept;
      activeTick = keep;
      depth++;
    }
    for (let k = 0; k < activeCount; k++) {
      out.workers[scored] = active[k]!;
      out.blocks[scored++] = depth;
    }
    out.count = scored;
  }

  /** The entry for the query's block at `position`, or 0. */
  private entryAt(position: number, chain: Uint32Array, local: Uint32Array): number {
    const entry = this.index.find(position, chain[2 * position]!, chain[2 * position + 1]!);
    if (entry === 0) return 0;
    const entries = this.entries;
    return entries.localHi[entry] === local[2 * position] &&
      entries.localLo[entry] === local[2 * position + 1]
      ? entry
      : 0;
  }

  private nextTick(): number {
    if (this.tick >= STAMP_LIMIT) {
      this.stamp.fill(0);
      this.tick = 2;
    }
    const tick = this.tick;
    this.tick += 1;
    return tick;
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
      nodes: this.entries.live,
      edgeWords: 2 * this.entries.live,
      lookupEntries: entries,
      rejected: rejectCounts(this.counters),
      bytes:
        this.entries.bytes() +
        this.owners.bytes() +
        this.index.bytes() +
        this.slots.bytes() +
        this.tiers.bytes(),
    };
  }

  workers(): WorkerInfo[] {
    return this.slots.workers();
  }

  dump(): IndexOp[] {
    return dumpEvents(freezeByWalk(this.dumpSource()), this.blockSize);
  }

  /** The copy is one walk of the blocks: done in the first step. */
  freeze(): FreezeJob {
    return frozenAtOnce(() => freezeByWalk(this.dumpSource()));
  }

  private dumpSource(): DumpSource {
    const entries = this.entries;
    const slots = this.slots;
    return {
      blockKeyLimit: entries.highWater,
      tiers: this.tiers.freeze(this.workerTable),
      forEachBlock(visit) {
        const live: number[] = [];
        for (let id = 1; id < entries.highWater; id++) if (entries.isLive(id)) live.push(id);
        live.sort((x, y) => entries.position[x]! - entries.position[y]!); // parents first
        for (const id of live) {
          const parent = entries.parent[id]!;
          visit(id, parent === NO_PARENT ? -1 : parent, entries.localHi[id]!, entries.localLo[id]!);
        }
      },
      forEachWorker: slots.forEachWorker,
    };
  }

  /** O(N): entries vs index vs parents vs owners vs lookups. */
  verify(): void {
    const entries = this.entries;
    const kids = new Uint32Array(entries.highWater);
    const heldBySlot = new Float64Array(this.slots.highWater);
    let live = 0;
    for (let id = 1; id < entries.highWater; id++) {
      if (!entries.isLive(id)) continue;
      live++;
      const parent = entries.parent[id]!;
      if (parent !== NO_PARENT) {
        assert(entries.isLive(parent), "verify: entry's parent is free");
        assert(
          entries.position[parent]! + 1 === entries.position[id],
          "verify: entry not one past its parent",
        );
        kids[parent]!++;
      } else {
        assert(entries.position[id] === 0, "verify: root entry not at position 0");
      }
      assert(
        this.index.find(entries.position[id]!, entries.chainHi[id]!, entries.chainLo[id]!) === id,
        "verify: entry not indexed",
      );
      const count = this.owners.count[id]!;
      const pairs = this.owners.snapshot(id);
      for (let k = 0; k < count; k++) {
        assert(this.slots.isLive(pairs[2 * k]!), "verify: entry owned by a free slot");
        assert(pairs[2 * k + 1] === 1, "verify: positional owner value is not 1");
        heldBySlot[pairs[2 * k]!]!++;
      }
    }
    for (let id = 1; id < entries.highWater; id++) {
      if (!entries.isLive(id)) continue;
      assert(entries.kids[id] === kids[id], "verify: child count drifted");
      assert(entries.kids[id]! > 0 || this.owners.count[id]! > 0, "verify: dead entry kept");
    }
    assert(live === entries.live && this.index.count === live, "verify: entry counts disagree");
    this.slots.copies.verify((slot) => this.slots.lookupOf(slot));
    this.tiers.verify((slot) => this.slots.isLive(slot));
    const seen = new Uint32Array(entries.highWater);
    for (let slot = 0; slot < this.slots.highWater; slot++) {
      const lookup = this.slots.lookup[slot];
      if (!lookup) {
        assert(heldBySlot[slot] === 0, "verify: free slot owns entries");
        continue;
      }
      assert(lookup.count === heldBySlot[slot], "verify: lookup entries differ from owned entries");
      for (let at = 0; at < lookup.table.length; at += 3) {
        const entry = lookup.table[at + 2]!;
        if (entry === 0) continue;
        assert(
          entries.isLive(entry) && this.owners.get(entry, slot) === 1,
          "verify: lookup names an entry not owned",
        );
        assert(seen[entry] !== slot + 1, "verify: two hashes name one entry for a worker");
        seen[entry] = slot + 1;
      }
    }
  }

  private reject(status: StoreStatus): StoreStatus {
    countRejection(this.counters, status);
    return status;
  }
}
