/**
 * The index packed as operation words: what `dump()` says, as u32 words in one typed
 * array (no strings, no per-block objects), read straight from a backend's DumpSource.
 * Warm-restart snapshots store these words (src/state/snapshot.ts documents the layout):
 *
 *   1 (stored) · worker ref · dp rank · has parent · parent hi · parent lo · n · n × (ext hi, ext lo) · n × (local hi, local lo)
 *   2 (removed) · worker ref · dp rank · n · n × (ext hi, ext lo)
 *   4 (stored in a lower tier) · worker ref · dp rank · tier · has parent · parent sequence hi · lo · n · n × (ext hi, ext lo) · n × (local hi, local lo)
 *
 * Same events as dumpEvents (dump.ts): per worker its held blocks in depth-first order,
 * chained while each block's parent is the previous one; a block below blocks the
 * worker does not hold is stored through them under placeholder hashes that a removed
 * event then drops; a present worker with no blocks is stored and emptied again. A block
 * held in more than one copy is then stored again once per extra copy (a store of a held
 * block is one more copy), so the words need no kind of their own for copies. After
 * every worker, the lower tiers' blocks, one operation 4 each (and one more per extra
 * copy), under their parent's sequence hash: no parent needs to be held to restore them.
 *
 * Two phases, so neither a dump nor a periodic snapshot stalls the event loop:
 *   freeze        `KvIndex.freeze()`: a FreezeJob that copies the index in slices of
 *                 words (crtc: its node, block and lookup arrays; the others: their
 *                 block walk, `freezeByWalk`, in one step). The copy is one instant's
 *                 state because the caller pauses writes from its first slice to its
 *                 last (src/index/write-pause.ts); nothing of the index is read after;
 *   IndexPacker   turns the copy into words, `step(budget)` at a time: linking the
 *                 copied tree in slices of units, ranking it, then each worker (filling
 *                 its order, a radix sort in passes, its emission: all split by the budget).
 */
import { fail } from "./assert";
import { u64 } from "../util/u64";

/** What an index backend gives `packIndex` (and through it, a dump) to read. */
export interface DumpSource {
  /** Block keys are integers in [0, blockKeyLimit). */
  readonly blockKeyLimit: number;
  /** Visits every block, each after its parent (parent -1 = the root). */
  forEachBlock(visit: (key: number, parent: number, hi: number, lo: number) => void): void;
  /**
   * Visits every present worker with its held blocks: external hashes (pairs) and keys,
   * and its blocks held in more than one copy as (key, copies beyond the first) pairs,
   * in arrays of its own that the index does not touch again.
   */
  forEachWorker(
    visit: (
      workerId: bigint,
      dpRank: number,
      external: Uint32Array,
      keys: Uint32Array,
      count: number,
      copies: Uint32Array,
    ) => void,
  ): void;
  /** The lower tiers' held blocks, read now. */
  readonly tiers: readonly FrozenTierBlocks[];
}

/** One (worker, lower tier)'s held blocks, as a dump packs them. */
export interface FrozenTierBlocks {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly tier: number;
  /** TIER_BLOCK_WORDS words per block: ext hi, lo, local hi, lo, has parent, parent sequence hi, lo, extra copies. */
  readonly words: Uint32Array;
}

export const TIER_BLOCK_WORDS = 8;
export const OP_STORED = 1;
export const OP_REMOVED = 2;
/** 3 is a snapshot's active request (src/state/snapshot.ts). */
export const OP_TIER_STORED = 4;
const ROOT_KEY = -1;

/**
 * A copy of an index, read later in slices. Blocks are walked in units (crtc: tree
 * nodes), in any order, each block with its parent key (-1 = the root); workers as in
 * DumpSource.
 */
export interface FrozenIndex {
  readonly blockKeyLimit: number;
  readonly units: number;
  /** Visits the blocks of units from `from` on until at least `budget` blocks (or the end); returns the next unit. */
  forEachBlockFrom(
    from: number,
    budget: number,
    visit: (key: number, parent: number, hi: number, lo: number) => void,
  ): number;
  /** Present workers, each read out of the copy in slices. */
  readonly workers: readonly FrozenWorker[];
  /** The lower tiers' held blocks (copied at the freeze). */
  readonly tiers: readonly FrozenTierBlocks[];
}

