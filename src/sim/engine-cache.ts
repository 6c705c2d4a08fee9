/**
 * The KV cache of one mock engine, as vLLM's prefix-caching block manager behaves
 * when seen from outside (its KV events).
 *
 * - A fixed pool of `capacityBlocks` slots of `blockSize` tokens.
 * - A full block is named by the engine's own chained hash (an "external" hash, as
 *   vLLM's): ext[i] = XXH3(ext[i−1] ‖ content[i], 1337) with content[i] = XXH3 of the
 *   block's tokens under a per-engine random 64-bit seed (vLLM's random NONE_HASH /
 *   PYTHONHASHSEED). It is deliberately not kvedge's local hash, so the router's
 *   dual-key design is exercised.
 * - A sequence reuses the blocks of its longest cached prefix (at most
 *   ⌊(prompt−1)/blockSize⌋ blocks: vLLM always computes the last prompt token).
 * - Running sequences pin their blocks (reference counts). A block whose count drops
 *   to 0 joins the free queue; a sequence frees its blocks in reverse order, so its
 *   tail is evicted first (vLLM does the same). Allocation takes the head of the free
 *   queue — the least recently used block — and evicts it if it is cached.
 * - Newly computed full blocks are registered when `commit` says so (prompt blocks
 *   when the step computing them is scheduled, as vLLM V1's allocate_slots caches them;
 *   output blocks at the end of the step that fills them). If a block's hash is already
 *   cached (two sequences mid-chunked-prefill computing the same chunk, each having
 *   looked the cache up only when it was first scheduled; or a fully cached
 *   block-aligned prompt recomputing its last block), the block is kept as another
 *   physical copy and announced again, as vLLM's prefix cache does (its
 *   BlockHashToBlockMap keeps a block id -> block map per hash): hits use the oldest
 *   copy, and each copy is evicted on its own, with a BlockRemoved of its own. With
 *   `keepDuplicates: false` the sequence adopts the cached copy and frees its own instead
 *   (each hash cached once: a set history). A sequence pins every block it has
 *   committed, so the parent of every BlockStored is cached when the event is emitted.
 * - With a CPU tier (`cpuCapacityBlocks`, ./cpu-tier.ts), evicting a block's last
 *   device copy spills it there (vLLM's OffloadingConnector, offloading on eviction),
 *   announced as a `BlockStored` of medium "CPU" with its tokens, unless no tier holds
 *   its parent any more; the tier evicts its least recently used block when full
 *   (`BlockRemoved`, "CPU"). A request's prefix that continues past its device hit in the
 *   CPU tier is loaded back instead of computed (`loadedBlocks`; the engine charges the
 *   copy's time).
 * - Events are plain objects in vLLM's field order. Like current vLLM, which caches a
 *   step's blocks when it schedules them but publishes the step's events after it ran
 *   (Scheduler.update_from_output), they are published by `publish()` (the engine calls
 *   it at every step's end) and `takeEvents()` returns what was published. What a
 *   consumer of the events knows until then is the *published view*, per tier: a copy
 *   cached (or a block spilled to the CPU tier) since the last publish is hidden from
 *   it, and a published copy (or CPU block) evicted since is still in it (a ghost).
 *   `visiblePrefixBlocks`, `snapshot` and `hostSnapshot` answer from that view.
 *
 * Slots live in typed arrays allocated once in the constructor; cached slots are found
 * through a PairTable keyed by the full 64-bit hash, sized so it never grows.
 */
import { blockCount, chainHashes, DEFAULT_SEED, hashBlocks, type Seed } from "../hash";
import { u64 } from "../util/u64";
import { PairTable } from "../util/tables";
import { CpuTier, type HostBlock } from "./cpu-tier";

export interface BlockStoredEvent {
  readonly type: "BlockStored";
  readonly block_hashes: bigint[];
  readonly parent_block_hash: bigint | null;
  readonly token_ids: number[];
  readonly block_size: number;
  readonly lora_name: null;
  readonly medium: "GPU" | "CPU";
}

export interface BlockRemovedEvent {
  readonly type: "BlockRemoved";
  readonly block_hashes: bigint[];
  readonly medium: "GPU" | "CPU";
}

export interface AllBlocksClearedEvent {
  readonly type: "AllBlocksCleared";
}

export type KvEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent;

