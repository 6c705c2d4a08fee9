/**
 * The node pool, structure of arrays. Node ids are u32 indexes; 0 is null and 1 is
 * the root (empty edge, never freed). A live non-root node has an edge of at least
 * one block, so `len === 0` marks a free id; free ids chain through `parent`.
 * Owner lists (coverage) are records of the same ids in an OwnerLists, grown here.
 */
import { assert, fail } from "../assert";
import type { OwnerLists } from "../owners";
import { PRIVATE_MEMORY, type PoolMemory } from "./shared-memory";
import { RETIRED_NODE, type SharedWriter } from "./shared-writer";

export const NULL_NODE = 0;
export const ROOT = 1;
/** runOrder of a node that does not start its block run (a split suffix). */
export const NOT_RUN_HEAD = 255;
const CAPACITY_MIN = 64;

export class NodePool {
  /** Parent node; for a free id, the next free id. */
  parent: Uint32Array;
  /** First block id of the edge. */
  start: Uint32Array;
  /** Blocks in the edge. */
  len: Uint32Array;
  /** Unused ids of the block run right after the edge (room to grow in place). */
  spare: Uint32Array;
  /** Number of children. */
  kids: Uint32Array;
  /**
   * The sequence hash (src/hash chainHashes) of the edge's last block, (hi, lo): a
   * lookup whose query has the same sequence hash at that depth matches the whole edge
   * without comparing its blocks (match.ts). Kept by tree.ts. Two words per node, side
   * by side: a lookup's one cache miss for both.
   */
  chain: Uint32Array;
  /** Order of the block run this node starts, or NOT_RUN_HEAD. */
  runOrder: Uint8Array;
  /** Live nodes, the root excluded. */
  live = 0;
  private next = 2;
  private freeHead = NULL_NODE;
  private readonly owners: OwnerLists;
  private readonly memory: PoolMemory;
  /** Shared mode: freed ids wait here until no reader can follow them. */
  private readonly writer: SharedWriter | null;

  constructor(
    owners: OwnerLists,
    memory: PoolMemory = PRIVATE_MEMORY,
    writer: SharedWriter | null = null,
  ) {
    this.owners = owners;
    this.memory = memory;
    this.writer = writer;
    this.parent = this.start = this.len = this.spare = this.kids = EMPTY;
    this.chain = EMPTY;
    this.runOrder = new Uint8Array(0);
    this.resize(CAPACITY_MIN, 0);
    this.runOrder[ROOT] = NOT_RUN_HEAD;
    owners.ensureRecords(CAPACITY_MIN);
  }

  /** Back to the initial size once the tree is empty (memory returns to baseline). */
  reset(): void {
    assert(this.live === 0 && this.kids[ROOT] === 0, "node pool reset while nodes are live");
    this.resize(CAPACITY_MIN, 0);
    this.runOrder[ROOT] = NOT_RUN_HEAD;
    this.next = 2;
    this.freeHead = NULL_NODE;
    this.owners.resetAll(CAPACITY_MIN);
  }

  get capacity(): number {
    return this.parent.length;
  }

  /** A fresh node id; the caller sets every field (len >= 1). */
  allocate(): number {
    let id = this.freeHead;
    if (id !== NULL_NODE) {
      this.freeHead = this.parent[id]!;
    } else {
      if (this.next === this.capacity) this.grow();
      id = this.next++;
    }
    this.live++;
    return id;
  }

  free(id: number): void {
    if (id <= ROOT || id >= this.next || this.len[id] === 0)
      fail("freeing a node id that is not live");
    if (this.kids[id] !== 0 || this.owners.count[id] !== 0)
      fail("freeing a node that has children or owners");
    this.writer?.touch(id);
    this.len[id] = 0;
    this.start[id] = 0;
    this.spare[id] = 0;
    this.live--;
    if (this.writer === null) this.release(id);
    else this.writer.retire(RETIRED_NODE, id, 0);
  }

  /** Puts a freed id on the free list (at once, or when it leaves limbo). */
  release(id: number): void {
    this.parent[id] = this.freeHead;
    this.freeHead = id;
  }

  isLive(id: number): boolean {
    return id === ROOT || (id > ROOT && id < this.next && this.len[id]! > 0);
  }

  /** Ids ever handed out (live or free) are below this. */
  get highWater(): number {
    return this.next;
  }

  /** Walks the free list; returns its length (verify; ids in limbo are not on it). */
  freeCount(): number {
    let count = 0;
    for (let id = this.freeHead; id !== NULL_NODE; id = this.parent[id]!) {
      assert(count++ < this.next, "node free list cycles");
      assert(this.len[id] === 0, "free node has an edge");
    }
    return count;
  }

  bytes(): number {
    return 5 * this.parent.byteLength + this.chain.byteLength + this.runOrder.byteLength;
  }

  private grow(): void {
    const size = this.capacity * 2;
    this.resize(size, this.capacity);
    this.owners.ensureRecords(size);
  }

  /** Every array at `size` entries, keeping the first `keep` (decisions.md#plain-typed-arrays). */
  private resize(size: number, keep: number): void {
    const memory = this.memory;
    this.parent = memory.u32("nodes.parent", size, this.parent, keep);
    this.start = memory.u32("nodes.start", size, this.start, keep);
    this.len = memory.u32("nodes.len", size, this.len, keep);
    this.spare = memory.u32("nodes.spare", size, this.spare, keep);
    this.kids = memory.u32("nodes.kids", size, this.kids, keep);
    this.chain = memory.u32("nodes.chain", 2 * size, this.chain, 2 * keep);
    this.runOrder = memory.u8("nodes.runOrder", size, this.runOrder, keep);
  }
}

const EMPTY = new Uint32Array(0);