export interface FrozenWorker {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Blocks held. */
  readonly count: number;
  /** Blocks held in more than one copy: (key, copies beyond the first) pairs, read at the freeze. */
  readonly copies: Uint32Array;
  /**
   * Visits the held blocks (external hash, block key) found in units `from` to
   * `from + budget` of the worker's storage (crtc: its lookup table's slots); returns
   * the next unit, or -1 once every unit was read.
   */
  readHeld(
    from: number,
    budget: number,
    visit: (extHi: number, extLo: number, key: number) => void,
  ): number;
}

/**
 * Taking a FrozenIndex in slices: `step(words)` copies about that many more words.
 * The copy is consistent only if the index is not written from the first step to the
 * last (src/index/write-pause.ts pauses the writes).
 */
export interface FreezeJob {
  /** Copies about `words` more words; true once the copy is complete. */
  step(words: number): boolean;
  /** The copy; only once `step` returned true. */
  result(): FrozenIndex;
}

/** A FreezeJob already done (a backend whose copy is one walk). */
export function frozenAtOnce(take: () => FrozenIndex): FreezeJob {
  let frozen: FrozenIndex | null = null;
  return {
    step: () => {
      frozen ??= take();
      return true;
    },
    result: () => frozen ?? fail("the copy is not complete"),
  };
}

/** Runs a FreezeJob to its end at once (shutdown, tests, dump()). */
export function freezeNow(job: FreezeJob): FrozenIndex {
  while (!job.step(Infinity));
  return job.result();
}

/** Copies of the leading `lengths[i]` words of each source array, made `step(words)` at a time. */
export class SlicedCopy {
  readonly copies: Uint32Array[];
  private array = 0;
  private at = 0;

  constructor(
    private readonly sources: readonly Uint32Array[],
    private readonly lengths: readonly number[],
  ) {
    // Zeroed pages come from the system lazily: allocating is cheap, the copy is the work.
    this.copies = lengths.map((length) => new Uint32Array(length));
  }

  step(words: number): boolean {
    let budget = words;
    while (this.array < this.sources.length && budget > 0) {
      const length = this.lengths[this.array]!;
      const end = Math.min(length, this.at + budget);
      this.copies[this.array]!.set(this.sources[this.array]!.subarray(this.at, end), this.at);
      budget -= end - this.at;
      this.at = end;
      if (this.at === length) {
        this.array++;
        this.at = 0;
      }
    }
    return this.array === this.sources.length;
  }
}

/** A FrozenIndex from any backend's DumpSource: its whole block walk is the copy (one synchronous step). */
export function freezeByWalk(source: DumpSource): FrozenIndex {
  const limit = source.blockKeyLimit;
  const parentOf = new Int32Array(limit);
  const hiOf = new Uint32Array(limit);
  const loOf = new Uint32Array(limit);
  const present = new Uint8Array(limit);
  source.forEachBlock((key, parent, hi, lo) => {
    parentOf[key] = parent;
    hiOf[key] = hi;
    loOf[key] = lo;
    present[key] = 1;
  });
  const workers: FrozenWorker[] = [];
  source.forEachWorker((workerId, dpRank, external, keys, count, copies) =>
    workers.push({
      workerId,
      dpRank,
      count,
      copies,
      readHeld(from, budget, visit) {
        const to = Math.min(count, from + budget);
        for (let i = from; i < to; i++) visit(external[2 * i]!, external[2 * i + 1]!, keys[i]!);
        return to === count ? -1 : to;
      },
    }),
  );
  return {
    blockKeyLimit: limit,
    units: limit,
    tiers: source.tiers,
    forEachBlockFrom(from, budget, visit) {
      const to = Math.min(limit, from + budget);
      for (let key = from; key < to; key++)
        if (present[key] === 1) visit(key, parentOf[key]!, hiOf[key]!, loOf[key]!);
      return to;
    },
    workers,
  };
}