/** One scheduler step's events (vLLM's KVEventBatch): `ts` in seconds. */
export interface KvEventBatch {
  readonly ts: number;
  readonly events: KvEvent[];
}

/** A cached block as introspection reports it (once, however many copies it has). */
export interface CachedBlock {
  /** The engine's external hash. */
  readonly hash: bigint;
  /** Physical copies of the block in the cache (vLLM keeps duplicates; 1 usually). */
  readonly copies: number;
  /** External hash of the block before it in its sequence (null at position 0). */
  readonly parent: bigint | null;
  /** Block index in its sequence (0 = first block of a prompt). */
  readonly position: number;
  /** kvedge's sequence hash of the block (Dynamo's chain over local hashes): its token path. */
  readonly path: bigint;
  readonly tokens: Uint32Array;
}

/**
 * A token sequence as this engine sees it: tokens, and for every full block its
 * external hash and kvedge path hash, as (hi, lo) pairs.
 */
export interface CacheSequence {
  readonly tokens: Uint32Array;
  readonly promptLength: number;
  /** Full blocks of `tokens`. */
  readonly fullBlocks: number;
  readonly ext: Uint32Array;
  readonly path: Uint32Array;
  /** Slots held while allocated (length = blocks of tokens, partial tail included). */
  slots: Int32Array | null;
  /** Leading blocks reused from the cache at allocation. */
  hitBlocks: number;
  /** Blocks after those loaded back from the CPU tier at allocation. */
  loadedBlocks: number;
  /** Blocks [0, committedBlocks) are cached (hit, registered or adopted) and pinned. */
  committedBlocks: number;
}

export interface EngineCacheOptions {
  readonly capacityBlocks: number;
  /** Tokens per block (vLLM's default is 16). */
  readonly blockSize?: number;
  /** The engine's hash seed (random per engine, like vLLM's per-process seed). */
  readonly hashSeed: bigint;
  /** Collect KV events (off in the fast virtual-time simulator when nobody listens). */
  readonly recordEvents?: boolean;
  /**
   * Keep a computed block whose hash is already cached as another copy and announce it
   * (vLLM; the default), or adopt the cached copy (each hash cached once).
   */
  readonly keepDuplicates?: boolean;
  /** Blocks of the CPU offload tier (0 or absent: none). */
  readonly cpuCapacityBlocks?: number;
}

export const DEFAULT_BLOCK_SIZE = 16;
/** Capacity bound: slot indexes are i32 and the token pool is one typed array. */
export const CAPACITY_BLOCKS_MAX = 1 << 24;

const NONE = -1;

/** Counters the metrics layer (and tests) read. */
export interface EngineCacheCounters {
  /** Prompt blocks looked up at allocation, and how many were cache hits. */
  lookupBlocks: number;
  hitBlocks: number;
  storedBlocks: number;
  evictedBlocks: number;
  /** Computed blocks whose hash was already cached (kept as another copy, or the cached one adopted). */
  duplicateBlocks: number;
  clears: number;
  /** CPU tier: prompt blocks loaded back, blocks spilled there, blocks it evicted. */
  hostHitBlocks: number;
  spilledBlocks: number;
  hostEvictedBlocks: number;
}

export class EngineCache {
  readonly capacityBlocks: number;
  readonly blockSize: number;
  readonly recordEvents: boolean;
  readonly keepDuplicates: boolean;
  readonly counters: EngineCacheCounters = {
    lookupBlocks: 0,
    hitBlocks: 0,
    storedBlocks: 0,
    evictedBlocks: 0,
    duplicateBlocks: 0,
    clears: 0,
    hostHitBlocks: 0,
    spilledBlocks: 0,
    hostEvictedBlocks: 0,
  };
  /** The CPU offload tier, or null. */
  readonly cpu: CpuTier | null;
  /**
   * The CPU tier's blocks after the device hit in the last `cachedPrefixBlocks` call
   * (the true cache), or `visiblePrefixBlocks` call (the published view).
   */
  lastHostBlocks = 0;
  private readonly evictedHost = new Uint32Array(2);

