/**
 * Predictions from kvedge's own decisions, request by request: what the core (and the
 * virtual-time demo) tells them, so both drive the same code.
 *
 *   routed       a request went to an approximate worker: its prompt's blocks become
 *                predicted blocks of that worker now (`predict_at = route`), or are
 *                kept until its prefill is done (`prefill_done`, the default: a request
 *                that never reaches the engine predicts nothing)
 *   prefillDone  the engine computed the prompt: its blocks are predicted; a reported
 *                cached-token count corrects the worker first
 *   observed     the engine's answer said how many prompt tokens it served from cache
 *                (`usage.prompt_tokens_details.cached_tokens`, read by the proxy)
 *   done         the request ended: the engine released its blocks, which become the
 *                most recently used of its predictions (vLLM appends a finished
 *                request's blocks to its free queue, the LRU order it evicts from), and
 *                what was kept for the request goes
 *
 * Correction: a worker that served fewer cached tokens than its predicted blocks
 * promised no longer held the first missing block, so, its cache being an LRU, no block
 * used before the deepest predicted one either: those predictions are purged and the
 * worker's capacity moves toward what is left (./predicted-blocks.ts). A worker that
 * served more than kvedge credited had room for more: a learned capacity grows back.
 *
 * Per request routed to an approximate worker: a record in typed arrays (found by a
 * 53-bit hash of its id, checked by 11 more bits) and its hashes in an arena (16 bytes
 * a block) until it is done. Records end
 * with `done`, or `requestTtlMs` after routing (a gateway that never calls done), and
 * at most `maxPending` are kept (the oldest goes first).
 */
import type { KvEventSink } from "../ingest/normalize";
import { KeyTable } from "../util/tables";
import { Arena, orderOf } from "./arena";
import { PredictedBlocks } from "./predicted-blocks";
import { hashCheck, hashKey, idHash } from "./requests";

export const PREDICT_AT = ["prefill_done", "route"] as const;
export type PredictAt = (typeof PREDICT_AT)[number];

export interface PredictionSettings {
  readonly blockSize: number;
  readonly predictAt: PredictAt;
  /** Fleet default KV capacity of an approximate worker, blocks; null = unknown (TTL). */
  readonly capacityBlocks: number | null;
  /** Predicted blocks unused this long expire on workers without a known capacity. */
  readonly ttlMs: number;
  /** Most predicted blocks per worker without a known capacity. */
  readonly maxBlocks: number;
  /** A request record is dropped this long after routing if done never comes. */
  readonly requestTtlMs: number;
  readonly maxPending: number;
  /** Correct by reported cached tokens (default true). */
  readonly correct?: boolean;
}

/** Dynamo's approximate mode: TTL 120 s (`--router-ttl-secs`). */
export const DEFAULT_PREDICTED_TTL_MS = 120_000;
/** 2^20 blocks: 16M tokens at block size 16, past any one engine's KV cache. */
export const DEFAULT_PREDICTED_MAX_BLOCKS = 1 << 20;
/** TTL expiry runs at most this often (Dynamo rounds expiries to 100 ms buckets). */
const EXPIRE_EVERY_MS = 100;
const NONE = -1;
const INITIAL_RECORDS = 64;

export interface PredictionCounters {
  /** Answers that reported fewer cached tokens than the predicted blocks promised. */
  shortfalls: number;
  /** Answers that reported more than kvedge credited the worker with. */
  surpluses: number;
  /** Answers that matched the prediction. */
  confirmed: number;
  /** Records dropped by the TTL or the bound. */
  dropped: number;
}

/** Told what this process predicts and corrects, to share with its peers (src/cluster). */
export interface PredictionShare {
  /**
   * Blocks [0, count) of the chain were predicted or refreshed on `slot`, [0, held) of
   * them predicted here already (a refresh: held = count). Arrays valid during the call.
   */
  predicted(
    slot: number,
    local: Uint32Array,
    chain: Uint32Array,
    held: number,
    count: number,
  ): void;
  /**
   * An answer corrected `slot`: a shortfall (the capacity shrunk and, `named`, every
   * block older than the one named by its sequence hash purged) or a surplus (the
   * capacity grown).
   */
  corrected(slot: number, shortfall: boolean, named: boolean, hi: number, lo: number): void;
}

