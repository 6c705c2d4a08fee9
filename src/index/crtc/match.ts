/**
 * The match walk, the one for every crtc: a private tree (the index's own thread) and
 * the shared tree that readers on other threads walk while the writer thread changes it
 * (./shared.ts). Those readers pass a ReadGuard; the walk then checks what a torn read
 * could break and gives up (false) when a node changes under it. Without a guard every
 * check is skipped: a branch on a constant per call.
 *
 * findMatches: walk the query's local hashes from the root. At the first node the
 * active set is every slot holding the whole edge; a slot holding only a prefix of an
 * edge is scored where its holding ends and never continues. At each later node every
 * active slot is checked against the node's owners for real (no size shortcuts: equal
 * sizes say nothing about equal members); slots that do not hold the whole edge leave
 * and are scored. Allocation-free: membership is a stamp per slot.
 *
 * An edge the query covers is matched by one comparison: the node's end sequence hash
 * against the query's at that depth (both chain the local hashes from the root, so they
 * are equal exactly when the paths are, up to a 64-bit hash collision, the same trust
 * the index already puts in local hashes). Only the edge where the query ends or
 * leaves is compared block by block. A lookup that reads its blocks cold spends most of
 * its time streaming them in (bench/JOURNAL.md, "Edges by their last hash").
 */
import { ChainBuffer } from "../../hash";
import type { LinkTable } from "../link-table";
import type { MatchResult } from "../types";
import { ROOT } from "./nodes";
import type { CrtcTree } from "./tree";

const STAMP_LIMIT = 0xffff_fff0;

export class MatchScratch {
  active = new Uint32Array(64);
  stamp = new Uint32Array(64);
  private tick = 2;
  /** The sequence hashes of a query whose caller passed none. */
  readonly chain = new ChainBuffer();

  ensure(slots: number): void {
    if (this.stamp.length >= slots) return;
    this.active = new Uint32Array(slots);
    this.stamp = new Uint32Array(slots);
    this.tick = 2;
  }

  /** Two fresh stamp values (tick and tick + 1). */
  nextTick(): number {
    if (this.tick >= STAMP_LIMIT) {
      this.stamp.fill(0);
      this.tick = 2;
    }
    const tick = this.tick;
    this.tick += 2;
    return tick;
  }
}

/**
 * How many blocks of `node`'s edge (`start`, `len`) the query matches from `depth` on
 * (at least 1: the child was chosen by its first block's hash). One comparison of end
 * sequence hashes when the query covers the edge, else block by block. The shared
 * reader's walk uses it too, on its views (`hi`, `lo`: block hashes, `nodeChain`).
 */
export function edgeMatch(
  hi: Uint32Array,
  lo: Uint32Array,
  nodeChain: Uint32Array,
  node: number,
  start: number,
  len: number,
  query: Uint32Array,
  chain: Uint32Array,
  depth: number,
  count: number,
): number {
  const end = 2 * (depth + len - 1);
  if (
    len <= count - depth &&
    nodeChain[2 * node + 1] === chain[end + 1] &&
    nodeChain[2 * node] === chain[end]
  )
    return len;
  const limit = len < count - depth ? len : count - depth;
  let matched = 1;
  while (
    matched < limit &&
    hi[start + matched] === query[2 * (depth + matched)] &&
    lo[start + matched] === query[2 * (depth + matched) + 1]
  )
    matched++;
  return matched;
}

const NO_ARRAY: Uint32Array = new Uint32Array(0);

/**
 * What a walk reads and how. A private tree's pools grow by copying, so its arrays are
 * taken afresh for each walk (`of`), and links come from its table; a shared tree's
 * arrays are the fixed views of its regions, and its reader is the guard.
 */
export class TreeReads {
  start: Uint32Array = NO_ARRAY;
  len: Uint32Array = NO_ARRAY;
  /** Per node, the sequence hash of its edge's last block (pairs). */
  chain: Uint32Array = NO_ARRAY;
  ownerCount: Uint32Array = NO_ARRAY;
  ownerA: Uint32Array = NO_ARRAY;
  ownerB: Uint32Array = NO_ARRAY;
  words: Uint32Array = NO_ARRAY;
  hi: Uint32Array = NO_ARRAY;
  lo: Uint32Array = NO_ARRAY;
  /** A private tree's links (null when a guard reads a shared tree). */
  links: LinkTable | null = null;
  /** A shared tree's reader; null for a private tree (every check skipped). */
  guard: ReadGuard | null = null;
  /** Slots at or above it cannot be real (a torn read); 2^31 - 1 for a private tree. */
  slotLimit = 0x7fff_ffff;

  /** This private tree's arrays and links as they are now. */
  of(tree: CrtcTree): this {
    const { nodes, owners, blocks } = tree;
    this.start = nodes.start;
    this.len = nodes.len;
    this.chain = nodes.chain;
    this.ownerCount = owners.count;
    this.ownerA = owners.a;
    this.ownerB = owners.b;
    this.words = owners.words;
    this.hi = blocks.hi;
    this.lo = blocks.lo;
    this.links = tree.children;
    return this;
  }
}

