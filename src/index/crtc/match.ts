/**
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

/** `chain`: the query's sequence hashes (src/hash chainHashes of `query`), pairs. */
export function findMatches(
  tree: CrtcTree,
  query: Uint32Array,
  chain: Uint32Array,
  count: number,
  out: MatchResult,
  scratch: MatchScratch,
): void {
  out.count = 0;
  if (count === 0) return;
  let node = tree.children.find(ROOT, query[0]!, query[1]!);
  if (node === 0) return;
  const { nodes, blocks, owners } = tree;
  const { active, stamp } = scratch;
  const { workers: outWorkers, blocks: outBlocks } = out;
  let scored = 0;
  let activeCount = 0;
  let activeTick = scratch.nextTick();
  let depth = 0;
  let first = true;
  // Bounded by the query: every round consumes at least one of its blocks.
  for (;;) {
    const start = nodes.start[node]!;
    const len = nodes.len[node]!;
    const ownerCount = owners.count[node]!;
    const offset = owners.a[node]!;
    const inlineHeld = owners.b[node]!;
    const matched = edgeMatch(
      blocks.hi,
      blocks.lo,
      nodes.chain,
      node,
      start,
      len,
      query,
      chain,
      depth,
      count,
    );
    // The next edge's link is probed before this node's owners are scanned, so that its
    // cache miss overlaps the scan (one probe wasted when no slot stays active).
    const next =
      matched === len && depth + len < count
        ? tree.children.find(node, query[2 * (depth + len)]!, query[2 * (depth + len) + 1]!)
        : 0;
    const inline = ownerCount === 1;
    const words = owners.words;
    if (first) {
      for (let k = 0; k < ownerCount; k++) {
        const slot = inline ? offset : words[offset + 2 * k]!;
        const held = inline ? inlineHeld : words[offset + 2 * k + 1]!;
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
      for (let k = 0; k < ownerCount; k++) {
        const slot = inline ? offset : words[offset + 2 * k]!;
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
    depth += matched;
    if (activeCount === 0 || next === 0) break;
    node = next;
  }
  for (let k = 0; k < activeCount; k++) {
    outWorkers[scored] = active[k]!;
    outBlocks[scored++] = depth;
  }
  out.count = scored;
}
