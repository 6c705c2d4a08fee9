/**
 * The lower tiers: blocks an engine keeps beyond its device cache, in host memory
 * (vLLM's OffloadingConnector `CPU`, SGLang's HiCache `CPU_PINNED`), on disk
 * (`STORAGE`, `DISK`) or outside (`EXTERNAL`), indexed beside the device tier with the
 * same event semantics (docs/decisions.md#lower-tiers; README.md, "Lower tiers"):
 *
 * - a block of a lower tier is named by its sequence hash (src/hash `chainHashes`: the
 *   chain of local hashes from the root), so a query's own sequence hashes find it at
 *   its position, whatever tier holds the blocks before it;
 * - a store's parent is resolved by the worker's external hash in the store's tier,
 *   then the device tier, then the other lower tiers: a block offloaded while its
 *   parent stays on the device (spill on eviction) continues the device's chain;
 * - copies, conflicts and removals as on the device tier, per (worker, tier);
 * - a match continues each worker's device match: the host tier counts the blocks held
 *   there right after the device's, the disk tier right after those, then external
 *   (Dynamo's continuation walk); a worker with no device match starts at the root.
 *
 * One entry per (tier, block) in typed arrays, with its owners (../owners.ts), found by
 * (tier, sequence hash) in one LinkTable; per (tier, worker slot) an external-hash
 * lookup and a copies table. Nothing is allocated until the first lower-tier store, and
 * everything goes back when the last lower-tier block does: an index that never hears
 * of a lower tier costs what it did before.
 */
import { chainHashes } from "../hash";
import { assert, fail } from "./assert";
import { CopyCounts } from "./copies";
import { LinkTable } from "./link-table";
import { ExternalLookup } from "./lookup";
import { OwnerLists } from "./owners";
import type { WorkerTable } from "../domain/worker-table";
import type { FrozenTierBlocks } from "./pack";
import {
  type IndexCounters,
  type IndexStats,
  type MatchResult,
  StoreStatus,
  TIER_ANY,
  TIER_DEVICE,
  TIER_DISK,
  TIER_EXTERNAL,
  TIER_HOST,
  type TierMatches,
} from "./types";

const CAPACITY_MIN = 64;
/** `flags` of an entry: bit 0 = it has a parent (else it is at the root); bits 1-2 = its tier. */
const HAS_PARENT = 1;
const FREE = 0xff;

/** Resolves a device block's sequence hash (into `out[0..1]`) for a parent; false if not held. */
export type DeviceSequence = (slot: number, hi: number, lo: number, out: Uint32Array) => boolean;

/** The lower tiers' arrays; made at the first store, dropped when the last block goes. */
class TierState {
  seqHi = new Uint32Array(CAPACITY_MIN);
  seqLo = new Uint32Array(CAPACITY_MIN);
  localHi = new Uint32Array(CAPACITY_MIN);
  localLo = new Uint32Array(CAPACITY_MIN);
  parentHi = new Uint32Array(CAPACITY_MIN);
  parentLo = new Uint32Array(CAPACITY_MIN);
  /** HAS_PARENT | tier << 1; FREE for a free id (whose parentHi is the next free id). */
  flags = new Uint8Array(CAPACITY_MIN).fill(FREE);
  readonly owners = new OwnerLists(CAPACITY_MIN);
  /** (tier, sequence hi, lo) -> entry. */
  readonly table = new LinkTable();
  /** [tier - 1][slot]: external hash -> entry. */
  readonly lookups: (ExternalLookup | null)[][] = [[], [], []];
  readonly copies = [new CopyCounts(), new CopyCounts(), new CopyCounts()];
  /** Held (worker, block) pairs per tier (index = tier; 0 unused). */
  readonly held = [0, 0, 0, 0];
  live = 0;
  private next = 1;
  private freeHead = 0;

  allocate(): number {
    let id = this.freeHead;
    if (id !== 0) this.freeHead = this.parentHi[id]!;
    else {
      if (this.next === this.seqHi.length) this.grow();
      id = this.next++;
    }
    this.live++;
    return id;
  }