  private readonly seed: Seed;
  // Per slot.
  private readonly extHi: Uint32Array;
  private readonly extLo: Uint32Array;
  private readonly parentHi: Uint32Array;
  private readonly parentLo: Uint32Array;
  private readonly pathHi: Uint32Array;
  private readonly pathLo: Uint32Array;
  private readonly position: Int32Array;
  private readonly refs: Uint32Array;
  private readonly cached: Uint8Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly queued: Uint8Array;
  /** Other cached copies of the slot's hash: a list, oldest first (the table names the oldest). */
  private readonly copyNext: Int32Array;
  private readonly copyPrev: Int32Array;
  private readonly tokenPool: Uint32Array;
  // Free queue: refcount-0 slots, least recently used at the head.
  private head = NONE;
  private tail = NONE;
  private freeCount = 0;
  private cachedCount = 0;
  /** Cached slots by external hash (the oldest copy of each). */
  private table: PairTable;
  private events: KvEvent[] = [];
  private published: KvEvent[] = [];
  /**
   * Per slot: 1 when listed in `hiddenSlots` (its copy was cached since the last publish;
   * a slot evicted meanwhile stays listed, so a slot is listed once).
   */
  private readonly hidden: Uint8Array;
  private readonly hiddenSlots: number[] = [];
  /** Published copies evicted since the last publish, per hash; with events, each hash's data once. */
  private readonly ghosts = new PairTable();
  private ghostBlocks: CachedBlock[] = [];
  private readonly scratch: { content: Uint32Array; ext: Uint32Array };

  constructor(options: EngineCacheOptions) {
    const capacity = options.capacityBlocks;
    const blockSize = options.blockSize ?? DEFAULT_BLOCK_SIZE;
    if (!Number.isSafeInteger(capacity) || capacity < 1 || capacity > CAPACITY_BLOCKS_MAX) {
      throw new RangeError(
        `capacityBlocks must be an integer in [1, ${CAPACITY_BLOCKS_MAX}], got ${capacity}`,
      );
    }
    if (!Number.isSafeInteger(blockSize) || blockSize < 1 || blockSize > 4096) {
      throw new RangeError(`blockSize must be an integer in [1, 4096], got ${blockSize}`);
    }
    this.capacityBlocks = capacity;
    this.blockSize = blockSize;
    this.recordEvents = options.recordEvents ?? true;
    this.keepDuplicates = options.keepDuplicates ?? true;
    const cpuBlocks = options.cpuCapacityBlocks ?? 0;
    this.cpu = cpuBlocks > 0 ? new CpuTier(cpuBlocks, this.recordEvents) : null;
    const seed = BigInt.asUintN(64, options.hashSeed);
    this.seed = { value: seed, hi: Number(seed >> 32n), lo: Number(seed & 0xffff_ffffn) };
    this.extHi = new Uint32Array(capacity);
    this.extLo = new Uint32Array(capacity);
    this.parentHi = new Uint32Array(capacity);
    this.parentLo = new Uint32Array(capacity);
    this.pathHi = new Uint32Array(capacity);
    this.pathLo = new Uint32Array(capacity);
    this.position = new Int32Array(capacity);
    this.refs = new Uint32Array(capacity);
    this.cached = new Uint8Array(capacity);
    this.prev = new Int32Array(capacity);
    this.next = new Int32Array(capacity);
    this.queued = new Uint8Array(capacity);
    this.copyNext = new Int32Array(capacity).fill(NONE);
    this.copyPrev = new Int32Array(capacity).fill(NONE);
    this.hidden = new Uint8Array(capacity);
    this.tokenPool = new Uint32Array(capacity * blockSize);
    for (let slot = 0; slot < capacity; slot++) this.enqueue(slot);
    // Holds at most `capacity` entries at load ≤ 1/2: twice as many buckets never grow.
    this.table = new PairTable(2 * capacity);
    this.scratch = { content: new Uint32Array(0), ext: new Uint32Array(0) };
  }

  /** Slots not pinned by any sequence (cached or not). */
  get freeBlocks(): number {
    return this.freeCount;
  }

  /** Slots pinned by running sequences. */
  get usedBlocks(): number {
    return this.capacityBlocks - this.freeCount;
  }

  /** Blocks currently in the prefix cache (pinned or evictable), every copy counted. */
  get cachedBlocks(): number {
    return this.cachedCount;
  }

  /** Distinct blocks (hashes) in the prefix cache: what an index of this engine holds. */
  get distinctBlocks(): number {
    return this.table.size;
  }

  /** Blocks a sequence of `tokenCount` tokens occupies (its partial tail included). */
  blocksFor(tokenCount: number): number {
    return Math.ceil(tokenCount / this.blockSize);
  }

