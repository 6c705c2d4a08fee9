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
 * a prefix tree, one *node* per (hash, worker). A request holds one reference, on the
 * node of its last block; a node lives while requests end on it or it has children.
 * Admission starts below the deepest node the worker already has and appends the
 * rest; removal deletes upward from the leaf while nodes are empty. Both cost the
 * blocks the request adds or frees, not the length of a shared system prompt.
 *
 * Why per-hash entries: the table maps a hash to how many workers hold it and the head
 * of a doubly linked list of their nodes. The count along a request's chain never rises
 * (a worker holding block i holds 0..i-1), so `sharedDepths` visits only the positions
 * where it drops (binary search) and lists the owners there. A block held by one worker
 * (the common case: a request's own tail) costs one table entry and one node.
 *
 * Layout: an open-addressing table (linear probing, backward-shift deletion), 4 words
 * per bucket (hi, lo, owners, first node), and a pool of 8-word nodes: one probe or
 * node access is one cache line. Node ids are stable while the pool grows; the pool is
 * compacted (renumbered) only when it shrinks, inside `removeEnding`. Table and pool
 * grow by doubling and shrink when an eighth full, so memory follows what is active
 * now; `clear` returns to the initial size.
 *
 * A 64-bit collision between two different prefixes could make a worker's chain look
 * held past its real depth; the structure stays consistent (every link is maintained
 * by these operations), only that worker's depth for that request would be off.
 */

/** Smallest table (buckets) and pool (nodes). */
const TABLE_CAPACITY_MIN = 1024;
const POOL_CAPACITY_MIN = 512;
const BUCKET_WORDS = 4;
const KEY_HI = 0;
const KEY_LO = 1;
const OWNERS = 2; // workers holding the hash; 0 marks an empty bucket
const FIRST = 3; // first node of the owner list
const NODE_WORDS = 8;
const SLOT = 0; // the worker; -1 on a free node
const REQUESTS = 1; // requests ending on this node
const NEXT = 2; // next owner of the same hash (free list link on a free node)
const PREV = 3; // previous owner of the same hash (0 = first)
const PARENT = 4; // the node of the previous block on the same worker (0 = first block)
const CHILDREN = 5;
const HI = 6;
const LO = 7;

export class ActiveBlocks {
  private capacity = 0;
  private mask = 0;
  private table = new Int32Array(0);
  private pool = new Int32Array(NODE_WORDS * POOL_CAPACITY_MIN);
  private nodeTop = 1; // id 0 is null
  private freeHead = 0;
  private nodes = 0;
  private hashes = 0;

  constructor() {
    this.resizeTable(TABLE_CAPACITY_MIN);
  }

  /** Live (hash, worker) nodes: the sum over workers of their distinct active blocks. */
  get nodeCount(): number {
    return this.nodes;
  }

  /** Distinct active hashes over all workers. */
  get hashCount(): number {
    return this.hashes;
  }

  /** Bytes held by the table and the pool. */
  get bytes(): number {
    return this.table.byteLength + this.pool.byteLength;
  }

  /**
   * Adds a request's chain (`count` (hi, lo) pairs) to `slot`. Returns how many blocks
   * were not active on `slot` before (its distinct-block increase). The request is
   * removed later by `removeEnding` with its last pair.
   *
   * `depth` and `node` may pass what `sharedDepths` just found for this chain and slot
   * (how many leading blocks the slot holds and the node of the last of them), which
   * saves searching again; the default searches.
   */
  add(slot: number, chain: Uint32Array, count: number, depth = -1, node = 0): number {
    assertSlot(slot);
    if (chain.length < 2 * count) throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    if (count === 0) return 0;
    let parent = node;
    if (depth < 0) {
      depth = this.depthOn(slot, chain, count);
      parent = depth === 0 ? 0 : this.nodeOf(chain[2 * depth - 2]! | 0, chain[2 * depth - 1]! | 0, slot);
    } else {
      check(depth <= count && (depth === 0) === (parent === 0), "bad depth hint");
      check(depth === 0 || (this.pool[parent * NODE_WORDS + SLOT] === slot
        && this.pool[parent * NODE_WORDS + HI] === (chain[2 * depth - 2]! | 0)
        && this.pool[parent * NODE_WORDS + LO] === (chain[2 * depth - 1]! | 0)), "node hint is not the slot's node of the block");
    }
    const added = count - depth;
    // Room first: growing moves buckets but never renumbers nodes.
    let capacity = this.capacity;
    while ((this.hashes + added) * 2 > capacity) capacity *= 2;
    if (capacity !== this.capacity) this.resizeTable(capacity);
    this.reservePool(added);
    const table = this.table;
    const pool = this.pool;
    for (let i = depth; i < count; i++) {
      const hi = chain[2 * i]! | 0;
      const lo = chain[2 * i + 1]! | 0;
      const b = this.bucketOf(hi, lo) * BUCKET_WORDS;
      const fresh = this.allocate(slot, hi, lo, parent);
      if (table[b + OWNERS] === 0) {
        table[b + KEY_HI] = hi;
        table[b + KEY_LO] = lo;
        table[b + OWNERS] = 1;
        this.hashes++;
      } else {
        const head = table[b + FIRST]!;
        pool[fresh * NODE_WORDS + NEXT] = head;
        pool[head * NODE_WORDS + PREV] = fresh;
        table[b + OWNERS]!++;
      }
      table[b + FIRST] = fresh;
      if (parent !== 0) pool[parent * NODE_WORDS + CHILDREN]!++;
      parent = fresh;
    }
    pool[parent * NODE_WORDS + REQUESTS]!++;
    return added;
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
    if (node === 0 || pool[node * NODE_WORDS + REQUESTS] === 0) throw new Error(`no request on slot ${slot} ends at this block`);
    pool[node * NODE_WORDS + REQUESTS]!--;
    let removed = 0;
    // Bounded by the chain length: each step moves to the parent.
    while (node !== 0) {
      const n = node * NODE_WORDS;
      if (pool[n + REQUESTS] !== 0 || pool[n + CHILDREN] !== 0) break;
      const parent = pool[n + PARENT]!;
      this.unlink(node);
      if (parent !== 0) pool[parent * NODE_WORDS + CHILDREN]!--;
      node = parent;
      removed++;
    }
    if (this.hashes * 8 < this.capacity && this.capacity > TABLE_CAPACITY_MIN) this.resizeTable(this.capacity >>> 1);
    if (this.nodes * 8 < this.pool.length / NODE_WORDS && this.pool.length > NODE_WORDS * POOL_CAPACITY_MIN) this.compactPool();
    return removed;
  }

  /**
   * For each worker slot holding a prefix of `chain`, writes into `depthBySlot[slot]`
   * how many leading blocks it holds and into `nodeBySlot[slot]` its node of the last
   * of them (the hints `add` takes). Slots holding none are left untouched: the caller
   * zeroes `depthBySlot` first.
   */
  sharedDepths(chain: Uint32Array, count: number, depthBySlot: Uint32Array, nodeBySlot: Int32Array): void {
    if (count === 0 || this.hashes === 0) return;
    const rootOwners = this.ownersAt(chain, 0);
    if (rootOwners === 0) return;
    const pool = this.pool;
    // End of the held prefix: the first position with no owner (counts never rise).
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
      const b = this.bucketOf(chain[2 * at]! | 0, chain[2 * at + 1]! | 0) * BUCKET_WORDS;
      const owners = this.table[b + OWNERS]!;
      for (let node = this.table[b + FIRST]!; node !== 0; node = pool[node * NODE_WORDS + NEXT]!) {
        const slot = pool[node * NODE_WORDS + SLOT]!;
        if (depthBySlot[slot] !== 0) continue;
        depthBySlot[slot] = at + 1;
        nodeBySlot[slot] = node;
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

  /** Drops everything and returns to the initial size. */
  clear(): void {
    this.nodes = 0;
    this.hashes = 0;
    this.capacity = 0;
    this.resizeTable(TABLE_CAPACITY_MIN);
    this.pool = new Int32Array(NODE_WORDS * POOL_CAPACITY_MIN);
    this.nodeTop = 1;
    this.freeHead = 0;
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): every hash entry is reachable by
   * probing and its owner list is mutual, has its count of distinct workers and only
   * nodes of that hash; every live node is on exactly one list; child counts match
   * parent links; no node is empty. Returns distinct blocks per slot.
   */
  verify(): Map<number, number> {
    const pool = this.pool;
    const perSlot = new Map<number, number>();
    const children = new Map<number, number>();
    let listed = 0;
    let hashes = 0;
    for (let at = 0; at < this.capacity; at++) {
      const b = at * BUCKET_WORDS;
      const owners = this.table[b + OWNERS]!;
      if (owners === 0) continue;
      hashes++;
      const hi = this.table[b + KEY_HI]!;
      const lo = this.table[b + KEY_LO]!;
      check(this.bucketOf(hi, lo) === at, "bucket not reachable by probing");
      const slots = new Set<number>();
      let prev = 0;
      for (let node = this.table[b + FIRST]!; node !== 0; node = pool[node * NODE_WORDS + NEXT]!) {
        const n = node * NODE_WORDS;
        check(node < this.nodeTop && pool[n + SLOT]! >= 0, "free node on an owner list");
        check(pool[n + PREV] === prev, "broken prev link");
        check(pool[n + HI] === hi && pool[n + LO] === lo, "node of another hash on the list");
        check(pool[n + REQUESTS]! > 0 || pool[n + CHILDREN]! > 0, "empty node kept");
        check(!slots.has(pool[n + SLOT]!), "two nodes of one worker for one hash");
        check(listed++ < this.nodeTop, "owner list cycles");
        slots.add(pool[n + SLOT]!);
        perSlot.set(pool[n + SLOT]!, (perSlot.get(pool[n + SLOT]!) ?? 0) + 1);
        const parent = pool[n + PARENT]!;
        if (parent !== 0) {
          check(pool[parent * NODE_WORDS + SLOT] === pool[n + SLOT], "parent on another worker");
          children.set(parent, (children.get(parent) ?? 0) + 1);
        }
        prev = node;
      }
      check(slots.size === owners, "owner count differs from the list");
    }
    check(hashes === this.hashes, `table holds ${hashes} hashes, count is ${this.hashes}`);
    check(listed === this.nodes, `lists hold ${listed} nodes, count is ${this.nodes}`);
    for (let node = 1; node < this.nodeTop; node++) {
      if (pool[node * NODE_WORDS + SLOT]! < 0) continue;
      check((children.get(node) ?? 0) === pool[node * NODE_WORDS + CHILDREN], "child count differs from parent links");
    }
    return perSlot;
  }

  /** How many leading blocks of `chain` have a node on `slot` (present, then absent: binary search). */
  private depthOn(slot: number, chain: Uint32Array, count: number): number {
    let low = 0;
    let high = count;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.nodeOf(chain[2 * mid]! | 0, chain[2 * mid + 1]! | 0, slot) !== 0) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  /** How many workers hold block `index` of `chain`. */
  private ownersAt(chain: Uint32Array, index: number): number {
    return this.table[this.bucketOf(chain[2 * index]! | 0, chain[2 * index + 1]! | 0) * BUCKET_WORDS + OWNERS]!;
  }

  /** The node of (hi, lo) on `slot`, or 0: a walk of the hash's owner list. */
  private nodeOf(hi: number, lo: number, slot: number): number {
    const pool = this.pool;
    const b = this.bucketOf(hi, lo) * BUCKET_WORDS;
    let node = this.table[b + OWNERS] === 0 ? 0 : this.table[b + FIRST]!;
    // Bounded: a list holds at most one node per worker.
    while (node !== 0 && pool[node * NODE_WORDS + SLOT] !== slot) node = pool[node * NODE_WORDS + NEXT]!;
    return node;
  }

  /** Takes a node off its hash's owner list (erasing the hash when it was the last) and frees it. */
  private unlink(node: number): void {
    const pool = this.pool;
    const table = this.table;
    const n = node * NODE_WORDS;
    const at = this.bucketOf(pool[n + HI]!, pool[n + LO]!);
    const b = at * BUCKET_WORDS;
    const prev = pool[n + PREV]!;
    const next = pool[n + NEXT]!;
    if (prev === 0) table[b + FIRST] = next;
    else pool[prev * NODE_WORDS + NEXT] = next;
    if (next !== 0) pool[next * NODE_WORDS + PREV] = prev;
    if (--table[b + OWNERS]! === 0) {
      this.erase(at);
      this.hashes--;
    }
    pool[n + SLOT] = -1;
    pool[n + NEXT] = this.freeHead;
    this.freeHead = node;
    this.nodes--;
  }

  /** Bucket holding (hi, lo), or the empty bucket where it would go. */
  private bucketOf(hi: number, lo: number): number {
    const table = this.table;
    const mask = this.mask;
    let at = home(hi, lo, mask);
    // Bounded: the table is at most half full, so an empty bucket is always reached.
    for (let probes = 0; probes <= mask; probes++) {
      const b = at * BUCKET_WORDS;
      if (table[b + OWNERS] === 0 || (table[b + KEY_LO] === lo && table[b + KEY_HI] === hi)) return at;
      at = (at + 1) & mask;
    }
    throw new Error("active-block table has no empty bucket");
  }

  /** Backward-shift deletion: later entries of the probe run move up into the hole. */
  private erase(hole: number): void {
    const table = this.table;
    const mask = this.mask;
    let at = hole;
    for (let probes = 0; probes <= mask; probes++) {
      at = (at + 1) & mask;
      const b = at * BUCKET_WORDS;
      if (table[b + OWNERS] === 0) break;
      const wanted = home(table[b + KEY_HI]!, table[b + KEY_LO]!, mask);
      // The entry stays if its home is cyclically within (hole, at].
      if (hole <= at ? wanted > hole && wanted <= at : wanted > hole || wanted <= at) continue;
      const h = hole * BUCKET_WORDS;
      table[h + KEY_HI] = table[b + KEY_HI]!;
      table[h + KEY_LO] = table[b + KEY_LO]!;
      table[h + OWNERS] = table[b + OWNERS]!;
      table[h + FIRST] = table[b + FIRST]!;
      hole = at;
    }
    table[hole * BUCKET_WORDS + OWNERS] = 0;
    table[hole * BUCKET_WORDS + FIRST] = 0;
  }

  private allocate(slot: number, hi: number, lo: number, parent: number): number {
    let node = this.freeHead;
    const pool = this.pool;
    if (node !== 0) this.freeHead = pool[node * NODE_WORDS + NEXT]!;
    else node = this.nodeTop++;
    const n = node * NODE_WORDS;
    pool[n + SLOT] = slot;
    pool[n + REQUESTS] = 0;
    pool[n + NEXT] = 0;
    pool[n + PREV] = 0;
    pool[n + PARENT] = parent;
    pool[n + CHILDREN] = 0;
    pool[n + HI] = hi;
    pool[n + LO] = lo;
    this.nodes++;
    return node;
  }

  /** Grows the pool (keeping node ids) so `extra` more nodes fit: free ones first, then the tail. */
  private reservePool(extra: number): void {
    const fromTail = extra - (this.nodeTop - 1 - this.nodes);
    let capacity = this.pool.length / NODE_WORDS;
    if (fromTail <= 0 || this.nodeTop + fromTail <= capacity) return;
    while (capacity < this.nodeTop + fromTail) capacity *= 2;
    const pool = new Int32Array(capacity * NODE_WORDS);
    pool.set(this.pool);
    this.pool = pool;
  }

  /** Renumbers live nodes densely from 1 into a pool of a quarter of the size. */
  private compactPool(): void {
    const old = this.pool;
    const oldTop = this.nodeTop;
    const renumber = new Int32Array(oldTop);
    let top = 1;
    for (let node = 1; node < oldTop; node++) if (old[node * NODE_WORDS + SLOT]! >= 0) renumber[node] = top++;
    let capacity = old.length / NODE_WORDS;
    while (capacity > POOL_CAPACITY_MIN && top * 4 <= capacity) capacity >>>= 1;
    const pool = new Int32Array(capacity * NODE_WORDS);
    for (let node = 1; node < oldTop; node++) {
      const fresh = renumber[node]!;
      if (fresh === 0) continue;
      const from = node * NODE_WORDS;
      const to = fresh * NODE_WORDS;
      pool.set(old.subarray(from, from + NODE_WORDS), to);
      pool[to + NEXT] = renumber[old[from + NEXT]!]!;
      pool[to + PREV] = renumber[old[from + PREV]!]!;
      pool[to + PARENT] = renumber[old[from + PARENT]!]!;
    }
    for (let b = 0; b < this.table.length; b += BUCKET_WORDS) {
      if (this.table[b + OWNERS] !== 0) this.table[b + FIRST] = renumber[this.table[b + FIRST]!]!;
    }
    this.pool = pool;
    this.nodeTop = top;
    this.freeHead = 0;
  }

  /** The table's one allocation site: rehashes every entry into `capacity` buckets. */
  private resizeTable(capacity: number): void {
    if (capacity < TABLE_CAPACITY_MIN || (capacity & (capacity - 1)) !== 0) throw new Error(`bad capacity ${capacity}`);
    if (this.hashes * 2 > capacity) throw new Error(`capacity ${capacity} cannot hold ${this.hashes} hashes`);
    const old = this.table;
    this.capacity = capacity;
    this.mask = capacity - 1;
    this.table = new Int32Array(capacity * BUCKET_WORDS);
    for (let b = 0; b < old.length; b += BUCKET_WORDS) {
      if (old[b + OWNERS] === 0) continue;
      const to = this.bucketOf(old[b + KEY_HI]!, old[b + KEY_LO]!) * BUCKET_WORDS;
      this.table.set(old.subarray(b, b + BUCKET_WORDS), to);
    }
  }
}

/**
 * Home bucket of (hi, lo). Sequence hashes are XXH3 outputs, but the table must not
 * degrade on poorly mixed input either.
 */
function home(hi: number, lo: number, mask: number): number {
  let h = Math.imul(lo ^ Math.imul(hi, 0x9e37_79b1), 0x85eb_ca6b);
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