  free(id: number): void {
    this.flags[id] = FREE;
    this.parentHi[id] = this.freeHead;
    this.freeHead = id;
    this.live--;
  }

  isLive(id: number): boolean {
    return id > 0 && id < this.next && this.flags[id] !== FREE;
  }

  get highWater(): number {
    return this.next;
  }

  lookupOf(tier: number, slot: number): ExternalLookup | null {
    return slot < 0 ? null : (this.lookups[tier - 1]![slot] ?? null);
  }

  bytes(): number {
    let total = 6 * this.seqHi.byteLength + this.flags.byteLength;
    total += this.owners.bytes() + this.table.bytes();
    for (const perSlot of this.lookups) for (const lookup of perSlot) total += lookup?.bytes() ?? 0;
    for (const copies of this.copies) total += copies.bytes();
    return total;
  }

  private grow(): void {
    const size = this.seqHi.length * 2;
    const grown = <T extends Uint32Array | Uint8Array>(array: T, make: (n: number) => T): T => {
      const next = make(size);
      next.set(array);
      return next;
    };
    const u32 = (n: number) => new Uint32Array(n);
    this.seqHi = grown(this.seqHi, u32);
    this.seqLo = grown(this.seqLo, u32);
    this.localHi = grown(this.localHi, u32);
    this.localLo = grown(this.localLo, u32);
    this.parentHi = grown(this.parentHi, u32);
    this.parentLo = grown(this.parentLo, u32);
    this.flags = grown(this.flags, (n) => new Uint8Array(n).fill(FREE));
    this.owners.ensureRecords(size);
  }
}

export class LowerTiers {
  private state: TierState | null = null;
  /** A store's sequence hashes: (base, then its blocks) pairs. */
  private chain = new Uint32Array(256);
  private going = new Uint32Array(128);
  private readonly base = new Uint32Array(2);
  // Match scratch, by slot: continuation end and a stamp per query.
  private cont = new Uint32Array(64);
  private seen = new Uint32Array(64);
  private owned = new Uint32Array(64);
  private tick = 0;
  private touched = new Uint32Array(64);
  private active = new Uint32Array(64);
  private starts = new Float64Array(64);

  constructor(
    private readonly counters: IndexCounters,
    private readonly deviceSequence: DeviceSequence,
  ) {}

  /** Held (worker, block) pairs of `tier`. */
  held(tier: number): number {
    return this.state?.held[tier] ?? 0;
  }

  /** Copies beyond the first over the lower tiers. */
  get extraCopies(): number {
    const state = this.state;
    return state === null
      ? 0
      : state.copies[0]!.extra + state.copies[1]!.extra + state.copies[2]!.extra;
  }

  /** Entries (distinct (tier, block)s held by someone). */
  get entries(): number {
    return this.state?.live ?? 0;
  }

  bytes(): number {
    return this.state?.bytes() ?? 0;
  }

