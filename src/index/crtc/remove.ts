/**
 * Removed and cleared events. A removal first takes every hash of the event out of the
 * slot's lookup (in order, one call), then groups consecutive hashes whose blocks share
 * a node (one coverage change per group), and keeps the slot's holding in every node a
 * prefix of its edge: when the removed positions leave a hole with held blocks after
 * it, the node is split at the start of each held run that follows a gap. The
 * descendants stay held (and count again once the hole is stored again). Every path
 * ends in `reclaim`.
 */
import { fail } from "../assert";
import type { ExternalLookup } from "../lookup";
import type { CrtcTree } from "./tree";

export class RemoveScratch {
  positions = new Uint32Array(64);
  nodes = new Uint32Array(64);
  blocks = new Uint32Array(64);
  /** A removal's hashes whose last copy goes (pairs), when some blocks have several copies. */
  hashes = new Uint32Array(128);

  ensureHashes(count: number): Uint32Array {
    if (this.hashes.length < 2 * count) this.hashes = new Uint32Array(count * 4);
    return this.hashes;
  }

  ensurePositions(count: number): Uint32Array {
    if (this.positions.length < count) this.positions = new Uint32Array(count * 2);
    return this.positions;
  }

  ensureBlocks(count: number): Uint32Array {
    if (this.blocks.length < count) this.blocks = new Uint32Array(count * 2);
    return this.blocks;
  }

  ensureNodes(count: number): Uint32Array {
    if (this.nodes.length < count) this.nodes = new Uint32Array(count * 2);
    return this.nodes;
  }
}

/** Removes hashes first..first+count of `external` for `slot`; returns how many were unknown. */
export function removeHashes(
  tree: CrtcTree,
  slot: number,
  lookup: ExternalLookup,
  external: Uint32Array,
  first: number,
  count: number,
  scratch: RemoveScratch,
): number {
  // The lookup first (one call for the event), then the tree, a group of blocks at a time.
  const blocks = scratch.ensureBlocks(count);
  lookup.removeMany(external, first, count, blocks);
  const positions = scratch.ensurePositions(count);
  let unknown = 0;
  let i = 0;
  while (i < count) {
    const block = blocks[i++]!;
    if (block === 0) {
      unknown++;
      continue;
    }
    // Read the arrays per group: removeGroup may split nodes and grow the pools.
    const blockNode = tree.blocks.node;
    const node = blockNode[block]!;
    const start = tree.nodes.start[node]!;
    positions[0] = block - start;
    let group = 1;
    while (i < count) {
      const next = blocks[i]!;
      if (next === 0 || blockNode[next] !== node) break;
      positions[group++] = next - start;
      i++;
    }
    removeGroup(tree, node, slot, positions, group);
  }
  return unknown;
}

/** The slot stops holding `node`'s edge positions positions[0..count) (distinct, held). */
function removeGroup(
  tree: CrtcTree,
  node: number,
  slot: number,
  positions: Uint32Array,
  count: number,
): void {
  const owners = tree.owners;
  const held = owners.get(node, slot);
  sortPrefix(positions, count);
  if (held === 0 || positions[count - 1]! >= held)
    fail("removing a block the worker does not hold");
  if (positions[0] === held - count) {
    // The tail of the holding: the prefix just gets shorter.
    if (held === count) owners.remove(node, slot);
    else owners.set(node, slot, held - count);
    tree.reclaim(node);
    return;
  }
  // Holes: split at the start of each held run after a gap, right to left. `node`
  // keeps the rightmost piece; `piece` walks left over the new prefix nodes.
  let piece = node;
  let runEnd = held;
  for (let j = count - 1; j >= 0; j--) {
    const runStart = positions[j]! + 1;
    if (runStart < runEnd) {
      const prefix = tree.split(piece, runStart);
      owners.set(piece, slot, runEnd - runStart);
      piece = prefix;
    }
    runEnd = positions[j]!;
  }
  if (runEnd === 0) owners.remove(piece, slot);
  else owners.set(piece, slot, runEnd);
  // Only the rightmost piece can be a leaf; the others have the next piece as child.
  tree.reclaim(node);
}

/** The slot holds nothing any more: drop its coverage everywhere, then reclaim. */
export function clearSlot(
  tree: CrtcTree,
  slot: number,
  lookup: ExternalLookup,
  scratch: RemoveScratch,
): number {
  const touched = scratch.ensureNodes(lookup.count);
  const table = lookup.table;
  const owners = tree.owners;
  let count = 0;
  for (let at = 2; at < table.length; at += 3) {
    const block = table[at]!;
    if (block === 0) continue;
    const node = tree.blocks.node[block]!;
    if (owners.remove(node, slot)) touched[count++] = node;
  }
  const removed = lookup.count;
  lookup.clear();
  // Coverage first, reclaim second: a cascade then only meets nodes nobody holds.
  for (let j = 0; j < count; j++) {
    const node = touched[j]!;
    if (tree.nodes.isLive(node)) tree.reclaim(node);
  }
  return removed;
}

/** Sorts positions[0..count) ascending (groups are short; large ones use the native sort). */
function sortPrefix(positions: Uint32Array, count: number): void {
  if (count > 32) {
    positions.subarray(0, count).sort();
    return;
  }
  for (let i = 1; i < count; i++) {
    const value = positions[i]!;
    let j = i - 1;
    while (j >= 0 && positions[j]! > value) {
      positions[j + 1] = positions[j]!;
      j--;
    }
    positions[j + 1] = value;
  }
}
