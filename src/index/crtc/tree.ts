/**
 * The compressed radix tree's shape: pools plus the structural operations every
 * event path shares (split, new child, reclaim). README.md states the invariants.
 */
import { assert } from "../assert";
import { OwnerLists } from "../owners";
import { chainHashes } from "../../hash";
import { BlockPool, MARK_SHIFT } from "./blocks";
import { LinkTable } from "../link-table";
import { NOT_RUN_HEAD, NodePool, ROOT } from "./nodes";
import { PRIVATE_MEMORY, type PoolMemory } from "./shared-memory";
import { RETIRED_LIST, RETIRED_NODE, RETIRED_RUN, type SharedWriter } from "./shared-writer";

export class CrtcTree {
  readonly owners: OwnerLists;
  readonly nodes: NodePool;
  readonly blocks: BlockPool;
  readonly children: LinkTable;
  /** Blocks in live edges. */
  edgeBlocks = 0;
  private pairs = new Uint32Array(64);
  /** fold()'s (base, blocks...) pairs, hashed in place, and its result. */
  private foldPairs = new Uint32Array(64);
  private foldHi = 0;
  private foldLo = 0;

  /** `writer`: the shared mode's versions and epochs (shared-writer.ts); null for one thread. */
  constructor(
    memory: PoolMemory = PRIVATE_MEMORY,
    readonly writer: SharedWriter | null = null,
  ) {
    this.owners = new OwnerLists(64, memory, writer);
    this.nodes = new NodePool(this.owners, memory, writer);
    this.blocks = new BlockPool(undefined, memory, writer);
    this.children = new LinkTable(undefined, memory, writer);
    writer?.onRelease((kind, a, b) => {
      if (kind === RETIRED_NODE) this.nodes.release(a);
      else if (kind === RETIRED_RUN) this.blocks.release(a, b);
      else if (kind === RETIRED_LIST) this.owners.releaseList(a, b);
    });
  }

  /** Before changing what a reader reads of `node` (edge, owners, child links). */
  touch(node: number): void {
    if (this.writer !== null) this.writer.touch(node);
  }

  /** The end of one event (shared mode: versions close, epochs advance, limbo drains). */
  endEvent(): void {
    const writer = this.writer;
    if (writer === null) return;
    writer.endEvent();
    // An emptied tree resets its pools once nothing freed waits for readers any more.
    if (this.nodes.live === 0 && this.nodes.highWater > 2 && writer.limboEmpty) this.nodes.reset();
  }

  /**
   * Splits `node` at edge position `at` (0 < at < len). A new node takes the prefix
   * and the parent's link; `node` keeps the suffix (and its children, so nothing below
   * is re-keyed). Returns the prefix node. Owners holding >= at blocks hold all of the
   * prefix; the suffix keeps what they held past `at`.
   */
  split(node: number, at: number): number {
    const nodes = this.nodes;
    assert(node !== ROOT, "splitting the root");
    assert(at > 0 && at < nodes.len[node]!, "split position outside the edge");
    this.chainThrough(node, at);
    const prefix = nodes.allocate(); // may grow the node arrays: read them after
    const parent = nodes.parent[node]!;
    this.touch(prefix);
    this.touch(node);
    this.touch(parent);
    const start = nodes.start[node]!;
    const blocks = this.blocks;
    nodes.parent[prefix] = parent;
    nodes.start[prefix] = start;
    nodes.len[prefix] = at;
    nodes.spare[prefix] = 0;
    nodes.kids[prefix] = 1;
    nodes.runOrder[prefix] = nodes.runOrder[node]!;
    nodes.runOrder[node] = NOT_RUN_HEAD;
    this.setChain(prefix);
    this.children.replace(parent, blocks.hi[start]!, blocks.lo[start]!, node, prefix);
    nodes.start[node] = start + at;
    nodes.len[node] = nodes.len[node]! - at;
    nodes.parent[node] = prefix;
    this.children.insert(prefix, blocks.hi[start + at]!, blocks.lo[start + at]!, node);
    const blockNode = blocks.node;
    for (let block = start; block < start + at; block++) blockNode[block] = prefix;

    const owners = this.owners;
    const count = owners.count[node]!;
    if (this.pairs.length < 2 * count) this.pairs = new Uint32Array(4 * count);
    const pairs = this.pairs;
    pairs.set(owners.snapshot(node).subarray(0, 2 * count));
    owners.reset(node);
    for (let i = 0; i < 2 * count; i += 2) {
      const slot = pairs[i]!;
      const held = pairs[i + 1]!;
      owners.set(prefix, slot, held < at ? held : at);
      if (held > at) owners.set(node, slot, held - at);
    }
    return prefix;
  }