export class Predictions {
  readonly blocks: PredictedBlocks;
  readonly counters: PredictionCounters = { shortfalls: 0, surpluses: 0, confirmed: 0, dropped: 0 };
  /** Told every prediction, refresh and correction this process makes (a cluster shares them as this replica's facts). */
  share: PredictionShare | null = null;
  private readonly keys = new KeyTable();
  private readonly words = new Arena(1024);
  // Per record.
  private check = new Uint16Array(INITIAL_RECORDS);
  private slot = new Int32Array(INITIAL_RECORDS);
  private epochAt = new Float64Array(INITIAL_RECORDS);
  private key = new Float64Array(INITIAL_RECORDS);
  /** LRU stamp of the deepest predicted block of the overlap at routing (-1: none). */
  private stamp = new Float64Array(INITIAL_RECORDS);
  private predicted = new Int32Array(INITIAL_RECORDS);
  private credited = new Int32Array(INITIAL_RECORDS);
  private hashesAt = new Int32Array(INITIAL_RECORDS);
  private count = new Int32Array(INITIAL_RECORDS);
  private routedMs = new Float64Array(INITIAL_RECORDS);
  private corrected = new Uint8Array(INITIAL_RECORDS);
  /** 1 once the record's blocks were predicted (at routing or at prefill done). */
  private inserted = new Uint8Array(INITIAL_RECORDS);
  /** Routing order (older / newer); `newer` links free records. */
  private older = new Int32Array(INITIAL_RECORDS);
  private newer = new Int32Array(INITIAL_RECORDS);
  private oldestRecord = NONE;
  private newestRecord = NONE;
  private freeRecord = NONE;
  private top = 0;
  private live = 0;
  /** Per slot: bumped whenever its mode changes, so older records no longer apply. */
  private epochs = new Float64Array(0);
  private nextExpiryMs = 0;

  constructor(
    sink: Pick<KvEventSink, "storeAt" | "removeAt" | "clearAt">,
    private readonly settings: PredictionSettings,
    private readonly now: () => number,
  ) {
    this.blocks = new PredictedBlocks({
      sink,
      ttlMs: settings.ttlMs,
      maxBlocks: settings.maxBlocks,
      now,
    });
  }

  /** Request records kept. */
  get records(): number {
    return this.live;
  }

  isApproximate(slot: number): boolean {
    return this.blocks.isEnabled(slot);
  }

  /** The slot's worker is approximate (capacity: its own, else the fleet default, else unknown). */
  enable(slot: number, capacityBlocks: number | null): void {
    this.bumpEpoch(slot);
    this.blocks.enable(slot, capacityBlocks ?? this.settings.capacityBlocks);
  }

  /** The slot's worker is exact again, or gone: its predictions leave the index. */
  disable(slot: number): void {
    this.bumpEpoch(slot);
    this.blocks.disable(slot);
  }

  /**
   * A request was routed to `slot`. `overlapBlocks` is what the index said the slot
   * holds, `creditedBlocks` what the router counted as cached (with pending blocks).
   */
  routed(
    requestId: string,
    slot: number,
    local: Uint32Array,
    chain: Uint32Array,
    count: number,
    tokenCount: number,
    overlapBlocks: number,
    creditedBlocks: number,
  ): void {
    this.tick();
    if (!this.blocks.isEnabled(slot)) return;
    const reusable = Math.max(0, Math.floor((tokenCount - 1) / this.settings.blockSize));
    const predicted = Math.min(overlapBlocks, count, reusable);
    const stamp =
      predicted > 0
        ? this.blocks.stampOf(slot, chain[2 * predicted - 2]!, chain[2 * predicted - 1]!)
        : NONE;
    const record = this.newRecord(requestId, slot);
    this.stamp[record] = stamp;
    this.predicted[record] = predicted;
    this.credited[record] = Math.min(Math.max(creditedBlocks, predicted), reusable);
    // The hashes stay until done: a finished request's blocks are refreshed then.
    this.keepHashes(record, local, chain, count);
    if (this.settings.predictAt === "route") this.insertKept(record);
  }

