/**
 * The blocks of in-flight requests, per worker: which sequence hashes (Dynamo's
 * chained block hashes, src/hash `chainHashes`) each worker's active requests cover.
 *
 * It answers two questions on the routing hot path:
 *  - how many distinct blocks a worker has active (its decode load): `add` and
 *    `remove` return how many blocks a request adds to or frees from its worker;
 *  - for a new request, how deep its prefix is already active on each worker
 *    (`sharedDepths`), so the cost charges only the blocks a worker would add.
 *
 * Structure: one radix tree of the chains of all active requests. A node is an edge,
 * a run of consecutive blocks that every request reaching it shares, and counts, per
 * worker, the active requests that pass through it. A worker holds a node's blocks
 * while its count there is above 0, so its distinct active blocks are the summed edge
 * lengths of the nodes it holds. Edges split where requests diverge or end, and merge
 * back when a node is left with one child and no request ending on it, so a node has
 * either requests ending on it or at least two children (or none: a leaf).
 *
 * Layout: typed arrays, no object per node. Every routing decision walks a path of
 * this tree and every admission and expiry updates one, so it is laid out for few
 * cache misses (an object tree cost ~7 µs per route in `kvedge serve`, most of it
 * pointer chasing):
 *  - node records of NODE_WORDS int32s (parent, position, edge, holders, counts,
 *    sibling links) in one array, so a node is one cache line;
 *  - edges ((hi, lo) words) and holder lists ((slot, count) pairs sorted by slot) in
 *    two arenas with power-of-two size classes and a free list per class;
 *  - children found through one open-addressing table keyed by (parent, first block).
 * Node ids are recycled; a request keeps its leaf's id (`ChainHolder.leaf`) until it is
 * removed. Once the tree is empty every array goes back to its initial size.
 *
 * Blocks are sequence hashes, which name their whole prefix: two chains equal at block
 * i are equal up to i. An edge is therefore matched by comparing its last block (and,
 * where the chains diverge inside it, by bisection), not block by block.
 *
 * Cost: a request touches the few nodes on its path (a shared system prompt is one
 * node, the request's own tail another), one comparison or a bisection per edge; no
 * per-block entry exists. Depths for all workers come from one walk down the query's path and
 * one pass over the holders of the nodes on it.
 *
 * See docs/decisions.md#active-block-tree.
 */
import { TripleTable } from "../util/tables";
import { assert } from "../util/verify";
import { Arena, orderOf } from "./arena";

export interface ChainHolder {
  /** Set by `add`: the node where the request's chain ends (null for an empty chain). */
  leaf: number | null;
}

// Node record fields (int32 offsets within a record).
const PARENT = 0; // -1 = free record
const START = 1; // chain position of the edge's first block
const LENGTH = 2; // blocks in the edge
const EDGE = 3; // edge arena offset (words)
const TOTAL = 4; // active requests passing through
const ENDING = 5; // active requests whose chain ends at the edge's last block
const HOLDERS = 6; // holder arena offset (words), -1 = none
const HOLDER_SIZE = 7; // slots holding the node
const HOLDER_CLASS = 8; // log2 of the holder list's capacity in words
const FIRST_CHILD = 9; // -1 = none
const NEXT_SIBLING = 10;
const PREV_SIBLING = 11;
const CHILD_COUNT = 12;
const NODE_WORDS = 16; // 64 bytes

const ROOT = 0;
const NONE = -1;
/** Holder lists up to this size are searched linearly, longer ones by bisection. */
const HOLDERS_SCAN_MAX = 16;
const INITIAL_NODES = 64;
const INITIAL_ARENA_WORDS = 1024;

export class ActiveBlocks {
  private nodes = new Int32Array(INITIAL_NODES * NODE_WORDS);
  private nodeTop = 1; // record 0 is the root
  private freeNode = NONE; // free records, linked through NEXT_SIBLING
  private liveNodes = 0; // excluding the root
  private edgeWords = 0; // words in live edges (2 per block)
  private readonly edges = new Arena(INITIAL_ARENA_WORDS);
  private readonly holders = new Arena(INITIAL_ARENA_WORDS);
  /** Children: (parent, first block hi, first block lo) -> child. */
  private readonly children = new TripleTable();
  // sharedDepths scratch: the query's path and the depth reached at each node. `add`
  // reuses the walk when nothing changed since and its chain ends with the same block
  // (a sequence hash names its whole prefix): routing walks a request's path just
  // before admitting it.
  private path = new Int32Array(64);
  private pathDepths = new Int32Array(64);
  private pathLength = 0;
  private pathCount = -1; // the walked chain's block count, -1 = no walk to reuse
  private pathHi = 0;
  private pathLo = 0;
  private pathVersion = 0;
  private version = 0; // counts changes to the tree