  /** Hashes `tokens` (prompt, then any output) for this engine. */
  prepare(tokens: Uint32Array, promptLength: number): CacheSequence {
    if (!Number.isSafeInteger(promptLength) || promptLength < 1 || promptLength > tokens.length) {
      throw new RangeError(`promptLength ${promptLength} outside [1, ${tokens.length}]`);
    }
    const fullBlocks = blockCount(tokens.length, this.blockSize);
    const ext = new Uint32Array(2 * fullBlocks);
    const path = new Uint32Array(2 * fullBlocks);
    hashBlocks(tokens, this.blockSize, this.seed, ext);
    chainHashes(ext, fullBlocks, ext);
    hashBlocks(tokens, this.blockSize, DEFAULT_SEED, path);
    chainHashes(path, fullBlocks, path);
    return {
      tokens,
      promptLength,
      fullBlocks,
      ext,
      path,
      slots: null,
      hitBlocks: 0,
      loadedBlocks: 0,
      committedBlocks: 0,
    };
  }

  /**
   * Longest cached prefix of a prompt, in blocks, without touching anything (what a
   * router with exact knowledge of this engine would see).
   */
  cachedPrefixBlocks(tokens: Uint32Array, promptLength: number): number {
    const limit = this.reusableBlocks(promptLength);
    this.lastHostBlocks = 0;
    if (limit === 0) return 0;
    const ext = this.hashPrompt(tokens, limit);
    const device = this.matchPrefix(ext, limit);
    this.lastHostBlocks = this.hostContinuation(ext, device, limit);
    return device;
  }

  /**
   * Longest prefix of a prompt (at most the blocks the engine may reuse) whose every
   * block `holds` says is held, by this engine's external hashes: what another view of
   * this engine (an index that lost some of its events) knows; of the device only
   * (`lastHostBlocks` 0).
   */
  prefixBlocksIn(
    tokens: Uint32Array,
    promptLength: number,
    holds: (hi: number, lo: number) => boolean,
  ): number {
    const limit = this.reusableBlocks(promptLength);
    this.lastHostBlocks = 0;
    if (limit === 0) return 0;
    const ext = this.hashPrompt(tokens, limit);
    for (let i = 0; i < limit; i++) if (!holds(ext[2 * i]!, ext[2 * i + 1]!)) return i;
    return limit;
  }

  /**
   * Longest prefix of a prompt the published view holds, in blocks (at most the blocks
   * the engine may reuse): what an index fed by this engine's events can know now. Sets
   * `lastHostBlocks` to the published CPU tier's blocks after it.
   */
  visiblePrefixBlocks(tokens: Uint32Array, promptLength: number): number {
    const limit = this.reusableBlocks(promptLength);
    this.lastHostBlocks = 0;
    if (limit === 0) return 0;
    const ext = this.hashPrompt(tokens, limit);
    let device = 0;
    while (device < limit && this.publishedCopies(ext[2 * device]!, ext[2 * device + 1]!) > 0)
      device++;
    const cpu = this.cpu;
    if (cpu !== null) {
      let at = device;
      while (at < limit && cpu.hasPublished(ext[2 * at]!, ext[2 * at + 1]!)) at++;
      this.lastHostBlocks = at - device;
    }
    return device;
  }

  /** Everything cached and evicted so far becomes the published view; its events become takeable. */
  publish(): void {
    for (const slot of this.hiddenSlots) this.hidden[slot] = 0;
    this.hiddenSlots.length = 0;
    if (this.ghosts.size > 0) this.ghosts.clear();
    if (this.ghostBlocks.length > 0) this.ghostBlocks = [];
    this.cpu?.publish();
    if (this.events.length === 0) return;
    if (this.published.length === 0) this.published = this.events;
    else for (const event of this.events) this.published.push(event);
    this.events = [];
  }

  /** Cached prefix of a prepared sequence, in blocks (no side effects). */
  sequencePrefixBlocks(sequence: CacheSequence): number {
    return this.matchPrefix(sequence.ext, this.reusableBlocks(sequence.promptLength));
  }

  /** Blocks from `from` on that the CPU tier holds, one after another (up to `limit`). */
  private hostContinuation(ext: Uint32Array, from: number, limit: number): number {
    const cpu = this.cpu;
    if (cpu === null) return 0;
    let at = from;
    while (at < limit && cpu.has(ext[2 * at]!, ext[2 * at + 1]!)) at++;
    return at - from;
  }

