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
 * a run of consecutive blocks (hashes in a Uint32Array) that every request reaching it
 * shares, and counts, per worker, the active requests that pass through it. A worker
 * holds a node's blocks while its count there is above 0, so its distinct active
 * blocks are the summed edge lengths of the nodes it holds. Edges split where
 * requests diverge or end, and merge back when a node is left with one child and no
 * request ending on it, so a node has either requests ending on it or at least two
 * children (or none: a leaf).
 *
 * Cost: a request touches the few nodes on its path (a shared system prompt is one
 * node, the request's own tail another), comparing hashes sequentially along edges;
 * no per-block table entry exists. Depths for all workers come from one walk down the
 * query's path and one pass over the holders of the nodes on it.
 *
 * A request's leaf node is kept by the caller (`ChainHolder.leaf`) to remove it later;
 * node objects are never reused, so a handle stays valid until its request is removed.
 */

export interface ChainHolder {
  /** Set by `add`: the node where the request's chain ends (null for an empty chain). */
  leaf: ActiveNode | null;
}

/** Holders past this many are found through a Map instead of a scan. */
const HOLDERS_SCAN_MAX = 16;

/**
 * Per worker slot, how many active requests pass through a node. Slots and counts sit
 * in two packed arrays, because every routing decision iterates the holders of the
 * nodes on its path; a slot is found by a scan while there are few, else through a Map
 * of positions. Removal moves the last holder into the gap (order is not kept).
 */
export class Holders {
  readonly slots: number[] = [];
  readonly counts: number[] = [];
  private positions: Map<number, number> | null = null;

  get size(): number {
    return this.slots.length;
  }

  /** Requests of `slot` passing through (0 if none). */
  count(slot: number): number {
    const at = this.find(slot);
    return at < 0 ? 0 : this.counts[at]!;
  }

  /** Counts one more request of `slot`; true if the slot did not hold the node before. */
  add(slot: number): boolean {
    const at = this.find(slot);
    if (at >= 0) {
      this.counts[at]!++;
      return false;
    }
    this.slots.push(slot);
    this.counts.push(1);
    if (this.positions !== null) this.positions.set(slot, this.slots.length - 1);
    else if (this.slots.length > HOLDERS_SCAN_MAX) {
      this.positions = new Map();
      for (let i = 0; i < this.slots.length; i++) this.positions.set(this.slots[i]!, i);
    }
    return true;
  }

  /** Counts one request of `slot` less (it must hold the node); true if it no longer does. */
  remove(slot: number): boolean {
    const at = this.find(slot);
    if (at < 0) throw new Error(`active blocks: slot ${slot} does not hold the node`);
    if (--this.counts[at]! > 0) return false;
    const last = this.slots.length - 1;
    if (at !== last) {
      this.slots[at] = this.slots[last]!;
      this.counts[at] = this.counts[last]!;
      this.positions?.set(this.slots[at]!, at);
    }
    this.slots.pop();
    this.counts.pop();
    if (this.positions !== null) {
      this.positions.delete(slot);
      // Back to scanning well below the switch point, so a size near it does not flap.
      if (this.slots.length <= HOLDERS_SCAN_MAX / 2) this.positions = null;
    }
    return true;
  }

  copyFrom(other: Holders): void {
    for (let i = 0; i < other.size; i++) {
      this.slots.push(other.slots[i]!);
      this.counts.push(other.counts[i]!);
    }
    if (other.positions !== null) this.positions = new Map(other.positions);
  }

  /** O(size) check: distinct slots, and the positions Map (if any) agrees. */
  verify(): void {
    const seen = new Set(this.slots);
    check(seen.size === this.slots.length && this.counts.length === this.slots.length, "holder slots repeat or counts misaligned");
    if (this.positions !== null) {
      check(this.positions.size === this.slots.length, "holder positions size");
      for (let i = 0; i < this.slots.length; i++) check(this.positions.get(this.slots[i]!) === i, "holder position");
    }
  }

  private find(slot: number): number {
    if (this.positions !== null) return this.positions.get(slot) ?? -1;
    const slots = this.slots;
    for (let i = 0; i < slots.length; i++) if (slots[i] === slot) return i;
    return -1;
  }
}

export class ActiveNode {
  /** (hi, lo) pairs of the edge's blocks. */
  edge: Uint32Array;
  /** Chain position of the edge's first block. */
  start: number;
  parent: ActiveNode | null;
  /**
   * Children by the lo word of their first block (`sameLo` chains the rare collisions);
   * null until the first child (most nodes are a request's own tail, a leaf).
   */
  children: Map<number, ActiveNode> | null = null;
  sameLo: ActiveNode | null = null;
  /** Active requests passing through this node, per worker slot. */
  readonly holders = new Holders();
  /** Sum of `holders`' counts. */
  total = 0;
  /** Requests whose chain ends at this node's last block. */
  ending = 0;

  constructor(edge: Uint32Array, start: number, parent: ActiveNode | null) {
    this.edge = edge;
    this.start = start;
    this.parent = parent;
  }

  get length(): number {
    return this.edge.length >>> 1;
  }
}

export class ActiveBlocks {
  private readonly root = new ActiveNode(new Uint32Array(0), 0, null);
  private nodes = 0;
  private words = 0;

  /** Live nodes (edges) over all active chains. */
  get nodeCount(): number {
    return this.nodes;
  }

  /** Blocks stored in edges (each distinct prefix position once, however many workers hold it). */
  get blockCount(): number {
    return this.words >>> 1;
  }

  /** Approximate bytes held: edge words plus a per-node overhead. */
  get bytes(): number {
    return this.words * 4 + this.nodes * 160;
  }

  /**
   * Adds a request's chain (`count` (hi, lo) pairs) to `slot`, storing its leaf in
   * `holder`. Returns how many blocks were not active on `slot` before.
   */
  add(slot: number, chain: Uint32Array, count: number, holder: ChainHolder): number {
    assertSlot(slot);
    if (chain.length < 2 * count) throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    holder.leaf = null;
    if (count === 0) return 0;
    let node = this.root;
    let at = 0;
    // Walk down while the chain follows existing edges; bounded by `count` blocks.
    while (at < count) {
      const child = this.childAt(node, chain, at);
      if (child === null) break;
      const matched = matchEdge(child, chain, at, count);
      if (matched < child.length) {
        node = this.split(child, matched);
        at += matched;
        break;
      }
      node = child;
      at += matched;
    }
    if (at < count) {
      const leaf = new ActiveNode(chain.slice(2 * at, 2 * count), at, node);
      this.link(node, leaf);
      this.nodes++;
      this.words += leaf.edge.length;
      node = leaf;
    }
    node.ending++;
    holder.leaf = node;
    // Count the request on its whole path.
    let added = 0;
    for (let n: ActiveNode = node; n !== this.root; n = n.parent!) {
      if (n.holders.add(slot)) added += n.length;
      n.total++;
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
    if (leaf.ending === 0 || !(leaf.holders.count(slot) > 0)) throw new Error(`no request on slot ${slot} ends at this node`);
    holder.leaf = null;
    leaf.ending--;
    let removed = 0;
    for (let n: ActiveNode = leaf; n !== this.root; n = n.parent!) {
      if (n.holders.remove(slot)) removed += n.length;
      n.total--;
    }
    // Drop the nodes no request passes through any more (a suffix of the path).
    let node = leaf;
    while (node !== this.root && node.total === 0) {
      const parent = node.parent!;
      this.unlink(parent, node);
      this.nodes--;
      this.words -= node.edge.length;
      node.parent = null;
      node = parent;
    }
    if (node !== this.root && node.ending === 0) {
      const child = onlyChild(node);
      if (child !== null) this.mergeIntoChild(node, child);
    }
    return removed;
  }

  /**
   * For each worker slot holding a prefix of `chain`, writes into `depthBySlot[slot]`
   * how many leading blocks it holds. Slots holding none are left untouched: the caller
   * zeroes the array first.
   */
  sharedDepths(chain: Uint32Array, count: number, depthBySlot: Uint32Array): void {
    const path = this.path;
    const depths = this.pathDepths;
    let length = 0;
    let node = this.root;
    let at = 0;
    while (at < count) {
      const child = this.childAt(node, chain, at);
      if (child === null) break;
      const matched = matchEdge(child, chain, at, count);
      path[length] = child;
      depths[length++] = at + matched;
      if (matched < child.length) break;
      node = child;
      at += matched;
    }
    // Holders only shrink going down, so the deepest node a worker holds gives its depth,
    // and the first node's holders are every worker with a depth: once that many have
    // one, the shallower nodes (often a hot prefix split many times, each part held by
    // every worker) have nothing left to give. Depths are >= 1, so 0 means "not yet".
    const workers = length > 0 ? path[0]!.holders.size : 0;
    let assigned = 0;
    for (let i = length - 1; i >= 0 && assigned < workers; i--) {
      const depth = depths[i]!;
      const holders = path[i]!.holders;
      const slots = holders.slots;
      for (let h = 0; h < holders.size; h++) {
        const slot = slots[h]!;
        if (depthBySlot[slot] === 0) {
          depthBySlot[slot] = depth;
          assigned++;
        }
      }
    }
    for (let i = 0; i < length; i++) path[i] = this.root; // drop the references
  }

  private readonly path: ActiveNode[] = [];
  private readonly pathDepths: number[] = [];

  /** Drops everything. */
  clear(): void {
    this.root.children = null;
    this.nodes = 0;
    this.words = 0;
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): positions and links agree, every
   * node's count equals the requests ending on it plus its children's counts (also per
   * worker, as an upper bound), no node is empty or mergeable. Returns distinct blocks
   * per slot.
   */
  verify(): Map<number, number> {
    const perSlot = new Map<number, number>();
    let nodes = 0;
    let words = 0;
    // Iterative (a chain of nested request ends can be thousands of nodes deep).
    const stack: ActiveNode[] = [this.root];
    while (stack.length > 0) {
      const node = stack.pop()!;
      let childTotal = 0;
      check(node.children === null || node.children.size > 0, "empty children map kept");
      for (const [key, first] of node.children ?? []) {
        for (let child: ActiveNode | null = first; child !== null; child = child.sameLo) {
          check(child.parent === node, "child's parent link");
          check(child.edge[1] === key, "child under the wrong key");
          check(child.start === node.start + node.length, "child position");
          check(child.length > 0 && child.total > 0, "empty node kept");
          check(child.ending > 0 || onlyChild(child) === null, "mergeable node kept");
          let sum = 0;
          child.holders.verify();
          for (let h = 0; h < child.holders.size; h++) {
            const slot = child.holders.slots[h]!;
            const held = child.holders.counts[h]!;
            check(held > 0, "zero holder count kept");
            check(node === this.root || node.holders.count(slot) >= held, "worker holds a node but not its parent");
            perSlot.set(slot, (perSlot.get(slot) ?? 0) + child.length);
            sum += held;
          }
          check(sum === child.total, "holder counts differ from the total");
          nodes++;
          words += child.edge.length;
          childTotal += child.total;
          stack.push(child);
        }
      }
      if (node !== this.root) check(node.total === node.ending + childTotal, "total differs from endings plus children");
    }
    check(nodes === this.nodes && words === this.words, "node or word count is off");
    return perSlot;
  }

  /** The child of `node` whose edge starts with block `at` of `chain`, or null. */
  private childAt(node: ActiveNode, chain: Uint32Array, at: number): ActiveNode | null {
    const hi = chain[2 * at]!;
    if (node.children === null) return null;
    let child = node.children.get(chain[2 * at + 1]!) ?? null;
    while (child !== null && child.edge[0] !== hi) child = child.sameLo;
    return child;
  }

  private link(parent: ActiveNode, child: ActiveNode): void {
    const key = child.edge[1]!;
    parent.children ??= new Map();
    child.sameLo = parent.children.get(key) ?? null;
    parent.children.set(key, child);
  }

  private unlink(parent: ActiveNode, child: ActiveNode): void {
    const key = child.edge[1]!;
    const children = parent.children!;
    let first = children.get(key)!;
    if (first === child) {
      if (child.sameLo !== null) children.set(key, child.sameLo);
      else if (children.size === 1) parent.children = null;
      else children.delete(key);
    } else {
      while (first.sameLo !== child) first = first.sameLo!;
      first.sameLo = child.sameLo;
    }
    child.sameLo = null;
  }

  /**
   * Splits `node` after its first `blocks` blocks: a new node takes the prefix and
   * `node` keeps the suffix (so handles to `node` stay valid). Returns the new node.
   */
  private split(node: ActiveNode, blocks: number): ActiveNode {
    const parent = node.parent!;
    const prefix = new ActiveNode(node.edge.slice(0, 2 * blocks), node.start, parent);
    this.unlink(parent, node);
    this.link(parent, prefix);
    prefix.holders.copyFrom(node.holders);
    prefix.total = node.total;
    node.edge = node.edge.slice(2 * blocks);
    node.start += blocks;
    node.parent = prefix;
    this.link(prefix, node);
    this.nodes++;
    return prefix;
  }

  /** `node` has one child and no request ending on it: the child absorbs its edge. */
  private mergeIntoChild(node: ActiveNode, child: ActiveNode): void {
    const parent = node.parent!;
    const edge = new Uint32Array(node.edge.length + child.edge.length);
    edge.set(node.edge);
    edge.set(child.edge, node.edge.length);
    this.unlink(parent, node);
    node.children = null;
    child.edge = edge;
    child.start = node.start;
    child.parent = parent;
    this.link(parent, child);
    node.parent = null;
    this.nodes--;
  }
}

/** The node's child if it has exactly one, else null. */
function onlyChild(node: ActiveNode): ActiveNode | null {
  if (node.children === null || node.children.size !== 1) return null;
  const child = node.children.values().next().value!;
  return child.sameLo === null ? child : null;
}

/** How many blocks of `node`'s edge equal `chain` from block `at` on (at most `count - at`). */
function matchEdge(node: ActiveNode, chain: Uint32Array, at: number, count: number): number {
  const edge = node.edge;
  const limit = Math.min(edge.length >>> 1, count - at);
  let i = 0;
  while (i < limit && edge[2 * i + 1] === chain[2 * (at + i) + 1] && edge[2 * i] === chain[2 * (at + i)]) i++;
  return i;
}

function assertSlot(slot: number): void {
  if (!(slot >= 0 && slot <= 0x7fff_ffff && Number.isInteger(slot))) throw new RangeError(`bad worker slot ${slot}`);
}

function check(condition: boolean, message: string): void {
  if (!condition) throw new Error(`active blocks: ${message}`);
}