/** The frozen copy as the packer reads it: the block tree (parent, local hash, child links) and each worker's blocks. */
class Capture {
  readonly parentOf: Int32Array;
  readonly hiOf: Uint32Array;
  readonly loOf: Uint32Array;
  /** First child of each key plus one, `firstChild[limit]` the root's; 0 = none (no fill). */
  readonly firstChild: Uint32Array;
  /** Next sibling plus one; 0 = none. */
  readonly nextSibling: Uint32Array;
  readonly workers: CapturedWorker[] = [];
  /** Distinct worker ids; a worker ref in the words indexes this list. */
  readonly workerIds: bigint[] = [];
  private unit = 0;
  private readonly refs = new Map<bigint, number>();
  private readonly link: (key: number, parent: number, hi: number, lo: number) => void;

  constructor(private readonly frozen: FrozenIndex) {
    const limit = frozen.blockKeyLimit;
    this.parentOf = new Int32Array(limit);
    this.hiOf = new Uint32Array(limit);
    this.loOf = new Uint32Array(limit);
    this.firstChild = new Uint32Array(limit + 1); // index `limit` is the root
    this.nextSibling = new Uint32Array(limit);
    const { parentOf, hiOf, loOf, firstChild, nextSibling } = this;
    this.link = (key, parent, hi, lo) => {
      parentOf[key] = parent;
      hiOf[key] = hi;
      loOf[key] = lo;
      const slot = parent === ROOT_KEY ? limit : parent;
      nextSibling[key] = firstChild[slot]!;
      firstChild[slot] = key + 1;
    };
  }

  /** Links about `budget` blocks, then reads workers (about `budget` blocks' worth per step); true once all are in. */
  step(budget: number): boolean {
    this.unit = this.frozen.forEachBlockFrom(this.unit, Math.max(1, budget), this.link);
    if (this.unit < this.frozen.units) return false;
    // Then the workers' refs (their blocks are read as each is packed).
    for (const frozen of this.frozen.workers) {
      let ref = this.refs.get(frozen.workerId);
      if (ref === undefined) {
        this.refs.set(frozen.workerId, (ref = this.workerIds.length));
        this.workerIds.push(frozen.workerId);
      }
      this.workers.push({ ref, dpRank: frozen.dpRank, frozen });
    }
    return true;
  }

  /** The ref of a present worker's id. */
  refOf(workerId: bigint): number {
    const ref = this.refs.get(workerId);
    if (ref === undefined) fail("a lower tier names a worker that is not present");
    return ref;
  }
}

interface CapturedWorker {
  readonly ref: number;
  readonly dpRank: number;
  readonly frozen: FrozenWorker;
}

/** Ranks of every key in a depth-first pre-order walk from the root, in steps (unvisited keys: rank 0, never read). */
class Preorder {
  readonly rank: Uint32Array;
  readonly keyAtRank: Uint32Array;
  private readonly stack: Int32Array;
  private top = 0;
  private next = 0;

  /** Child links as Capture keeps them (key + 1, 0 = none). */
  constructor(
    private readonly firstChild: Uint32Array,
    private readonly nextSibling: Uint32Array,
  ) {
    const limit = nextSibling.length;
    this.rank = new Uint32Array(limit);
    this.keyAtRank = new Uint32Array(limit);
    this.stack = new Int32Array(limit);
    for (let child = firstChild[limit]!; child !== 0; child = nextSibling[child - 1]!) {
      this.stack[this.top++] = child - 1;
    }
  }

  /** Ranks about `budget` keys; true when done. */
  step(budget: number): boolean {
    const { firstChild, nextSibling, stack, rank, keyAtRank } = this;
    for (let n = 0; n < budget && this.top > 0; n++) {
      const key = stack[--this.top]!;
      keyAtRank[this.next] = key;
      rank[key] = this.next++;
      for (let child = firstChild[key]!; child !== 0; child = nextSibling[child - 1]!) {
        stack[this.top++] = child - 1;
      }
    }
    return this.top === 0;
  }
}