  constructor() {
    this.initRoot();
  }

  /** Live nodes (edges) over all active chains. */
  get nodeCount(): number {
    return this.liveNodes;
  }

  /** Blocks stored in edges (each distinct prefix position once, however many workers hold it). */
  get blockCount(): number {
    return this.edgeWords >>> 1;
  }

  /** Bytes in use: node records, edge and holder words, child table entries (0 when empty). */
  get bytes(): number {
    return (
      this.liveNodes * NODE_WORDS * 4 +
      (this.edges.live + this.holders.live) * 4 +
      this.children.size * 16
    );
  }

  /** Bytes of the arrays themselves, used or not (tests: bursts give them back). */
  get reservedBytes(): number {
    return (
      this.nodes.byteLength +
      this.edges.words.byteLength +
      this.holders.words.byteLength +
      this.children.bytes
    );
  }

  /** Writes the chain ending at `leaf` (`count` blocks, as added) into `out` as (hi, lo) pairs. */
  chainOf(leaf: number, count: number, out: Uint32Array): void {
    const nodes = this.nodes;
    const words = this.edges.words;
    for (let node = leaf; node !== ROOT; node = nodes[node * NODE_WORDS + PARENT]!) {
      const r = node * NODE_WORDS;
      const start = nodes[r + START]!;
      const length = Math.min(nodes[r + LENGTH]!, count - start);
      if (length > 0)
        out.set(words.subarray(nodes[r + EDGE]!, nodes[r + EDGE]! + 2 * length), 2 * start);
    }
  }

  /**
   * Adds a request's chain (`count` (hi, lo) pairs) to `slot`, storing its leaf in
   * `holder`. Returns how many blocks were not active on `slot` before.
   */
  add(slot: number, chain: Uint32Array, count: number, holder: ChainHolder): number {
    assertSlot(slot);
    if (chain.length < 2 * count)
      throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    holder.leaf = null;
    if (count === 0) return 0;
    const reuse =
      this.pathVersion === this.version &&
      this.pathCount === count &&
      this.pathHi === chain[2 * count - 2] &&
      this.pathLo === chain[2 * count - 1];
    this.version++;
    let node = ROOT;
    let at = 0;
    if (reuse) {
      // The chain sharedDepths just walked: start where that walk ended.
      const length = this.pathLength;
      if (length > 0) {
        const last = this.path[length - 1]!;
        const start = this.nodes[last * NODE_WORDS + START]!;
        at = this.pathDepths[length - 1]!;
        node =
          at < start + this.nodes[last * NODE_WORDS + LENGTH]!
            ? this.split(last, at - start)
            : last;
      }
    } else {
      // Walk down while the chain follows existing edges; bounded by `count` blocks.
      while (at < count) {
        const child = this.childAt(node, chain[2 * at + 1]!, chain[2 * at]!);
        if (child === NONE) break;
        const matched = this.matchEdge(child, chain, at, count);
        if (matched < this.nodes[child * NODE_WORDS + LENGTH]!) {
          node = this.split(child, matched);
          at += matched;
          break;
        }
        node = child;
        at += matched;
      }
    }
    if (at < count) {
      const leaf = this.newNode(node, at, count - at);
      // A copy by hand: a subarray and set per added request was a tenth of a route.
      const words = this.edges.words;
      let to = this.nodes[leaf * NODE_WORDS + EDGE]!;
      for (let i = 2 * at; i < 2 * count; i++) words[to++] = chain[i]!;
      this.link(node, leaf);
      node = leaf;
    }
    const nodes = this.nodes;
    nodes[node * NODE_WORDS + ENDING]!++;
    holder.leaf = node;
    // Count the request on its whole path.
    let added = 0;
    for (let n = node; n !== ROOT; n = nodes[n * NODE_WORDS + PARENT]!) {
      if (this.holderAdd(n, slot)) added += nodes[n * NODE_WORDS + LENGTH]!;
      nodes[n * NODE_WORDS + TOTAL]!++;
    }
    return added;
  }

