/**
 * findMatches: walk the query's local hashes from the root. At the first node the
 * active set is every slot holding the whole edge; a slot holding only a prefix of an
 * edge is scored where its holding ends and never continues. At each later node every
 * active slot is checked against the node's owners for real (no size shortcuts: equal
 * sizes say nothing about equal members); slots that do not hold the whole edge leave
 * and are scored. Allocation-free: membership is a stamp per slot.
 */
import type { MatchResult } from "../types";
import { ROOT } from "./nodes";
import type { CrtcTree } from "./tree";

const STAMP_LIMIT = 0xffff_fff0;

export class MatchScratch {
  active = new Uint32Array(64);
  stamp = new Uint32Array(64);
  private tick = 2;

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

export function findMatches(
  tree: CrtcTree, query: Uint32Array, count: number, out: MatchResult, scratch: MatchScratch,
): void {
  out.count = 0;
  if (count === 0) return;
  let node = tree.children.find(ROOT, query[0]!, query[1]!);
  if (node === 0) return;
  const nodes = tree.nodes;
  const blocks = tree.blocks;
  const owners = tree.owners;
  const active = scratch.active;
  const stamp = scratch.stamp;
  const outWorkers = out.workers;
  const outBlocks = out.blocks;
  let scored = 0;
  let activeCount = 0;
  let activeTick = scratch.nextTick();
  let depth = 0;
  let first = true;
  // Bounded by the query: every round consumes at least one of its blocks.
  for (;;) {
    const start = nodes.start[node]!;
    const len = nodes.len[node]!;
    const limit = len < count - depth ? len : count - depth;
    let matched = 1; // the child was chosen by this block's hash
    while (matched < limit && blocks.hi[start + matched] === query[2 * (depth + matched)]
      && blocks.lo[start + matched] === query[2 * (depth + matched) + 1]) matched++;
    const ownerCount = owners.count[node]!;
    const inline = ownerCount === 1;
    const words = owners.words;
    const offset = owners.a[node]!;
    if (first) {
      for (let k = 0; k < ownerCount; k++) {
        const slot = inline ? offset : words[offset + 2 * k]!;
        const held = inline ? owners.b[node]! : words[offset + 2 * k + 1]!;
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
        const held = inline ? owners.b[node]! : words[offset + 2 * k + 1]!;
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
    if (activeCount === 0 || matched < len || depth === count) break;
    node = tree.children.find(node, query[2 * depth]!, query[2 * depth + 1]!);
    if (node === 0) break;
  }
  for (let k = 0; k < activeCount; k++) {
    outWorkers[scored] = active[k]!;
    outBlocks[scored++] = depth;
  }
  out.count = scored;
}
