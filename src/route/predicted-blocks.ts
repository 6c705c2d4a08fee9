/**
 * What approximate workers (engines that publish no KV events) are predicted to cache,
 * kept from kvedge's own decisions: per worker, an LRU over its predicted blocks,
 * written into the index through the same sink interface the engine streams use
 * (`KvEventSink`), so every backend, the memory accounting and the match path hold
 * them like any block.
 *
 * - A block is named by its sequence hash (Dynamo's chain over local hashes): that is
 *   its external hash in the index, and the key here. A worker's predicted set is
 *   prefix-closed: a request's blocks are touched deepest first, so a block is always
 *   more recent than its descendants and the LRU end holds the tail of the oldest
 *   chain (tail-first eviction, llm-d-router#2661; vLLM frees a request's blocks tail
 *   first too). Eviction from that end never leaves a hole.
 * - Bounded like the engine: at most `capacity` blocks per worker (its KV capacity in
 *   blocks); without a known capacity, blocks unused for `ttlMs` expire (Dynamo's
 *   approximate mode: 120 s) and at most `maxBlocks` are kept.
 * - Corrected by what the engine reports (`purge`): blocks at least as old as one the
 *   engine turned out not to hold are gone from an LRU cache too; the capacity then
 *   moves toward what is left (`shrink`).
 *
 * - Shared by replicas (several processes as one, src/cluster): each entry links to its
 *   parent's (a parent is always more recent than its children, so it lives while they
 *   do), so a peer's prediction names only the deepest block this process held already
 *   and the blocks past it (`extend`), and a refresh names only its deepest block.
 *
 * Entries live in typed arrays with a free list; the arrays go back to their first size
 * when no block is predicted. Nothing here allocates per block.
 *
 * See docs/decisions.md#predictions-in-index and docs/decisions.md#prediction-correction.
 */
import { chainHashes } from "../hash";
import type { KvEventSink } from "../ingest/normalize";
import { TripleTable } from "../util/tables";
import { assert } from "../util/verify";

const NONE = -1;
const INITIAL_ENTRIES = 64;
/**
 * Stamps count up from here as blocks are used; blocks a joining replica takes from a
 * peer (`prepend`) count down from it, older than any this process used.
 */
const STAMP_BASE = 2 ** 40;
/** A shrink moves the capacity at most this far down per shortfall. */
const SHRINK_STEP = 0.1;
/** A confirmed surplus moves a learned capacity up by this much. */
const GROW_STEP = 0.01;
/** Capacity is never shrunk below this many blocks. */
export const CAPACITY_FLOOR_BLOCKS = 256;

export interface PredictedBlocksOptions {
  readonly sink: Pick<KvEventSink, "storeAt" | "removeAt" | "clearAt">;
  /** Blocks unused this long expire, for workers without a known capacity. */
  readonly ttlMs: number;
  /** Most blocks kept for a worker without a known capacity. */
  readonly maxBlocks: number;
  readonly now: () => number;
}

export interface PredictedCounters {
  /** Blocks written to the index as predicted. */
  stored: number;
  /** Predicted blocks a later request used again. */
  refreshed: number;
  /** Removed to stay within the capacity. */
  evicted: number;
  /** Removed after the TTL (no capacity known). */
  expired: number;
  /** Removed because the engine reported fewer cached tokens than predicted. */
  purged: number;
}

export class PredictedBlocks {
  readonly counters: PredictedCounters = {
    stored: 0,
    refreshed: 0,
    evicted: 0,
    expired: 0,
    purged: 0,
  };
  // Per entry.
  private hashHi = new Uint32Array(INITIAL_ENTRIES);
  private hashLo = new Uint32Array(INITIAL_ENTRIES);
  /** The block's local hash (a peer joining needs it to index the block). */
  private localHi = new Uint32Array(INITIAL_ENTRIES);
  private localLo = new Uint32Array(INITIAL_ENTRIES);
  private slotOf = new Int32Array(INITIAL_ENTRIES);
  /** The entry of the block before it in its chain (NONE at the root). */
  private parentOf = new Int32Array(INITIAL_ENTRIES);
  private stamp = new Float64Array(INITIAL_ENTRIES);
  private usedMs = new Float64Array(INITIAL_ENTRIES);
  /** LRU links per slot (older / newer); `newer` links the free list. */
  private older = new Int32Array(INITIAL_ENTRIES);
  private newer = new Int32Array(INITIAL_ENTRIES);
  private top = 0;
  private freeEntry = NONE;
  private live = 0;
  /** (slot, hash hi, hash lo) -> entry. */
  private readonly table = new TripleTable();
  // Per slot.
  private oldest = new Int32Array(0);
  private newest = new Int32Array(0);
  private held = new Float64Array(0);
  /** Blocks the worker is believed to cache; 0 = unknown (TTL). */
  private capacity = new Float64Array(0);
  /** What the operator said (0 = unknown): a learned capacity never grows past it. */
  private configured = new Float64Array(0);
  private enabled = new Uint8Array(0);
  private stamps = STAMP_BASE;
  private oldStamps = STAMP_BASE;
  private removals = new Uint32Array(128);
  /** A peer's blocks: the anchor's sequence hash, then their local hashes, then their chain (`extend`). */
  private scratch = new Uint32Array(128);