  /**
   * Links a new child of `parent` over blocks [start, start+len) of a fresh run of
   * 2^order ids (the caller allocated the run and wrote the blocks' hashes).
   */
  attachChild(parent: number, start: number, len: number, order: number): number {
    const node = this.nodes.allocate();
    const nodes = this.nodes;
    this.touch(node);
    this.touch(parent);
    nodes.parent[node] = parent;
    nodes.start[node] = start;
    nodes.len[node] = len;
    nodes.spare[node] = 2 ** order - len;
    nodes.kids[node] = 0;
    nodes.runOrder[node] = order;
    const blockNode = this.blocks.node;
    for (let block = start; block < start + len; block++) blockNode[block] = node;
    this.foldAfter(parent, start, len);
    this.setChain(node);
    this.children.insert(parent, this.blocks.hi[start]!, this.blocks.lo[start]!, node);
    nodes.kids[parent]!++;
    this.edgeBlocks += len;
    return node;
  }

  /**
   * Gives back what `node` no longer needs, cascading upward: a leaf whose owners all
   * stop short of its tail is truncated to the longest holder; a leaf with no owners is
   * unlinked (identity-checked) and freed, and its parent is examined next.
   */
  reclaim(node: number): void {
    const nodes = this.nodes;
    // Bounded by the depth of the tree: each round moves one node up.
    while (node !== ROOT) {
      if (nodes.kids[node] !== 0) return;
      const len = nodes.len[node]!;
      const held = this.owners.max(node);
      if (held === len) return;
      if (held > 0) {
        this.truncate(node, held);
        return;
      }
      const parent = nodes.parent[node]!;
      const start = nodes.start[node]!;
      this.touch(parent);
      this.touch(node);
      this.children.remove(parent, this.blocks.hi[start]!, this.blocks.lo[start]!, node);
      nodes.kids[parent]!--;
      this.releaseEdge(node, parent);
      nodes.free(node);
      node = parent;
    }
    const settled = this.writer === null || this.writer.limboEmpty;
    if (nodes.live === 0 && nodes.highWater > 2 && settled) nodes.reset();
  }

  /** Shortens a leaf's edge to `len` blocks; the tail becomes spare room. */
  private truncate(node: number, len: number): void {
    const nodes = this.nodes;
    const start = nodes.start[node]!;
    const old = nodes.len[node]!;
    this.touch(node);
    this.chainThrough(node, len);
    this.setChain(node);
    const blockNode = this.blocks.node;
    for (let block = start + len; block < start + old; block++) blockNode[block] = 0;
    nodes.len[node] = len;
    nodes.spare[node] = nodes.spare[node]! + old - len;
    this.edgeBlocks -= old - len;
  }

  /**
   * Frees a dying node's blocks: a run head frees its whole run (its suffix pieces died
   * first, since each is a descendant); a suffix piece hands its ids back to the piece
   * before it in the run, which is always its parent.
   */
  private releaseEdge(node: number, parent: number): void {
    const nodes = this.nodes;
    const start = nodes.start[node]!;
    const len = nodes.len[node]!;
    const total = len + nodes.spare[node]!;
    const blockNode = this.blocks.node;
    for (let block = start; block < start + len; block++) blockNode[block] = 0;
    this.edgeBlocks -= len;
    const order = nodes.runOrder[node]!;
    if (order !== NOT_RUN_HEAD) {
      assert(total === 2 ** order, "run head does not own its whole run");
      nodes.runOrder[node] = NOT_RUN_HEAD;
      this.blocks.free(start, order);
      return;
    }
    assert(parent !== ROOT, "a suffix piece hangs off the root");
    assert(
      nodes.start[parent]! + nodes.len[parent]! === start,
      "suffix piece not adjacent to its parent",
    );
    assert(nodes.spare[parent] === 0, "a piece with spare room is not the last of its run");
    nodes.spare[parent] = total;
  }

