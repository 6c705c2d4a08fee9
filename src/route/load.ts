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
 * with the index, or one of the tracker's own): whoever owns the table gives and frees
 * slots, and every live slot is a routing candidate. The tracker knows workers by slot
 * only. Load lives in per-slot typed arrays, read by the routing loop without lookups,
 * grown to the table's capacity by `syncSlots`. A slot's owner frees it only after
 * `dropSlot` dropped its requests and zeroed its arrays, so a reused slot inherits
 * nothing.
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
 *
 * Several processes deciding as one (src/cluster): each peer's requests are kept too,
 * tagged by origin (one store of records per peer, its number from `openOrigin`), so
 * the per-slot load the router reads is the fleet's. Peers' requests change only by
 * their origin's facts (`peerRouted`, `peerPrefillDone`, `peerEnded`) or all at once
 * (`closeOrigin`); this tracker's own requests are reported to `facts` as they change.
 * Lifecycle calls (done, prefill_done) and request ids name own requests only.
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
/** Most peers whose requests one tracker holds: origins 1..ORIGINS_MAX (0 is the tracker's own). */
export const ORIGINS_MAX = 255;
/** The origin of the tracker's own requests. */
export const OWN = 0;
/** Peers' requests expire here after this many TTLs: a backstop for an end that never came. */
export const PEER_TTL_FACTOR = 2;

/** How an own request ended, as `OwnFacts.ended` reports it. */
export type EndReason = "done" | "expired" | "evicted" | "worker_removed";
const END_REASONS: Record<Ending, EndReason> = {
  already_done: "done",
  expired: "expired",
  evicted: "evicted",
  worker_removed: "worker_removed",
};

/**
 * What the tracker reports about its own requests as they change, synchronously (the
 * cluster's outbox publishes it to the peers). A request is named by its handle, a u32
 * unique among this tracker's requests of the last 2^32 (never 0): what peers need to
 * tell it apart, in 4 bytes whatever its id. `chain` is valid during the call only.
 */
export interface OwnFacts {
  /**
   * Admitted (routed, moved, or restored from a snapshot) with the load it adds: its
   * prefill tokens, output blocks, chain, and `added`, the decode blocks the chain
   * added on the worker as this tracker counted them (those not active there already).
   */
  routed(
    handle: number,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    added: number,
  ): void;
  prefillDone(handle: number): void;
  /** Ended; `freed`: the decode blocks its chain held on the worker that no other request holds. */
  ended(handle: number, reason: EndReason, freed: number): void;
}

/** What one request adds to its worker's load. */
interface RequestLoad {
  readonly chain: Uint32Array;
  readonly blocks: number;
  readonly prefillTokens: number;
  readonly outputBlocks: number;
}

/** One peer's requests here, and what its chainless ones add per slot. */
class OriginLoad {
  readonly records = new RequestRecords();
  /** Per slot: decode blocks the origin's chainless requests add (as its router counts them). */
  decode: Float64Array;
  /** Per slot: the origin's active requests. */
  requests: Uint32Array;

  constructor(capacity: number) {
    this.decode = new Float64Array(capacity);
    this.requests = new Uint32Array(capacity);
  }

  grow(capacity: number): void {
    this.decode = resized(this.decode, capacity, (n) => new Float64Array(n));
    this.requests = resized(this.requests, capacity, (n) => new Uint32Array(n));
  }
}

