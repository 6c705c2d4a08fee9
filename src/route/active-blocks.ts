/**
 * The blocks of in-flight requests, per worker: which sequence hashes (Dynamo's
 * chained block hashes, src/hash `chainHashes`) each worker's active requests cover.
 *
 * It answers two questions on the routing hot path:
 *  - how many distinct blocks a worker has active (its decode load): `add` and
 *    `removeEnding` return how many blocks a request adds to or frees from its worker;
 *  - for a new request, how deep its prefix is already active on each worker
 *    (`sharedDepths`), so the cost charges only the blocks a worker would add.
 *
 * Why a trie: a sequence hash names its whole prefix, so a worker's active blocks form
 * a prefix tree (one node per (hash, worker)). A request holds one reference, on the
 * node of its last block; a node lives while it has requests ending on it or children.
 * Admission jumps to the deepest node the worker already has (binary search: nodes on
 * a chain are present up to some depth and absent after) and appends the rest;
 * removal deletes upward from the leaf while nodes are empty. Both cost the blocks the
 * request adds or frees, not the length of a shared system prompt.
 *
 * Why global hash nodes: per sequence hash, a *hash node* counts the workers holding
 * it and heads a doubly linked list of their trie nodes. The count along a request's
 * chain never rises (a worker holding block i holds 0..i-1), so `sharedDepths` visits
 * only the positions where it drops (binary search), listing owners there.
 *
 * Layout: one open-addressing table (linear probing, backward-shift deletion) of
 * (hash hi, hash lo, slot) -> node id, interleaved 4 words per bucket; one node pool,
 * 8 words per node. One probe or node access is one cache line. Table and pool grow by
 * doubling and shrink (compacting the pool) when an eighth full: capacity follows what
 * is active now; `clear` returns to the initial size.
 */

const SLOT_NONE = -1;
/** Smallest table; the pool holds half as many nodes (the table stays at most half full). */
const TABLE_CAPACITY_MIN = 1024;
const BUCKET_WORDS = 4; // hi, lo, slot, node (0 = empty)
const NODE_WORDS = 8;
// Fields of every node.
const SLOT = 0; // worker slot, or SLOT_NONE for a hash node
const COUNT = 1; // hash node: workers holding it; trie node: requests ending on it
const LINK = 2; // hash node: first owner; trie node: next owner of the same hash; free list
// Hash node fields.
const HASH_HI = 3;
const HASH_LO = 4;
// Trie node fields.
const PREV = 3; // previous owner of the same hash (0 = first)
const PARENT = 4; // the node of the previous block on the same worker (0 = first block)
const CHILDREN = 5;
const HASH = 6; // its hash node

export class ActiveBlocks {
  private capacity = 0;
  private mask = 0;
  private table = new Int32Array(0);
  private pool = new Int32Array(0);
  private nodeTop = 1; // id 0 is null
  private freeHead = 0;
  private live = 0;
  private hashes = 0;

  constructor() {
    this.resize(TABLE_CAPACITY_MIN);
  }

  /** Live nodes: distinct hashes plus (hash, worker) trie nodes. */
  get nodeCount(): number {
    return this.live;
  }

  /** Distinct active hashes over all workers. */
  get hashCount(): number {
    return this.hashes;
  }

  /** (hash, worker) pairs: the sum over workers of their distinct active blocks. */
  get ownerCount(): number {
    return this.live - this.hashes;
  }

  /** Bytes held by the table and the pool. */
  get bytes(): number {
    return this.table.byteLength + this.pool.byteLength;
  }

