/**
 * Load tracking: the workers the router may choose from, and what each one is busy
 * with, from the requests routed to it (Dynamo's ActiveSequences, reference §5.4).
 *
 * A request's lifecycle is routed -> prefill done -> done. From admission until its
 * prefill is done it adds its uncached prompt tokens (isl - cached, never below 0) to
 * the worker's active prefill tokens; until done its prompt blocks (sequence hashes)
 * count among the worker's distinct active blocks (refcounted, so blocks shared by
 * several requests count once), plus its expected output blocks when output tracking
 * is on. A request never finished expires `requestTtlMs` after its last lifecycle call.
 *
 * Workers are the slots of a WorkerTable (src/domain/worker-table.ts; the core's, shared
 * with the index, or one of the tracker's own). Every live slot of the table is a
 * routing candidate. Load lives in per-slot typed arrays, read by the routing loop
 * without lookups, grown to the table's capacity by `syncSlots`. A slot is released
 * only after its requests are dropped and its arrays zeroed (`removeWorker`), so a
 * reused slot inherits nothing.
 *
 * The requests themselves (ids, records, touch order) are kept by ./requests.ts; this
 * file decides what each lifecycle call does to a worker's load, and when a request
 * expires or is evicted.
 *
 * Finished ids are remembered (so a repeated done or prefill_done is answered as such)
 * by a 64-bit hash of the id in typed arrays, not as strings: a Map of 65k strings that
 * every request writes to is rescanned by each young-generation collection (without it
 * the p99 of bench/serve-pauses.bench.ts fell by about a third). Two ids equal in 64
 * bits would share an ending (odds about 65k / 2^64 per unknown id).
 *
 * Expiry needs no timer: requests are kept in the order they were last touched, so the
 * due ones are always at the front. Every routing decision expires the due ones there
 * (`expireDue`, at most EXPIRE_PER_DECISION per call), so expiry is spread over routing
 * instead of stalling it in bursts (a periodic sweep of a gateway that relies on the
 * TTL would release a whole interval's requests at once); readers (metrics, status)
 * `sweep` everything due before reading. Either costs O(expired + 1).
 */
import { ActiveBlocks, type ChainHolder } from "./active-blocks";
import { type Ending, FINISHED_REMEMBERED_MAX, FinishedRing } from "./finished";
import {
  hashCheck,
  hashKey,
  type IdHash,
  idHash,
  INITIAL_RECORDS,
  NO_RECORD,
  RequestRecords,
  resized,
  type TypedArray,
} from "./requests";
import { WorkerTable } from "../domain/worker-table";
import { assert, VERIFY } from "../util/verify";
import { UnguessableIds } from "../util/random";

export { FINISHED_REMEMBERED_MAX, INITIAL_RECORDS };

/** Slots are u16 in the index; the router uses the same bound. */
export const WORKERS_MAX = 65_535;
/** Client-supplied request ids longer than this are refused. */
export const REQUEST_ID_LENGTH_MAX = 256;
export const DEFAULT_REQUEST_TTL_MS = 300_000;
/**
 * Most requests counted as load at once. A gateway that never calls done keeps its
 * requests until the TTL, rate x TTL of them: 7.5M at 25k/s and 300 s, at ~0.7 KB of
 * RSS each for 1,024-token prompts with half their blocks unique (measured at 400k).
 * Past this many, admitting one evicts the least recently touched.
 */
export const DEFAULT_MAX_ACTIVE_REQUESTS = 1_000_000;
/** Most requests a routing decision expires (a backlog after an idle spell drains over a few). */
export const EXPIRE_PER_DECISION = 64;

/**
 * What a lifecycle call found: `ok` (applied, or prefill already marked done),
 * `already_done`, `expired` (dropped by the TTL), `worker_removed` (its worker left),
 * `evicted` (dropped to admit another past the active-request limit), or `unknown`
 * (never seen, or forgotten: the server answers 404).
 */
export type LifecycleResult =
  | "ok"
  | "already_done"
  | "expired"
  | "worker_removed"
  | "evicted"
  | "unknown";

export interface LoadTrackerOptions {
  readonly blockSize: number;
  /** Requests never finished expire this long after their last lifecycle call. */
  readonly requestTtlMs?: number;
  /** Count each request's expected output blocks as decode load (Dynamo's default: off). */
  readonly trackOutputBlocks?: boolean;
  /** Most active requests; admitting past it evicts the least recently touched. */
  readonly maxActiveRequests?: number;
  /** Monotonic milliseconds; injectable for tests. */
  readonly now?: () => number;
  /** The 64-bit hash of request ids; injectable for tests (to make keys collide). */
  readonly idHash?: (id: string) => IdHash;
  /** The worker numbering to share (the core's); without it the tracker numbers its own. */
  readonly workers?: WorkerTable;
}