  /**
   * Removes the request added to `slot` with `holder`. Returns how many blocks are no
   * longer active on `slot`. Removing what was not added is a bug and throws.
   */
  remove(slot: number, holder: ChainHolder): number {
    const leaf = holder.leaf;
    if (leaf === null) return 0;
    const nodes = this.nodes;
    const live = leaf > ROOT && leaf < this.nodeTop && nodes[leaf * NODE_WORDS + PARENT] !== NONE;
    if (!live || nodes[leaf * NODE_WORDS + ENDING] === 0 || this.holderIndex(leaf, slot) < 0) {
      throw new Error(`no request on slot ${slot} ends at this node`);
    }
    holder.leaf = null;
    this.version++;
    nodes[leaf * NODE_WORDS + ENDING]!--;
    let removed = 0;
    for (let n = leaf; n !== ROOT; n = nodes[n * NODE_WORDS + PARENT]!) {
      if (this.holderRemove(n, slot)) removed += nodes[n * NODE_WORDS + LENGTH]!;
      nodes[n * NODE_WORDS + TOTAL]!--;
    }
    // Drop the nodes no request passes through any more (a suffix of the path).
    let node = leaf;
    while (node !== ROOT && nodes[node * NODE_WORDS + TOTAL] === 0) {
      const parent = nodes[node * NODE_WORDS + PARENT]!;
      this.unlink(parent, node);
      this.freeRecord(node);
      node = parent;
    }
    if (
      node !== ROOT &&
      nodes[node * NODE_WORDS + ENDING] === 0 &&
      nodes[node * NODE_WORDS + CHILD_COUNT] === 1
    ) {
      this.mergeIntoChild(node, nodes[node * NODE_WORDS + FIRST_CHILD]!);
    }
    if (this.liveNodes === 0) this.clear(); // give the arrays back
    return removed;
  }

  /**
   * For each worker slot holding a prefix of `chain`, writes into `depthBySlot[slot]`
   * how many leading blocks it holds. Slots holding none are left untouched: the caller
   * zeroes the array first.
   */
  sharedDepths(chain: Uint32Array, count: number, depthBySlot: Uint32Array): void {
    const nodes = this.nodes;
    let length = 0;
    let node = ROOT;
    let at = 0;
    while (at < count) {
      const child = this.childAt(node, chain[2 * at + 1]!, chain[2 * at]!);
      if (child === NONE) break;
      const matched = this.matchEdge(child, chain, at, count);
      if (length === this.path.length) this.growPath();
      this.path[length] = child;
      this.pathDepths[length++] = at + matched;
      if (matched < nodes[child * NODE_WORDS + LENGTH]!) break;
      node = child;
      at += matched;
    }
    this.pathLength = length;
    this.pathVersion = this.version;
    this.pathCount = count;
    this.pathHi = count > 0 ? chain[2 * count - 2]! : 0;
    this.pathLo = count > 0 ? chain[2 * count - 1]! : 0;
    // Holders only shrink going down, so the deepest node a worker holds gives its depth,
    // and the first node's holders are every worker with a depth: once that many have
    // one, the shallower nodes (often a hot prefix split many times, each part held by
    // every worker) have nothing left to give. Depths are >= 1, so 0 means "not yet".
    const workers = length > 0 ? nodes[this.path[0]! * NODE_WORDS + HOLDER_SIZE]! : 0;
    const words = this.holders.words;
    let assigned = 0;
    for (let i = length - 1; i >= 0 && assigned < workers; i--) {
      const depth = this.pathDepths[i]!;
      const record = this.path[i]! * NODE_WORDS;
      const first = nodes[record + HOLDERS]!;
      const end = first + 2 * nodes[record + HOLDER_SIZE]!;
      for (let h = first; h < end; h += 2) {
        const slot = words[h]!;
        if (depthBySlot[slot] === 0) {
          depthBySlot[slot] = depth;
          assigned++;
        }
      }
    }
  }