/** The child of `node` whose first block is (hi, lo), or 0. */
function childOf(reads: TreeReads, node: number, hi: number, lo: number): number {
  const guard = reads.guard;
  return guard === null ? reads.links!.find(node, hi, lo) : guard.link(node, hi, lo);
}

/** Whether a node read from a shared tree names no real edge or owner list (a torn read). */
function torn(
  reads: TreeReads,
  start: number,
  len: number,
  owners: number,
  offset: number,
): boolean {
  if (len === 0 || start + len > reads.hi.length || owners > reads.slotLimit) return true;
  return owners !== 1 && offset + 2 * owners > reads.words.length;
}

/**
 * What a reader of shared memory adds to the walk (./shared.ts, SharedIndexReader): a
 * node is read between two loads of its version, and links are found inside the link
 * table's seqlock.
 */
export interface ReadGuard {
  /** `node`'s version, recorded for the final check; -1 while the writer has it open. */
  open(node: number): number;
  /** `node`'s version now (not recorded). */
  versionOf(node: number): number;
  /** The child of `node` whose first block is (hi, lo), or 0. */
  link(node: number, hi: number, lo: number): number;
}

/**
 * Scores every slot holding a prefix of the query into `out` (out.count of them).
 * `chain`: the query's sequence hashes (src/hash chainHashes of `query`), pairs.
 * False: a guarded read met a change (retry); a private walk always completes.
 */
export function walkMatches(
  reads: TreeReads,
  query: Uint32Array,
  chain: Uint32Array,
  count: number,
  out: MatchResult,
  scratch: MatchScratch,
): boolean {
  out.count = 0;
  if (count === 0) return true;
  const { guard, slotLimit } = reads;
  if (guard !== null && guard.open(ROOT) < 0) return false;
  let node = childOf(reads, ROOT, query[0]!, query[1]!);
  if (node === 0) return true;
  const { start: starts, len: lens, ownerCount, ownerA, ownerB, words, hi, lo } = reads;
  const { active, stamp } = scratch;
  const { workers: outWorkers, blocks: outBlocks } = out;
  let scored = 0;
  let activeCount = 0;
  let activeTick = scratch.nextTick();
  let depth = 0;
  let first = true;
  // Bounded by the query: every round consumes at least one of its blocks.
  for (;;) {
    const seen = guard === null ? 0 : guard.open(node);
    if (seen < 0) return false;
    const start = starts[node]!;
    const len = lens[node]!;
    const owners = ownerCount[node]!;
    const inline = owners === 1;
    const offset = ownerA[node]!;
    const inlineHeld = ownerB[node]!;
    // A torn read can name anything: check it is a real edge and list before using it.
    if (guard !== null && torn(reads, start, len, owners, offset)) return false;
    const matched = edgeMatch(hi, lo, reads.chain, node, start, len, query, chain, depth, count);
    // The next edge's link is probed before this node's owners are scanned, so that its
    // cache miss overlaps the scan (one probe wasted when no slot stays active). A torn
    // len is caught by the version check below.
    const at = 2 * (depth + len);
    const next =
      matched === len && depth + len < count ? childOf(reads, node, query[at]!, query[at + 1]!) : 0;
    if (first) {
      for (let k = 0; k < owners; k++) {
        const slot = inline ? offset : words[offset + 2 * k]!;
        const held = inline ? inlineHeld : words[offset + 2 * k + 1]!;
        if (slot >= slotLimit) return false;
        if (held === len) {
          active[activeCount++] = slot;
          stamp[slot] = activeTick;
        } else {
          outWorkers[scored] = slot;
          outBlocks[scored++] = held < matched ? held : matched;
        }
      }
      first = false;
    } else {
      const keep = scratch.nextTick();
      const left = keep + 1;
      let stayed = 0;
      for (let k = 0; k < owners; k++) {
        const slot = inline ? offset : words[offset + 2 * k]!;
        if (slot >= slotLimit) return false;
        if (stamp[slot] !== activeTick) continue;
        const held = inline ? inlineHeld : words[offset + 2 * k + 1]!;
        if (held === len) {
          stamp[slot] = keep;
          stayed++;
        } else {
          stamp[slot] = left;
          outWorkers[scored] = slot;
          outBlocks[scored++] = depth + (held < matched ? held : matched);
        }
      }
      let kept = activeCount;
      if (stayed !== activeCount) {
        // Some active slots do not hold this whole edge: they leave (scored above if
        // they hold a prefix of it, else here, at the edge's start).
        kept = 0;
        for (let k = 0; k < activeCount; k++) {
          const slot = active[k]!;
          const mark = stamp[slot];
          if (mark === keep) {
            active[kept++] = slot;
          } else if (mark !== left) {
            outWorkers[scored] = slot;
            outBlocks[scored++] = depth;
          }
        }
      }
      activeCount = kept;
      activeTick = keep;
    }
    // The node read in one piece: what follows may rely on it.
    if (guard !== null && guard.versionOf(node) !== seen) return false;
    depth += matched;
    if (activeCount === 0 || next === 0) break;
    node = next;
  }
  for (let k = 0; k < activeCount; k++) {
    outWorkers[scored] = active[k]!;
    outBlocks[scored++] = depth;
  }
  out.count = scored;
  return true;
}