/** One worker's load, for metrics and the status page. */
export interface WorkerLoad {
  readonly slot: number;
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly degraded: boolean;
  readonly activeRequests: number;
  readonly activePrefillTokens: number;
  readonly activeDecodeBlocks: number;
  readonly routedTotal: number;
}

/** Totals since start, as plain fields for the metrics layer. */
export interface LoadCounters {
  admitted: number;
  prefillDone: number;
  done: number;
  expired: number;
  /** Dropped to admit a request past the active-request limit. */
  evicted: number;
  droppedWithWorker: number;
  /** Lifecycle calls for ids never seen or already forgotten. */
  unknown: number;
}

export class LoadTracker {
  readonly blockSize: number;
  readonly requestTtlMs: number;
  readonly trackOutputBlocks: boolean;
  readonly maxActiveRequests: number;
  readonly counters: LoadCounters = {
    admitted: 0,
    prefillDone: 0,
    done: 0,
    expired: 0,
    evicted: 0,
    droppedWithWorker: 0,
    unknown: 0,
  };
  /** The chains of active requests: distinct blocks and shared depths per worker. */
  readonly blocks = new ActiveBlocks();

  // Per slot, read directly by the routing loop (callers must not write them).
  // Length = slotCapacity; only live slots are meaningful.
  activePrefillTokens = new Float64Array(0);
  /** Distinct active prompt blocks plus expected output blocks (when tracked). */
  activeDecodeBlocks = new Float64Array(0);
  activeRequests = new Uint32Array(0);
  routedTotal = new Float64Array(0);
  degraded = new Uint8Array(0);
  /** The worker numbering: which slots are live, and who they are. */
  readonly table: WorkerTable;
  /** Told the first prefill_done of each request (its record, slot, and ms since admission): calibration. */
  prefillObserver: ((record: number, slot: number, elapsedMs: number) => void) | null = null;

  /** The active requests: ids, records, touch order (./requests.ts). */
  private readonly records = new RequestRecords();
  /** Carries a leaf to and from the active-block tree (one object, reused). */
  private readonly holder: ChainHolder = { leaf: null };
  /** Recently finished ids and how they ended (./finished.ts). */
  private readonly finished = new FinishedRing();
  private readonly now: () => number;
  private readonly idHash: (id: string) => IdHash;
  private readonly ids = new UnguessableIds();

  constructor(options: LoadTrackerOptions) {
    if (!Number.isInteger(options.blockSize) || options.blockSize < 1)
      throw new RangeError(`bad block size ${options.blockSize}`);
    this.blockSize = options.blockSize;
    this.requestTtlMs = options.requestTtlMs ?? DEFAULT_REQUEST_TTL_MS;
    if (!(this.requestTtlMs > 0)) throw new RangeError(`bad request TTL ${this.requestTtlMs}`);
    this.trackOutputBlocks = options.trackOutputBlocks ?? false;
    this.maxActiveRequests = options.maxActiveRequests ?? DEFAULT_MAX_ACTIVE_REQUESTS;
    if (!Number.isInteger(this.maxActiveRequests) || this.maxActiveRequests < 1) {
      throw new RangeError(`bad active request limit ${this.maxActiveRequests}`);
    }
    this.now = options.now ?? (() => performance.now());
    this.idHash = options.idHash ?? idHash;
    this.table = options.workers ?? new WorkerTable();
    this.growSlots(Math.max(8, this.table.capacity));
  }

  // ---- Workers ----

  /** Length of the per-slot arrays (call `syncSlots` first when the table may have grown). */
  get slotCapacity(): number {
    return this.degraded.length;
  }

  /** Grows the per-slot arrays to the table's capacity (slots the index added since). */
  syncSlots(): void {
    if (this.degraded.length < this.table.capacity) this.growSlots(this.table.capacity);
  }

  /** Per slot: 1 when a worker holds it. */
  get live(): Uint8Array {
    return this.table.live;
  }

  /** The live slots, densely packed (the routing loop's candidate list). */
  get liveSlots(): Int32Array {
    return this.table.liveSlots;
  }

  get liveCount(): number {
    return this.table.liveCount;
  }

  get dpRanks(): Uint32Array {
    return this.table.dpRanks;
  }