/** Packs a frozen index into words, in steps; `words()` once `step` returns true. */
export class IndexPacker {
  private capture: Capture | null = null;
  private captured = false;
  private preorder: Preorder | null = null;
  private out = new Uint32Array(0);
  private at = 0;
  private worker = 0;
  /** The current worker's held keys' ranks (null: not started): filled, then sorted in place. */
  private order: Uint32Array | null = null;
  private filled = 0;
  /** Next unit of the current worker's held blocks to read; -1 once all are read. */
  private cursor = -1;
  private sorted = false;
  private readonly sort = new SlicedSort();
  private next = 0;
  /** Per key: stamp of the worker holding it, and its external hash under that worker. */
  private heldStamp = new Uint32Array(0);
  private extHi = new Uint32Array(0);
  private extLo = new Uint32Array(0);
  /** Word index of the open stored event's count, and its last key (chaining). */
  private openCountAt = -1;
  private openLast = ROOT_KEY - 1;
  private placeholders: Placeholders | null = null;
  /** Pre-order rank of each block key and the key at each rank. */
  private rank: Uint32Array = new Uint32Array(0);
  private keyAtRank: Uint32Array = new Uint32Array(0);
  private ranked = false;
  /** Arrays written at random keys, first touched in slices (page faults) before use. */
  private touching: PageToucher | null = null;
  private touched = false;
  /** The lower tiers' progress: which frozen (worker, tier), and the next word in it. */
  private tier = 0;
  private tierAt = 0;

  constructor(private readonly frozen: FrozenIndex) {}

  /** Worker ids by ref (complete once `step` returned true). */
  get workerIds(): readonly bigint[] {
    return this.capture?.workerIds ?? [];
  }

  /**
   * Does about `budget` blocks of work (linking the copied tree, ranking it, packing a
   * worker's blocks); true when everything is packed.
   */
  step(budget: number): boolean {
    // Phases, each its own steps: allocate the copy's links, link, allocate the output, rank, pack.
    if (this.capture === null) {
      this.capture = new Capture(this.frozen);
      return false;
    }
    if (!this.captured) {
      this.captured = this.capture.step(budget);
      return false;
    }
    if (this.preorder === null) {
      this.allocate();
      this.preorder = new Preorder(this.capture.firstChild, this.capture.nextSibling);
      this.touching = new PageToucher([this.preorder.rank, this.heldStamp, this.extHi, this.extLo]);
      return false;
    }
    if (!this.touched) {
      this.touched = this.touching!.step(64 * budget);
      return false;
    }
    if (!this.ranked) {
      this.ranked = this.preorder.step(4 * budget);
      ({ rank: this.rank, keyAtRank: this.keyAtRank } = this.preorder);
      return false;
    }
    const workers = this.capture.workers;
    let done = 0;
    while (this.worker < workers.length && done < budget) {
      const worker = workers[this.worker]!;
      if (this.order === null) this.begin(worker);
      const order = this.order!;
      const left = Math.max(1, budget - done);
      if (this.cursor >= 0) {
        done += this.fill(worker, left);
        continue;
      }
      if (!this.sorted) {
        const [finished, work] = this.sort.step(order, left);
        this.sorted = finished;
        done += work;
        continue;
      }
      const end = Math.min(order.length, this.next + left);
      for (let i = this.next; i < end; i++) this.emit(worker, this.keyAtRank[order[i]!]!);
      done += end - this.next;
      this.next = end;
      if (this.next === order.length) this.finish(worker);
    }
    if (this.worker < workers.length) return false;
    return this.packTiers(Math.max(1, budget - done));
  }

