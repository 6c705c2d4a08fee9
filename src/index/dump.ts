/**
 * dump(): the events that rebuild an equal index (same workers, same held blocks under
 * the same external hashes) when applied in order to a fresh one. Shared by every
 * backend: a backend lists its blocks (parents before children) and each worker's
 * (external hash, block) pairs; this file turns them into stored/removed events.
 *
 * Per worker, held blocks are emitted in depth-first order of the tree, chained into
 * one stored event while each block's parent is the previous block. A held block whose
 * parent the worker does not hold (a descendant kept across a mid-chain removal) is
 * stored through the missing blocks under placeholder hashes, which a removed event
 * then drops: the worker ends up holding exactly the original blocks. Placeholders
 * count down from 2^64 - 1 and skip every hash the worker holds, so they cannot
 * collide with a real block of that worker (and other workers' hashes do not matter:
 * lookups are per worker). A worker present with no blocks is recreated the same way.
 */
import type { IndexOp, RemovedOp, StoredOp } from "./ops";
import { u64, u64String } from "../util/u64";

export interface DumpSource {
  /** Block keys are integers in [0, blockKeyLimit). */
  readonly blockKeyLimit: number;
  /** Visits every block, each after its parent (parent -1 = the root). */
  forEachBlock(visit: (key: number, parent: number, hi: number, lo: number) => void): void;
  /**
   * Visits every present worker with its held blocks: external hashes (pairs) and keys,
   * in arrays of its own that the index does not touch again.
   */
  forEachWorker(
    visit: (workerId: bigint, dpRank: number, external: Uint32Array, keys: Uint32Array, count: number) => void,
  ): void;
}

const ROOT_KEY = -1;

/** Longest stored event a dump writes; a longer chain continues in the next event. */
export const DUMP_CHAIN_BLOCKS_MAX = 4096;
/** Keys handled between two pauses (null steps) of the preparation. */
const STEP_KEYS = 65_536;
const NOT_A_BLOCK = -2;

/** A dump's events, or null: a step of work done without an event (a reader may pause there). */
export type DumpStep = IndexOp | null;

export function dumpEvents(source: DumpSource, blockSize: number): IndexOp[] {
  return collectDump(lazyDumpEvents(source, blockSize));
}

export function collectDump(steps: Iterable<DumpStep>): IndexOp[] {
  const events: IndexOp[] = [];
  for (const step of steps) if (step !== null) events.push(step);
  return events;
}

/**
 * The same events, built as they are read: only the copy of the index is made at the
 * call (so the events describe that instant however the index changes after); ordering
 * the blocks and writing each event happen as the steps are read, so a caller can
 * spread a large dump over many turns.
 */
export function lazyDumpEvents(source: DumpSource, blockSize: number): IterableIterator<DumpStep> {
  const limit = source.blockKeyLimit;
  const parentOf = new Int32Array(limit).fill(NOT_A_BLOCK);
  const hiOf = new Uint32Array(limit);
  const loOf = new Uint32Array(limit);
  const visited = new Int32Array(limit);
  let blocks = 0;
  source.forEachBlock((key, parent, hi, lo) => {
    parentOf[key] = parent;
    hiOf[key] = hi;
    loOf[key] = lo;
    visited[blocks++] = key;
  });
  // forEachWorker hands out fresh arrays: keeping them is the copy of the held pairs.
  const workers: HeldBlocks[] = [];
  source.forEachWorker((workerId, dpRank, external, keys, count) => workers.push({ workerId, dpRank, external, keys, count }));
  return dumpSteps({ parentOf, hiOf, loOf, visited: visited.subarray(0, blocks), limit }, workers, blockSize);
}

interface HeldBlocks {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly external: Uint32Array;
  readonly keys: Uint32Array;
  readonly count: number;
}

interface BlockCopy {
  readonly parentOf: Int32Array;
  readonly hiOf: Uint32Array;
  readonly loOf: Uint32Array;
  /** Block keys in the order forEachBlock visited them (parents first). */
  readonly visited: Int32Array;
  readonly limit: number;
}

