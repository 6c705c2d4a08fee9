/**
 * The index packed as operation words: what `dump()` says, as u32 words in one typed
 * array (no strings, no per-block objects), read straight from a backend's DumpSource.
 * Warm-restart snapshots store these words (src/state/snapshot.ts documents the layout):
 *
 *   1 (stored) · worker ref · dp rank · has parent · parent hi · parent lo · n · n × (ext hi, ext lo) · n × (local hi, local lo)
 *   2 (removed) · worker ref · dp rank · n · n × (ext hi, ext lo)
 *
 * Same events as dumpEvents (dump.ts): per worker its held blocks in depth-first order,
 * chained while each block's parent is the previous one; a block below blocks the
 * worker does not hold is stored through them under placeholder hashes that a removed
 * event then drops; a present worker with no blocks is stored and emptied again.
 *
 * Two phases, so a periodic snapshot need not stall the event loop:
 *   freeze        `KvIndex.freeze()`: one synchronous copy, the consistent view (crtc:
 *                 a memcpy of its arrays; the others: their block walk, `freezeByWalk`);
 *                 nothing of the index is read after it;
 *   IndexPacker   turns the copy into words, `step(budget)` at a time: linking the
 *                 copied tree in slices of units, ranking it (one step), then each
 *                 worker (its sort is one step, its emission split by the budget).
 */
import type { DumpSource } from "./dump";
import { u64 } from "../util/u64";

export const OP_STORED = 1;
export const OP_REMOVED = 2;
const ROOT_KEY = -1;

/**
 * A copy of an index taken in one synchronous step (crtc: memcpy of its arrays), read
 * later in slices. Blocks are walked in units (crtc: tree nodes), in any order, each
 * block with its parent key (-1 = the root); workers as in DumpSource.
 */
export interface FrozenIndex {
  readonly blockKeyLimit: number;
  readonly units: number;
  /** Visits the blocks of units from `from` on until at least `budget` blocks (or the end); returns the next unit. */
  forEachBlockFrom(from: number, budget: number, visit: (key: number, parent: number, hi: number, lo: number) => void): number;
  /** Present workers; `held()` reads one's blocks out of the copy (a step of its own). */
  readonly workers: readonly FrozenWorker[];
}