  constructor(private readonly options: PredictedBlocksOptions) {}

  /** Blocks predicted over every worker. */
  get size(): number {
    return this.live;
  }

  /** Bytes of the arrays (entries, per-slot, table); back to a fresh instance's when empty. */
  get bytes(): number {
    const perEntry = this.hashHi.byteLength * 4 + this.slotOf.byteLength * 4;
    const perSlot = this.oldest.byteLength * 2 + this.held.byteLength * 3 + this.enabled.length;
    return perEntry + this.stamp.byteLength * 2 + perSlot + this.table.bytes;
  }

  isEnabled(slot: number): boolean {
    return this.enabled[slot] === 1;
  }

  /** The slots of approximate workers. */
  enabledSlots(): number[] {
    const slots: number[] = [];
    for (let slot = 0; slot < this.enabled.length; slot++)
      if (this.enabled[slot] === 1) slots.push(slot);
    return slots;
  }

  /** Blocks predicted for the slot. */
  heldBy(slot: number): number {
    return slot < this.held.length ? this.held[slot]! : 0;
  }

  /** The slot's capacity in blocks (learned or configured), or null when none is known. */
  capacityOf(slot: number): number | null {
    const capacity = slot < this.capacity.length ? this.capacity[slot]! : 0;
    return capacity > 0 ? capacity : null;
  }

  /** The capacity the slot's worker was given (null: none, or not approximate). */
  configuredOf(slot: number): number | null {
    const configured = slot < this.configured.length ? this.configured[slot]! : 0;
    return configured > 0 ? configured : null;
  }

  /** The slot's worker is approximate: its predictions start empty. */
  enable(slot: number, capacityBlocks: number | null): void {
    this.ensureSlots(slot + 1);
    this.drop(slot);
    this.enabled[slot] = 1;
    this.configured[slot] = capacityBlocks ?? 0;
    this.capacity[slot] = capacityBlocks ?? 0;
  }

  /** The slot's worker is no longer approximate (exact, or removed): its predictions are dropped. */
  disable(slot: number): void {
    if (this.enabled[slot] !== 1) return;
    this.drop(slot);
    this.enabled[slot] = 0;
    this.configured[slot] = 0;
    this.capacity[slot] = 0;
  }

  /**
   * The slot's worker computed (or will compute) blocks [0, count) of a chain: the
   * missing ones are stored in the index, all of them refreshed, then the LRU end is
   * evicted down to the capacity. `local` and `chain` are (hi, lo) pairs. Returns how
   * many leading blocks were predicted already (the others were stored now).
   */
  insert(slot: number, local: Uint32Array, chain: Uint32Array, count: number): number {
    if (this.enabled[slot] !== 1 || count <= 0) return 0;
    const held = this.depthOf(slot, chain, count);
    const parent =
      held > 0 ? this.table.get(slot, chain[2 * held - 2]!, chain[2 * held - 1]!) : NONE;
    this.touchUp(this.storeRun(slot, parent, local, chain, held, count), this.options.now());
    this.fit(slot);
    return held;
  }

  /**
   * The slot's worker released blocks [0, count) of a chain (their request finished):
   * the ones still predicted become the most recently used, deepest first (vLLM puts a
   * finished request's blocks at its free queue's tail, tail block first). Returns how
   * many leading blocks that is.
   */
  refresh(slot: number, chain: Uint32Array, count: number): number {
    if (this.enabled[slot] !== 1 || count <= 0) return 0;
    const held = this.depthOf(slot, chain, count);
    if (held > 0)
      this.touchUp(
        this.table.get(slot, chain[2 * held - 2]!, chain[2 * held - 1]!),
        this.options.now(),
      );
    return held;
  }