  /**
   * Pins the cached prefix and allocates the rest of the sequence (prompt and output),
   * evicting least recently used free blocks. Returns false, changing nothing, when
   * there are not enough free blocks (the caller queues the sequence).
   */
  allocate(sequence: CacheSequence): boolean {
    if (sequence.slots !== null) throw new Error("sequence is already allocated");
    const total = this.blocksFor(sequence.tokens.length);
    if (total > this.capacityBlocks) return false;
    const hit = this.sequencePrefixBlocks(sequence);
    const loaded = this.hostContinuation(
      sequence.ext,
      hit,
      this.reusableBlocks(sequence.promptLength),
    );
    let hitFree = 0;
    for (let i = 0; i < hit; i++) if (this.refs[this.slotOf(sequence.ext, i)]! === 0) hitFree++;
    if (this.freeCount - hitFree < total - hit) return false;
    const slots = new Int32Array(total);
    for (let i = 0; i < hit; i++) {
      const slot = this.slotOf(sequence.ext, i);
      if (this.refs[slot] === 0) this.dequeue(slot);
      this.refs[slot]!++;
      slots[i] = slot;
    }
    // Loaded blocks become the most recent in the CPU tier, a child before its parent
    // (so the parent, more recent, outlives it there).
    for (let i = hit + loaded - 1; i >= hit; i--)
      this.cpu!.touch(sequence.ext[2 * i]!, sequence.ext[2 * i + 1]!);
    let removed: bigint[] | null = null;
    for (let i = hit; i < total; i++) {
      const slot = this.head;
      this.dequeue(slot);
      if (this.cached[slot] === 1) {
        const hash = this.evict(slot);
        if (this.recordEvents) (removed ??= []).push(hash);
      }
      this.refs[slot] = 1;
      slots[i] = slot;
    }
    if (removed !== null)
      this.events.push({ type: "BlockRemoved", block_hashes: removed, medium: "GPU" });
    this.counters.lookupBlocks += this.reusableBlocks(sequence.promptLength);
    this.counters.hitBlocks += hit;
    this.counters.hostHitBlocks += loaded;
    sequence.slots = slots;
    sequence.hitBlocks = hit;
    sequence.loadedBlocks = loaded;
    sequence.committedBlocks = hit;
    return true;
  }

  /**
   * Registers the sequence's computed full blocks below `tokenCount` tokens in the
   * prefix cache and announces them (BlockStored, chained to the block before).
   */
  commit(sequence: CacheSequence, tokenCount: number): void {
    const slots = sequence.slots;
    if (slots === null) throw new Error("commit of a sequence that is not allocated");
    const upTo = Math.min(Math.floor(tokenCount / this.blockSize), sequence.fullBlocks);
    let runStart = -1;
    for (let i = sequence.committedBlocks; i < upTo; i++) {
      if (this.register(sequence, i, slots)) {
        if (runStart < 0) runStart = i;
      } else if (runStart >= 0) {
        this.announce(sequence, runStart, i);
        runStart = -1;
      }
    }
    if (runStart >= 0) this.announce(sequence, runStart, upTo);
    if (upTo > sequence.committedBlocks) sequence.committedBlocks = upTo;
  }

  /** Unpins the sequence's blocks, tail first, so its tail is evicted first. */
  release(sequence: CacheSequence): void {
    const slots = sequence.slots;
    if (slots === null) throw new Error("release of a sequence that is not allocated");
    for (let i = slots.length - 1; i >= 0; i--) {
      const slot = slots[i]!;
      if (this.refs[slot] === 0) throw new Error(`slot ${slot} released twice`);
      if (--this.refs[slot]! === 0) this.enqueue(slot);
    }
    sequence.slots = null;
  }

  /**
   * Drops every cached block (vLLM's reset_prefix_cache) and announces
   * AllBlocksCleared. Like vLLM, refuses (returns false) while sequences hold blocks.
   */
  reset(): boolean {
    if (this.freeCount !== this.capacityBlocks) return false;
    this.publish();
    for (let slot = this.head; slot !== NONE; slot = this.next[slot]!) this.cached[slot] = 0;
    this.copyNext.fill(NONE);
    this.copyPrev.fill(NONE);
    this.table = new PairTable(2 * this.capacityBlocks);
    this.cpu?.clear();
    this.cachedCount = 0;
    this.counters.clears++;
    if (this.recordEvents) this.events.push({ type: "AllBlocksCleared" });
    this.publish();
    return true;
  }