export interface FrozenWorker {
  readonly workerId: bigint;
  readonly dpRank: number;
  held(): { external: Uint32Array; keys: Uint32Array; count: number };
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
  source.forEachWorker((workerId, dpRank, external, keys, count) => workers.push({ workerId, dpRank, held: () => ({ external, keys, count }) }));
  return {
    blockKeyLimit: limit,
    units: limit,
    forEachBlockFrom(from, budget, visit) {
      const to = Math.min(limit, from + budget);
      for (let key = from; key < to; key++) if (present[key] === 1) visit(key, parentOf[key]!, hiOf[key]!, loOf[key]!);
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
  /** First child of each key, `firstChild[limit]` the root's; -1 = none. */
  readonly firstChild: Int32Array;
  readonly nextSibling: Int32Array;
  readonly workers: CapturedWorker[] = [];
  /** Distinct worker ids; a worker ref in the words indexes this list. */
  readonly workerIds: bigint[] = [];
  private unit = 0;
  private worker = 0;
  private readonly refs = new Map<bigint, number>();
  private readonly link: (key: number, parent: number, hi: number, lo: number) => void;

  constructor(private readonly frozen: FrozenIndex) {
    const limit = frozen.blockKeyLimit;
    this.parentOf = new Int32Array(limit);
    this.hiOf = new Uint32Array(limit);
    this.loOf = new Uint32Array(limit);
    this.firstChild = new Int32Array(limit + 1).fill(-1); // index `limit` is the root
    this.nextSibling = new Int32Array(limit).fill(-1);
    const { parentOf, hiOf, loOf, firstChild, nextSibling } = this;
    this.link = (key, parent, hi, lo) => {
      parentOf[key] = parent;
      hiOf[key] = hi;
      loOf[key] = lo;
      const slot = parent === ROOT_KEY ? limit : parent;
      nextSibling[key] = firstChild[slot]!;
      firstChild[slot] = key;
    };
  }

  /** Links about `budget` blocks, then reads workers (about `budget` blocks' worth per step); true once all are in. */
  step(budget: number): boolean {
    this.unit = this.frozen.forEachBlockFrom(this.unit, Math.max(1, budget), this.link);
    if (this.unit < this.frozen.units) return false;
    // Then the workers, about `budget` blocks' worth per step.
    for (let done = 0; this.worker < this.frozen.workers.length && done < budget; this.worker++) {
      const { workerId, dpRank } = this.frozen.workers[this.worker]!;
      const { external, keys, count } = this.frozen.workers[this.worker]!.held();
      let ref = this.refs.get(workerId);
      if (ref === undefined) {
        this.refs.set(workerId, ref = this.workerIds.length);
        this.workerIds.push(workerId);
      }
      this.workers.push({ ref, dpRank, external, keys, count });
      done += count;
    }
    return this.worker === this.frozen.workers.length;
  }
}

interface CapturedWorker {
  readonly ref: number;
  readonly dpRank: number;
  readonly external: Uint32Array;
  readonly keys: Uint32Array;
  readonly count: number;
}

/** Ranks of every key in a depth-first pre-order walk from the root, in steps (unvisited keys: rank 0, never read). */
class Preorder {
  readonly rank: Uint32Array;
  readonly keyAtRank: Uint32Array;
  private readonly stack: Int32Array;
  private top = 0;
  private next = 0;

  constructor(private readonly firstChild: Int32Array, private readonly nextSibling: Int32Array) {
    const limit = nextSibling.length;
    this.rank = new Uint32Array(limit);
    this.keyAtRank = new Uint32Array(limit);
    this.stack = new Int32Array(limit);
    for (let key = firstChild[limit]!; key !== -1; key = nextSibling[key]!) this.stack[this.top++] = key;
  }

  /** Ranks about `budget` keys; true when done. */
  step(budget: number): boolean {
    const { firstChild, nextSibling, stack, rank, keyAtRank } = this;
    for (let n = 0; n < budget && this.top > 0; n++) {
      const key = stack[--this.top]!;
      keyAtRank[this.next] = key;
      rank[key] = this.next++;
      for (let child = firstChild[key]!; child !== -1; child = nextSibling[child]!) stack[this.top++] = child;
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
  /** The current worker's held keys' ranks, sorted (null: not started). */
  private order: Uint32Array | null = null;
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
      return false;
    }
    if (!this.ranked) {
      this.ranked = this.preorder.step(4 * budget);
      ({ rank: this.rank, keyAtRank: this.keyAtRank } = this.preorder);
      return false;
    }
    const capture = this.capture;
    const workers = capture.workers;
    let done = 0;
    while (this.worker < workers.length && done < budget) {
      const worker = workers[this.worker]!;
      if (this.order === null) {
        this.begin(worker);
        done += worker.count >>> 3; // the sort
      }
      const order = this.order!;
      const end = Math.min(order.length, this.next + Math.max(1, budget - done));
      for (let i = this.next; i < end; i++) this.emit(worker, this.keyAtRank[order[i]!]!);
      done += end - this.next;
      this.next = end;
      if (this.next === order.length) this.finish(worker);
    }
    return this.worker === workers.length;
  }

  private allocate(): void {
    const capture = this.capture!;
    const limit = capture.parentOf.length;
    this.heldStamp = new Uint32Array(limit);
    this.extHi = new Uint32Array(limit);
    this.extLo = new Uint32Array(limit);
    let pairs = 0;
    for (const worker of capture.workers) pairs += worker.count;
    // Room for every pair plus a header per 14 blocks: long chains never regrow (a regrow is one big copy).
    this.out = new Uint32Array(4 * pairs + (pairs >>> 1) + 64);
  }

  /** The packed words (a view; valid once `step` returned true). */
  words(): Uint32Array {
    return this.out.subarray(0, this.at);
  }

  private begin(worker: CapturedWorker): void {
    const stamp = this.worker + 1;
    const order = new Uint32Array(worker.count);
    for (let i = 0; i < worker.count; i++) {
      const key = worker.keys[i]!;
      this.heldStamp[key] = stamp;
      this.extHi[key] = worker.external[2 * i]!;
      this.extLo[key] = worker.external[2 * i + 1]!;
      order[i] = this.rank[key]!;
    }
    order.sort();
    this.order = order;
    this.next = 0;
    this.openCountAt = -1;
    this.placeholders = null;
  }

  private finish(worker: CapturedWorker): void {
    this.closeOpen();
    if (worker.count === 0) {
      // Present but empty: store one placeholder block and drop it again.
      const [hi, lo] = this.placeholder(worker);
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
      this.header(OP_STORED, worker, has, has ? this.extHi[parent]! : 0, has ? this.extLo[parent]! : 0, 0);
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
    this.header(OP_STORED, worker, has, has ? this.extHi[ancestor]! : 0, has ? this.extLo[ancestor]! : 0, n);
    const holes = missing.map(() => this.placeholder(worker));
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

  private header(kind: number, worker: CapturedWorker, hasParent: boolean, hi: number, lo: number, n: number): void {
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

  private placeholder(worker: CapturedWorker): [number, number] {
    this.placeholders ??= new Placeholders(worker.external, worker.count);
    return this.placeholders.next();
  }
}

/** Packs a frozen index at once (shutdown, tests). */
export function packIndex(frozen: FrozenIndex): { words: Uint32Array; workerIds: readonly bigint[] } {
  const packer = new IndexPacker(frozen);
  while (!packer.step(Infinity));
  return { words: packer.words(), workerIds: packer.workerIds };
}

/** Hashes no held block of one worker uses, counting down from 2^64 - 1 (built on first use: most workers need none). */
class Placeholders {
  private held: Set<bigint> | null = null;
  private value = (1n << 64n) - 1n;

  constructor(private readonly external: Uint32Array, private readonly count: number) {}

  next(): [number, number] {
    if (this.held === null) {
      this.held = new Set();
      for (let i = 0; i < this.count; i++) this.held.add(u64(this.external[2 * i]!, this.external[2 * i + 1]!));
    }
    while (this.held.has(this.value)) this.value--;
    const value = this.value--;
    return [Number(value >> 32n), Number(value & 0xffff_ffffn)];
  }
}