/** What peers' facts did, since start. */
export interface PeerCounters {
  routed: number;
  /** A routed fact for an id its origin still had active here: the old one was replaced. */
  replaced: number;
  prefillDone: number;
  ended: number;
  /** Dropped by this tracker's TTL (their origin's end never came). */
  expired: number;
  /** Dropped past the per-origin limit of active requests. */
  evicted: number;
  droppedWithWorker: number;
  /** Dropped with their origin (lease ran out, restart, resync). */
  droppedWithOrigin: number;
  /** Facts for ids their origin has no active request under here. */
  unknown: number;
}

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
  /** The part of activeRequests / activePrefillTokens that peers routed (src/cluster). */
  readonly peerRequests: number;
  readonly peerPrefillTokens: number;
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
  readonly peerCounters: PeerCounters = {
    routed: 0,
    replaced: 0,
    prefillDone: 0,
    ended: 0,
    expired: 0,
    evicted: 0,
    droppedWithWorker: 0,
    droppedWithOrigin: 0,
    unknown: 0,
  };
  /** Told every change of an own request (null: nobody listens, single process). */
  facts: OwnFacts | null = null;
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
  /** The part of activeRequests / activePrefillTokens that peers' requests make up. */
  peerRequests = new Uint32Array(0);
  peerPrefillTokens = new Float64Array(0);
  /** Distinct blocks of the chains in the active-block tree, per slot (part of activeDecodeBlocks). */
  private treeBlocks = new Float64Array(0);
  /** 1 for an approximate worker: its overlap is kvedge's prediction, not the engine's events. */
  approximate = new Uint8Array(0);
  /**
   * 1 for a degraded exact worker routed on kvedge's predictions (route.degraded_fallback):
   * the router trusts the larger of its predicted blocks and its discounted indexed ones
   * (./router.ts fallbackOverlap).
   */
  fallback = new Uint8Array(0);
  /** The worker numbering: which slots are live, and who they are. */
  readonly table: WorkerTable;
  /** Told the first prefill_done of each request (its record, slot, and ms since admission): calibration. */
  prefillObserver: ((record: number, slot: number, elapsedMs: number) => void) | null = null;

  /** The active requests: ids, records, touch order (./requests.ts). */
  private readonly records = new RequestRecords();
  /** Per origin (1..ORIGINS_MAX), its requests; null = no such peer. Index 0 is unused. */
  private readonly origins: (OriginLoad | null)[] = [null];
  /** Carries a leaf to and from the active-block tree (one object, reused). */
  private readonly holder: ChainHolder = { leaf: null };
  /** Recently finished ids and how they ended (./finished.ts). */
  private readonly finished = new FinishedRing();
  private readonly now: () => number;
  private readonly idHash: (id: string) => IdHash;
  private readonly ids = new UnguessableIds("r-");

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

  /**
   * A worker's life ends (src/core ends it): drops its requests, own and peers', and
   * zeroes its load, so a slot given to another worker inherits nothing. The table's
   * owner then frees the slot. Returns how many own requests were dropped.
   */
  dropSlot(slot: number): number {
    this.assertLive(slot);
    this.syncSlots();
    let dropped = 0;
    if (this.activeRequests[slot]! > 0) {
      dropped = this.dropOnSlot(this.records, OWN, slot);
      this.counters.droppedWithWorker += dropped;
      for (let origin = 1; origin < this.origins.length; origin++) {
        const peer = this.origins[origin];
        if (peer)
          this.peerCounters.droppedWithWorker += this.dropOnSlot(peer.records, origin, slot);
      }
    }
    assert(
      this.activeRequests[slot] === 0 && this.activePrefillTokens[slot] === 0,
      "load left on a removed worker",
    );
    assert(this.activeDecodeBlocks[slot] === 0, "blocks left on a removed worker");
    this.degraded[slot] = 0;
    this.approximate[slot] = 0;
    this.fallback[slot] = 0;
    this.routedTotal[slot] = 0;
    return dropped;
  }

  /** Releases every request of one origin on `slot`; returns how many. */
  private dropOnSlot(store: RequestRecords, origin: number, slot: number): number {
    let dropped = 0;
    for (let record = 0; record < store.top; record++) {
      if (store.slot[record] !== slot) continue;
      this.release(store, origin, record, "worker_removed");
      dropped++;
    }
    return dropped;
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

  /**
   * Distinct blocks of the active chains on `slot` (the own requests', and peers' sent
   * with their chains): what an own request's `added` and `freed` are counted against.
   */
  treeBlocksOf(slot: number): number {
    return this.treeBlocks[slot] ?? 0;
  }

  /** Marks a degraded worker as routed on predictions (its overlap not discounted again), or not. */
  setFallback(slot: number, fallback: boolean): void {
    this.assertLive(slot);
    this.syncSlots();
    this.fallback[slot] = fallback ? 1 : 0;
  }

  /** Marks a worker approximate (no event stream: its overlap is predicted) or exact. */
  setApproximate(slot: number, approximate: boolean): void {
    this.assertLive(slot);
    this.syncSlots();
    this.approximate[slot] = approximate ? 1 : 0;
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
        peerRequests: this.peerRequests[slot]!,
        peerPrefillTokens: this.peerPrefillTokens[slot]!,
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

  /** The request's prompt tokens still to prefill: 0 once its prefill is done or it is not active (route.pacing). */
  prefillTokensOf(requestId: string): number {
    const record = this.records.find(requestId, hashKey(this.idHash(requestId)));
    return record === NO_RECORD ? 0 : this.records.prefill[record]!;
  }

  /** A fresh request id, unique among active requests and unguessable (128 random bits). */
  newRequestId(): string {
    for (let attempts = 0; attempts < 16; attempts++) {
      const id = this.ids.next();
      if (!this.isActive(id)) return id;
    }
    throw new Error("could not generate a free request id");
  }

  /**
   * Records a request routed to `slot`. `chain` holds `blocks` sequence hashes (only
   * read here, the caller may reuse it). `cachedTokens` is what the worker is expected
   * to hold of the prompt; `nowMs`, when given, the clock as the decision read it.
   */
  admit(
    requestId: string,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    promptTokens: number,
    cachedTokens: number,
    expectedOutputTokens: number,
    nowMs: number = this.now(),
  ): number {
    this.assertLive(slot);
    const hash = this.idHash(requestId);
    const key = hashKey(hash);
    const idCheck = hashCheck(hash);
    assert(this.records.find(requestId, key) === NO_RECORD, "request admitted twice");
    assert(blocks * this.blockSize <= promptTokens, "more blocks than prompt tokens");
    if (this.records.count >= this.maxActiveRequests) {
      // Before the new request's blocks go in: release uses the same holder.
      this.release(this.records, OWN, this.records.oldest, "evicted");
      this.counters.evicted++;
    }
    const prefillTokens = Math.max(0, promptTokens - cachedTokens);
    const outputBlocks = this.trackOutputBlocks
      ? Math.ceil(expectedOutputTokens / this.blockSize)
      : 0;
    const load = { chain, blocks, prefillTokens, outputBlocks };
    const record = this.insert(this.records, OWN, requestId, key, idCheck, slot, load, nowMs);
    this.routedTotal[slot]!++;
    this.counters.admitted++;
    if (VERIFY) this.verify();
    return record;
  }

  /**
   * Visits every active request, least recently touched first: its slot, id, prompt
   * tokens still in prefill (0 once prefill is done), expected output blocks, time
   * since its last lifecycle call, its chain (valid during the call) and its handle
   * (`OwnFacts`).
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
      handle: number,
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
        r.serial[record]!,
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
    const load = { chain, blocks, prefillTokens, outputBlocks };
    const touched = this.now() - Math.max(0, idleMs);
    this.insert(this.records, OWN, requestId, key, hashCheck(hash), slot, load, touched);
    if (VERIFY) this.verify();
    return true;
  }

  // ---- Peers' requests (several processes deciding as one: src/cluster) ----

  /** A number for a new peer's requests (1..ORIGINS_MAX), or -1 when every one is taken. */
  openOrigin(): number {
    let origin = this.origins.indexOf(null, 1);
    if (origin < 0) {
      if (this.origins.length > ORIGINS_MAX) return -1;
      origin = this.origins.length;
      this.origins.push(null);
    }
    this.origins[origin] = new OriginLoad(this.slotCapacity);
    return origin;
  }

  /** Drops every request of `origin` and frees its number (and its records' memory). Returns how many. */
  closeOrigin(origin: number): number {
    const store = this.originLoad(origin).records;
    let dropped = 0;
    for (let record = 0; record < store.top && store.count > 0; record++) {
      if (store.slot[record] === NO_RECORD) continue;
      this.release(store, origin, record, "worker_removed");
      dropped++;
    }
    this.peerCounters.droppedWithOrigin += dropped;
    this.origins[origin] = null;
    while (this.origins.length > 1 && this.origins[this.origins.length - 1] === null)
      this.origins.pop();
    return dropped;
  }

  /** Drops every request of `origin` and keeps the number (a resync replaces its set). */
  clearOrigin(origin: number): number {
    const dropped = this.closeOrigin(origin);
    while (this.origins.length <= origin) this.origins.push(null);
    this.origins[origin] = new OriginLoad(this.slotCapacity);
    return dropped;
  }

  /** Active requests of `origin` (0 for an origin not open). */
  originCount(origin: number): number {
    return this.origins[origin]?.records.count ?? 0;
  }

  /** Active requests of every peer. */
  get peerRequestCount(): number {
    let count = 0;
    for (const peer of this.origins) count += peer?.records.count ?? 0;
    return count;
  }

  /**
   * A peer routed a request to `slot`, adding the load its router counted: prompt
   * tokens still in prefill, output blocks, and either its chain (`decodeBlocks` null:
   * into the active-block tree, as an own request's) or, without one, `decodeBlocks`
   * as its origin counted them. An id its origin still has active here is replaced (its
   * end was lost); past the limit of active requests the origin's least recently touched
   * one is dropped first.
   */
  peerRouted(
    origin: number,
    requestId: string,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    decodeBlocks: number | null = null,
  ): void {
    this.assertLive(slot);
    const store = this.originLoad(origin).records;
    const chainBlocks = decodeBlocks === null ? blocks : 0;
    if (!(Number.isInteger(chainBlocks) && chainBlocks >= 0 && chain.length >= 2 * chainBlocks))
      throw new RangeError(`bad chain of ${blocks} blocks`);
    if (!(prefillTokens >= 0 && outputBlocks >= 0 && (decodeBlocks ?? 0) >= 0))
      throw new RangeError("negative load");
    const hash = this.idHash(requestId);
    const key = hashKey(hash);
    const known = store.find(requestId, key);
    if (known !== NO_RECORD) {
      this.release(store, origin, known, "worker_removed");
      this.peerCounters.replaced++;
    } else if (store.count >= this.maxActiveRequests) {
      this.release(store, origin, store.oldest, "evicted");
      this.peerCounters.evicted++;
    }
    const load = { chain, blocks: chainBlocks, prefillTokens, outputBlocks };
    const record = this.insert(
      store,
      origin,
      requestId,
      key,
      hashCheck(hash),
      slot,
      load,
      this.now(),
    );
    if (decodeBlocks !== null && decodeBlocks > 0)
      this.addFlat(origin, store, record, decodeBlocks);
    this.peerCounters.routed++;
    if (VERIFY) this.verify();
  }

  /** A peer's request finished its prefill. False if `origin` has no such request here. */
  peerPrefillDone(origin: number, requestId: string): boolean {
    const r = this.originLoad(origin).records;
    const record = r.find(requestId, hashKey(this.idHash(requestId)));
    if (record === NO_RECORD) {
      this.peerCounters.unknown++;
      return false;
    }
    const slot = r.slot[record]!;
    this.activePrefillTokens[slot]! -= r.prefill[record]!;
    this.peerPrefillTokens[slot]! -= r.prefill[record]!;
    r.prefill[record] = 0;
    r.touch(record, this.now());
    this.peerCounters.prefillDone++;
    return true;
  }

  /**
   * A peer's request ended (done, expired, evicted, dropped there), freeing `freed`
   * decode blocks as its origin counted them (a chainless one). False if unknown here.
   */
  peerEnded(origin: number, requestId: string, freed = 0): boolean {
    const r = this.originLoad(origin).records;
    const record = r.find(requestId, hashKey(this.idHash(requestId)));
    if (record === NO_RECORD) {
      this.peerCounters.unknown++;
      return false;
    }
    this.release(r, origin, record, "already_done", freed);
    this.peerCounters.ended++;
    return true;
  }

  /**
   * What a peer's chainless requests on `slot` add, as its router counts them now (its
   * snapshot says so: a sum of what each added would drift with the order they end in).
   * Ignored for a slot where it has no request here.
   */
  peerDecodeTotal(origin: number, slot: number, blocks: number): void {
    this.assertLive(slot);
    const peer = this.originLoad(origin);
    if (!(blocks >= 0)) throw new RangeError("negative load");
    this.syncSlots();
    if (peer.requests[slot] === 0) return;
    this.activeDecodeBlocks[slot]! += blocks - peer.decode[slot]!;
    peer.decode[slot] = blocks;
  }

  private originLoad(origin: number): OriginLoad {
    const peer = origin >= 1 ? this.origins[origin] : undefined;
    if (!peer) throw new RangeError(`no peer origin ${origin}`);
    return peer;
  }

  /** A chainless peer request's decode blocks, counted on its slot under its origin. */
  private addFlat(origin: number, store: RequestRecords, record: number, blocks: number): void {
    const slot = store.slot[record]!;
    store.flat[record] = blocks;
    this.originLoad(origin).decode[slot]! += blocks;
    this.activeDecodeBlocks[slot]! += blocks;
  }

  /** Takes a record in `store` (of `origin`) and adds its load to `slot`. */
  private insert(
    store: RequestRecords,
    origin: number,
    requestId: string,
    key: number,
    idCheck: number,
    slot: number,
    load: RequestLoad,
    touched: number,
  ): number {
    const { chain, blocks, prefillTokens, outputBlocks } = load;
    this.syncSlots(); // a slot the index or the core took since the last decision
    const added = this.blocks.add(slot, chain, blocks, this.holder);
    // After anything that can throw: a record is live once taken.
    const record = store.add(requestId, key, idCheck, slot, touched);
    store.leaf[record] = this.holder.leaf ?? -1;
    store.blocks[record] = blocks;
    store.prefill[record] = prefillTokens;
    store.output[record] = outputBlocks;
    store.flat[record] = 0;
    this.treeBlocks[slot]! += added;
    this.activePrefillTokens[slot]! += prefillTokens;
    this.activeDecodeBlocks[slot]! += added + outputBlocks;
    this.activeRequests[slot]!++;
    if (origin === OWN) {
      this.finished.forget(key, idCheck);
      this.facts?.routed(
        store.serial[record]!,
        slot,
        chain,
        blocks,
        prefillTokens,
        outputBlocks,
        added,
      );
    } else {
      this.peerRequests[slot]!++;
      this.peerPrefillTokens[slot]! += prefillTokens;
      this.origins[origin]!.requests[slot]!++;
    }
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
    this.facts?.prefillDone(r.serial[record]!);
    return "ok";
  }

  /** The request finished: all its load is released. A repeat answers `already_done`. */
  done(requestId: string): LifecycleResult {
    const hash = this.idHash(requestId);
    const record = this.records.find(requestId, hashKey(hash));
    if (record === NO_RECORD) return this.ended(hash);
    this.release(this.records, OWN, record, "already_done");
    this.counters.done++;
    return "ok";
  }

  /**
   * The routing path's expiry: the due requests at the front, at most EXPIRE_PER_DECISION.
   * Returns the clock it read, for the decision to reuse.
   */
  expireDue(): number {
    const now = this.now();
    this.sweep(now, EXPIRE_PER_DECISION);
    return now;
  }

  /**
   * Expires requests idle for the TTL or longer, oldest first, at most `max`; forgets
   * finished ids as old (as many). Returns how many requests expired.
   */
  sweep(now = this.now(), max = Infinity): number {
    const expired = this.expireIn(this.records, OWN, now, max);
    this.finished.forgetOlderThan(now, this.requestTtlMs, max);
    this.counters.expired += expired;
    // Peers' requests end by their origin's facts; the TTL is a backstop (a lost end).
    let left = max - expired;
    for (let origin = 1; origin < this.origins.length && left > 0; origin++) {
      const peer = this.origins[origin];
      if (!peer) continue;
      const dropped = this.expireIn(peer.records, origin, now, left);
      this.peerCounters.expired += dropped;
      left -= dropped;
    }
    return expired;
  }

  /** Expires one origin's requests idle for the TTL, oldest first, at most `max`. */
  private expireIn(store: RequestRecords, origin: number, now: number, max: number): number {
    let expired = 0;
    // A peer's request gets twice the TTL: its origin's own expiry (and end) comes first.
    const ttl = origin === OWN ? this.requestTtlMs : PEER_TTL_FACTOR * this.requestTtlMs;
    // Oldest touch first (the clock is monotonic): the first fresh request ends the sweep.
    while (
      expired < max &&
      store.oldest !== NO_RECORD &&
      now - store.touched[store.oldest]! >= ttl
    ) {
      this.release(store, origin, store.oldest, "expired");
      expired++;
    }
    return expired;
  }

  /**
   * O(N) consistency check (tests, KVEDGE_VERIFY): per-slot counters equal sums over
   * active requests, the block table agrees with the decode counters, and the touch
   * list holds exactly the active requests, oldest first.
   */
  verify(): void {
    const perSlot = this.blocks.verify();
    const n = this.slotCapacity;
    const sums = {
      requests: new Uint32Array(n),
      prefill: new Float64Array(n),
      output: new Float64Array(n),
    };
    const peers = {
      requests: new Uint32Array(n),
      prefill: new Float64Array(n),
      output: new Float64Array(n),
    };
    const flat = new Float64Array(n);
    this.sumStore(this.records, sums);
    for (let origin = 1; origin < this.origins.length; origin++) {
      const peer = this.origins[origin];
      if (!peer) continue;
      assert(
        peer.records.count <= this.maxActiveRequests,
        `origin ${origin} over the active limit`,
      );
      const own = {
        requests: new Uint32Array(n),
        prefill: new Float64Array(n),
        output: new Float64Array(n),
      };
      this.sumStore(peer.records, own);
      for (let slot = 0; slot < n; slot++) {
        assert(
          own.requests[slot] === (peer.requests[slot] ?? 0),
          `origin ${origin} requests on ${slot}`,
        );
        const decode = peer.decode[slot] ?? 0;
        assert(
          decode >= 0 && (decode === 0 || own.requests[slot]! > 0),
          `origin ${origin} decode on ${slot}`,
        );
        flat[slot]! += decode;
      }
      this.sumStore(peer.records, sums);
      this.sumStore(peer.records, peers);
    }
    for (let slot = 0; slot < n; slot++) {
      assert(
        sums.requests[slot] === this.activeRequests[slot],
        `slot ${slot} active request count`,
      );
      assert(sums.prefill[slot] === this.activePrefillTokens[slot], `slot ${slot} prefill tokens`);
      assert((perSlot.get(slot) ?? 0) === this.treeBlocks[slot], `slot ${slot} tree blocks`);
      assert(
        this.treeBlocks[slot]! + sums.output[slot]! + flat[slot]! === this.activeDecodeBlocks[slot],
        `slot ${slot} decode blocks`,
      );
      assert(peers.requests[slot] === this.peerRequests[slot], `slot ${slot} peers' requests`);
      assert(peers.prefill[slot] === this.peerPrefillTokens[slot], `slot ${slot} peers' prefill`);
    }
    assert(this.finished.size <= FINISHED_REMEMBERED_MAX, "too many finished ids remembered");
  }

  /** Checks one store and adds its requests, prefill and output blocks per slot to `into`. */
  private sumStore(
    r: RequestRecords,
    into: { requests: Uint32Array; prefill: Float64Array; output: Float64Array },
  ): void {
    r.verify((id) => hashKey(this.idHash(id)));
    for (let record = 0; record < r.top; record++) {
      const slot = r.slot[record]!;
      if (slot === NO_RECORD) continue;
      assert(this.live[slot] === 1, "request on a dead slot");
      into.requests[slot]!++;
      into.prefill[slot]! += r.prefill[record]!;
      into.output[slot]! += r.output[record]!;
    }
  }

  private ended(hash: IdHash): LifecycleResult {
    const ending = this.finished.endingOf(hashKey(hash), hashCheck(hash));
    if (ending !== null) return ending;
    this.counters.unknown++;
    return "unknown";
  }

  /**
   * Ends an active request of `origin`: its load leaves its worker; an own one's id joins
   * the finished ones and its end is reported. A
   * chainless peer request takes `freed` decode blocks with it (its origin's count), or
   * without one its own share, at most what its origin still has there; the last of an
   * origin's requests on a slot takes the rest.
   */
  private release(
    r: RequestRecords,
    origin: number,
    record: number,
    ending: Ending,
    freed?: number,
  ): void {
    const slot = r.slot[record]!;
    this.activePrefillTokens[slot]! -= r.prefill[record]!;
    const leaf = r.leaf[record]!;
    this.holder.leaf = leaf < 0 ? null : leaf;
    const treeFreed = this.blocks.remove(slot, this.holder);
    this.treeBlocks[slot]! -= treeFreed;
    this.activeDecodeBlocks[slot]! -= treeFreed + r.output[record]!;
    this.activeRequests[slot]!--;
    if (origin === OWN) {
      this.finished.remember(r.key[record]!, r.check[record]!, ending, this.now());
      this.facts?.ended(r.serial[record]!, END_REASONS[ending], treeFreed);
    } else {
      this.peerRequests[slot]!--;
      this.peerPrefillTokens[slot]! -= r.prefill[record]!;
      this.releaseFlat(this.origins[origin]!, slot, r.flat[record]!, freed);
    }
    r.remove(record);
    if (VERIFY) this.verify();
  }

  /** A peer request leaves `slot`: its chainless decode blocks go (see `release`). */
  private releaseFlat(peer: OriginLoad, slot: number, own: number, freed?: number): void {
    const left = --peer.requests[slot]!;
    const held = peer.decode[slot]!;
    const gone = left === 0 ? held : Math.min(held, freed ?? own);
    peer.decode[slot] = held - gone;
    this.activeDecodeBlocks[slot]! -= gone;
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
    this.peerRequests = grow(this.peerRequests, (n) => new Uint32Array(n));
    this.peerPrefillTokens = grow(this.peerPrefillTokens, (n) => new Float64Array(n));
    this.treeBlocks = grow(this.treeBlocks, (n) => new Float64Array(n));
    for (const peer of this.origins) peer?.grow(capacity);
    this.approximate = grow(this.approximate, (n) => new Uint8Array(n));
    this.fallback = grow(this.fallback, (n) => new Uint8Array(n));
  }
}
