/**
 * verify(): an O(N) walk that checks every invariant of README.md against the actual
 * arrays — links, edges, runs, coverage, lookups and pool counts. Off the hot path;
 * runs after every mutation when KVEDGE_VERIFY=1.
 */
import { chainHashes } from "../../hash";
import { assert } from "../assert";
import type { WorkerSlots } from "../workers";
import { FREE_TAG, MARK_SHIFT } from "./blocks";
import { NOT_RUN_HEAD, ROOT } from "./nodes";
import { RETIRED_NODE, RETIRED_RUN } from "./shared-writer";
import type { CrtcTree } from "./tree";

export function verifyTree(tree: CrtcTree, slots: WorkerSlots): void {
  const { nodes, blocks, owners } = tree;
  const kids = tree.childLists();
  const heldBySlot = new Float64Array(slots.highWater);
  let reachable = 0;
  let edgeBlocks = 0;
  let runIds = 1; // the reserved id 0
  const stack = [ROOT];
  while (stack.length > 0) {
    const node = stack.pop()!;
    const children = kids.get(node) ?? [];
    assert(
      nodes.kids[node] === children.length,
      "verify: child count differs from the child table",
    );
    for (const child of children) {
      assert(nodes.isLive(child), "verify: a link names a free node");
      assert(nodes.parent[child] === node, "verify: parent pointer differs from the link");
      const first = nodes.start[child]!;
      assert(
        tree.children.find(node, blocks.hi[first]!, blocks.lo[first]!) === child,
        "verify: link key is not the first block",
      );
      stack.push(child);
    }
    if (node === ROOT) {
      assert(owners.count[ROOT] === 0, "verify: the root has owners");
      continue;
    }
    reachable++;
    const start = nodes.start[node]!;
    const len = nodes.len[node]!;
    const spare = nodes.spare[node]!;
    assert(len > 0, "verify: live node with an empty edge");
    edgeBlocks += len;
    verifyEdge(tree, node, start, len, spare);
    const order = nodes.runOrder[node]!;
    if (order === NOT_RUN_HEAD) {
      const parent = nodes.parent[node]!;
      assert(parent !== ROOT, "verify: suffix piece under the root");
      assert(
        nodes.start[parent]! + nodes.len[parent]! === start,
        "verify: suffix piece not adjacent to its parent",
      );
      assert(nodes.spare[parent] === 0, "verify: a piece before another has spare room");
    } else {
      assert(start % 2 ** order === 0, "verify: run head misaligned");
      assert(blocks.node[start]! < FREE_TAG, "verify: run head lies in a free run");
      runIds += 2 ** order;
    }
    verifyOwners(tree, slots, node, len, children.length, heldBySlot);
  }
  assert(reachable === nodes.live, "verify: live nodes unreachable from the root");
  // Shared mode: freed ids and runs wait in limbo until readers have left.
  const retiredNodes = tree.writer?.retiredUnits(RETIRED_NODE) ?? 0;
  const retiredIds = tree.writer?.retiredUnits(RETIRED_RUN) ?? 0;
  const nodeIds = nodes.freeCount() + nodes.live + 2 + retiredNodes;
  assert(nodeIds === nodes.highWater, "verify: node pool count mismatch");
  assert(tree.children.count === nodes.live, "verify: child table holds dead links");
  assert(edgeBlocks === tree.edgeBlocks, "verify: edge block count drifted");
  assert(runIds + retiredIds === blocks.allocated, "verify: allocated runs do not add up");
  assert(
    blocks.freeIds() + blocks.allocated === blocks.capacity,
    "verify: block pool count mismatch",
  );
  verifyLookups(tree, slots, heldBySlot);
}