  /**
   * A peer's prediction: blocks after the anchor (the block named by its sequence hash;
   * `anchored` false: from the root), given by their local hashes, were computed on the
   * slot's worker, and with them every block before. Stored and refreshed as `insert`
   * does (none given: a refresh up from the anchor). False, and nothing done, when the
   * slot is not approximate or does not hold the anchor.
   */
  extend(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): boolean {
    if (this.enabled[slot] !== 1) return false;
    const anchor = anchored ? this.table.get(slot, anchorHi, anchorLo) : NONE;
    if (anchored && anchor < 0) return false;
    const chain = this.chainAfter(anchored, anchorHi, anchorLo, local, count);
    const held = this.depthOf(slot, chain, count);
    const parent =
      held > 0 ? this.table.get(slot, chain[2 * held - 2]!, chain[2 * held - 1]!) : anchor;
    this.touchUp(this.storeRun(slot, parent, local, chain, held, count), this.options.now());
    this.fit(slot);
    return true;
  }

  /**
   * A peer's older predictions (a joining replica takes them, newest first): blocks after
   * the anchor, given by their local hashes, are added at the least recently used end
   * (each one older than every block there), last used `usedMs`; blocks held already
   * keep their place; nothing is added past the capacity. False, and nothing done, when
   * the slot is not approximate or does not hold the anchor.
   */
  prepend(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
    usedMs: number,
  ): boolean {
    if (this.enabled[slot] !== 1) return false;
    const anchor = anchored ? this.table.get(slot, anchorHi, anchorLo) : NONE;
    if (anchored && anchor < 0) return false;
    const chain = this.chainAfter(anchored, anchorHi, anchorLo, local, count);
    const held = this.depthOf(slot, chain, count);
    const bound = this.capacity[slot]! > 0 ? this.capacity[slot]! : this.options.maxBlocks;
    const end = Math.min(count, held + Math.max(0, bound - this.held[slot]!));
    let parent =
      held > 0 ? this.table.get(slot, chain[2 * held - 2]!, chain[2 * held - 1]!) : anchor;
    if (held >= end) return true;
    const hasParent = parent !== NONE;
    const parentHi = hasParent ? this.hashHi[parent]! : 0;
    const parentLo = hasParent ? this.hashLo[parent]! : 0;
    this.options.sink.storeAt(slot, hasParent, parentHi, parentLo, chain, local, end - held, held);
    // Never more recent than the oldest block there: expiry walks from that end.
    const first = this.oldest[slot]!;
    const used = first === NONE ? usedMs : Math.min(usedMs, this.usedMs[first]!);
    for (let k = held; k < end; k++) {
      parent = this.add(slot, chain, local, k, parent);
      // From the newest end, where `add` put it, to the oldest.
      this.unlink(slot, parent);
      this.prependLink(slot, parent);
      this.stamp[parent] = --this.oldStamps;
      this.usedMs[parent] = used;
    }
    this.counters.stored += end - held;
    return true;
  }

  /**
   * The slot's predictions newest first, as runs of blocks each the child of the one
   * before (a chain as one request used it), at most `maxBlocks` in all: `visit` gets a
   * run's anchor (the parent of its first block, held earlier in this order; none: the
   * root), its local hashes (valid during the call), and when its first block was used.
   */
  forEachRun(
    slot: number,
    maxBlocks: number,
    runBlocksMax: number,
    visit: (
      anchored: boolean,
      anchorHi: number,
      anchorLo: number,
      local: Uint32Array,
      count: number,
      usedMs: number,
    ) => void,
  ): void {
    if (this.enabled[slot] !== 1) return;
    let left = maxBlocks;
    let e = this.newest[slot]!;
    while (e !== NONE && left > 0) {
      const parent = this.parentOf[e]!;
      const usedMs = this.usedMs[e]!;
      let count = 0;
      let previous = parent;
      while (e !== NONE && this.parentOf[e] === previous && count < runBlocksMax && count < left) {
        if (2 * count + 2 > this.scratch.length) this.growScratch(2 * count + 2);
        this.scratch[2 * count] = this.localHi[e]!;
        this.scratch[2 * count + 1] = this.localLo[e]!;
        count++;
        previous = e;
        e = this.older[e]!;
      }
      const anchored = parent !== NONE;
      visit(
        anchored,
        anchored ? this.hashHi[parent]! : 0,
        anchored ? this.hashLo[parent]! : 0,
        this.scratch,
        count,
        usedMs,
      );
      left -= count;
    }
  }