  /** The request's first token: its prompt is in the engine's cache now. */
  prefillDone(requestId: string, cachedTokens: number | null): void {
    const record = this.find(requestId);
    if (record === NONE) return;
    if (cachedTokens !== null) this.correct(record, cachedTokens);
    if (this.inserted[record] === 0) this.insertKept(record);
  }

  /** The engine's answer reported `cachedTokens` cached prompt tokens. */
  observed(requestId: string, cachedTokens: number): void {
    const record = this.find(requestId);
    if (record !== NONE) this.correct(record, cachedTokens);
  }

  /** The request finished: the engine released its blocks, now its most recently used. */
  done(requestId: string): void {
    const record = this.find(requestId);
    if (record === NONE) return;
    const at = this.hashesAt[record]!;
    if (this.inserted[record] === 1 && at !== NONE && this.current(record)) {
      const count = this.count[record]!;
      const slot = this.slot[record]!;
      const words = this.words.words;
      const chain = words.subarray(at + 2 * count, at + 4 * count);
      const held = this.blocks.refresh(slot, chain, count);
      if (held > 0)
        this.share?.predicted(slot, words.subarray(at, at + 2 * count), chain, held, held);
    }
    this.remove(record);
  }

  /** Predicts the kept hashes' blocks for the record's worker (once). */
  private insertKept(record: number): void {
    this.inserted[record] = 1;
    const at = this.hashesAt[record]!;
    if (at === NONE || !this.current(record)) return;
    const count = this.count[record]!;
    const words = this.words.words;
    const local = words.subarray(at, at + 2 * count);
    const chain = words.subarray(at + 2 * count, at + 4 * count);
    this.insert(this.slot[record]!, local, chain, count);
  }

  /**
   * A peer's prediction or refresh (several processes as one; `PredictedBlocks.extend`):
   * applied as if made here, not shared again. False when the slot is not approximate
   * here or does not hold the anchor.
   */
  apply(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): boolean {
    return this.blocks.extend(slot, anchored, anchorHi, anchorLo, local, count);
  }

  /**
   * Every approximate worker's predictions, newest first, in runs (`PredictedBlocks.forEachRun`),
   * at most `maxBlocks` in all (shared evenly between the workers): what a joining
   * replica is sent. `ageMs`: how long ago a run's first block was used.
   */
  forEachRun(
    maxBlocks: number,
    runBlocksMax: number,
    visit: (
      slot: number,
      anchored: boolean,
      anchorHi: number,
      anchorLo: number,
      local: Uint32Array,
      count: number,
      ageMs: number,
    ) => void,
  ): void {
    const slots = this.blocks.enabledSlots();
    if (slots.length === 0) return;
    const quota = Math.floor(maxBlocks / slots.length);
    const now = this.now();
    for (const slot of slots)
      this.blocks.forEachRun(slot, quota, runBlocksMax, (anchored, hi, lo, local, count, usedMs) =>
        visit(slot, anchored, hi, lo, local, count, Math.max(0, now - usedMs)),
      );
  }

  /**
   * A peer's older predictions, newest first (a joining replica takes a peer's set):
   * added at the least recently used end, as `PredictedBlocks.prepend` says, last used
   * `ageMs` ago. False when the slot is not approximate here or lacks the anchor.
   */
  applyOlder(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
    ageMs: number,
  ): boolean {
    const usedMs = this.now() - ageMs;
    return this.blocks.prepend(slot, anchored, anchorHi, anchorLo, local, count, usedMs);
  }