  /** The events published since the last call, in order (one scheduler step's batch). */
  takeEvents(): KvEvent[] {
    const events = this.published;
    if (events.length > 0) this.published = [];
    return events;
  }

  /** Every block of the CPU tier's published view (introspection, as `snapshot`). */
  hostSnapshot(): HostBlock[] {
    return this.cpu?.snapshot() ?? [];
  }

  /**
   * Every block of the published view, once with its published copies (introspection
   * for tests and the demo, which compare a router's index with it): the cached copies
   * but those cached since the last publish, and the published ones evicted since (whose
   * data is kept only with events recorded).
   */
  snapshot(): CachedBlock[] {
    const blocks: CachedBlock[] = [];
    for (let slot = 0; slot < this.capacityBlocks; slot++) {
      if (this.cached[slot] !== 1 || this.copyPrev[slot] !== NONE) continue;
      const copies = this.publishedCopies(this.extHi[slot]!, this.extLo[slot]!);
      if (copies > 0) blocks.push(this.blockAt(slot, copies));
    }
    for (const ghost of this.ghostBlocks) {
      const hi = Number(ghost.hash >> 32n);
      const lo = Number(ghost.hash & 0xffff_ffffn);
      if (this.lookup(hi, lo) === NONE) blocks.push({ ...ghost, copies: this.ghosts.get(hi, lo) });
    }
    return blocks;
  }

  private blockAt(slot: number, copies: number): CachedBlock {
    const position = this.position[slot]!;
    const size = this.blockSize;
    return {
      hash: u64(this.extHi[slot]!, this.extLo[slot]!),
      copies,
      parent: position === 0 ? null : u64(this.parentHi[slot]!, this.parentLo[slot]!),
      position,
      path: u64(this.pathHi[slot]!, this.pathLo[slot]!),
      tokens: this.tokenPool.slice(slot * size, (slot + 1) * size),
    };
  }

  /** Copies of (hi, lo) in the published view: cached ones not hidden, and ghosts. */
  private publishedCopies(hi: number, lo: number): number {
    let copies = Math.max(0, this.ghosts.get(hi, lo));
    for (let copy = this.lookup(hi, lo); copy !== NONE; copy = this.copyNext[copy]!)
      if (this.hidden[copy] === 0) copies++;
    return copies;
  }

  /** O(capacity) consistency check of every invariant; throws on the first violation. */
  verify(): void {
    let queued = 0;
    let previous = NONE;
    for (let slot = this.head; slot !== NONE; slot = this.next[slot]!) {
      if (++queued > this.capacityBlocks) throw new Error("free queue has a cycle");
      if (this.prev[slot] !== previous) throw new Error(`free queue link broken at slot ${slot}`);
      if (this.queued[slot] !== 1 || this.refs[slot] !== 0)
        throw new Error(`slot ${slot} queued but pinned`);
      previous = slot;
    }
    if (previous !== this.tail) throw new Error("free queue tail mismatch");
    if (queued !== this.freeCount)
      throw new Error(`free count ${this.freeCount}, queue holds ${queued}`);
    let cached = 0;
    for (let slot = 0; slot < this.capacityBlocks; slot++) {
      if ((this.refs[slot] === 0) !== (this.queued[slot] === 1))
        throw new Error(`slot ${slot}: refs vs queue`);
      if (this.cached[slot] !== 1) {
        if (this.copyNext[slot] !== NONE || this.copyPrev[slot] !== NONE)
          throw new Error(`uncached slot ${slot} is linked as a copy`);
        continue;
      }
      cached++;
      let oldest = slot;
      while (this.copyPrev[oldest] !== NONE) oldest = this.copyPrev[oldest]!;
      if (this.lookup(this.extHi[slot]!, this.extLo[slot]!) !== oldest) {
        throw new Error(`cached slot ${slot} missing from the hash table`);
      }
    }
    let copies = 0;
    this.table.forEach((hi, lo, slot) => {
      if (this.cached[slot] !== 1) throw new Error(`hash table names uncached slot ${slot}`);
      if (this.copyPrev[slot] !== NONE) throw new Error(`hash table names a later copy ${slot}`);
      for (let copy = slot; copy !== NONE; copy = this.copyNext[copy]!) {
        if (this.extHi[copy] !== hi || this.extLo[copy] !== lo)
          throw new Error(`slot ${copy} holds another hash`);
        if (copy !== slot && this.copyPrev[this.copyPrev[copy]!] === copy)
          throw new Error(`copy list of slot ${slot} loops`);
        copies++;
      }
    });
    if (!this.keepDuplicates && copies !== this.table.size)
      throw new Error("a hash is cached twice although duplicates are adopted");
    if (cached !== this.cachedCount || cached !== copies) {
      throw new Error(`cached ${cached}, count ${this.cachedCount}, copies ${copies}`);
    }
    let hidden = 0;
    for (let slot = 0; slot < this.capacityBlocks; slot++) hidden += this.hidden[slot]!;
    if (hidden !== this.hiddenSlots.length)
      throw new Error(`${hidden} slots hidden, ${this.hiddenSlots.length} listed`);
    this.cpu?.verify();
  }