  /**
   * After `count` blocks written at `from`, right after `node`'s edge (the caller then
   * lengthens it): its end's sequence hash moves on over them.
   */
  chainAppended(node: number, from: number, count: number): void {
    this.foldAfter(node, from, count);
    this.setChain(node);
  }

  /**
   * The sequence hash of `node`'s edge block at position `end - 1` (1 <= end <= len)
   * into foldHi/foldLo: from the last mark at or before it inside the edge, else from
   * the parent's end (the root: from nothing), so at most 16 hashes.
   */
  chainThrough(node: number, end: number): void {
    const nodes = this.nodes;
    const start = nodes.start[node]!;
    const last = start + end - 1;
    const mark = last - ((last + 1) & ((1 << MARK_SHIFT) - 1));
    if (mark >= start) {
      const marks = this.blocks.marks;
      const at = 2 * (mark >>> MARK_SHIFT);
      this.fold(true, marks[at]!, marks[at + 1]!, mark + 1, last - mark);
      return;
    }
    this.foldAfter(nodes.parent[node]!, start, end);
  }

  /** The sequence hash of `node`'s edge block at position `end - 1`, into out[0..1] (writer only). */
  sequenceAt(node: number, end: number, out: Uint32Array): void {
    this.chainThrough(node, end);
    out[0] = this.foldHi;
    out[1] = this.foldLo;
  }

  /** fold() from the end of `node`'s edge (the root: from nothing). */
  private foldAfter(node: number, from: number, count: number): void {
    const chain = this.nodes.chain;
    if (node === ROOT) this.fold(false, 0, 0, from, count);
    else this.fold(true, chain[2 * node]!, chain[2 * node + 1]!, from, count);
  }

  /** The last fold's result becomes `node`'s end sequence hash. */
  private setChain(node: number): void {
    this.nodes.chain[2 * node] = this.foldHi;
    this.nodes.chain[2 * node + 1] = this.foldLo;
  }

  /**
   * The sequence hash after blocks [from, from + count) of the pool, continuing the
   * chain (baseHi, baseLo) (hasBase false: from the root, where the first block's
   * sequence hash is its local hash), into foldHi/foldLo; the marks of ids 15 mod 16
   * among them are written on the way.
   */
  private fold(
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    from: number,
    count: number,
  ): void {
    if (count === 0) {
      this.foldHi = baseHi;
      this.foldLo = baseLo;
      return;
    }
    const skip = hasBase ? 1 : 0;
    const total = count + skip;
    if (this.foldPairs.length < 2 * total) this.foldPairs = new Uint32Array(2 * total + 64);
    const pairs = this.foldPairs;
    const { hi, lo, marks } = this.blocks;
    pairs[0] = baseHi;
    pairs[1] = baseLo;
    for (let k = 0, at = 2 * skip; k < count; k++, at += 2) {
      pairs[at] = hi[from + k]!;
      pairs[at + 1] = lo[from + k]!;
    }
    chainHashes(pairs, total, pairs);
    const group = (1 << MARK_SHIFT) - 1;
    for (let id = from | group; id < from + count; id += group + 1) {
      const at = 2 * (id - from + skip);
      marks[2 * (id >>> MARK_SHIFT)] = pairs[at]!;
      marks[2 * (id >>> MARK_SHIFT) + 1] = pairs[at + 1]!;
    }
    this.foldHi = pairs[2 * total - 2]!;
    this.foldLo = pairs[2 * total - 1]!;
  }

  /** parent -> children, from one scan of the child table (verify only). */
  childLists(): Map<number, number[]> {
    const lists = new Map<number, number[]>();
    const table = this.children.table;
    for (let at = 0; at < table.length; at += 4) {
      const child = table[at + 3]!;
      if (child === 0) continue;
      const parent = table[at]!;
      let list = lists.get(parent);
      if (list === undefined) {
        list = [];
        lists.set(parent, list);
      }
      list.push(child);
    }
    return lists;
  }

  bytes(): number {
    return this.blocks.bytes() + this.nodes.bytes() + this.children.bytes() + this.owners.bytes();
  }
}