function verifyOwners(
  tree: CrtcTree,
  slots: WorkerSlots,
  node: number,
  len: number,
  children: number,
  heldBySlot: Float64Array,
): void {
  const pairs = tree.owners.snapshot(node);
  const count = tree.owners.count[node]!;
  let longest = 0;
  for (let i = 0; i < count; i++) {
    const slot = pairs[2 * i]!;
    const held = pairs[2 * i + 1]!;
    assert(slots.isLive(slot), "verify: coverage names a free slot");
    assert(held >= 1 && held <= len, "verify: coverage outside the edge");
    for (let j = 0; j < i; j++)
      assert(pairs[2 * j] !== slot, "verify: slot listed twice on a node");
    heldBySlot[slot] = heldBySlot[slot]! + held;
    if (held > longest) longest = held;
  }
  if (children === 0) assert(longest === len, "verify: leaf with an unheld tail or no owner");
}

function verifyLookups(tree: CrtcTree, slots: WorkerSlots, heldBySlot: Float64Array): void {
  slots.copies.verify((slot) => slots.lookupOf(slot));
  const seen = new Uint32Array(tree.blocks.capacity);
  for (let slot = 0; slot < slots.highWater; slot++) {
    const lookup = slots.lookup[slot];
    if (!lookup) {
      assert(heldBySlot[slot] === 0, "verify: a free slot holds blocks");
      continue;
    }
    assert(lookup.count === heldBySlot[slot], "verify: lookup entries differ from held blocks");
    let entries = 0;
    for (let at = 0; at < lookup.table.length; at += 3) {
      const block = lookup.table[at + 2]!;
      if (block === 0) continue;
      entries++;
      assert(seen[block] !== slot + 1, "verify: two hashes name one block for a worker");
      seen[block] = slot + 1;
      const node = tree.blocks.node[block]!;
      assert(
        node !== 0 && node < FREE_TAG && tree.nodes.isLive(node),
        "verify: lookup names a dead block",
      );
      const position = block - tree.nodes.start[node]!;
      assert(
        position < tree.owners.get(node, slot),
        "verify: lookup names a block the worker does not hold",
      );
      assert(
        lookup.find(lookup.table[at]!, lookup.table[at + 1]!) === block,
        "verify: lookup entry unreachable by probing",
      );
    }
    assert(entries === lookup.count, "verify: lookup count drifted");
  }
}

/**
 * The edge's blocks point back to the node and its spare ids to nothing; its end
 * sequence hash and the marks inside it equal the chain recomputed from the parent's
 * end (checked before it: parents are visited first).
 */
function verifyEdge(tree: CrtcTree, node: number, start: number, len: number, spare: number): void {
  const { nodes, blocks } = tree;
  for (let block = start; block < start + len; block++) {
    assert(blocks.node[block] === node, "verify: block does not point back to its node");
  }
  for (let block = start + len; block < start + len + spare; block++) {
    assert(blocks.node[block] === 0, "verify: spare block is in use");
  }
  const parent = nodes.parent[node]!;
  const skip = parent === ROOT ? 0 : 1;
  const pairs = new Uint32Array(2 * (len + skip));
  pairs[0] = nodes.chain[2 * parent]!;
  pairs[1] = nodes.chain[2 * parent + 1]!;
  for (let k = 0; k < len; k++) {
    pairs[2 * (k + skip)] = blocks.hi[start + k]!;
    pairs[2 * (k + skip) + 1] = blocks.lo[start + k]!;
  }
  chainHashes(pairs, len + skip, pairs);
  const last = 2 * (len + skip - 1);
  assert(
    nodes.chain[2 * node] === pairs[last] && nodes.chain[2 * node + 1] === pairs[last + 1],
    "verify: a node's end sequence hash differs from its path's",
  );
  const group = 2 ** MARK_SHIFT - 1;
  for (let id = start | group; id < start + len; id += group + 1) {
    const at = 2 * (id - start + skip);
    const mark = 2 * Math.floor(id / 2 ** MARK_SHIFT);
    assert(
      blocks.marks[mark] === pairs[at] && blocks.marks[mark + 1] === pairs[at + 1],
      "verify: a block's mark differs from its sequence hash",
    );
  }
}