  /** The lower tiers' blocks, about `budget` at a time (after every worker); true when all are in. */
  private packTiers(budget: number): boolean {
    const tiers = this.frozen.tiers;
    const capture = this.capture!;
    for (let done = 0; this.tier < tiers.length && done < budget; ) {
      const { workerId, dpRank, tier, words } = tiers[this.tier]!;
      const ref = capture.refOf(workerId);
      const end = Math.min(words.length, this.tierAt + TIER_BLOCK_WORDS * (budget - done));
      for (let at = this.tierAt; at < end; at += TIER_BLOCK_WORDS) {
        for (let copy = words[at + 7]!; copy >= 0; copy--) {
          this.reserve(12);
          const out = this.out;
          out.set(
            [OP_TIER_STORED, ref, dpRank, tier, words[at + 4]!, words[at + 5]!, words[at + 6]!, 1],
            this.at,
          );
          out.set(words.subarray(at, at + 4), this.at + 8);
          this.at += 12;
        }
      }
      done += (end - this.tierAt) / TIER_BLOCK_WORDS;
      this.tierAt = end;
      if (end === words.length) {
        this.tier++;
        this.tierAt = 0;
      }
    }
    return this.tier === tiers.length;
  }

  private allocate(): void {
    const capture = this.capture!;
    const limit = capture.parentOf.length;
    this.heldStamp = new Uint32Array(limit);
    this.extHi = new Uint32Array(limit);
    this.extLo = new Uint32Array(limit);
    let pairs = 0;
    for (const worker of capture.workers) pairs += worker.frozen.count;
    // Room for every pair plus a header per 14 blocks: long chains never regrow (a regrow is one big copy).
    this.out = new Uint32Array(4 * pairs + (pairs >>> 1) + 64);
  }

  /** The packed words (a view; valid once `step` returned true). */
  words(): Uint32Array {
    return this.out.subarray(0, this.at);
  }

  /** The packed words followed by `more`, as a view (the output usually has room: no copy). */
  wordsWith(more: Uint32Array): Uint32Array {
    this.reserve(more.length);
    this.out.set(more, this.at);
    return this.out.subarray(0, this.at + more.length);
  }

  private begin(worker: CapturedWorker): void {
    this.order = new Uint32Array(worker.frozen.count);
    this.filled = 0;
    this.cursor = 0;
    this.sorted = false;
    this.next = 0;
    this.openCountAt = -1;
    this.placeholders = null;
  }

  /** Reads about `budget` units of the worker's held blocks into the order; returns the units read. */
  private fill(worker: CapturedWorker, budget: number): number {
    const from = this.cursor;
    this.cursor = worker.frozen.readHeld(from, budget, this.fillOne);
    const order = this.order!;
    if (this.cursor < 0 && this.filled < order.length) this.order = order.subarray(0, this.filled);
    return this.cursor < 0 ? budget : this.cursor - from;
  }

  private readonly fillOne = (extHi: number, extLo: number, key: number): void => {
    this.heldStamp[key] = this.worker + 1;
    this.extHi[key] = extHi;
    this.extLo[key] = extLo;
    this.order![this.filled++] = this.rank[key]!;
  };

  private finish(worker: CapturedWorker): void {
    this.closeOpen();
    // Extra copies: the block stored again, once per copy (a store of a held block counts one).
    const copies = worker.frozen.copies;
    for (let i = 0; i < copies.length; i += 2) {
      for (let extra = copies[i + 1]!; extra > 0; extra--) this.emit(worker, copies[i]!);
    }
    this.closeOpen();
    if (this.order!.length === 0) {
      // Present but empty: store one placeholder block and drop it again.
      const [hi, lo] = this.placeholder();
      this.header(OP_STORED, worker, false, 0, 0, 1);
      this.put(hi, lo);
      this.put(0, 0);
      this.header(OP_REMOVED, worker, false, 0, 0, 1);
      this.put(hi, lo);
    }
    this.order = null;
    this.worker++;
  }