  /** LRU stamp of a predicted block (its last use), or -1 when the slot does not hold it. */
  stampOf(slot: number, hi: number, lo: number): number {
    const entry = this.table.get(slot, hi, lo);
    return entry < 0 ? -1 : this.stamp[entry]!;
  }

  /**
   * The engine did not hold a block last used at `stamp`: in an LRU cache every block
   * used no later is gone too. Removes them; returns how many.
   */
  purge(slot: number, stamp: number): number {
    if (this.enabled[slot] !== 1) return 0;
    let purged = 0;
    let n = 0;
    for (let entry = this.oldest[slot]!; entry !== NONE && this.stamp[entry]! <= stamp; ) {
      const next = this.newer[entry]!;
      n = this.release(entry, n);
      purged++;
      entry = next;
    }
    this.flushRemovals(slot, n);
    this.counters.purged += purged;
    return purged;
  }

  /**
   * A shortfall: the capacity moves toward the blocks left (at most SHRINK_STEP of it
   * per call, never below CAPACITY_FLOOR_BLOCKS); a worker without one gets what is left.
   */
  shrink(slot: number): void {
    if (this.enabled[slot] !== 1) return;
    const left = this.held[slot]!;
    const capacity = this.capacity[slot]!;
    const target = capacity > 0 ? Math.max(left, Math.round(capacity * (1 - SHRINK_STEP))) : left;
    this.capacity[slot] = Math.min(Math.max(CAPACITY_FLOOR_BLOCKS, target), this.options.maxBlocks);
    this.fit(slot);
  }

  /** The engine held more than predicted: a learned capacity grows back (never past the configured one). */
  grow(slot: number): void {
    if (this.enabled[slot] !== 1) return;
    const capacity = this.capacity[slot]!;
    if (capacity === 0) return;
    const bound = this.configured[slot]! > 0 ? this.configured[slot]! : this.options.maxBlocks;
    this.capacity[slot] = Math.min(bound, Math.ceil(capacity * (1 + GROW_STEP)));
  }

  /** Expires blocks past the TTL on workers without a known capacity (O(workers + expired)). */
  expire(): void {
    const cutoff = this.options.now() - this.options.ttlMs;
    for (let slot = 0; slot < this.enabled.length; slot++) {
      if (this.enabled[slot] !== 1 || this.capacity[slot]! > 0) continue;
      this.counters.expired += this.releaseUsedBy(slot, cutoff);
    }
  }

  /** Removes the slot's blocks last used at `cutoffMs` or before (oldest first); returns how many. */
  private releaseUsedBy(slot: number, cutoffMs: number): number {
    let n = 0;
    for (let e = this.oldest[slot]!; e !== NONE && this.usedMs[e]! <= cutoffMs; ) {
      const next = this.newer[e]!;
      n = this.release(e, n);
      e = next;
    }
    this.flushRemovals(slot, n);
    return n;
  }

  /** O(N) check: links, counts and the table agree; every predicted set is prefix-ordered by stamp. */
  verify(): void {
    let total = 0;
    for (let slot = 0; slot < this.enabled.length; slot++) {
      let count = 0;
      let previous = -Infinity;
      let previousMs = -Infinity;
      for (let e = this.oldest[slot]!; e !== NONE; e = this.newer[e]!) {
        assert(this.slotOf[e] === slot, "entry on another slot's list");
        assert(this.stamp[e]! > previous, "LRU list out of stamp order");
        assert(this.usedMs[e]! >= previousMs, "LRU list out of use-time order");
        previousMs = this.usedMs[e]!;
        assert(this.table.get(slot, this.hashHi[e]!, this.hashLo[e]!) === e, "entry not in table");
        const parent = this.parentOf[e]!;
        assert(
          parent === NONE || (this.slotOf[parent] === slot && this.stamp[parent]! > this.stamp[e]!),
          "a block's parent is gone or older than the block",
        );
        previous = this.stamp[e]!;
        count++;
      }
      assert(count === this.held[slot], `slot ${slot} holds ${this.held[slot]}, lists ${count}`);
      total += count;
    }
    assert(total === this.live && this.table.size === this.live, "entry count");
  }