  /**
   * Drops everything and gives back the arrays that grew. Arrays still at their first
   * size are zeroed and kept: a router whose requests often all finish (a quiet fleet,
   * a gateway that calls done at once) empties the tree at every request, and fresh
   * arrays each time made every young collection several times slower.
   */
  clear(): void {
    if (this.nodes.length > INITIAL_NODES * NODE_WORDS)
      this.nodes = new Int32Array(INITIAL_NODES * NODE_WORDS);
    else this.nodes.fill(0, 0, this.nodeTop * NODE_WORDS);
    this.nodeTop = 1;
    this.freeNode = NONE;
    this.liveNodes = 0;
    this.edgeWords = 0;
    this.edges.reset();
    this.holders.reset();
    this.children.clear();
    this.version++;
    this.initRoot();
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): positions and links agree, every
   * node's count equals the requests ending on it plus its children's counts (also per
   * worker, as an upper bound), holder lists are sorted and positive, no node is empty
   * or mergeable, the child table finds every child and nothing else. Returns distinct
   * blocks per slot.
   */
  verify(): Map<number, number> {
    const nodes = this.nodes;
    const words = this.holders.words;
    const perSlot = new Map<number, number>();
    let liveNodes = 0;
    let edgeWords = 0;
    let holderWords = 0;
    let edgeArenaWords = 0;
    // Iterative (a chain of nested request ends can be thousands of nodes deep).
    const stack: number[] = [ROOT];
    while (stack.length > 0) {
      const node = stack.pop()!;
      const record = node * NODE_WORDS;
      let childTotal = 0;
      let children = 0;
      let previous = NONE;
      for (
        let child = nodes[record + FIRST_CHILD]!;
        child !== NONE;
        child = nodes[child * NODE_WORDS + NEXT_SIBLING]!
      ) {
        const c = child * NODE_WORDS;
        children++;
        assert(nodes[c + PREV_SIBLING] === previous, "sibling links");
        previous = child;
        assert(nodes[c + PARENT] === node, "child's parent link");
        assert(
          nodes[c + START] === nodes[record + START]! + nodes[record + LENGTH]!,
          "child position",
        );
        assert(nodes[c + LENGTH]! > 0 && nodes[c + TOTAL]! > 0, "empty node kept");
        assert(nodes[c + ENDING]! > 0 || nodes[c + CHILD_COUNT] !== 1, "mergeable node kept");
        const edge = nodes[c + EDGE]!;
        assert(
          this.childAt(node, this.edges.words[edge + 1]!, this.edges.words[edge]!) === child,
          "child table misses a child",
        );
        const size = nodes[c + HOLDER_SIZE]!;
        const start = nodes[c + HOLDERS]!;
        assert(size > 0 && 2 * size <= 1 << nodes[c + HOLDER_CLASS]!, "holder list size");
        let sum = 0;
        for (let h = 0; h < size; h++) {
          const slot = words[start + 2 * h]!;
          const held = words[start + 2 * h + 1]!;
          assert(held > 0, "zero holder count kept");
          assert(h === 0 || words[start + 2 * h - 2]! < slot, "holder slots unsorted or repeated");
          assert(
            node === ROOT || this.holderCount(node, slot) >= held,
            "worker holds a node but not its parent",
          );
          perSlot.set(slot, (perSlot.get(slot) ?? 0) + nodes[c + LENGTH]!);
          sum += held;
        }
        assert(sum === nodes[c + TOTAL], "holder counts differ from the total");
        liveNodes++;
        edgeWords += 2 * nodes[c + LENGTH]!;
        edgeArenaWords += 1 << orderOf(2 * nodes[c + LENGTH]!);
        holderWords += 1 << nodes[c + HOLDER_CLASS]!;
        childTotal += nodes[c + TOTAL]!;
        stack.push(child);
      }
      assert(children === nodes[record + CHILD_COUNT], "child count");
      if (node !== ROOT)
        assert(
          nodes[record + TOTAL] === nodes[record + ENDING]! + childTotal,
          "total differs from endings plus children",
        );
    }
    assert(
      liveNodes === this.liveNodes && edgeWords === this.edgeWords,
      "node or word count is off",
    );
    assert(this.children.size === liveNodes, "child table holds entries for no node");
    assert(
      this.edges.live === edgeArenaWords && this.holders.live === holderWords,
      "arena words leaked",
    );
    return perSlot;
  }

  // ---- nodes ----

  private initRoot(): void {
    const nodes = this.nodes;
    nodes[PARENT] = NONE;
    nodes[HOLDERS] = NONE;
    nodes[FIRST_CHILD] = NONE;
    nodes[NEXT_SIBLING] = NONE;
    nodes[PREV_SIBLING] = NONE;
  }