  private emit(worker: CapturedWorker, key: number): void {
    const { parentOf, hiOf, loOf } = this.capture!;
    const stamp = this.worker + 1;
    const parent = parentOf[key]!;
    if (this.openCountAt >= 0 && parent === this.openLast) {
      this.appendToOpen(key);
      return;
    }
    this.closeOpen();
    if (parent === ROOT_KEY || this.heldStamp[parent] === stamp) {
      const has = parent !== ROOT_KEY;
      this.header(
        OP_STORED,
        worker,
        has,
        has ? this.extHi[parent]! : 0,
        has ? this.extLo[parent]! : 0,
        0,
      );
      this.openCountAt = this.at - 1;
      this.appendToOpen(key);
      return;
    }
    // A held block below blocks this worker does not hold: store through them.
    const missing: number[] = [];
    let ancestor = parent;
    while (ancestor !== ROOT_KEY && this.heldStamp[ancestor] !== stamp) {
      missing.push(ancestor);
      ancestor = parentOf[ancestor]!;
    }
    missing.reverse();
    const has = ancestor !== ROOT_KEY;
    const n = missing.length + 1;
    this.header(
      OP_STORED,
      worker,
      has,
      has ? this.extHi[ancestor]! : 0,
      has ? this.extLo[ancestor]! : 0,
      n,
    );
    const holes = missing.map(() => this.placeholder());
    for (const [hi, lo] of holes) this.put(hi, lo);
    this.put(this.extHi[key]!, this.extLo[key]!);
    for (const hole of missing) this.put(hiOf[hole]!, loOf[hole]!);
    this.put(hiOf[key]!, loOf[key]!);
    this.header(OP_REMOVED, worker, false, 0, 0, holes.length);
    for (const [hi, lo] of holes) this.put(hi, lo);
  }

  /**
   * Adds a block to the open stored event. Its external and local pairs are kept
   * interleaved while open and split when it closes, so appending is O(1).
   */
  private appendToOpen(key: number): void {
    this.put(this.extHi[key]!, this.extLo[key]!);
    this.put(this.capture!.hiOf[key]!, this.capture!.loOf[key]!);
    this.out[this.openCountAt]!++;
    this.openLast = key;
  }

  private closeOpen(): void {
    const countAt = this.openCountAt;
    if (countAt < 0) return;
    this.openCountAt = -1;
    const n = this.out[countAt]!;
    const first = countAt + 1;
    // Interleaved (ext, local) pairs -> n ext pairs then n local pairs.
    const pairs = this.out.slice(first, first + 4 * n);
    for (let i = 0; i < n; i++) {
      this.out[first + 2 * i] = pairs[4 * i]!;
      this.out[first + 2 * i + 1] = pairs[4 * i + 1]!;
      this.out[first + 2 * n + 2 * i] = pairs[4 * i + 2]!;
      this.out[first + 2 * n + 2 * i + 1] = pairs[4 * i + 3]!;
    }
  }

  private header(
    kind: number,
    worker: CapturedWorker,
    hasParent: boolean,
    hi: number,
    lo: number,
    n: number,
  ): void {
    this.reserve(kind === OP_STORED ? 7 : 4);
    const out = this.out;
    out[this.at++] = kind;
    out[this.at++] = worker.ref;
    out[this.at++] = worker.dpRank;
    if (kind === OP_STORED) {
      out[this.at++] = hasParent ? 1 : 0;
      out[this.at++] = hi;
      out[this.at++] = lo;
    }
    out[this.at++] = n;
  }

  private put(hi: number, lo: number): void {
    this.reserve(2);
    this.out[this.at++] = hi;
    this.out[this.at++] = lo;
  }

  private reserve(words: number): void {
    if (this.at + words <= this.out.length) return;
    const grown = new Uint32Array(Math.max(this.out.length * 2, this.at + words));
    grown.set(this.out.subarray(0, this.at));
    this.out = grown;
  }

  private placeholder(): [number, number] {
    this.placeholders ??= new Placeholders(this.order!, this.keyAtRank, this.extHi, this.extLo);
    return this.placeholders.next();
  }
}

/**
 * Writes every page of fresh arrays, a slice of words at a time. The arrays that are
 * then written at random keys would otherwise take their page faults (a few µs each)
 * thousands at a time in one step (40 ms for 16K keys at 10M pairs).
 */
class PageToucher {
  private array = 0;
  private at = 0;