function* dumpSteps(copy: BlockCopy, workers: HeldBlocks[], blockSize: number): Generator<DumpStep> {
  const { parentOf, hiOf, loOf, limit } = copy;
  const order = yield* preorder(copy);
  const heldStamp = new Uint32Array(limit);
  const extHi = new Uint32Array(limit);
  const extLo = new Uint32Array(limit);
  let stamp = 0;
  for (const { workerId: workerIdBig, dpRank, external, keys, count } of workers) {
    stamp++;
    const workerId = workerIdBig.toString();
    const held = new Uint32Array(count);
    for (let i = 0; i < count; i++) {
      const key = keys[i]!;
      heldStamp[key] = stamp;
      extHi[key] = external[2 * i]!;
      extLo[key] = external[2 * i + 1]!;
      held[i] = order.rank[key]!;
    }
    held.sort(); // numeric, native: by pre-order rank
    for (let i = 0; i < count; i++) held[i] = order.keyAt[held[i]!]!;
    yield null;
    const placeholders = new Placeholders(external, count);
    const hashOf = (key: number): string => u64String(extHi[key]!, extLo[key]!);
    const localOf = (key: number): string => u64String(hiOf[key]!, loOf[key]!);
    // The stored event being extended while each block's parent is the previous one.
    let open: StoredOp | null = null;
    let openLast = ROOT_KEY - 1;
    for (const key of held) {
      const parent = parentOf[key]!;
      if (open !== null && parent === openLast && open.block_hashes.length < DUMP_CHAIN_BLOCKS_MAX) {
        open.block_hashes.push(hashOf(key));
        open.local_hashes!.push(localOf(key));
        openLast = key;
        continue;
      }
      if (open !== null) yield open;
      open = null;
      if (parent === ROOT_KEY || heldStamp[parent] === stamp) {
        open = stored(workerId, dpRank, parent === ROOT_KEY ? null : hashOf(parent), blockSize);
        open.block_hashes.push(hashOf(key));
        open.local_hashes!.push(localOf(key));
        openLast = key;
        continue;
      }
      // A held block below blocks this worker does not hold: store through them.
      const missing: number[] = [];
      let ancestor = parent;
      while (ancestor !== ROOT_KEY && heldStamp[ancestor] !== stamp) {
        missing.push(ancestor);
        ancestor = parentOf[ancestor]!;
      }
      missing.reverse();
      const event = stored(workerId, dpRank, ancestor === ROOT_KEY ? null : hashOf(ancestor), blockSize);
      const removed: RemovedOp = { op: "removed", worker_id: workerId, dp_rank: dpRank, block_hashes: [] };
      for (const hole of missing) {
        const placeholder = placeholders.next();
        event.block_hashes.push(placeholder);
        event.local_hashes!.push(localOf(hole));
        removed.block_hashes.push(placeholder);
      }
      event.block_hashes.push(hashOf(key));
      event.local_hashes!.push(localOf(key));
      yield event;
      yield removed;
    }
    if (open !== null) yield open;
    if (count === 0) {
      // Present but empty: store one placeholder block and drop it again.
      const placeholder = placeholders.next();
      const event = stored(workerId, dpRank, null, blockSize);
      event.block_hashes.push(placeholder);
      event.local_hashes!.push("0");
      yield event;
      yield { op: "removed", worker_id: workerId, dp_rank: dpRank, block_hashes: [placeholder] };
    }
  }
}

function stored(workerId: string, dpRank: number, parent: string | null, blockSize: number): StoredOp {
  return {
    op: "stored",
    worker_id: workerId,
    dp_rank: dpRank,
    parent_block_hash: parent,
    block_hashes: [],
    local_hashes: [],
    block_size: blockSize,
  };
}

/**
 * Every block's rank in a depth-first pre-order walk from the root, and the block at
 * each rank, in steps of STEP_KEYS keys (a null step between them).
 */
function* preorder(copy: BlockCopy): Generator<null, { rank: Uint32Array; keyAt: Int32Array }> {
  const { parentOf, visited, limit } = copy;
  const firstChild = new Int32Array(limit + 1).fill(-1); // index `limit` is the root
  const nextSibling = new Int32Array(limit).fill(-1);
  for (let i = 0; i < visited.length; i++) {
    const key = visited[i]!;
    const parent = parentOf[key]!;
    const slot = parent === ROOT_KEY ? limit : parent;
    nextSibling[key] = firstChild[slot]!;
    firstChild[slot] = key;
    if (i % STEP_KEYS === STEP_KEYS - 1) yield null;
  }
  const rank = new Uint32Array(limit);
  const keyAt = new Int32Array(visited.length);
  const stack = new Int32Array(visited.length);
  let top = 0;
  for (let key = firstChild[limit]!; key !== -1; key = nextSibling[key]!) stack[top++] = key;
  let next = 0;
  while (top > 0) {
    const key = stack[--top]!;
    keyAt[next] = key;
    rank[key] = next++;
    for (let child = firstChild[key]!; child !== -1; child = nextSibling[child]!) stack[top++] = child;
    if (next % STEP_KEYS === 0) yield null;
  }
  return { rank, keyAt };
}

/** Hashes no held block of one worker uses, counting down from 2^64 - 1. */
class Placeholders {
  private held: Set<bigint> | null = null;
  private value = (1n << 64n) - 1n;

  constructor(private readonly external: Uint32Array, private readonly count: number) {}

  next(): string {
    if (this.held === null) {
      // Built on first use: most workers need no placeholder.
      this.held = new Set();
      for (let i = 0; i < this.count; i++) this.held.add(u64(this.external[2 * i]!, this.external[2 * i + 1]!));
    }
    while (this.held.has(this.value)) this.value--;
    const text = this.value.toString();
    this.value--;
    return text;
  }
}