  /**
   * A peer's correction (`PredictionShare.corrected`): a shortfall purges every block
   * older than the named one here (the peer purged those no newer than it was when the
   * request was routed there; here it may have been used since, and what is older here
   * is older there too) and shrinks the capacity; a surplus grows it. False when the
   * slot is not approximate here.
   */
  applyCorrection(
    slot: number,
    shortfall: boolean,
    named: boolean,
    hi: number,
    lo: number,
  ): boolean {
    if (!this.blocks.isEnabled(slot)) return false;
    if (!shortfall) this.blocks.grow(slot);
    else {
      const stamp = named ? this.blocks.stampOf(slot, hi, lo) : NONE;
      if (stamp >= 0) this.blocks.purge(slot, stamp - 1);
      this.blocks.shrink(slot);
    }
    return true;
  }

  /** Drops records past the request TTL and expires predicted blocks past theirs (at most every 100 ms). */
  tick(): void {
    const now = this.now();
    if (now < this.nextExpiryMs) return;
    this.nextExpiryMs = now + EXPIRE_EVERY_MS;
    this.blocks.expire();
    const cutoff = now - this.settings.requestTtlMs;
    while (this.oldestRecord !== NONE && this.routedMs[this.oldestRecord]! <= cutoff) {
      this.remove(this.oldestRecord);
      this.counters.dropped++;
    }
  }

  private insert(slot: number, local: Uint32Array, chain: Uint32Array, count: number): void {
    const held = this.blocks.insert(slot, local, chain, count);
    if (count > 0) this.share?.predicted(slot, local, chain, held, count);
  }

  private correct(record: number, cachedTokens: number): void {
    if (this.corrected[record] === 1 || !this.current(record)) return;
    this.corrected[record] = 1;
    const slot = this.slot[record]!;
    const observed = Math.floor(cachedTokens / this.settings.blockSize);
    // Counted either way; acted on unless correction is off.
    const act = this.settings.correct !== false;
    if (observed < this.predicted[record]!) {
      this.counters.shortfalls++;
      if (!act) return;
      const purge = this.stamp[record]! >= 0;
      if (purge) this.blocks.purge(slot, this.stamp[record]!);
      this.blocks.shrink(slot);
      this.shareShortfall(record, purge);
    } else if (observed > this.credited[record]!) {
      this.counters.surpluses++;
      if (!act) return;
      this.blocks.grow(slot);
      this.share?.corrected(slot, false, false, 0, 0);
    } else {
      this.counters.confirmed++;
    }
  }

  /** Tells the peers of a shortfall: its purge named by the deepest block predicted at routing. */
  private shareShortfall(record: number, purge: boolean): void {
    const share = this.share;
    if (share === null) return;
    const at = this.hashesAt[record]!;
    const deepest = this.predicted[record]! - 1;
    const named = purge && at !== NONE && deepest >= 0;
    const words = this.words.words;
    const p = at + 2 * this.count[record]! + 2 * deepest;
    share.corrected(
      this.slot[record]!,
      true,
      named,
      named ? words[p]! : 0,
      named ? words[p + 1]! : 0,
    );
  }

  /** Whether the record's slot is still the approximate worker it was routed to. */
  private current(record: number): boolean {
    const slot = this.slot[record]!;
    return this.blocks.isEnabled(slot) && this.epochs[slot] === this.epochAt[record];
  }

  private bumpEpoch(slot: number): void {
    if (this.epochs.length <= slot) {
      const grown = new Float64Array(Math.max(8, 2 * (slot + 1)));
      grown.set(this.epochs);
      this.epochs = grown;
    }
    this.epochs[slot]!++;
  }

  private find(requestId: string): number {
    const hash = idHash(requestId);
    const record = this.keys.get(hashKey(hash));
    return record !== NONE && this.check[record] === hashCheck(hash) ? record : NONE;
  }

  private keepHashes(record: number, local: Uint32Array, chain: Uint32Array, count: number): void {
    if (count === 0) return;
    const at = this.words.allocate(orderOf(4 * count));
    const words = this.words.words;
    words.set(local.subarray(0, 2 * count), at);
    words.set(chain.subarray(0, 2 * count), at + 2 * count);
    this.hashesAt[record] = at;
    this.count[record] = count;
  }