  // ---- internals ----

  /** Prompt blocks a sequence may reuse: vLLM always computes the last prompt token. */
  private reusableBlocks(promptLength: number): number {
    return Math.floor((promptLength - 1) / this.blockSize);
  }

  /** The external hashes of a prompt's first `limit` blocks, in the scratch (reused). */
  private hashPrompt(tokens: Uint32Array, limit: number): Uint32Array {
    let { content, ext } = this.scratch;
    if (ext.length < 2 * limit) {
      content = new Uint32Array(4 * limit);
      ext = new Uint32Array(4 * limit);
      this.scratch.content = content;
      this.scratch.ext = ext;
    }
    const prompt = tokens.subarray(0, limit * this.blockSize);
    hashBlocks(prompt, this.blockSize, this.seed, content);
    chainHashes(content, limit, ext);
    return ext;
  }

  private matchPrefix(ext: Uint32Array, limit: number): number {
    for (let i = 0; i < limit; i++)
      if (this.lookup(ext[2 * i]!, ext[2 * i + 1]!) === NONE) return i;
    return limit;
  }

  /** The slot caching external hash (hi, lo), or NONE. */
  private lookup(hi: number, lo: number): number {
    return this.table.get(hi, lo);
  }

  private slotOf(ext: Uint32Array, i: number): number {
    const slot = this.lookup(ext[2 * i]!, ext[2 * i + 1]!);
    if (slot === NONE) throw new Error(`block ${i} vanished from the cache`);
    return slot;
  }

  /**
   * Caches block i of the sequence in its slot and returns true (a hash already cached
   * gets another copy, as in vLLM); or, with duplicates adopted, swaps the sequence onto
   * the cached copy, frees its own slot and returns false (nothing to announce).
   */
  private register(sequence: CacheSequence, i: number, slots: Int32Array): boolean {
    const hi = sequence.ext[2 * i]!;
    const lo = sequence.ext[2 * i + 1]!;
    const slot = slots[i]!;
    const existing = this.lookup(hi, lo);
    if (existing !== NONE) {
      this.counters.duplicateBlocks++;
      if (this.keepDuplicates) {
        let last = existing;
        while (this.copyNext[last] !== NONE) last = this.copyNext[last]!;
        this.copyNext[last] = slot;
        this.copyPrev[slot] = last;
      } else {
        if (this.refs[existing] === 0) this.dequeue(existing);
        this.refs[existing]!++;
        slots[i] = existing;
        if (--this.refs[slot]! === 0) this.enqueue(slot);
        return false;
      }
    } else this.table.set(hi, lo, slot);
    this.extHi[slot] = hi;
    this.extLo[slot] = lo;
    this.cached[slot] = 1;
    this.cachedCount++;
    this.parentHi[slot] = i > 0 ? sequence.ext[2 * i - 2]! : 0;
    this.parentLo[slot] = i > 0 ? sequence.ext[2 * i - 1]! : 0;
    this.pathHi[slot] = sequence.path[2 * i]!;
    this.pathLo[slot] = sequence.path[2 * i + 1]!;
    this.position[slot] = i;
    if (this.hidden[slot] === 0) {
      this.hidden[slot] = 1;
      this.hiddenSlots.push(slot);
    }
    const size = this.blockSize;
    const tokens = sequence.tokens;
    const pool = this.tokenPool;
    for (let t = 0, from = i * size, to = slot * size; t < size; t++)
      pool[to + t] = tokens[from + t]!;
    this.counters.storedBlocks++;
    return true;
  }