  /**
   * How many leading blocks of a chain the slot holds: a predicted set is closed under
   * prefixes (a block's parent is more recent, so it stays while the block does), so
   * the held ones are a prefix, found by bisection.
   */
  private depthOf(slot: number, chain: Uint32Array, count: number): number {
    let low = 0;
    let high = count;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.table.get(slot, chain[2 * mid]!, chain[2 * mid + 1]!) >= 0) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  /**
   * Stores blocks [from, to) of a chain after the entry `parent` (NONE: the root) in the
   * index and as entries; returns the deepest block's entry (`parent` when none).
   */
  private storeRun(
    slot: number,
    parent: number,
    local: Uint32Array,
    chain: Uint32Array,
    from: number,
    to: number,
  ): number {
    if (from >= to) return parent;
    const hasParent = parent !== NONE;
    const parentHi = hasParent ? this.hashHi[parent]! : 0;
    const parentLo = hasParent ? this.hashLo[parent]! : 0;
    this.options.sink.storeAt(slot, hasParent, parentHi, parentLo, chain, local, to - from, from);
    let entry = parent;
    for (let k = from; k < to; k++) entry = this.add(slot, chain, local, k, entry);
    this.counters.stored += to - from;
    return entry;
  }

  /** Refreshes an entry and every block before it in its chain, deepest first. */
  private touchUp(entry: number, now: number): void {
    for (let e = entry; e !== NONE; e = this.parentOf[e]!) this.touch(e, now);
  }

  /** The sequence hashes of `count` blocks after the anchor (or from the root), in the scratch. */
  private chainAfter(
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): Uint32Array {
    this.growScratch(2 * (count + 1));
    const scratch = this.scratch;
    if (!anchored) {
      scratch.set(local.subarray(0, 2 * count));
      chainHashes(scratch, count, scratch);
      return scratch;
    }
    // The chain goes on from the anchor's sequence hash: seq[i] = H(seq[i - 1], local[i]).
    scratch[0] = anchorHi;
    scratch[1] = anchorLo;
    scratch.set(local.subarray(0, 2 * count), 2);
    chainHashes(scratch, count + 1, scratch);
    return scratch.subarray(2);
  }

  /** Evicts from the LRU end down to the capacity (or the hard bound). */
  private fit(slot: number): void {
    const capacity = this.capacity[slot]! > 0 ? this.capacity[slot]! : this.options.maxBlocks;
    let n = 0;
    let evicted = 0;
    while (this.held[slot]! > capacity) {
      n = this.release(this.oldest[slot]!, n);
      evicted++;
    }
    this.flushRemovals(slot, n);
    this.counters.evicted += evicted;
  }

  /** Block `k` of a chain as a new entry (the newest of its slot, not stamped yet) after `parent`; returns it. */
  private add(
    slot: number,
    chain: Uint32Array,
    local: Uint32Array,
    k: number,
    parent: number,
  ): number {
    const hi = chain[2 * k]!;
    const lo = chain[2 * k + 1]!;
    if (this.freeEntry === NONE && this.top === this.hashHi.length) this.grow2x();
    let entry: number;
    if (this.freeEntry !== NONE) {
      entry = this.freeEntry;
      this.freeEntry = this.newer[entry]!;
    } else {
      entry = this.top++;
    }
    this.hashHi[entry] = hi;
    this.hashLo[entry] = lo;
    this.localHi[entry] = local[2 * k]!;
    this.localLo[entry] = local[2 * k + 1]!;
    this.slotOf[entry] = slot;
    this.parentOf[entry] = parent;
    this.older[entry] = NONE;
    this.newer[entry] = NONE;
    this.stamp[entry] = 0;
    this.table.set(slot, hi, lo, entry);
    this.append(slot, entry);
    this.held[slot]!++;
    this.live++;
    return entry;
  }

  /** Moves an entry to its slot's newest end with a new stamp. */
  private touch(entry: number, now: number): void {
    const slot = this.slotOf[entry]!;
    if (this.stamp[entry]! > 0) this.counters.refreshed++;
    this.unlink(slot, entry);
    this.append(slot, entry);
    this.stamp[entry] = ++this.stamps;
    this.usedMs[entry] = now;
  }

  /** Unlists an entry and queues its hash for removal at `n`; returns the next position. */
  private release(entry: number, n: number): number {
    const slot = this.slotOf[entry]!;
    if (2 * n + 2 > this.removals.length) {
      const grown = new Uint32Array(2 * this.removals.length);
      grown.set(this.removals);
      this.removals = grown;
    }
    this.removals[2 * n] = this.hashHi[entry]!;
    this.removals[2 * n + 1] = this.hashLo[entry]!;
    this.unlink(slot, entry);
    this.table.delete(slot, this.hashHi[entry]!, this.hashLo[entry]!);
    this.slotOf[entry] = NONE;
    this.newer[entry] = this.freeEntry;
    this.freeEntry = entry;
    this.held[slot]!--;
    this.live--;
    return n + 1;
  }