  /** The worker's slot, or -1. */
  slotOf(workerId: bigint, dpRank: number): number {
    return this.table.find(workerId, dpRank);
  }

  workerIdOf(slot: number): bigint {
    return this.table.workerIdOf(slot);
  }

  /** `workerIdOf` as a decimal string. */
  workerIdTextOf(slot: number): string {
    return this.table.workerIdTextOf(slot);
  }

  /** Adds a worker (idempotent: a known one keeps its slot and load). Returns its slot. */
  addWorker(workerId: bigint, dpRank: number): number {
    if (workerId < 0n || workerId >= 1n << 64n)
      throw new RangeError(`worker id ${workerId} is not a u64`);
    if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank > 0xffff_ffff)
      throw new RangeError(`dp rank ${dpRank} is not a u32`);
    const known = this.slotOf(workerId, dpRank);
    if (known >= 0) return known;
    if (this.liveCount >= WORKERS_MAX) throw new RangeError(`more than ${WORKERS_MAX} workers`);
    const slot = this.table.acquire(workerId, dpRank);
    if (slot < 0) throw new RangeError(`more than ${this.table.maxSlots} workers`);
    this.syncSlots();
    return slot;
  }

  /**
   * Removes a worker: drops its requests, zeroes its load and releases its slot in the
   * table (whose other holders, the index, must hold nothing of it). False if unknown.
   */
  removeWorker(workerId: bigint, dpRank: number): boolean {
    const slot = this.slotOf(workerId, dpRank);
    if (slot < 0) return false;
    this.syncSlots();
    if (this.activeRequests[slot]! > 0) {
      for (let record = 0; record < this.records.top; record++) {
        if (this.records.slot[record] !== slot) continue;
        this.release(record, "worker_removed");
        this.counters.droppedWithWorker++;
      }
    }
    assert(
      this.activeRequests[slot] === 0 && this.activePrefillTokens[slot] === 0,
      "load left on a removed worker",
    );
    assert(this.activeDecodeBlocks[slot] === 0, "blocks left on a removed worker");
    this.degraded[slot] = 0;
    this.routedTotal[slot] = 0;
    this.table.release(slot);
    return true;
  }

  /**
   * Marks a worker degraded (its event source lost events it could not replay, so
   * its overlap is only partly trusted) or healthy again.
   */
  setDegraded(slot: number, degraded: boolean): void {
    this.assertLive(slot);
    this.syncSlots();
    this.degraded[slot] = degraded ? 1 : 0;
  }

  /** Every live worker's load (allocates: for scrapes and status, not the hot path). */
  workers(): WorkerLoad[] {
    this.syncSlots();
    const rows: WorkerLoad[] = [];
    for (let i = 0; i < this.liveCount; i++) {
      const slot = this.liveSlots[i]!;
      rows.push({
        slot,
        workerId: this.table.workerIdOf(slot),
        dpRank: this.dpRanks[slot]!,
        degraded: this.degraded[slot] === 1,
        activeRequests: this.activeRequests[slot]!,
        activePrefillTokens: this.activePrefillTokens[slot]!,
        activeDecodeBlocks: this.activeDecodeBlocks[slot]!,
        routedTotal: this.routedTotal[slot]!,
      });
    }
    return rows;
  }

  // ---- Requests ----

  /** Requests routed and not yet done, expired or dropped. */
  get activeRequestCount(): number {
    return this.records.count;
  }

  /** Request records allocated (0 before the first request, INITIAL_RECORDS once none is active after a burst). */
  get recordCapacity(): number {
    return this.records.capacity;
  }

  /** Bytes of the arena holding the active ids (tests: a burst gives them back). */
  get idArenaBytes(): number {
    return this.records.idArenaBytes;
  }

  isActive(requestId: string): boolean {
    return this.records.find(requestId, hashKey(this.idHash(requestId))) !== NO_RECORD;
  }

  /** A fresh request id, unique among active requests and unguessable (128 random bits). */
  newRequestId(): string {
    for (let attempts = 0; attempts < 16; attempts++) {
      const id = this.ids.next("r-");
      if (!this.isActive(id)) return id;
    }
    throw new Error("could not generate a free request id");
  }

  /**
   * Records a request routed to `slot`. `chain` holds `blocks` sequence hashes (only
   * read here, the caller may reuse it). `cachedTokens` is what the worker is expected
   * to hold of the prompt.
   */
  admit(
    requestId: string,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    promptTokens: number,
    cachedTokens: number,
    expectedOutputTokens: number,
  ): number {
    this.assertLive(slot);
    const hash = this.idHash(requestId);
    const key = hashKey(hash);
    const idCheck = hashCheck(hash);
    assert(this.records.find(requestId, key) === NO_RECORD, "request admitted twice");
    assert(blocks * this.blockSize <= promptTokens, "more blocks than prompt tokens");
    if (this.records.count >= this.maxActiveRequests) {
      // Before the new request's blocks go in: release uses the same holder.
      this.release(this.records.oldest, "evicted");
      this.counters.evicted++;
    }
    const prefillTokens = Math.max(0, promptTokens - cachedTokens);
    const outputBlocks = this.trackOutputBlocks
      ? Math.ceil(expectedOutputTokens / this.blockSize)
      : 0;
    const record = this.insert(
      requestId,
      key,
      idCheck,
      slot,
      chain,
      blocks,
      prefillTokens,
      outputBlocks,
      this.now(),
    );
    this.routedTotal[slot]!++;
    this.counters.admitted++;
    if (VERIFY) this.verify();
    return record;
  }

  /**
   * Visits every active request, least recently touched first: its slot, id, prompt
   * tokens still in prefill (0 once prefill is done), expected output blocks, time
   * since its last lifecycle call, and its chain (valid during the call).
   */
  forEachActive(
    visit: (
      slot: number,
      id: string,
      prefillTokens: number,
      outputBlocks: number,
      idleMs: number,
      chain: Uint32Array,
      blocks: number,
    ) => void,
  ): void {
    const now = this.now();
    let chain = new Uint32Array(64);
    const r = this.records;
    for (let record = r.oldest; record !== NO_RECORD; record = r.newer(record)) {
      const blocks = r.blocks[record]!;
      if (chain.length < 2 * blocks) chain = new Uint32Array(2 * blocks);
      const leaf = r.leaf[record]!;
      if (leaf >= 0) this.blocks.chainOf(leaf, blocks, chain);
      visit(
        r.slot[record]!,
        r.idOf(record),
        r.prefill[record]!,
        r.output[record]!,
        now - r.touched[record]!,
        chain,
        blocks,
      );
    }
  }

  /**
   * Takes back an active request saved by a snapshot, idle for `idleMs` already: its
   * load counts again on `slot` and it expires when the rest of its TTL runs out.
   * Returns false (and changes nothing) when the TTL has passed, the id is already
   * active or the tracker is full.
   */
  restore(
    requestId: string,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    idleMs: number,
  ): boolean {
    this.assertLive(slot);
    const hash = this.idHash(requestId);
    const key = hashKey(hash);
    if (!(idleMs < this.requestTtlMs) || this.records.count >= this.maxActiveRequests) return false;
    if (this.records.find(requestId, key) !== NO_RECORD || requestId.length > REQUEST_ID_LENGTH_MAX)
      return false;
    this.insert(
      requestId,
      key,
      hashCheck(hash),
      slot,
      chain,
      blocks,
      prefillTokens,
      outputBlocks,
      this.now() - Math.max(0, idleMs),
    );
    if (VERIFY) this.verify();
    return true;
  }

  private insert(
    requestId: string,
    key: number,
    idCheck: number,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    touched: number,
  ): number {
    const added = this.blocks.add(slot, chain, blocks, this.holder);
    // After anything that can throw: a record is live once taken.
    const r = this.records;
    const record = r.add(requestId, key, idCheck, slot, touched);
    r.leaf[record] = this.holder.leaf ?? -1;
    r.blocks[record] = blocks;
    r.prefill[record] = prefillTokens;
    r.output[record] = outputBlocks;
    this.finished.forget(key, idCheck);
    this.activePrefillTokens[slot]! += prefillTokens;
    this.activeDecodeBlocks[slot]! += added + outputBlocks;
    this.activeRequests[slot]!++;
    return record;
  }

  /** The request's prefill finished: its prompt tokens stop counting. Idempotent. */
  prefillDone(requestId: string): LifecycleResult {
    const hash = this.idHash(requestId);
    const r = this.records;
    const record = r.find(requestId, hashKey(hash));
    if (record === NO_RECORD) return this.ended(hash);
    const now = this.now();
    if (r.prefill[record]! > 0) {
      this.activePrefillTokens[r.slot[record]!]! -= r.prefill[record]!;
      r.prefill[record] = 0;
      // Until now the record was last touched when it was admitted.
      this.prefillObserver?.(record, r.slot[record]!, now - r.touched[record]!);
    }
    r.touch(record, now);
    this.counters.prefillDone++;
    return "ok";
  }

  /** The request finished: all its load is released. A repeat answers `already_done`. */
  done(requestId: string): LifecycleResult {
    const hash = this.idHash(requestId);
    const record = this.records.find(requestId, hashKey(hash));
    if (record === NO_RECORD) return this.ended(hash);
    this.release(record, "already_done");
    this.counters.done++;
    return "ok";
  }

  /** The routing path's expiry: the due requests at the front, at most EXPIRE_PER_DECISION. */
  expireDue(): void {
    this.sweep(this.now(), EXPIRE_PER_DECISION);
  }

  /**
   * Expires requests idle for the TTL or longer, oldest first, at most `max`; forgets
   * finished ids as old (as many). Returns how many requests expired.
   */
  sweep(now = this.now(), max = Infinity): number {
    let expired = 0;
    // Oldest touch first (the clock is monotonic): the first fresh request ends the sweep.
    const r = this.records;
    while (
      expired < max &&
      r.oldest !== NO_RECORD &&
      now - r.touched[r.oldest]! >= this.requestTtlMs
    ) {
      this.release(r.oldest, "expired");
      expired++;
    }
    this.finished.forgetOlderThan(now, this.requestTtlMs, max);
    this.counters.expired += expired;
    return expired;
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): per-slot counters equal sums over
   * active requests, the block table agrees with the decode counters, and the touch
   * list holds exactly the active requests, oldest first.
   */
  verify(): void {
    const r = this.records;
    r.verify((id) => hashKey(this.idHash(id)));
    const perSlot = this.blocks.verify();
    const requests = new Uint32Array(this.slotCapacity);
    const prefill = new Float64Array(this.slotCapacity);
    const output = new Float64Array(this.slotCapacity);
    for (let record = 0; record < r.top; record++) {
      const slot = r.slot[record]!;
      if (slot === NO_RECORD) continue;
      assert(this.live[slot] === 1, "request on a dead slot");
      requests[slot]!++;
      prefill[slot]! += r.prefill[record]!;
      output[slot]! += r.output[record]!;
    }
    for (let slot = 0; slot < this.slotCapacity; slot++) {
      assert(requests[slot] === this.activeRequests[slot], `slot ${slot} active request count`);
      assert(prefill[slot] === this.activePrefillTokens[slot], `slot ${slot} prefill tokens`);
      assert(
        (perSlot.get(slot) ?? 0) + output[slot]! === this.activeDecodeBlocks[slot],
        `slot ${slot} decode blocks`,
      );
    }
    assert(this.finished.size <= FINISHED_REMEMBERED_MAX, "too many finished ids remembered");
  }

  private ended(hash: IdHash): LifecycleResult {
    const ending = this.finished.endingOf(hashKey(hash), hashCheck(hash));
    if (ending !== null) return ending;
    this.counters.unknown++;
    return "unknown";
  }

  /** Ends an active request: its load leaves its worker, its id joins the finished ones. */
  private release(record: number, ending: Ending): void {
    const r = this.records;
    const slot = r.slot[record]!;
    this.activePrefillTokens[slot]! -= r.prefill[record]!;
    const leaf = r.leaf[record]!;
    this.holder.leaf = leaf < 0 ? null : leaf;
    const freed = this.blocks.remove(slot, this.holder);
    this.activeDecodeBlocks[slot]! -= freed + r.output[record]!;
    this.activeRequests[slot]!--;
    this.finished.remember(r.key[record]!, r.check[record]!, ending, this.now());
    r.remove(record);
    if (VERIFY) this.verify();
  }

  private assertLive(slot: number): void {
    if (!this.table.isLive(slot)) throw new RangeError(`no worker in slot ${slot}`);
  }

  /** The one allocation site for per-slot arrays. */
  private growSlots(capacity: number): void {
    const grow = <T extends TypedArray>(old: T, make: (n: number) => T) =>
      resized(old, capacity, make);
    this.activePrefillTokens = grow(this.activePrefillTokens, (n) => new Float64Array(n));
    this.activeDecodeBlocks = grow(this.activeDecodeBlocks, (n) => new Float64Array(n));
    this.activeRequests = grow(this.activeRequests, (n) => new Uint32Array(n));
    this.routedTotal = grow(this.routedTotal, (n) => new Float64Array(n));
    this.degraded = grow(this.degraded, (n) => new Uint8Array(n));
  }
}