  /** A record for an edge of `length` blocks at chain position `start` (edge words not written). */
  private newNode(parent: number, start: number, length: number): number {
    let node = this.freeNode;
    if (node !== NONE) this.freeNode = this.nodes[node * NODE_WORDS + NEXT_SIBLING]!;
    else {
      node = this.nodeTop++;
      if (this.nodeTop * NODE_WORDS > this.nodes.length) {
        const grown = new Int32Array(this.nodes.length * 2);
        grown.set(this.nodes);
        this.nodes = grown;
      }
    }
    const r = node * NODE_WORDS;
    const nodes = this.nodes;
    nodes[r + PARENT] = parent;
    nodes[r + START] = start;
    nodes[r + LENGTH] = length;
    nodes[r + EDGE] = this.edges.allocate(orderOf(2 * length));
    nodes[r + TOTAL] = 0;
    nodes[r + ENDING] = 0;
    nodes[r + HOLDERS] = NONE;
    nodes[r + HOLDER_SIZE] = 0;
    nodes[r + HOLDER_CLASS] = 0;
    nodes[r + FIRST_CHILD] = NONE;
    nodes[r + NEXT_SIBLING] = NONE;
    nodes[r + PREV_SIBLING] = NONE;
    nodes[r + CHILD_COUNT] = 0;
    this.liveNodes++;
    this.edgeWords += 2 * length;
    return node;
  }

  private freeRecord(node: number): void {
    const r = node * NODE_WORDS;
    const nodes = this.nodes;
    this.edges.release(nodes[r + EDGE]!, orderOf(2 * nodes[r + LENGTH]!));
    if (nodes[r + HOLDERS] !== NONE)
      this.holders.release(nodes[r + HOLDERS]!, nodes[r + HOLDER_CLASS]!);
    this.edgeWords -= 2 * nodes[r + LENGTH]!;
    this.liveNodes--;
    nodes[r + PARENT] = NONE;
    nodes[r + NEXT_SIBLING] = this.freeNode;
    this.freeNode = node;
  }