  private freeHashes(record: number): void {
    const at = this.hashesAt[record]!;
    if (at === NONE) return;
    this.words.release(at, orderOf(4 * this.count[record]!));
    this.hashesAt[record] = NONE;
  }

  /** A record for the request (one already kept under its key is replaced). */
  private newRecord(requestId: string, slot: number): number {
    const hash = idHash(requestId);
    const key = hashKey(hash);
    const known = this.keys.get(key);
    if (known !== NONE) this.remove(known);
    else if (this.live >= this.settings.maxPending && this.oldestRecord !== NONE) {
      this.remove(this.oldestRecord);
      this.counters.dropped++;
    }
    const record = this.takeRecord();
    this.keys.set(key, record);
    this.key[record] = key;
    this.check[record] = hashCheck(hash);
    this.slot[record] = slot;
    this.epochAt[record] = this.epochs[slot] ?? 0;
    this.hashesAt[record] = NONE;
    this.count[record] = 0;
    this.corrected[record] = 0;
    this.inserted[record] = 0;
    this.routedMs[record] = this.now();
    this.older[record] = this.newestRecord;
    this.newer[record] = NONE;
    if (this.newestRecord === NONE) this.oldestRecord = record;
    else this.newer[this.newestRecord] = record;
    this.newestRecord = record;
    this.live++;
    return record;
  }

  private remove(record: number): void {
    this.freeHashes(record);
    this.keys.delete(this.key[record]!);
    const before = this.older[record]!;
    const after = this.newer[record]!;
    if (before === NONE) this.oldestRecord = after;
    else this.newer[before] = after;
    if (after === NONE) this.newestRecord = before;
    else this.older[after] = before;
    this.slot[record] = NONE;
    this.newer[record] = this.freeRecord;
    this.freeRecord = record;
    if (--this.live === 0) this.resetRecords();
  }

  private takeRecord(): number {
    if (this.freeRecord !== NONE) {
      const record = this.freeRecord;
      this.freeRecord = this.newer[record]!;
      return record;
    }
    if (this.top === this.slot.length) this.growRecords(2 * this.slot.length);
    return this.top++;
  }

  private growRecords(capacity: number): void {
    const grow = <T extends Uint16Array | Int32Array | Float64Array | Uint8Array>(old: T): T => {
      const grown = new (old.constructor as { new (n: number): T })(capacity);
      grown.set(old);
      return grown;
    };
    this.check = grow(this.check);
    this.slot = grow(this.slot);
    this.epochAt = grow(this.epochAt);
    this.key = grow(this.key);
    this.stamp = grow(this.stamp);
    this.predicted = grow(this.predicted);
    this.credited = grow(this.credited);
    this.hashesAt = grow(this.hashesAt);
    this.count = grow(this.count);
    this.routedMs = grow(this.routedMs);
    this.corrected = grow(this.corrected);
    this.inserted = grow(this.inserted);
    this.older = grow(this.older);
    this.newer = grow(this.newer);
  }

  /** No record left: the arrays and the arena go back to their first size. */
  private resetRecords(): void {
    this.top = 0;
    this.freeRecord = NONE;
    this.oldestRecord = NONE;
    this.newestRecord = NONE;
    this.words.reset();
    if (this.slot.length > INITIAL_RECORDS) this.growRecordsTo(INITIAL_RECORDS);
  }

  private growRecordsTo(capacity: number): void {
    this.check = new Uint16Array(capacity);
    this.slot = new Int32Array(capacity);
    this.epochAt = new Float64Array(capacity);
    this.key = new Float64Array(capacity);
    this.stamp = new Float64Array(capacity);
    this.predicted = new Int32Array(capacity);
    this.credited = new Int32Array(capacity);
    this.hashesAt = new Int32Array(capacity);
    this.count = new Int32Array(capacity);
    this.routedMs = new Float64Array(capacity);
    this.corrected = new Uint8Array(capacity);
    this.inserted = new Uint8Array(capacity);
    this.older = new Int32Array(capacity);
    this.newer = new Int32Array(capacity);
  }
}