  /** Whether `slot` holds anything in a lower tier. */
  holds(slot: number): boolean {
    const state = this.state;
    if (state === null) return false;
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++)
      if (state.lookupOf(tier, slot) !== null) return true;
    return false;
  }

  /**
   * A stored event on `tier` (1..3) for `slot` (which must exist): its parent resolved by
   * external hash (this tier, the device, the other lower tiers), then its blocks.
   */
  store(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): StoreStatus {
    checkTier(tier);
    if (hasParent && !this.resolve(tier, slot, parentHi >>> 0, parentLo >>> 0)) {
      this.counters.tierRejectedParentNotFound++;
      return StoreStatus.ParentNotFound;
    }
    const base = this.base;
    return this.storeUnder(
      tier,
      slot,
      hasParent,
      base[0]!,
      base[1]!,
      external,
      local,
      count,
      first,
    );
  }

  /** A stored event on `tier` below a given sequence hash (none: the root); a dump restores with it. */
  storeUnder(
    tier: number,
    slot: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): StoreStatus {
    checkTier(tier);
    if (external.length < 2 * (first + count) || local.length < 2 * (first + count))
      fail("stored arrays too short");
    this.counters.tierStoredEvents++;
    if (count === 0) return StoreStatus.Ok;
    const state = (this.state ??= new TierState());
    const chain = this.chainOf(hasBase, baseHi, baseLo, local, first, count);
    let lookup = state.lookupOf(tier, slot);
    if (lookup === null) {
      lookup = new ExternalLookup();
      state.lookups[tier - 1]![slot] = lookup;
    }
    const skip = hasBase ? 1 : 0;
    for (let k = 0; k < count; k++) {
      const i = first + k;
      const at = 2 * (k + skip);
      const placed = this.place(
        state,
        tier,
        slot,
        lookup,
        external,
        local,
        i,
        chain,
        at,
        k > 0 || hasBase,
      );
      if (!placed) {
        this.counters.tierHashConflicts++;
        break;
      }
    }
    if (lookup.count === 0) this.dropLookup(state, tier, slot);
    return StoreStatus.Ok;
  }

  /** One block: held already (a copy), taken, or a conflict (false). */
  private place(
    state: TierState,
    tier: number,
    slot: number,
    lookup: ExternalLookup,
    external: Uint32Array,
    local: Uint32Array,
    i: number,
    chain: Uint32Array,
    at: number,
    hasParent: boolean,
  ): boolean {
    const seqHi = chain[at]!;
    const seqLo = chain[at + 1]!;
    let entry = state.table.find(tier, seqHi, seqLo);
    // Same tier and sequence hash, another block: a 64-bit collision.
    if (
      entry !== 0 &&
      (state.localHi[entry] !== local[2 * i] || state.localLo[entry] !== local[2 * i + 1])
    )
      return false;
    const hi = external[2 * i]!;
    const lo = external[2 * i + 1]!;
    const found = lookup.find(hi, lo);
    if (entry !== 0 && state.owners.get(entry, slot) !== 0) {
      if (found !== entry) return false;
      state.copies[tier - 1]!.add(slot, hi, lo);
      this.counters.tierBlocksDuplicate++;
      return true;
    }
    if (found !== 0) return false;
    if (entry === 0) {
      entry = state.allocate();
      state.seqHi[entry] = seqHi;
      state.seqLo[entry] = seqLo;
      state.localHi[entry] = local[2 * i]!;
      state.localLo[entry] = local[2 * i + 1]!;
      state.parentHi[entry] = hasParent ? chain[at - 2]! : 0;
      state.parentLo[entry] = hasParent ? chain[at - 1]! : 0;
      state.flags[entry] = (hasParent ? HAS_PARENT : 0) | (tier << 1);
      state.table.insert(tier, seqHi, seqLo, entry);
    }
    state.owners.set(entry, slot, 1);
    // find() above set the probe slot; nothing touched this lookup since.
    lookup.insertAtProbe(hi, lo, entry);
    state.held[tier]!++;
    this.counters.tierBlocksStored++;
    return true;
  }

  /** The sequence hashes of the event's blocks, after the base (if any) at pairs 0. */
  private chainOf(
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    local: Uint32Array,
    first: number,
    count: number,
  ): Uint32Array {
    const skip = hasBase ? 1 : 0;
    if (this.chain.length < 2 * (count + skip)) this.chain = new Uint32Array(4 * (count + skip));
    const chain = this.chain;
    chain[0] = baseHi;
    chain[1] = baseLo;
    chain.set(local.subarray(2 * first, 2 * (first + count)), 2 * skip);
    chainHashes(chain, count + skip, chain);
    return chain;
  }

  /** The parent's sequence hash into `base`: this tier, the device, the other lower tiers. */
  private resolve(tier: number, slot: number, hi: number, lo: number): boolean {
    if (this.sequenceIn(tier, slot, hi, lo)) return true;
    if (this.deviceSequence(slot, hi, lo, this.base)) return true;
    for (let other = TIER_HOST; other <= TIER_EXTERNAL; other++)
      if (other !== tier && this.sequenceIn(other, slot, hi, lo)) return true;
    return false;
  }

  private sequenceIn(tier: number, slot: number, hi: number, lo: number): boolean {
    const state = this.state;
    const entry = state?.lookupOf(tier, slot)?.find(hi, lo) ?? 0;
    if (entry === 0) return false;
    this.base[0] = state!.seqHi[entry]!;
    this.base[1] = state!.seqLo[entry]!;
    return true;
  }

  /**
   * A removed event on `tier` (1..3), or on every lower tier (TIER_ANY: a removal whose
   * medium kvedge does not know, which must not leave a block indexed anywhere).
   * Returns how many hashes were unknown (TIER_ANY: 0, the device's removal counts them).
   */
  remove(tier: number, slot: number, external: Uint32Array, count: number, first: number): number {
    if (tier !== TIER_ANY) checkTier(tier);
    if (external.length < 2 * (first + count)) fail("removed array too short");
    this.counters.tierRemovedEvents++;
    if (tier === TIER_ANY) {
      for (let each = TIER_HOST; each <= TIER_EXTERNAL; each++)
        this.removeFrom(each, slot, external, count, first, false);
      return 0;
    }
    return this.removeFrom(tier, slot, external, count, first, true);
  }

  private removeFrom(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first: number,
    countUnknown: boolean,
  ): number {
    const state = this.state;
    const lookup = state?.lookupOf(tier, slot) ?? null;
    if (state === null || lookup === null) {
      if (countUnknown) this.counters.tierBlocksUnknown += count;
      return countUnknown ? count : 0;
    }
    let hashes = external;
    let from = first;
    let going = count;
    const copies = state.copies[tier - 1]!;
    if (copies.of(slot) !== null) {
      if (this.going.length < 2 * count) this.going = new Uint32Array(4 * count);
      hashes = this.going;
      going = copies.take(slot, external, first, count, hashes);
      from = 0;
      this.counters.tierCopiesRemoved += count - going;
    }
    let unknown = 0;
    for (let i = from; i < from + going; i++) {
      const entry = lookup.remove(hashes[2 * i]!, hashes[2 * i + 1]!);
      if (entry === 0) {
        unknown++;
        continue;
      }
      this.unhold(state, tier, entry, slot);
    }
    this.counters.tierBlocksRemoved += going - unknown;
    if (countUnknown) this.counters.tierBlocksUnknown += unknown;
    if (lookup.count === 0) this.dropLookup(state, tier, slot);
    return countUnknown ? unknown : 0;
  }

  private unhold(state: TierState, tier: number, entry: number, slot: number): void {
    state.owners.remove(entry, slot);
    state.held[tier]!--;
    if (state.owners.count[entry] !== 0) return;
    state.table.remove(tier, state.seqHi[entry]!, state.seqLo[entry]!, entry);
    state.free(entry);
  }

  /** A slot without blocks in `tier` keeps no lookup; an index without lower-tier blocks keeps nothing. */
  private dropLookup(state: TierState, tier: number, slot: number): void {
    assert(state.copies[tier - 1]!.of(slot) === null, "a lookup dropped with copies left");
    state.lookups[tier - 1]![slot] = null;
    if (state.live === 0 && state.held[1] === 0 && state.held[2] === 0 && state.held[3] === 0)
      this.state = null;
  }

  /** The slot holds nothing in any lower tier (a clear, a restart, the worker's removal). */
  clear(slot: number): number {
    const state = this.state;
    if (state === null) return 0;
    let removed = 0;
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      const lookup = state.lookupOf(tier, slot);
      if (lookup === null) continue;
      state.copies[tier - 1]!.drop(slot);
      const table = lookup.table;
      for (let at = 2; at < table.length; at += 3) {
        const entry = table[at]!;
        if (entry !== 0) this.unhold(state, tier, entry, slot);
      }
      removed += lookup.count;
      lookup.clear();
      this.dropLookup(state, tier, slot);
      if (this.state === null) break;
    }
    this.counters.tierBlocksRemoved += removed;
    return removed;
  }

  /**
   * Per worker, how many blocks of the query each lower tier holds right after what the
   * tiers before it matched (host after the device, disk after those, external after
   * those); `device` is the query's device matches. `chain`: the query's sequence hashes.
   */
  matches(
    chain: Uint32Array,
    count: number,
    device: MatchResult,
    slots: number,
    out: TierMatches,
  ): void {
    out.reset(slots);
    const state = this.state;
    if (state === null || count === 0) return;
    this.ensureScratch(slots);
    const tick = this.nextTick();
    const { cont, seen, touched } = this;
    let touchedCount = 0;
    for (let i = 0; i < device.count; i++) {
      const slot = device.workers[i]!;
      if (seen[slot] !== tick) {
        seen[slot] = tick;
        cont[slot] = 0;
        touched[touchedCount++] = slot;
      }
      if (device.blocks[i]! > cont[slot]!) cont[slot] = device.blocks[i]!;
    }
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      if (state.held[tier] === 0) continue;
      touchedCount = this.walk(state, tier, chain, count, tick, touchedCount, out);
    }
  }

  /**
   * One tier's continuation walk: every slot continues from where it stands (its
   * device match, or the tiers before), slots at 0 only if they hold the root block;
   * one probe per position some slot stands at. Returns the touched slots' count.
   */
  private walk(
    state: TierState,
    tier: number,
    chain: Uint32Array,
    count: number,
    tick: number,
    touchedCount: number,
    out: TierMatches,
  ): number {
    const { cont, seen, touched, starts, owned } = this;
    // Starts: (position * 2^16 + slot) of every touched slot still inside the query, sorted.
    let startCount = 0;
    for (let k = 0; k < touchedCount; k++) {
      const slot = touched[k]!;
      if (cont[slot]! < count) starts[startCount++] = cont[slot]! * 65_536 + slot;
    }
    const root = this.entryAt(state, tier, chain, 0);
    if (root !== 0) {
      const owners = state.owners.snapshot(root);
      for (let k = 0; k < state.owners.count[root]!; k++) {
        const slot = owners[2 * k]!;
        if (seen[slot] === tick) continue;
        seen[slot] = tick;
        cont[slot] = 0;
        touched[touchedCount++] = slot;
        starts[startCount++] = slot;
      }
    }
    const sorted = starts.subarray(0, startCount).sort();
    let next = 0;
    let activeCount = 0;
    const list = this.active;
    let position = startCount === 0 ? count : Math.floor(sorted[0]! / 65_536);
    // Bounded: each round moves `position` forward by one, or to the next start.
    while (position < count && (activeCount > 0 || next < startCount)) {
      while (next < startCount && Math.floor(sorted[next]! / 65_536) === position)
        list[activeCount++] = sorted[next++]! % 65_536;
      const entry = this.entryAt(state, tier, chain, position);
      let kept = 0;
      if (entry !== 0) {
        const mark = ++this.tick;
        const snapshot = state.owners.snapshot(entry);
        for (let k = 0; k < state.owners.count[entry]!; k++) owned[snapshot[2 * k]!] = mark;
        for (let k = 0; k < activeCount; k++) {
          const slot = list[k]!;
          if (owned[slot] !== mark) continue;
          cont[slot] = position + 1;
          this.addHit(out, slot, tier);
          list[kept++] = slot;
        }
      }
      activeCount = kept;
      position =
        activeCount > 0 || next >= startCount ? position + 1 : Math.floor(sorted[next]! / 65_536);
    }
    return touchedCount;
  }

  /** The entry of `tier` at query position `position` (its sequence hash), or 0. */
  private entryAt(state: TierState, tier: number, chain: Uint32Array, position: number): number {
    return state.table.find(tier, chain[2 * position]!, chain[2 * position + 1]!);
  }

  private addHit(out: TierMatches, slot: number, tier: number): void {
    const at = out.entryOf(slot);
    if (tier === TIER_HOST) out.host[at]!++;
    else if (tier === TIER_EXTERNAL) out.external[at]!++;
    else out.disk[at]!++;
  }

  private ensureScratch(slots: number): void {
    if (this.cont.length >= slots) return;
    this.cont = new Uint32Array(slots);
    this.seen = new Uint32Array(slots);
    this.owned = new Uint32Array(slots);
    this.touched = new Uint32Array(slots);
    this.active = new Uint32Array(slots);
    this.starts = new Float64Array(slots);
    this.tick = 0;
  }

  private nextTick(): number {
    if (this.tick >= 0xffff_fff0) {
      this.seen.fill(0);
      this.owned.fill(0);
      this.tick = 0;
    }
    return ++this.tick;
  }

  /** Held pairs per lower tier and their extra copies (IndexStats.lowerTiers). */
  stats(): IndexStats["lowerTiers"] {
    return {
      host_pinned: this.held(TIER_HOST),
      disk: this.held(TIER_DISK),
      external: this.held(TIER_EXTERNAL),
      copies: this.extraCopies,
    };
  }

  /** Each (worker, tier)'s held blocks for a dump, read now (the lower tiers are copied at once). */
  freeze(workers: WorkerTable): FrozenTierBlocks[] {
    const state = this.state;
    if (state === null) return [];
    const frozen: FrozenTierBlocks[] = [];
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      const perSlot = state.lookups[tier - 1]!;
      for (let slot = 0; slot < perSlot.length; slot++) {
        const lookup = perSlot[slot];
        if (!lookup) continue;
        const words = new Uint32Array(8 * lookup.count);
        let n = 0;
        const copies = state.copies[tier - 1]!;
        for (let at = 0; at < lookup.table.length; at += 3) {
          const entry = lookup.table[at + 2]!;
          if (entry === 0) continue;
          const hi = lookup.table[at]!;
          const lo = lookup.table[at + 1]!;
          words.set(
            [
              hi,
              lo,
              state.localHi[entry]!,
              state.localLo[entry]!,
              state.flags[entry]! & HAS_PARENT,
              state.parentHi[entry]!,
              state.parentLo[entry]!,
              copies.count(slot, hi, lo),
            ],
            8 * n++,
          );
        }
        frozen.push({
          workerId: workers.workerIdOf(slot),
          dpRank: workers.dpRankOf(slot),
          tier,
          words,
        });
      }
    }
    return frozen;
  }

  /** O(N): entries vs table vs owners vs lookups vs copies. */
  verify(slotLive: (slot: number) => boolean): void {
    const state = this.state;
    if (state === null) return;
    const ownedBy = new Uint32Array(state.highWater);
    let live = 0;
    for (let entry = 1; entry < state.highWater; entry++) {
      if (!state.isLive(entry)) continue;
      live++;
      const tier = state.flags[entry]! >>> 1;
      assert(tier >= TIER_HOST && tier <= TIER_EXTERNAL, "verify: an entry of no lower tier");
      assert(
        state.table.find(tier, state.seqHi[entry]!, state.seqLo[entry]!) === entry,
        "verify: a tier entry not in its table",
      );
      assert(state.owners.count[entry]! > 0, "verify: a tier entry nobody holds");
      ownedBy[entry] = state.owners.count[entry]!;
    }
    assert(live === state.live && state.table.count === live, "verify: tier entry counts differ");
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      const perSlot = state.lookups[tier - 1]!;
      let held = 0;
      for (let slot = 0; slot < perSlot.length; slot++) {
        const lookup = perSlot[slot];
        if (!lookup) continue;
        assert(slotLive(slot), "verify: a free slot holds lower-tier blocks");
        assert(lookup.count > 0, "verify: an empty tier lookup is kept");
        for (let at = 0; at < lookup.table.length; at += 3) {
          const entry = lookup.table[at + 2]!;
          if (entry === 0) continue;
          assert(
            state.isLive(entry) && state.flags[entry]! >>> 1 === tier,
            "verify: a tier lookup names a dead entry",
          );
          assert(
            state.owners.get(entry, slot) === 1,
            "verify: a tier lookup names an entry not owned",
          );
          ownedBy[entry]!--;
          held++;
        }
      }
      assert(held === state.held[tier], "verify: held tier blocks drifted");
      state.copies[tier - 1]!.verify((slot) => state.lookupOf(tier, slot));
    }
    assert(
      ownedBy.every((left) => left === 0),
      "verify: tier owners and lookups differ",
    );
  }
}

function checkTier(tier: number): void {
  if (tier < TIER_HOST || tier > TIER_EXTERNAL || tier === TIER_DEVICE)
    throw new RangeError(`not a lower tier: ${tier}`);
}
