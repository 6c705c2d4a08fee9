/**
 * The blocks of in-flight requests, per worker, refcounted: which sequence hashes
 * (Dynamo's chained block hashes, src/hash `chainHashes`) each worker's active
 * requests cover, and how many of its requests cover each one.
 *
 * It answers two questions on the routing hot path:
 *  - how many distinct blocks a worker has active (its decode load), kept by the
 *    caller from the counts `add` and `remove` return;
 *  - for a new request, how deep its prefix is already active on each worker
 *    (`sharedDepths`), so the cost charges only the blocks a worker would add.
 *
 * Layout: one open-addressing table (linear probing, backward-shift deletion) keyed by
 * (hash hi, hash lo, slot) over a pool of nodes. A *hash node* (slot = SLOT_NONE) holds
 * how many workers have the hash active and heads a doubly linked list of *owner nodes*,
 * one per (hash, worker), each holding its refcount. So adding or removing a request
 * costs O(1) per block however many workers share the block, and the owners of a hash
 * can be listed without a scan of all workers.
 *
 * Why depths are cheap: a sequence hash names its whole prefix, so a worker that has
 * block i of a chain active also has blocks 0..i-1 active. The owner count along a
 * request's chain is therefore non-increasing, and `sharedDepths` only visits the
 * positions where it drops (found by binary search), not every block.
 *
 * Memory: the table and pool grow by doubling and shrink (with compaction) when an
 * eighth full, so capacity follows what is active now; `clear` goes back to the
 * initial size. `nodeCount`/`hashCount` expose exact counts for tests.
 */

const SLOT_NONE = 0xffff_ffff;
/** Smallest table; the pool holds half as many nodes (the table stays at most half full). */
const TABLE_CAPACITY_MIN = 1024;

export class ActiveBlocks {
  private capacity = 0;
  private mask = 0;
  // Table buckets. tableNode 0 marks an empty bucket.
  private tableHi = new Uint32Array(0);
  private tableLo = new Uint32Array(0);
  private tableSlot = new Uint32Array(0);
  private tableNode = new Uint32Array(0);
  // Node pool (id 0 is null). For a hash node: count = owners, link = first owner.
  // For an owner node: count = refs, link = next owner, prev = previous owner,
  // parent = its hash node, slot = the worker.
  private poolCount = new Uint32Array(0);
  private poolLink = new Uint32Array(0);
  private poolPrev = new Uint32Array(0);
  private poolParent = new Uint32Array(0);
  private poolSlot = new Uint32Array(0);
  private nodeTop = 1;
  private freeHead = 0;
  private live = 0;
  private hashes = 0;

  constructor() {
    this.resize(TABLE_CAPACITY_MIN);
  }