  /** How many blocks of `node`'s edge equal `chain` from block `at` on (at most `count - at`). */
  private matchEdge(node: number, chain: Uint32Array, at: number, count: number): number {
    const r = node * NODE_WORDS;
    const words = this.edges.words;
    const edge = this.nodes[r + EDGE]!;
    const limit = Math.min(this.nodes[r + LENGTH]!, count - at);
    // Sequence hashes: equal at block i means equal up to i. So one comparison at the
    // end settles the usual case, and a divergence is found by bisection (block 0
    // matched already: the child was found by it).
    if (sameBlock(words, edge, chain, at, limit - 1)) return limit;
    let low = 1;
    let high = limit - 1; // the first block known to differ
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (sameBlock(words, edge, chain, at, middle)) low = middle + 1;
      else high = middle;
    }
    return low;
  }

  /**
   * Splits `node` after its first `blocks` blocks: a new node takes the prefix and
   * `node` keeps the suffix (so requests ending at `node` keep their handle). Returns
   * the new node.
   */
  private split(node: number, blocks: number): number {
    const r = node * NODE_WORDS;
    const parent = this.nodes[r + PARENT]!;
    const length = this.nodes[r + LENGTH]!;
    const oldEdge = this.nodes[r + EDGE]!;
    this.unlink(parent, node);
    const prefix = this.newNode(parent, this.nodes[r + START]!, blocks); // may grow this.nodes
    const nodes = this.nodes;
    const p = prefix * NODE_WORDS;
    const words = this.edges.words;
    words.copyWithin(nodes[p + EDGE]!, oldEdge, oldEdge + 2 * blocks);
    // The suffix moves to a block of its own size class.
    const suffixEdge = this.edges.allocate(orderOf(2 * (length - blocks)));
    const grownWords = this.edges.words;
    grownWords.copyWithin(suffixEdge, oldEdge + 2 * blocks, oldEdge + 2 * length);
    this.edges.release(oldEdge, orderOf(2 * length));
    this.edgeWords -= 2 * blocks; // the prefix's words were counted twice by newNode
    nodes[r + EDGE] = suffixEdge;
    nodes[r + START] += blocks;
    nodes[r + LENGTH] = length - blocks;
    nodes[r + PARENT] = prefix;
    nodes[p + TOTAL] = nodes[r + TOTAL]!;
    this.copyHolders(node, prefix);
    this.link(parent, prefix);
    this.link(prefix, node);
    return prefix;
  }

  /** `node` has one child and no request ending on it: the child absorbs its edge. */
  private mergeIntoChild(node: number, child: number): void {
    const nodes = this.nodes;
    const r = node * NODE_WORDS;
    const c = child * NODE_WORDS;
    const parent = nodes[r + PARENT]!;
    const nodeLength = nodes[r + LENGTH]!;
    const childLength = nodes[c + LENGTH]!;
    this.unlink(node, child);
    this.unlink(parent, node);
    const merged = this.edges.allocate(orderOf(2 * (nodeLength + childLength)));
    const words = this.edges.words;
    words.copyWithin(merged, nodes[r + EDGE]!, nodes[r + EDGE]! + 2 * nodeLength);
    words.copyWithin(merged + 2 * nodeLength, nodes[c + EDGE]!, nodes[c + EDGE]! + 2 * childLength);
    this.edges.release(nodes[c + EDGE]!, orderOf(2 * childLength));
    nodes[c + EDGE] = merged;
    nodes[c + START] = nodes[r + START]!;
    nodes[c + LENGTH] = nodeLength + childLength;
    nodes[c + PARENT] = parent;
    this.edgeWords += 2 * nodeLength; // freeRecord takes the node's words off again
    this.freeRecord(node);
    this.link(parent, child);
  }

  private growPath(): void {
    const path = new Int32Array(this.path.length * 2);
    path.set(this.path);
    this.path = path;
    const depths = new Int32Array(this.pathDepths.length * 2);
    depths.set(this.pathDepths);
    this.pathDepths = depths;
  }

  // ---- children: sibling lists, and a table from (parent, first block) to the child ----

  private link(parent: number, child: number): void {
    const nodes = this.nodes;
    const c = child * NODE_WORDS;
    const p = parent * NODE_WORDS;
    const edge = nodes[c + EDGE]!;
    this.children.set(parent, this.edges.words[edge]!, this.edges.words[edge + 1]!, child);
    const first = nodes[p + FIRST_CHILD]!;
    nodes[c + NEXT_SIBLING] = first;
    nodes[c + PREV_SIBLING] = NONE;
    if (first !== NONE) nodes[first * NODE_WORDS + PREV_SIBLING] = child;
    nodes[p + FIRST_CHILD] = child;
    nodes[p + CHILD_COUNT]!++;
  }

  private unlink(parent: number, child: number): void {
    const nodes = this.nodes;
    const c = child * NODE_WORDS;
    const edge = nodes[c + EDGE]!;
    if (!this.children.delete(parent, this.edges.words[edge]!, this.edges.words[edge + 1]!)) {
      throw new Error("active blocks: child table misses an entry");
    }
    const next = nodes[c + NEXT_SIBLING]!;
    const previous = nodes[c + PREV_SIBLING]!;
    if (previous === NONE) nodes[parent * NODE_WORDS + FIRST_CHILD] = next;
    else nodes[previous * NODE_WORDS + NEXT_SIBLING] = next;
    if (next !== NONE) nodes[next * NODE_WORDS + PREV_SIBLING] = previous;
    nodes[c + NEXT_SIBLING] = NONE;
    nodes[c + PREV_SIBLING] = NONE;
    nodes[parent * NODE_WORDS + CHILD_COUNT]!--;
  }

  /** The child of `parent` whose edge starts with block (hi, lo), or NONE. */
  private childAt(parent: number, lo: number, hi: number): number {
    return this.children.get(parent, hi, lo); // -1 = NONE
  }

  // ---- holder lists: (slot, count) pairs sorted by slot ----

  /** Index (pairs) of `slot` in the node's list, or -(insertion point) - 1. */
  private holderIndex(node: number, slot: number): number {
    const r = node * NODE_WORDS;
    const size = this.nodes[r + HOLDER_SIZE]!;
    const first = this.nodes[r + HOLDERS]!;
    const words = this.holders.words;
    let low = 0;
    let high = size;
    if (size <= HOLDERS_SCAN_MAX) {
      while (low < size && words[first + 2 * low]! < slot) low++;
    } else {
      while (low < high) {
        const middle = (low + high) >>> 1;
        if (words[first + 2 * middle]! < slot) low = middle + 1;
        else high = middle;
      }
    }
    return low < size && words[first + 2 * low] === slot ? low : -low - 1;
  }

  private holderCount(node: number, slot: number): number {
    const at = this.holderIndex(node, slot);
    return at < 0 ? 0 : this.holders.words[this.nodes[node * NODE_WORDS + HOLDERS]! + 2 * at + 1]!;
  }

  /** Counts one more request of `slot`; true if the slot did not hold the node before. */
  private holderAdd(node: number, slot: number): boolean {
    const at = this.holderIndex(node, slot);
    const r = node * NODE_WORDS;
    if (at >= 0) {
      this.holders.words[this.nodes[r + HOLDERS]! + 2 * at + 1]!++;
      return false;
    }
    const insert = -at - 1;
    const size = this.nodes[r + HOLDER_SIZE]!;
    if (this.nodes[r + HOLDERS] === NONE || 2 * (size + 1) > 1 << this.nodes[r + HOLDER_CLASS]!) {
      this.resizeHolders(node, orderOf(2 * (size + 1)));
    }
    const first = this.nodes[r + HOLDERS]!;
    const words = this.holders.words;
    words.copyWithin(first + 2 * insert + 2, first + 2 * insert, first + 2 * size);
    words[first + 2 * insert] = slot;
    words[first + 2 * insert + 1] = 1;
    this.nodes[r + HOLDER_SIZE] = size + 1;
    return true;
  }

  /** Counts one request of `slot` less (it must hold the node); true if it no longer does. */
  private holderRemove(node: number, slot: number): boolean {
    const at = this.holderIndex(node, slot);
    if (at < 0) throw new Error(`active blocks: slot ${slot} does not hold the node`);
    const r = node * NODE_WORDS;
    const first = this.nodes[r + HOLDERS]!;
    const words = this.holders.words;
    if (--words[first + 2 * at + 1]! > 0) return false;
    const size = this.nodes[r + HOLDER_SIZE]! - 1;
    words.copyWithin(first + 2 * at, first + 2 * at + 2, first + 2 * size + 2);
    this.nodes[r + HOLDER_SIZE] = size;
    // Shrink a list at a quarter of its capacity, so a list once long gives memory back.
    const order = this.nodes[r + HOLDER_CLASS]!;
    if (size > 0 && order > 2 && 8 * size <= 1 << order) this.resizeHolders(node, order - 1);
    return true;
  }

  /** Moves the node's holder list to a block of 2^order words. */
  private resizeHolders(node: number, order: number): void {
    const r = node * NODE_WORDS;
    const fresh = this.holders.allocate(order);
    const old = this.nodes[r + HOLDERS]!;
    if (old !== NONE) {
      this.holders.words.copyWithin(fresh, old, old + 2 * this.nodes[r + HOLDER_SIZE]!);
      this.holders.release(old, this.nodes[r + HOLDER_CLASS]!);
    }
    this.nodes[r + HOLDERS] = fresh;
    this.nodes[r + HOLDER_CLASS] = order;
  }

  /** Gives `to` (with no holders yet) a copy of `from`'s holder list. */
  private copyHolders(from: number, to: number): void {
    const f = from * NODE_WORDS;
    const size = this.nodes[f + HOLDER_SIZE]!;
    this.resizeHolders(to, this.nodes[f + HOLDER_CLASS]!);
    const first = this.nodes[f + HOLDERS]!;
    this.holders.words.copyWithin(this.nodes[to * NODE_WORDS + HOLDERS]!, first, first + 2 * size);
    this.nodes[to * NODE_WORDS + HOLDER_SIZE] = size;
  }
}

/** Whether block `i` of the edge at `edge` equals block `at + i` of `chain`. */
function sameBlock(
  words: Uint32Array,
  edge: number,
  chain: Uint32Array,
  at: number,
  i: number,
): boolean {
  return (
    words[edge + 2 * i + 1] === chain[2 * (at + i) + 1] &&
    words[edge + 2 * i] === chain[2 * (at + i)]
  );
}

function assertSlot(slot: number): void {
  if (!(slot >= 0 && slot <= 0x7fff_ffff && Number.isInteger(slot)))
    throw new RangeError(`bad worker slot ${slot}`);
}