  constructor(private readonly arrays: readonly Uint32Array[]) {}

  step(words: number): boolean {
    for (let budget = Math.max(1, words); budget > 0 && this.array < this.arrays.length; ) {
      const array = this.arrays[this.array]!;
      const end = Math.min(array.length, this.at + budget);
      array.fill(0, this.at, end);
      budget -= end - this.at;
      this.at = end;
      if (end === array.length) {
        this.array++;
        this.at = 0;
      }
    }
    return this.array === this.arrays.length;
  }
}

/** Below this many values a sort is one step (a native sort of 8K values: well under 1 ms). */
const RADIX_MIN = 8192;
const DIGIT = 1 << 16;

/**
 * Sorts u32 values in place, in steps of about `budget` values: an LSD radix sort on
 * two 16-bit digits (a counting pass for both, then one scatter pass per digit), so a
 * worker holding millions of blocks is never one long step. Reused across arrays.
 */
class SlicedSort {
  private phase = 0; // 0: counting, 1: scatter by the low digit, 2: by the high digit
  private at = 0;
  private readonly low = new Uint32Array(DIGIT);
  private readonly high = new Uint32Array(DIGIT);
  private temp = new Uint32Array(0);

  /** One step over `values` (the same array until it is done); returns [done, values handled]. */
  step(values: Uint32Array, budget: number): [boolean, number] {
    const n = values.length;
    if (n < RADIX_MIN) {
      values.sort();
      return [true, n];
    }
    const from = this.at;
    const end = Math.min(n, from + budget);
    const { low, high } = this;
    if (this.phase === 0) {
      if (from === 0) {
        low.fill(0);
        high.fill(0);
        if (this.temp.length < n) this.temp = new Uint32Array(n);
      }
      for (let i = from; i < end; i++) {
        low[values[i]! & 0xffff]!++;
        high[values[i]! >>> 16]!++;
      }
    } else if (this.phase === 1) {
      const temp = this.temp;
      for (let i = from; i < end; i++) temp[low[values[i]! & 0xffff]!++] = values[i]!;
    } else {
      const temp = this.temp;
      for (let i = from; i < end; i++) values[high[temp[i]! >>> 16]!++] = temp[i]!;
    }
    this.at = end;
    if (end < n) return [false, end - from];
    if (this.phase === 0) {
      startsOf(low);
      startsOf(high);
    }
    this.at = 0;
    this.phase = (this.phase + 1) % 3;
    return [this.phase === 0, end - from];
  }
}

/** Counts per digit -> the first position of each digit (exclusive prefix sums), in place. */
function startsOf(counts: Uint32Array): void {
  let sum = 0;
  for (let d = 0; d < counts.length; d++) {
    const count = counts[d]!;
    counts[d] = sum;
    sum += count;
  }
}

/** Packs a frozen index at once (shutdown, tests). */
export function packIndex(frozen: FrozenIndex): {
  words: Uint32Array;
  workerIds: readonly bigint[];
} {
  const packer = new IndexPacker(frozen);
  while (!packer.step(Infinity));
  return { words: packer.words(), workerIds: packer.workerIds };
}

/** Hashes no held block of one worker uses, counting down from 2^64 - 1 (built on first use: most workers need none). */
class Placeholders {
  private held: Set<bigint> | null = null;
  private value = (1n << 64n) - 1n;

  /** The worker's held blocks: ranks in `order`, their keys by rank, external hashes by key. */
  constructor(
    private readonly order: Uint32Array,
    private readonly keyAtRank: Uint32Array,
    private readonly extHi: Uint32Array,
    private readonly extLo: Uint32Array,
  ) {}

  next(): [number, number] {
    if (this.held === null) {
      this.held = new Set();
      for (const rank of this.order) {
        const key = this.keyAtRank[rank]!;
        this.held.add(u64(this.extHi[key]!, this.extLo[key]!));
      }
    }
    while (this.held.has(this.value)) this.value--;
    const value = this.value--;
    return [Number(value >> 32n), Number(value & 0xffff_ffffn)];
  }
}