  /** Live nodes: distinct hashes plus (hash, worker) owners. */
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
    return this.capacity * 16 + ((this.capacity >>> 1) + 1) * 20;
  }

  /**
   * Adds one request's chain (`count` (hi, lo) pairs) to `slot`. Returns how many of
   * the hashes were not active on `slot` before (its distinct-block increase).
   */
  add(slot: number, chain: Uint32Array, count: number): number {
    assertSlot(slot);
    if (chain.length < 2 * count) throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    let added = 0;
    for (let i = 0; i < count; i++) {
      if ((this.live + 2) * 2 > this.capacity) this.resize(this.capacity * 2);
      const hi = chain[2 * i]!;
      const lo = chain[2 * i + 1]!;
      const ownerAt = this.find(hi, lo, slot);
      const existing = this.tableNode[ownerAt]!;
      if (existing !== 0) {
        this.poolCount[existing]!++;
        continue;
      }
      const hashAt = this.find(hi, lo, SLOT_NONE);
      let hashNode = this.tableNode[hashAt]!;
      if (hashNode === 0) {
        hashNode = this.allocate(0, SLOT_NONE);
        this.put(hashAt, hi, lo, SLOT_NONE, hashNode);
        this.hashes++;
      }
      // The hash insert may have taken the owner's bucket: probe again.
      const owner = this.allocate(1, slot);
      this.put(this.find(hi, lo, slot), hi, lo, slot, owner);
      const head = this.poolLink[hashNode]!;
      this.poolParent[owner] = hashNode;
      this.poolLink[owner] = head;
      this.poolPrev[owner] = 0;
      if (head !== 0) this.poolPrev[head] = owner;
      this.poolLink[hashNode] = owner;
      this.poolCount[hashNode]!++;
      added++;
    }
    return added;
  }

  /**
   * Removes one request's chain from `slot` (exactly what `add` was given). Returns
   * how many hashes are no longer active on `slot`. Removing what was never added is
   * a bug in the caller and throws.
   */
  remove(slot: number, chain: Uint32Array, count: number): number {
    assertSlot(slot);
    if (chain.length < 2 * count) throw new RangeError(`chain holds ${chain.length} words, needs ${2 * count}`);
    let removed = 0;
    for (let i = 0; i < count; i++) {
      const hi = chain[2 * i]!;
      const lo = chain[2 * i + 1]!;
      const ownerAt = this.find(hi, lo, slot);
      const owner = this.tableNode[ownerAt]!;
      if (owner === 0) throw new Error(`active block ${i} of the chain is not held by slot ${slot}`);
      if (--this.poolCount[owner]! > 0) continue;
      const hashNode = this.poolParent[owner]!;
      const prev = this.poolPrev[owner]!;
      const next = this.poolLink[owner]!;
      if (prev === 0) this.poolLink[hashNode] = next;
      else this.poolLink[prev] = next;
      if (next !== 0) this.poolPrev[next] = prev;
      this.erase(ownerAt);
      this.release(owner);
      if (--this.poolCount[hashNode]! === 0) {
        this.erase(this.find(hi, lo, SLOT_NONE));
        this.release(hashNode);
        this.hashes--;
      }
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
      const hashNode = this.hashNodeAt(chain, at);
      const owners = this.poolCount[hashNode]!;
      let node = this.poolLink[hashNode]!;
      while (node !== 0) {
        const slot = this.poolSlot[node]!;
        if (depthBySlot[slot] === 0) depthBySlot[slot] = at + 1;
        node = this.poolLink[node]!;
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

  /** The hash node of block `index` of `chain` (0 when no worker has it active). */
  private hashNodeAt(chain: Uint32Array, index: number): number {
    return this.tableNode[this.find(chain[2 * index]!, chain[2 * index + 1]!, SLOT_NONE)]!;
  }

  /** How many workers have block `index` of `chain` active (pool count 0 is 0). */
  private ownersAt(chain: Uint32Array, index: number): number {
    return this.poolCount[this.hashNodeAt(chain, index)]!;
  }

  /** Drops everything and returns to the initial capacity. */
  clear(): void {
    this.live = 0;
    this.hashes = 0;
    this.capacity = 0;
    this.resize(TABLE_CAPACITY_MIN);
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): every node is in the table once,
   * list links are mutual, owner counts match list lengths, and the live count matches.
   * Returns per-slot distinct block counts so callers can compare their own counters.
   */
  verify(): Map<number, number> {
    const perSlot = new Map<number, number>();
    let seen = 0;
    let hashNodes = 0;
    for (let at = 0; at < this.capacity; at++) {
      const node = this.tableNode[at]!;
      if (node === 0) continue;
      seen++;
      const slot = this.tableSlot[at]!;
      check(this.poolSlot[node] === slot, "node slot differs from its key");
      check(this.find(this.tableHi[at]!, this.tableLo[at]!, slot) === at, "bucket not reachable by probing");
      if (slot !== SLOT_NONE) {
        check(this.poolCount[node]! > 0, "owner with zero refs");
        perSlot.set(slot, (perSlot.get(slot) ?? 0) + 1);
        continue;
      }
      hashNodes++;
      let length = 0;
      let prev = 0;
      for (let owner = this.poolLink[node]!; owner !== 0; owner = this.poolLink[owner]!) {
        check(this.poolPrev[owner] === prev, "broken prev link");
        check(this.poolParent[owner] === node, "owner points at another hash");
        check(length++ < this.capacity, "owner list cycles");
        prev = owner;
      }
      check(length === this.poolCount[node] && length > 0, "owner count differs from list length");
    }
    check(seen === this.live, `table holds ${seen} nodes, live count is ${this.live}`);
    check(hashNodes === this.hashes, "hash node count is off");
    return perSlot;
  }

  /** Bucket holding (hi, lo, slot), or the empty bucket where it would go. */
  private find(hi: number, lo: number, slot: number): number {
    let at = mix(hi, lo, slot) & this.mask;
    // Bounded: the table is at most half full, so an empty bucket is always reached.
    for (let probes = 0; probes <= this.mask; probes++) {
      if (this.tableNode[at] === 0) return at;
      if (this.tableLo[at] === lo && this.tableHi[at] === hi && this.tableSlot[at] === slot) return at;
      at = (at + 1) & this.mask;
    }
    throw new Error("active-block table has no empty bucket");
  }

  private put(at: number, hi: number, lo: number, slot: number, node: number): void {
    this.tableHi[at] = hi;
    this.tableLo[at] = lo;
    this.tableSlot[at] = slot;
    this.tableNode[at] = node;
  }

  /** Backward-shift deletion: later entries of the probe run move up into the hole. */
  private erase(hole: number): void {
    let at = hole;
    for (let probes = 0; probes <= this.mask; probes++) {
      at = (at + 1) & this.mask;
      const node = this.tableNode[at]!;
      if (node === 0) break;
      const home = mix(this.tableHi[at]!, this.tableLo[at]!, this.tableSlot[at]!) & this.mask;
      // Move the entry if its home is not cyclically within (hole, at].
      const stays = hole <= at ? home > hole && home <= at : home > hole || home <= at;
      if (stays) continue;
      this.put(hole, this.tableHi[at]!, this.tableLo[at]!, this.tableSlot[at]!, node);
      hole = at;
    }
    this.tableNode[hole] = 0;
  }

  private allocate(count: number, slot: number): number {
    let node = this.freeHead;
    if (node !== 0) this.freeHead = this.poolLink[node]!;
    else node = this.nodeTop++;
    this.poolCount[node] = count;
    this.poolLink[node] = 0;
    this.poolPrev[node] = 0;
    this.poolParent[node] = 0;
    this.poolSlot[node] = slot;
    this.live++;
    return node;
  }

  private release(node: number): void {
    this.poolCount[node] = 0;
    this.poolLink[node] = this.freeHead;
    this.freeHead = node;
    this.live--;
  }

  /**
   * The one allocation site: new table and pool of `capacity` buckets, live nodes
   * renumbered densely from 1 (so a shrink also compacts the pool).
   */
  private resize(capacity: number): void {
    if (capacity < TABLE_CAPACITY_MIN || (capacity & (capacity - 1)) !== 0) throw new Error(`bad capacity ${capacity}`);
    const old = {
      capacity: this.capacity, hi: this.tableHi, lo: this.tableLo, slot: this.tableSlot, node: this.tableNode,
      count: this.poolCount, link: this.poolLink, prev: this.poolPrev, parent: this.poolParent,
    };
    const poolSize = (capacity >>> 1) + 1;
    if (this.live + 1 > poolSize) throw new Error(`capacity ${capacity} cannot hold ${this.live} nodes`);
    this.capacity = capacity;
    this.mask = capacity - 1;
    this.tableHi = new Uint32Array(capacity);
    this.tableLo = new Uint32Array(capacity);
    this.tableSlot = new Uint32Array(capacity);
    this.tableNode = new Uint32Array(capacity);
    this.poolCount = new Uint32Array(poolSize);
    this.poolLink = new Uint32Array(poolSize);
    this.poolPrev = new Uint32Array(poolSize);
    this.poolParent = new Uint32Array(poolSize);
    this.poolSlot = new Uint32Array(poolSize);
    this.freeHead = 0;
    this.nodeTop = 1;
    if (old.capacity === 0) return;
    const renumber = new Uint32Array(old.count.length);
    for (let at = 0; at < old.capacity; at++) {
      const node = old.node[at]!;
      if (node === 0) continue;
      const fresh = this.nodeTop++;
      renumber[node] = fresh;
      this.put(this.find(old.hi[at]!, old.lo[at]!, old.slot[at]!), old.hi[at]!, old.lo[at]!, old.slot[at]!, fresh);
      this.poolSlot[fresh] = old.slot[at]!;
    }
    for (let node = 1; node < old.count.length; node++) {
      const fresh = renumber[node]!;
      if (fresh === 0) continue;
      this.poolCount[fresh] = old.count[node]!;
      this.poolLink[fresh] = renumber[old.link[node]!]!;
      this.poolPrev[fresh] = renumber[old.prev[node]!]!;
      this.poolParent[fresh] = renumber[old.parent[node]!]!;
    }
  }
}

/** Bucket hash of (hi, lo, slot). Sequence hashes are XXH3 outputs; mixing in the slot
 * keeps a hash's owner entries from clustering on one probe run. */
function mix(hi: number, lo: number, slot: number): number {
  let h = Math.imul(lo ^ Math.imul(hi, 0x9e37_79b1), 0x85eb_ca6b) ^ Math.imul(slot + 1, 0xc2b2_ae35);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b_3c6d);
  return (h ^ (h >>> 12)) >>> 0;
}

function assertSlot(slot: number): void {
  if (!(slot >= 0 && slot < SLOT_NONE && Number.isInteger(slot))) throw new RangeError(`bad worker slot ${slot}`);
}

function check(condition: boolean, message: string): void {
  if (!condition) throw new Error(`active blocks: ${message}`);
}