  /**
   * Adds a request's chain (`count` (hi, lo) pairs) to `slot`. Returns how many blocks
   * were not active on `slot` before (its distinct-block increase). The request is
   * removed later by `removeEnding` with its last pair.
   */
  add(slot: number, chain: Uint32Array, count: number): number {
    assertSlot(slot);
    if (chain.length < 2 * count) throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    if (count === 0) return 0;
    const depth = this.depthOn(slot, chain, count);
    // Room for a trie node and a hash node per new block, before taking node ids
    // (a resize renumbers them).
    let capacity = this.capacity;
    while ((this.live + 2 * (count - depth)) * 2 > capacity) capacity *= 2;
    if (capacity !== this.capacity) this.resize(capacity);
    let parent = depth === 0 ? 0 : this.nodeOf((chain[2 * depth - 2]! | 0), (chain[2 * depth - 1]! | 0), slot);
    let created = 0;
    for (let i = depth; i < count; i++) {
      const hi = (chain[2 * i]! | 0);
      const lo = (chain[2 * i + 1]! | 0);
      const at = this.bucketOf(hi, lo, slot);
      const existing = this.table[at * BUCKET_WORDS + 3]!;
      if (existing !== 0) {
        // Only after a 64-bit hash collision broke prefix order: keep the structure consistent.
        parent = existing;
        continue;
      }
      parent = this.createNode(hi, lo, slot, parent, at);
      created++;
    }
    this.pool[parent * NODE_WORDS + COUNT]!++;
    return created;
  }

  /**
   * Removes one request added to `slot` whose chain ended with (hi, lo). Returns how
   * many blocks are no longer active on `slot`. Removing what was never added is a bug
   * in the caller and throws before changing anything.
   */
  removeEnding(slot: number, hi: number, lo: number): number {
    assertSlot(slot);
    const pool = this.pool;
    let node = this.nodeOf(hi | 0, lo | 0, slot);
    if (node === 0 || pool[node * NODE_WORDS + COUNT] === 0) throw new Error(`no request on slot ${slot} ends at this block`);
    pool[node * NODE_WORDS + COUNT]!--;
    let removed = 0;
    // Bounded by the chain length: each step moves to the parent.
    while (node !== 0 && pool[node * NODE_WORDS + COUNT] === 0 && pool[node * NODE_WORDS + CHILDREN] === 0) {
      const parent = pool[node * NODE_WORDS + PARENT]!;
      this.deleteNode(node);
      if (parent !== 0) pool[parent * NODE_WORDS + CHILDREN]!--;
      node = parent;
      removed++;
    }
    if (this.live * 8 < this.capacity && this.capacity > TABLE_CAPACITY_MIN) this.resize(this.capacity >>> 1);
    return removed;
  }