  /** One BlockStored for blocks [from, to) of the sequence. */
  private announce(sequence: CacheSequence, from: number, to: number): void {
    if (!this.recordEvents) return;
    const ext = sequence.ext;
    const hashes: bigint[] = [];
    for (let i = from; i < to; i++) hashes.push(u64(ext[2 * i]!, ext[2 * i + 1]!));
    this.events.push({
      type: "BlockStored",
      block_hashes: hashes,
      parent_block_hash: from === 0 ? null : u64(ext[2 * from - 2]!, ext[2 * from - 1]!),
      token_ids: Array.from(sequence.tokens.subarray(from * this.blockSize, to * this.blockSize)),
      block_size: this.blockSize,
      lora_name: null,
      medium: "GPU",
    });
  }

  /** Drops a free slot's cached block (this copy only); returns its hash (for BlockRemoved). */
  private evict(slot: number): bigint {
    const hi = this.extHi[slot]!;
    const lo = this.extLo[slot]!;
    // A published copy stays in the published view until the next publish (a ghost);
    // a copy cached since (hidden) was never in it.
    if (this.hidden[slot] === 0 && this.ghosts.adjust(hi, lo, 1) === 1 && this.recordEvents)
      this.ghostBlocks.push(this.blockAt(slot, 0));
    const before = this.copyPrev[slot]!;
    const after = this.copyNext[slot]!;
    if (before !== NONE) this.copyNext[before] = after;
    else if (after !== NONE) this.table.set(hi, lo, after);
    else this.table.delete(hi, lo);
    if (after !== NONE) this.copyPrev[after] = before;
    this.copyPrev[slot] = NONE;
    this.copyNext[slot] = NONE;
    this.cached[slot] = 0;
    this.cachedCount--;
    this.counters.evictedBlocks++;
    if (before === NONE && after === NONE) this.spill(slot);
    return this.recordEvents ? u64(hi, lo) : 0n;
  }

  /**
   * The last device copy of a block is going: it goes to the CPU tier, if there is one,
   * unless the tier has it already or no tier holds its parent any more (an orphan is
   * not offloaded). The tier's own eviction is announced first.
   */
  private spill(slot: number): void {
    const cpu = this.cpu;
    if (cpu === null) return;
    const hi = this.extHi[slot]!;
    const lo = this.extLo[slot]!;
    if (cpu.has(hi, lo)) return cpu.touch(hi, lo);
    if (cpu.makeRoom(this.evictedHost)) {
      this.counters.hostEvictedBlocks++;
      const [evictedHi, evictedLo] = this.evictedHost;
      if (this.recordEvents)
        this.events.push({
          type: "BlockRemoved",
          block_hashes: [u64(evictedHi!, evictedLo!)],
          medium: "CPU",
        });
    }
    const position = this.position[slot]!;
    const [parentHi, parentLo] = [this.parentHi[slot]!, this.parentLo[slot]!];
    if (position > 0 && this.lookup(parentHi, parentLo) === NONE && !cpu.has(parentHi, parentLo))
      return;
    cpu.store(hi, lo, parentHi, parentLo, this.pathHi[slot]!, this.pathLo[slot]!, position);
    this.counters.spilledBlocks++;
    if (!this.recordEvents) return;
    const size = this.blockSize;
    this.events.push({
      type: "BlockStored",
      block_hashes: [u64(hi, lo)],
      parent_block_hash: position === 0 ? null : u64(parentHi, parentLo),
      token_ids: Array.from(this.tokenPool.subarray(slot * size, (slot + 1) * size)),
      block_size: size,
      lora_name: null,
      medium: "CPU",
    });
  }

  private enqueue(slot: number): void {
    this.prev[slot] = this.tail;
    this.next[slot] = NONE;
    if (this.tail === NONE) this.head = slot;
    else this.next[this.tail] = slot;
    this.tail = slot;
    this.queued[slot] = 1;
    this.freeCount++;
  }

  private dequeue(slot: number): void {
    if (this.queued[slot] !== 1) throw new Error(`slot ${slot} is not in the free queue`);
    const before = this.prev[slot]!;
    const after = this.next[slot]!;
    if (before === NONE) this.head = after;
    else this.next[before] = after;
    if (after === NONE) this.tail = before;
    else this.prev[after] = before;
    this.queued[slot] = 0;
    this.freeCount--;
  }
}
