/**
 * Stored events: walk from the parent block along the chain's local hashes, sharing
 * blocks that exist, splitting where the chain leaves an edge, growing a leaf in place
 * when its run has room, else starting a child with a fresh run.
 *
 * A slot's holding in a node is always a prefix [0, held) of the edge, and the walk
 * keeps pos <= held: it enters a node at 0 or just after a held parent block, and each
 * step either finds the block already held (pos < held) or takes it (pos == held).
 */
import { fail } from "../assert";
import type { ExternalLookup } from "../lookup";
import type { IndexCounters } from "../types";
import type { CopyCounts } from "../copies";
import { RUN_ORDER_MAX } from "./blocks";
import { ROOT } from "./nodes";
import type { CrtcTree } from "./tree";

/** Runs started to continue a full leaf (decode appends) reserve at least 2^3 ids. */
const CONTINUATION_ORDER_MIN = 3;

/**
 * The run order for a new leaf of `blocks` blocks: room for at least a quarter more
 * (and one more), so the appends that follow a prefill (decode, one block at a time)
 * usually land in place instead of starting a node each.
 */
function leafOrder(blocks: number, continuation: boolean): number {
  const order = Math.min(RUN_ORDER_MAX, ceilLog2(blocks + Math.max(1, blocks >> 2)));
  return continuation && order < CONTINUATION_ORDER_MIN ? CONTINUATION_ORDER_MIN : order;
}

/** Most blocks one new node takes (one run); longer chains continue in child nodes. */
const NODE_BLOCKS_MAX = 2 ** RUN_ORDER_MAX;

function ceilLog2(n: number): number {
  return n <= 1 ? 0 : 32 - Math.clz32(n - 1);
}

/**
 * Places blocks first..first+count of (external, local) for `slot`, starting at edge
 * position `pos` of `node` (just after the parent block; the root with pos 0 for
 * none). Stops at the first block that breaks the engine-hash invariant. A block the
 * slot already holds under the same hash is one more copy of it (`copies`).
 *
 * No Math.min in here: each pass through one left the optimized code by an exit the JIT
 * does not count, and storeChain then ran unoptimized for the rest of a replay
 * (bench/JOURNAL.md, "Compiles under the clock").
 */
export function storeChain(
  tree: CrtcTree,
  slot: number,
  lookup: ExternalLookup,
  node: number,
  pos: number,
  external: Uint32Array,
  local: Uint32Array,
  first: number,
  count: number,
  counters: IndexCounters,
  copies: CopyCounts,
): void {
  const nodes = tree.nodes;
  const owners = tree.owners;
  let held = node === ROOT ? 0 : owners.get(node, slot);
  let heldBefore = held;
  let stored = 0;
  let conflict = false;
  let i = first;
  const end = first + count;
  while (i < end) {
    const len = nodes.len[node]!;
    if (pos < len) {
      const block = nodes.start[node]! + pos;
      if (tree.blocks.hi[block] === local[2 * i] && tree.blocks.lo[block] === local[2 * i + 1]) {
        const found = lookup.find(external[2 * i]!, external[2 * i + 1]!);
        if (pos < held) {
          if (found !== block) {
            conflict = true;
            break;
          }
          copies.add(slot, external[2 * i]!, external[2 * i + 1]!);
          counters.blocksDuplicate++;
        } else {
          if (pos !== held) fail("store walk passed a block the worker does not hold");
          if (found !== 0) {
            conflict = true;
            break;
          }
          lookup.insertAtProbe(external[2 * i]!, external[2 * i + 1]!, block);
          held = pos + 1;
          stored++;
        }
        pos++;
        i++;
        continue;
      }
      // The chain leaves the edge here: the prefix becomes its own node.
      if (held !== heldBefore) owners.set(node, slot, held);
      node = tree.split(node, pos);
      held = owners.get(node, slot);
      heldBefore = held;
      continue;
    }
    // At the end of the edge: the slot holds all of it (or this is the root).
    if (held !== len && node !== ROOT) fail("store reached an edge end it does not hold");
    if (held !== heldBefore) {
      owners.set(node, slot, held);
      heldBefore = held;
    }
    const child = tree.children.find(node, local[2 * i]!, local[2 * i + 1]!);
    if (child !== 0) {
      node = child;
      pos = 0;
      held = owners.get(child, slot);
      heldBefore = held;
      continue;
    }
    const leaf = node !== ROOT && nodes.kids[node] === 0;
    const remaining = end - i;
    let placed: number;
    let wanted: number;
    if (leaf && nodes.spare[node]! > 0) {
      wanted = nodes.spare[node]! < remaining ? nodes.spare[node]! : remaining;
      placed = extendLeaf(tree, node, lookup, external, local, i, i + wanted);
      held = nodes.len[node]!;
      pos = held;
    } else {
      wanted = remaining < NODE_BLOCKS_MAX ? remaining : NODE_BLOCKS_MAX;
      const fresh = startChild(tree, node, lookup, external, local, i, i + wanted, leaf);
      placed = fresh === 0 ? 0 : nodes.len[fresh]!;
      if (fresh !== 0) {
        owners.set(fresh, slot, placed);
        node = fresh;
        held = placed;
        heldBefore = placed;
        pos = placed;
      }
    }
    stored += placed;
    i += placed;
    // A placement stops short only at a hash that breaks the invariant.
    if (placed < wanted) {
      conflict = true;
      break;
    }
  }
  if (node !== ROOT && held !== heldBefore) owners.set(node, slot, held);
  counters.blocksStored += stored;
  if (conflict) counters.hashConflicts++;
}

/**
 * Appends blocks from..end to a leaf's edge, inside its run's spare room; returns how
 * many were placed (fewer only at a conflicting hash).
 */
function extendLeaf(
  tree: CrtcTree,
  node: number,
  lookup: ExternalLookup,
  external: Uint32Array,
  local: Uint32Array,
  from: number,
  end: number,
): number {
  const nodes = tree.nodes;
  const blocks = tree.blocks;
  const base = nodes.start[node]! + nodes.len[node]!;
  tree.touch(node);
  const placed = lookup.insertRun(external, from, end - from, base);
  for (let k = 0; k < placed; k++) {
    blocks.hi[base + k] = local[2 * (from + k)]!;
    blocks.lo[base + k] = local[2 * (from + k) + 1]!;
    blocks.node[base + k] = node;
  }
  tree.chainAppended(node, base, placed);
  nodes.len[node] = nodes.len[node]! + placed;
  nodes.spare[node] = nodes.spare[node]! - placed;
  tree.edgeBlocks += placed;
  return placed;
}

/**
 * Starts a child of `parent` with the remaining blocks in a fresh run. Returns the new
 * node, or 0 if the very first block conflicts. Blocks after a conflict are not placed.
 */
function startChild(
  tree: CrtcTree,
  parent: number,
  lookup: ExternalLookup,
  external: Uint32Array,
  local: Uint32Array,
  from: number,
  end: number,
  continuation: boolean,
): number {
  const want = end - from;
  const order = leafOrder(want, continuation);
  const start = tree.blocks.allocate(order); // may grow the block arrays: read them after
  const placed = lookup.insertRun(external, from, want, start);
  if (placed === 0) {
    tree.blocks.free(start, order);
    return 0;
  }
  const blocks = tree.blocks;
  for (let k = 0; k < placed; k++) {
    blocks.hi[start + k] = local[2 * (from + k)]!;
    blocks.lo[start + k] = local[2 * (from + k) + 1]!;
  }
  return tree.attachChild(parent, start, placed, order);
}