  /**
   * For each worker slot with active blocks on `chain`'s prefix, writes into
   * `depthBySlot[slot]` how many leading blocks of the chain it has active. Slots with
   * none are left untouched (the caller zeroes the array first).
   */
  sharedDepths(chain: Uint32Array, count: number, depthBySlot: Uint32Array): void {
    if (count === 0 || this.hashes === 0) return;
    const rootOwners = this.ownersAt(chain, 0);
    if (rootOwners === 0) return;
    const pool = this.pool;
    // End of the active prefix: the first position with no owner (counts never rise).
    let low = 1;
    let high = count;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.ownersAt(chain, mid) === 0) high = mid;
      else low = mid + 1;
    }
    // Walk down the staircase: at the last position of each run of equal owner counts,
    // every owner not yet given a depth ends there. Each step strictly lowers `at`.
    let at = low - 1;
    while (at >= 0) {
      const hashNode = this.nodeOf((chain[2 * at]! | 0), (chain[2 * at + 1]! | 0), SLOT_NONE);
      const owners = pool[hashNode * NODE_WORDS + COUNT]!;
      for (let node = pool[hashNode * NODE_WORDS + LINK]!; node !== 0; node = pool[node * NODE_WORDS + LINK]!) {
        const slot = pool[node * NODE_WORDS + SLOT]!;
        if (depthBySlot[slot] === 0) depthBySlot[slot] = at + 1;
      }
      if (owners >= rootOwners) break;
      // First position whose owner count is at most this run's: the run starts there.
      low = 0;
      high = at;
      while (low < high) {
        const mid = (low + high) >>> 1;
        if (this.ownersAt(chain, mid) <= owners) high = mid;
        else low = mid + 1;
      }
      at = low - 1;
    }
  }

  /** Drops everything and returns to the initial capacity. */
  clear(): void {
    this.live = 0;
    this.hashes = 0;
    this.capacity = 0;
    this.resize(TABLE_CAPACITY_MIN);
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): every node is in the table once and
   * reachable by probing, owner lists are mutual and match their counts, child counts
   * match parent links, and no trie node is empty. Returns distinct blocks per slot.
   */
  verify(): Map<number, number> {
    const pool = this.pool;
    const perSlot = new Map<number, number>();
    const children = new Map<number, number>();
    let seen = 0;
    let hashNodes = 0;
    for (let at = 0; at < this.capacity; at++) {
      const b = at * BUCKET_WORDS;
      const node = this.table[b + 3]!;
      if (node === 0) continue;
      seen++;
      const n = node * NODE_WORDS;
      const slot = this.table[b + 2]!;
      check(pool[n + SLOT] === slot, "node slot differs from its key");
      check(this.bucketOf(this.table[b]!, this.table[b + 1]!, slot) === at, "bucket not reachable by probing");
      if (slot !== SLOT_NONE) {
        const hashNode = pool[n + HASH]! * NODE_WORDS;
        check(pool[hashNode + HASH_HI] === this.table[b] && pool[hashNode + HASH_LO] === this.table[b + 1], "wrong hash node");
        check(pool[n + COUNT]! > 0 || pool[n + CHILDREN]! > 0, "empty trie node kept");
        const parent = pool[n + PARENT]!;
        if (parent !== 0) children.set(parent, (children.get(parent) ?? 0) + 1);
        perSlot.set(slot, (perSlot.get(slot) ?? 0) + 1);
        continue;
      }
      hashNodes++;
      check(pool[n + HASH_HI] === this.table[b] && pool[n + HASH_LO] === this.table[b + 1], "hash node key differs");
      let length = 0;
      let prev = 0;
      for (let owner = pool[n + LINK]!; owner !== 0; owner = pool[owner * NODE_WORDS + LINK]!) {
        check(pool[owner * NODE_WORDS + PREV] === prev, "broken prev link");
        check(pool[owner * NODE_WORDS + HASH] === node, "owner points at another hash");
        check(length++ < this.capacity, "owner list cycles");
        prev = owner;
      }
      check(length === pool[n + COUNT] && length > 0, "owner count differs from list length");
    }
    for (let at = 0; at < this.capacity; at++) {
      const node = this.table[at * BUCKET_WORDS + 3]!;
      if (node === 0 || this.table[at * BUCKET_WORDS + 2] === SLOT_NONE) continue;
      check((children.get(node) ?? 0) === pool[node * NODE_WORDS + CHILDREN], "child count differs from parent links");
    }
    check(seen === this.live, `table holds ${seen} nodes, live count is ${this.live}`);
    check(hashNodes === this.hashes, "hash node count is off");
    return perSlot;
  }

  /** How many leading blocks of `chain` have a node on `slot` (binary search: present, then absent). */
  private depthOn(slot: number, chain: Uint32Array, count: number): number {
    let low = 0;
    let high = count;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.nodeOf((chain[2 * mid]! | 0), (chain[2 * mid + 1]! | 0), slot) !== 0) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  /** How many workers have block `index` of `chain` active. */
  private ownersAt(chain: Uint32Array, index: number): number {
    const node = this.nodeOf((chain[2 * index]! | 0), (chain[2 * index + 1]! | 0), SLOT_NONE);
    return node === 0 ? 0 : this.pool[node * NODE_WORDS + COUNT]!;
  }

  /** Creates the node of (hi, lo) on `slot`; `at` is the empty bucket its key probes to. */
  private createNode(hi: number, lo: number, slot: number, parent: number, at: number): number {
    const pool = this.pool;
    const hashAt = this.bucketOf(hi, lo, SLOT_NONE);
    let hashNode = this.table[hashAt * BUCKET_WORDS + 3]!;
    if (hashNode === 0) {
      hashNode = this.allocate(SLOT_NONE);
      pool[hashNode * NODE_WORDS + HASH_HI] = hi;
      pool[hashNode * NODE_WORDS + HASH_LO] = lo;
      this.put(hashAt, hi, lo, SLOT_NONE, hashNode);
      this.hashes++;
      // Filling another empty bucket cannot move the first empty one on this key's
      // probe path, unless it was that very bucket.
      if (hashAt === at) at = this.bucketOf(hi, lo, slot);
    }
    const node = this.allocate(slot);
    const n = node * NODE_WORDS;
    const head = pool[hashNode * NODE_WORDS + LINK]!;
    pool[n + LINK] = head;
    pool[n + PARENT] = parent;
    pool[n + HASH] = hashNode;
    if (head !== 0) pool[head * NODE_WORDS + PREV] = node;
    pool[hashNode * NODE_WORDS + LINK] = node;
    pool[hashNode * NODE_WORDS + COUNT]!++;
    if (parent !== 0) pool[parent * NODE_WORDS + CHILDREN]!++;
    this.put(at, hi, lo, slot, node);
    return node;
  }

  private deleteNode(node: number): void {
    const pool = this.pool;
    const n = node * NODE_WORDS;
    const hashNode = pool[n + HASH]!;
    const h = hashNode * NODE_WORDS;
    const hi = pool[h + HASH_HI]!;
    const lo = pool[h + HASH_LO]!;
    const prev = pool[n + PREV]!;
    const next = pool[n + LINK]!;
    if (prev === 0) pool[h + LINK] = next;
    else pool[prev * NODE_WORDS + LINK] = next;
    if (next !== 0) pool[next * NODE_WORDS + PREV] = prev;
    this.erase(this.bucketOf(hi, lo, pool[n + SLOT]!));
    this.release(node);
    if (--pool[h + COUNT]! === 0) {
      this.erase(this.bucketOf(hi, lo, SLOT_NONE));
      this.release(hashNode);
      this.hashes--;
    }
  }

  /** The node stored under (hi, lo, slot), or 0. */
  private nodeOf(hi: number, lo: number, slot: number): number {
    return this.table[this.bucketOf(hi, lo, slot) * BUCKET_WORDS + 3]!;
  }

  /** Bucket holding (hi, lo, slot), or the empty bucket where it would go. */
  private bucketOf(hi: number, lo: number, slot: number): number {
    const table = this.table;
    let at = home(hi, lo, slot, this.mask);
    // Bounded: the table is at most half full, so an empty bucket is always reached.
    for (let probes = 0; probes <= this.mask; probes++) {
      const b = at * BUCKET_WORDS;
      if (table[b + 3] === 0) return at;
      if (table[b + 1] === lo && table[b] === hi && table[b + 2] === slot) return at;
      at = (at + 1) & this.mask;
    }
    throw new Error("active-block table has no empty bucket");
  }

  private put(at: number, hi: number, lo: number, slot: number, node: number): void {
    const b = at * BUCKET_WORDS;
    this.table[b] = hi;
    this.table[b + 1] = lo;
    this.table[b + 2] = slot;
    this.table[b + 3] = node;
  }

  /** Backward-shift deletion: later entries of the probe run move up into the hole. */
  private erase(hole: number): void {
    const table = this.table;
    let at = hole;
    for (let probes = 0; probes <= this.mask; probes++) {
      at = (at + 1) & this.mask;
      const b = at * BUCKET_WORDS;
      if (table[b + 3] === 0) break;
      const wanted = home(table[b]!, table[b + 1]!, table[b + 2]!, this.mask);
      // The entry stays if its home is cyclically within (hole, at].
      const stays = hole <= at ? wanted > hole && wanted <= at : wanted > hole || wanted <= at;
      if (stays) continue;
      const h = hole * BUCKET_WORDS;
      table[h] = table[b]!;
      table[h + 1] = table[b + 1]!;
      table[h + 2] = table[b + 2]!;
      table[h + 3] = table[b + 3]!;
      hole = at;
    }
    table[hole * BUCKET_WORDS + 3] = 0;
  }

  private allocate(slot: number): number {
    let node = this.freeHead;
    if (node !== 0) this.freeHead = this.pool[node * NODE_WORDS + LINK]!;
    else node = this.nodeTop++;
    const n = node * NODE_WORDS;
    const pool = this.pool;
    pool[n + SLOT] = slot;
    pool[n + COUNT] = 0;
    pool[n + LINK] = 0;
    pool[n + 3] = 0;
    pool[n + 4] = 0;
    pool[n + 5] = 0;
    pool[n + 6] = 0;
    this.live++;
    return node;
  }

  private release(node: number): void {
    this.pool[node * NODE_WORDS + LINK] = this.freeHead;
    this.freeHead = node;
    this.live--;
  }

  /**
   * The one allocation site: a new table of `capacity` buckets and a pool of half as
   * many nodes, live nodes renumbered densely from 1 (so a shrink also compacts).
   */
  private resize(capacity: number): void {
    if (capacity < TABLE_CAPACITY_MIN || (capacity & (capacity - 1)) !== 0) throw new Error(`bad capacity ${capacity}`);
    const poolSize = (capacity >>> 1) + 1;
    if (this.live + 1 > poolSize) throw new Error(`capacity ${capacity} cannot hold ${this.live} nodes`);
    const oldCapacity = this.capacity;
    const oldTable = this.table;
    const oldPool = this.pool;
    this.capacity = capacity;
    this.mask = capacity - 1;
    this.table = new Int32Array(capacity * BUCKET_WORDS);
    this.pool = new Int32Array(poolSize * NODE_WORDS);
    this.freeHead = 0;
    this.nodeTop = 1;
    if (oldCapacity === 0) return;
    const renumber = new Int32Array(oldPool.length / NODE_WORDS);
    for (let at = 0; at < oldCapacity; at++) {
      const b = at * BUCKET_WORDS;
      const node = oldTable[b + 3]!;
      if (node === 0) continue;
      const fresh = this.nodeTop++;
      renumber[node] = fresh;
      this.put(this.bucketOf(oldTable[b]!, oldTable[b + 1]!, oldTable[b + 2]!), oldTable[b]!, oldTable[b + 1]!,
        oldTable[b + 2]!, fresh);
    }
    const pool = this.pool;
    for (let node = 1; node < renumber.length; node++) {
      const fresh = renumber[node]!;
      if (fresh === 0) continue;
      const from = node * NODE_WORDS;
      const to = fresh * NODE_WORDS;
      pool.set(oldPool.subarray(from, from + NODE_WORDS), to);
      pool[to + LINK] = renumber[oldPool[from + LINK]!]!;
      if (oldPool[from + SLOT] === SLOT_NONE) continue;
      pool[to + PREV] = renumber[oldPool[from + PREV]!]!;
      pool[to + PARENT] = renumber[oldPool[from + PARENT]!]!;
      pool[to + HASH] = renumber[oldPool[from + HASH]!]!;
    }
  }
}

/**
 * Home bucket of (hi, lo, slot). Sequence hashes are XXH3 outputs, but the table must
 * not degrade on poorly mixed input either; mixing in the slot keeps one hash's owner
 * entries from sharing a probe run.
 */
function home(hi: number, lo: number, slot: number, mask: number): number {
  let h = Math.imul(lo ^ Math.imul(hi, 0x9e37_79b1), 0x85eb_ca6b) ^ Math.imul(slot + 1, 0xc2b2_ae35);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b_3c6d);
  return (h ^ (h >>> 12)) & mask;
}

function assertSlot(slot: number): void {
  if (!(slot >= 0 && slot <= 0x7fff_ffff && Number.isInteger(slot))) throw new RangeError(`bad worker slot ${slot}`);
}

function check(condition: boolean, message: string): void {
  if (!condition) throw new Error(`active blocks: ${message}`);
}