  private flushRemovals(slot: number, n: number): void {
    if (n > 0) this.options.sink.removeAt(slot, this.removals, n, 0);
    if (this.live === 0) this.resetEntries();
  }

  /** Drops every prediction of a slot: the index slot is cleared, the entries freed. */
  private drop(slot: number): void {
    if (this.held[slot]! > 0) this.options.sink.clearAt(slot);
    for (let e = this.oldest[slot]!; e !== NONE; ) {
      const next = this.newer[e]!;
      this.release(e, 0); // the clear removed them from the index already
      e = next;
    }
    if (this.live === 0) this.resetEntries();
    assert(this.held[slot] === 0, "predictions left on a dropped slot");
  }

  private growScratch(words: number): void {
    if (this.scratch.length >= words) return;
    const grown = new Uint32Array(Math.max(words, 2 * this.scratch.length));
    grown.set(this.scratch);
    this.scratch = grown;
  }

  /** Links an entry at its slot's oldest end. */
  private prependLink(slot: number, entry: number): void {
    const first = this.oldest[slot]!;
    this.newer[entry] = first;
    this.older[entry] = NONE;
    if (first === NONE) this.newest[slot] = entry;
    else this.older[first] = entry;
    this.oldest[slot] = entry;
  }

  private append(slot: number, entry: number): void {
    const last = this.newest[slot]!;
    this.older[entry] = last;
    this.newer[entry] = NONE;
    if (last === NONE) this.oldest[slot] = entry;
    else this.newer[last] = entry;
    this.newest[slot] = entry;
  }

  private unlink(slot: number, entry: number): void {
    const before = this.older[entry]!;
    const after = this.newer[entry]!;
    if (before === NONE) {
      if (this.oldest[slot] === entry) this.oldest[slot] = after;
    } else this.newer[before] = after;
    if (after === NONE) {
      if (this.newest[slot] === entry) this.newest[slot] = before;
    } else this.older[after] = before;
    this.older[entry] = NONE;
    this.newer[entry] = NONE;
  }

  private ensureSlots(count: number): void {
    if (this.enabled.length >= count) return;
    let capacity = Math.max(8, this.enabled.length);
    while (capacity < count) capacity *= 2;
    const grow = <T extends Int32Array | Float64Array | Uint8Array>(old: T, fill: number): T => {
      const grown = new (old.constructor as { new (n: number): T })(capacity);
      grown.fill(fill);
      grown.set(old);
      return grown;
    };
    this.oldest = grow(this.oldest, NONE);
    this.newest = grow(this.newest, NONE);
    this.held = grow(this.held, 0);
    this.capacity = grow(this.capacity, 0);
    this.configured = grow(this.configured, 0);
    this.enabled = grow(this.enabled, 0);
  }

  private grow2x(): void {
    const capacity = 2 * this.hashHi.length;
    const grow = <T extends Uint32Array | Int32Array | Float64Array>(old: T): T => {
      const grown = new (old.constructor as { new (n: number): T })(capacity);
      grown.set(old);
      return grown;
    };
    this.hashHi = grow(this.hashHi);
    this.hashLo = grow(this.hashLo);
    this.localHi = grow(this.localHi);
    this.localLo = grow(this.localLo);
    this.slotOf = grow(this.slotOf);
    this.parentOf = grow(this.parentOf);
    this.stamp = grow(this.stamp);
    this.usedMs = grow(this.usedMs);
    this.older = grow(this.older);
    this.newer = grow(this.newer);
  }

  /** No block predicted: the entry arrays go back to their first size. */
  private resetEntries(): void {
    this.top = 0;
    this.freeEntry = NONE;
    if (this.hashHi.length === INITIAL_ENTRIES) return;
    this.hashHi = new Uint32Array(INITIAL_ENTRIES);
    this.hashLo = new Uint32Array(INITIAL_ENTRIES);
    this.localHi = new Uint32Array(INITIAL_ENTRIES);
    this.localLo = new Uint32Array(INITIAL_ENTRIES);
    this.slotOf = new Int32Array(INITIAL_ENTRIES);
    this.parentOf = new Int32Array(INITIAL_ENTRIES);
    this.stamp = new Float64Array(INITIAL_ENTRIES);
    this.usedMs = new Float64Array(INITIAL_ENTRIES);
    this.older = new Int32Array(INITIAL_ENTRIES);
    this.newer = new Int32Array(INITIAL_ENTRIES);
  }
}
