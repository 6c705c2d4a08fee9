/**
 * Worker selection: Dynamo's cost model (reference §5.2, device tier) and its
 * selection rule (§5.3), over every known worker.
 *
 * For a request of `isl` prompt tokens, `n` complete blocks, block size `bs`, and a
 * candidate worker w:
 *
 *   raw_prefill  = (active_prefill_tokens[w] + isl) / bs
 *   decay        = 1 / (1 + d * ((active_prefill_tokens[w] - min_w') / bs) / ceil(isl / bs))
 *                  when overlap_score_credit_decay d > 0, else 1
 *   overlap      = device overlap blocks[w] * (degraded[w] ? degraded_overlap_weight : 1)
 *                  (a degraded worker routed on predictions: fallbackOverlap of its indexed
 *                  and predicted blocks instead)
 *   lower        = (host_cache_hit_weight * host blocks[w] + disk_cache_hit_weight *
 *                  (disk + external blocks[w])) * (degraded[w] ? degraded_overlap_weight : 1)
 *                  (the lower tiers' blocks right after the device's; reference §5.1)
 *   prefill_cost = prefill_load_scale * max(0, raw_prefill - overlap_score_credit * decay * overlap - lower)
 *   decode       = active_decode_blocks[w] + (n - blocks of the prompt already active on w)
 *   cost         = prefill_cost + decode + decode_active_request_weight * active_requests[w]
 *
 * Temperature 0 picks the lowest cost, ties broken uniformly at random (reservoir
 * sampling); T > 0 samples softmax(-(c - min) / ((max - min) * T)), uniform when all
 * costs are equal. Workers with no overlap are candidates like any other, so misses
 * spread by load and random ties; a hot worker's growing load outweighs its cache.
 *
 * Hot path: one pass over the live slots reading per-slot typed arrays; the only
 * allocations per decision are the result object and the request's id (the candidates
 * go into a CandidateList the caller may reuse, the request's record into the load
 * tracker's arrays).
 */
import { KvedgeError } from "../domain/errors";
import { LoadTracker, type LoadTrackerOptions, REQUEST_ID_LENGTH_MAX } from "./load";
import { Calibration, type LearnedTimes } from "./calibration";
import { SPILL_BACKLOG, SPILL_WEIGHT_FRACTION } from "./pacing";
import {
  checkTtftSettings,
  DEFAULT_TTFT_SETTINGS,
  kvReadMs,
  ownPrefillTokens,
  predictTtft,
  reloadMsOf,
  type RoutePolicy,
  stepsUntilFirstToken,
  TtftParts,
  type TtftSettings,
} from "./ttft";

export interface RouteWeights {
  /** Credit, in blocks of prefill, per block the worker already holds. */
  readonly overlapScoreCredit: number;
  /** Shrinks the credit of workers with more queued prefill than the least busy one. */
  readonly overlapScoreCreditDecay: number;
  /** Weight of the (credited) prefill blocks against decode blocks. */
  readonly prefillLoadScale: number;
  /** Cost per active request, in blocks. */
  readonly decodeActiveRequestWeight: number;
  /** 0 = argmin with random ties; > 0 = softmax over normalized costs. */
  readonly temperature: number;
  /** Factor on a degraded worker's overlap (0 = ignore it, 1 = trust it fully). */
  readonly degradedOverlapWeight: number;
  /** Credit of a host-tier block beyond the device match, in device blocks. */
  readonly hostCacheHitWeight: number;
  /** Credit of a disk or external block beyond the host match, in device blocks. */
  readonly diskCacheHitWeight: number;
}

/** Dynamo's defaults (reference §5.6), plus kvedge's degraded-worker discount. */
export const DEFAULT_ROUTE_WEIGHTS: RouteWeights = {
  overlapScoreCredit: 1,
  overlapScoreCreditDecay: 0,
  prefillLoadScale: 1,
  decodeActiveRequestWeight: 0,
  temperature: 0,
  degradedOverlapWeight: 0.5,
  hostCacheHitWeight: 0.75,
  diskCacheHitWeight: 0.25,
};

/** An engine's two speed constants that calibration learns. */
export interface EngineTimes {
  readonly prefillTokensPerSecond: number;
  readonly stepBaseMs: number;
}

export interface RouterOptions extends LoadTrackerOptions {
  /** "ttft" (predicted time to first token, ./ttft.ts) or "dynamo" (the weights below); default "dynamo". */
  readonly policy?: RoutePolicy;
  readonly weights?: Partial<RouteWeights>;
  /** The engine time model behind predicted TTFTs (every policy reports them). */
  readonly ttft?: Partial<TtftSettings>;
  /** Learn each worker's prefill speed and step cost from its lifecycle timings (./calibration.ts). */
  readonly calibrate?: boolean;
  /**
   * Credit a worker with the blocks of its active requests (routed, not done) as cached
   * for a new request sharing them: vLLM pins a running request's blocks, and a request
   * queued there computes them before a later one (default true; ./README.md; see
   * docs/decisions.md#pending-credit).
   */
  readonly pendingCredit?: boolean;
  /**
   * ttft policy: the recompute charge per ms of prefill that is only pending on another
   * worker (a burst's prefix in flight there), instead of `recomputeWeight`: a burst
   * stays on its holder until that queue is about this many times the prefix's prefill,
   * then spreads to another worker, which computes the prefix once more (default 2).
   */
  readonly pendingRecomputeWeight?: number;
  /** Uniform in [0, 1); injectable for tests. */
  readonly random?: () => number;
}

/**
 * The index's answer for one request: per worker holding a prefix of it, the number
 * of leading blocks held. `slots` are router slots (`LoadTracker.slotOf`); entries for
 * slots no longer live are ignored, workers not listed have overlap 0.
 */
export interface Overlaps {
  readonly count: number;
  readonly slots: ArrayLike<number>;
  readonly blocks: ArrayLike<number>;
  /**
   * The lower tiers' blocks right after the device's (src/index/tiers.ts), per entry;
   * absent when no worker has any. An entry may then have 0 device blocks.
   */
  readonly host?: ArrayLike<number>;
  readonly disk?: ArrayLike<number>;
  readonly external?: ArrayLike<number>;
  /**
   * Per entry, kvedge's predicted blocks of a degraded worker routed on predictions
   * (LoadTracker.fallback; src/core/fallback.ts), beside its indexed `blocks`; absent
   * when none is.
   */
  readonly predicted?: ArrayLike<number>;
}

export const NO_OVERLAPS: Overlaps = { count: 0, slots: [], blocks: [] };

export interface RouteRequest {
  /** Sequence hashes of the prompt's complete blocks, (hi, lo) pairs (src/hash chainHashes). */
  readonly chain: Uint32Array;
  readonly blockCount: number;
  /** Prompt length in tokens (isl), including a trailing partial block. */
  readonly tokenCount: number;
  /** Client's id; one is generated when absent. Must not be active already. */
  readonly requestId?: string | null;
  readonly expectedOutputTokens?: number | null;
  /** Per-request overrides of the configured weights. */
  readonly overlapScoreCredit?: number | null;
  readonly prefillLoadScale?: number | null;
  readonly temperature?: number | null;
  /** Return up to this many candidates, lowest cost first (default 0: none). */
  readonly candidatesMax?: number;
}

export interface Candidate {
  /** The worker's router slot (LoadTracker). */
  readonly slot: number;
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Blocks the index says the worker holds (before any degraded discount). */
  readonly overlapBlocks: number;
  /** What the overlap rests on: the engine's events, kvedge's predictions, or events it lost. */
  readonly overlapKind: OverlapKind;
  /** Blocks of the prompt the worker's active requests cover. */
  readonly pendingBlocks: number;
  /** Lower-tier blocks right after them: host, disk, external. */
  readonly hostBlocks: number;
  readonly diskBlocks: number;
  readonly externalBlocks: number;
  readonly cost: number;
  readonly degraded: boolean;
  readonly activePrefillTokens: number;
  readonly activeDecodeBlocks: number;
  readonly activeRequests: number;
  /** Predicted time to first token on this worker (ms) = queue + prefill + steps. */
  readonly predictedTtftMs: number;
  /** Prefill already routed to the worker, ahead of this request (ms). */
  readonly queueMs: number;
  /** Copying the lower tiers' blocks back to the device (ms). */
  readonly reloadMs: number;
  /** This request's uncached prefill (ms). */
  readonly prefillMs: number;
  /** Per-step overhead (weights and decode KV reads) over the steps until its first token (ms). */
  readonly stepsMs: number;
}

export interface RouteDecision {
  readonly requestId: string;
  readonly slot: number;
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly overlapBlocks: number;
  /** Blocks of this prompt the chosen worker's active requests cover (credited when pending credit is on). */
  readonly pendingBlocks: number;
  /** Blocks counted as cached on the chosen worker: the (trusted) overlap or the pending blocks. */
  readonly creditedBlocks: number;
  /** Lower-tier blocks right after the device's on the chosen worker. */
  readonly hostBlocks: number;
  readonly diskBlocks: number;
  readonly externalBlocks: number;
  readonly cost: number;
  /** The chosen worker's predicted time to first token (ms). */
  readonly predictedTtftMs: number;
  readonly candidates: CandidateList;
}

/** What a worker's overlap rests on (route answers and /v1/match say it per worker). */
export const OVERLAP_KINDS = ["exact", "approximate", "degraded"] as const;
export type OverlapKind = (typeof OVERLAP_KINDS)[number];

/** What a degraded exact worker is routed on (route.degraded_fallback). */
export const DEGRADED_FALLBACKS = ["predictions", "discount"] as const;

/**
 * The overlap the router trusts of a degraded exact worker routed on predictions
 * (route.degraded_fallback = predictions): the larger of what kvedge predicted it holds
 * from its own decisions since it degraded and its indexed overlap discounted as any
 * degraded worker's (the index keeps what the lost events did not change: after a short
 * loss it is nearly right, and predictions start empty).
 */
export function fallbackOverlap(
  indexed: number,
  predicted: number,
  degradedWeight: number,
): number {
  return Math.max(predicted, indexed * degradedWeight);
}

/** A slot's overlap kind as its index in OVERLAP_KINDS: degraded first, then approximate. */
export function overlapKindOf(load: LoadTracker, slot: number): number {
  return load.degraded[slot] === 1 ? 2 : load.approximate[slot] === 1 ? 1 : 0;
}

/** Measured on the burst workload (bench/burst.ts; src/route/README.md). */
export const DEFAULT_PENDING_RECOMPUTE_WEIGHT = 2;
const NO_MAXIMA = { cachedMax: 0, creditedMax: 0 } as const;

const NO_I32 = new Int32Array(0);
const NO_U32 = new Uint32Array(0);
const NO_F64 = new Float64Array(0);
const NO_U8 = new Uint8Array(0);

/**
 * The cheapest candidates of one decision, cheapest first, in columns: no object per
 * candidate, so the WebSocket path writes them straight into its answer. Router.route
 * fills the list it is given (a fresh one by default); a caller that passes the same
 * list every time reads it before its next decision. Load figures are as they were
 * before the request was admitted.
 */
export class CandidateList {
  count = 0;
  // Empty until the first candidates: a list per decision costs one object, not nine.
  slots = NO_I32;
  /** Entries past `count` are left from earlier decisions. */
  readonly workerIds: bigint[] = [];
  dpRanks = NO_U32;
  overlapBlocks = NO_F64;
  /** Index in OVERLAP_KINDS. */
  overlapKinds = NO_U8;
  pendingBlocks = NO_F64;
  hostBlocks = NO_F64;
  diskBlocks = NO_F64;
  externalBlocks = NO_F64;
  costs = NO_F64;
  degraded = NO_U8;
  activePrefillTokens = NO_F64;
  activeDecodeBlocks = NO_F64;
  activeRequests = NO_U32;
  predictedTtftMs = NO_F64;
  queueMs = NO_F64;
  reloadMs = NO_F64;
  prefillMs = NO_F64;
  stepsMs = NO_F64;

  /** Candidate `i` as an object (JSON answers, tests). */
  at(i: number): Candidate {
    if (!(Number.isInteger(i) && i >= 0 && i < this.count))
      throw new RangeError(`no candidate ${i} of ${this.count}`);
    return {
      slot: this.slots[i]!,
      workerId: this.workerIds[i]!,
      dpRank: this.dpRanks[i]!,
      overlapBlocks: this.overlapBlocks[i]!,
      overlapKind: OVERLAP_KINDS[this.overlapKinds[i]!]!,
      pendingBlocks: this.pendingBlocks[i]!,
      hostBlocks: this.hostBlocks[i]!,
      diskBlocks: this.diskBlocks[i]!,
      externalBlocks: this.externalBlocks[i]!,
      cost: this.costs[i]!,
      degraded: this.degraded[i] === 1,
      activePrefillTokens: this.activePrefillTokens[i]!,
      activeDecodeBlocks: this.activeDecodeBlocks[i]!,
      activeRequests: this.activeRequests[i]!,
      predictedTtftMs: this.predictedTtftMs[i]!,
      queueMs: this.queueMs[i]!,
      reloadMs: this.reloadMs[i]!,
      prefillMs: this.prefillMs[i]!,
      stepsMs: this.stepsMs[i]!,
    };
  }

  toArray(): Candidate[] {
    return Array.from({ length: this.count }, (_, i) => this.at(i));
  }

  /** A list of its own with the same candidates (a decision answered later keeps it). */
  copy(): CandidateList {
    const copy = new CandidateList();
    const n = this.count;
    copy.reset(n);
    copy.count = n;
    for (const name of CANDIDATE_COLUMNS)
      (copy[name] as { set(values: ArrayLike<number>): void }).set(this[name].subarray(0, n));
    for (let i = 0; i < n; i++) copy.workerIds[i] = this.workerIds[i]!;
    return copy;
  }

  /** Empties the list and makes room for `capacity` candidates. */
  reset(capacity: number): void {
    this.count = 0;
    if (this.slots.length >= capacity) return;
    this.slots = new Int32Array(capacity);
    this.dpRanks = new Uint32Array(capacity);
    this.overlapBlocks = new Float64Array(capacity);
    this.overlapKinds = new Uint8Array(capacity);
    this.pendingBlocks = new Float64Array(capacity);
    this.hostBlocks = new Float64Array(capacity);
    this.diskBlocks = new Float64Array(capacity);
    this.externalBlocks = new Float64Array(capacity);
    this.costs = new Float64Array(capacity);
    this.degraded = new Uint8Array(capacity);
    this.activePrefillTokens = new Float64Array(capacity);
    this.activeDecodeBlocks = new Float64Array(capacity);
    this.activeRequests = new Uint32Array(capacity);
    this.predictedTtftMs = new Float64Array(capacity);
    this.queueMs = new Float64Array(capacity);
    this.reloadMs = new Float64Array(capacity);
    this.prefillMs = new Float64Array(capacity);
    this.stepsMs = new Float64Array(capacity);
  }
}

/** CandidateList's typed columns (all but workerIds). */
const CANDIDATE_COLUMNS = [
  "slots",
  "dpRanks",
  "overlapBlocks",
  "overlapKinds",
  "pendingBlocks",
  "hostBlocks",
  "diskBlocks",
  "externalBlocks",
  "costs",
  "degraded",
  "activePrefillTokens",
  "activeDecodeBlocks",
  "activeRequests",
  "predictedTtftMs",
  "queueMs",
  "reloadMs",
  "prefillMs",
  "stepsMs",
] as const;

const EXPECTED_OUTPUT_TOKENS_MAX = 2 ** 31;
/** Never filled: listCandidates(0, ...) only sets its count to 0. */
const NO_CANDIDATES = new CandidateList();

export class Router {
  readonly load: LoadTracker;
  readonly weights: RouteWeights;
  readonly policy: RoutePolicy;
  readonly ttft: TtftSettings;
  /** Null when calibration is off: every worker is predicted with the configured constants. */
  readonly calibration: Calibration | null;
  /** Active requests' blocks count as cached for a request sharing them (RouterOptions.pendingCredit). */
  readonly pendingCredit: boolean;
  /** The recompute charge of blocks only pending elsewhere (RouterOptions.pendingRecomputeWeight). */
  readonly pendingRecomputeWeight: number;
  private readonly maxima = { cachedMax: 0, creditedMax: 0 };
  private readonly random: () => number;
  // Scratch, by slot, reused by every decision.
  private overlapBySlot = new Float64Array(0);
  /** Degraded workers routed on predictions: their predicted blocks (Overlaps.predicted). */
  private predictedBySlot = new Float64Array(0);
  private predictedAny = false;
  /** Lower tiers' blocks by slot: filled (and used) only while a decision has any. */
  private hostBySlot = new Float64Array(0);
  private diskBySlot = new Float64Array(0);
  private externalBySlot = new Float64Array(0);
  /** Whether this decision's overlaps have lower-tier blocks (else the arrays above are 0). */
  private tiered = false;
  /** The clock as this decision's expiry read it (admission reuses it: a clock read less). */
  private decidedMs = 0;
  private depthBySlot = new Uint32Array(0);
  private costBySlot = new Float64Array(0);
  private ttftBySlot = new Float64Array(0);
  private readonly parts = new TtftParts();
  private readonly features = { tokens: 0, steps: 0, kvMs: 0 };
  private order = new Int32Array(0);
  /** route.pacing's requests waiting per slot (./pacing.ts), for the spill; null without pacing. */
  paced: { readonly backlog: Uint32Array } | null = null;
  /** Set only inside `evaluate` while a spilled request is costed: the recompute weight then. */
  private spillWeight: number | null = null;
  /** Set only inside `cheapestUnder`: constants that replace the configured and learned ones. */
  private uniformTimes: EngineTimes | null = null;

  constructor(options: RouterOptions) {
    this.load = new LoadTracker(options);
    this.weights = { ...DEFAULT_ROUTE_WEIGHTS, ...options.weights };
    checkWeights(this.weights);
    this.policy = options.policy ?? "dynamo";
    this.ttft = { ...DEFAULT_TTFT_SETTINGS, ...options.ttft };
    checkTtftSettings(this.ttft);
    this.calibration =
      options.calibrate === true
        ? new Calibration(this.ttft.prefillTokensPerSecond, this.ttft.stepBaseMs)
        : null;
    const calibration = this.calibration;
    if (calibration !== null)
      this.load.prefillObserver = (record, slot, elapsedMs) =>
        calibration.observe(record, slot, elapsedMs);
    this.random = options.random ?? Math.random;
    this.pendingCredit = options.pendingCredit ?? true;
    // Never above the recompute weight itself (a pending block is no dearer than a cached one).
    this.pendingRecomputeWeight = Math.min(
      this.ttft.recomputeWeight,
      options.pendingRecomputeWeight ?? DEFAULT_PENDING_RECOMPUTE_WEIGHT,
    );
    if (!(this.pendingRecomputeWeight >= 0))
      throw new RangeError("pendingRecomputeWeight must be a number >= 0");
  }

  /**
   * Picks a worker for the request and records it as that worker's load. The
   * `request.candidatesMax` cheapest workers are listed in `out` (a list the caller
   * reuses) or, without it, in a list of the decision's own.
   */
  route(request: RouteRequest, overlaps: Overlaps, out?: CandidateList): RouteDecision {
    const best = this.evaluate(request, overlaps);
    const requestId = this.requestIdOf(request.requestId);
    const load = this.load;
    const tokenCount = request.tokenCount;
    const held = this.creditedBlocks(best);
    const cachedTokens = Math.min(tokenCount, Math.round(held * load.blockSize));
    const max = request.candidatesMax ?? 0;
    // No list given: a fresh one, or with no candidates asked for, the shared empty one.
    const candidates = out ?? (max > 0 ? new CandidateList() : NO_CANDIDATES);
    const predictedTtftMs =
      this.policy === "ttft" ? this.ttftBySlot[best]! : this.predict(best, tokenCount);
    this.listCandidates(max, candidates, tokenCount);
    const calibration = this.calibration;
    if (calibration !== null) this.noteFeatures(best, tokenCount, cachedTokens);
    const record = load.admit(
      requestId,
      best,
      request.chain,
      request.blockCount,
      tokenCount,
      cachedTokens,
      request.expectedOutputTokens ?? 0,
      this.decidedMs,
    );
    if (calibration !== null)
      calibration.admitted(
        record,
        this.features.tokens,
        this.features.steps,
        this.features.kvMs,
        load.recordCapacity,
      );
    return {
      requestId,
      slot: best,
      workerId: load.table.workerIdOf(best),
      dpRank: load.dpRanks[best]!,
      overlapBlocks: this.reportedOverlap(best),
      pendingBlocks: this.depthBySlot[best]!,
      creditedBlocks: held,
      hostBlocks: this.tiered ? this.hostBySlot[best]! : 0,
      diskBlocks: this.tiered ? this.diskBySlot[best]! : 0,
      externalBlocks: this.tiered ? this.externalBySlot[best]! : 0,
      cost: this.costBySlot[best]!,
      predictedTtftMs,
      candidates,
    };
  }

  /** Blocks `slot` holds of the request in every tier (the device's, then the lower tiers'). */
  private heldBlocks(slot: number): number {
    const device = this.overlapBySlot[slot]!;
    if (!this.tiered) return device;
    return device + this.hostBySlot[slot]! + this.diskBySlot[slot]! + this.externalBySlot[slot]!;
  }

  /**
   * Blocks `slot` holds of the request in every tier as the router trusts them: a
   * degraded worker's discounted, but for the device overlap of one routed on
   * predictions (`fallbackOverlap` of its indexed and predicted blocks).
   */
  private heldTrusted(slot: number): number {
    const device = this.overlapBySlot[slot]!;
    const blocks = this.tiered ? this.heldBlocks(slot) : device;
    // The common case first: a worker trusted as it is.
    if (this.load.degraded[slot] !== 1) return blocks;
    return this.deviceTrusted(slot) + this.trusted(slot, blocks - device);
  }

  /** The device overlap as trusted: discounted when degraded; routed on predictions, `fallbackOverlap`. */
  private deviceTrusted(slot: number): number {
    const overlap = this.overlapBySlot[slot]!;
    if (this.load.fallback[slot] !== 1) return this.trusted(slot, overlap);
    const predicted = this.predictedAny ? this.predictedBySlot[slot]! : 0;
    return fallbackOverlap(overlap, predicted, this.weights.degradedOverlapWeight);
  }

  /** The device blocks answers show: the indexed ones, or the predicted ones when more. */
  private reportedOverlap(slot: number): number {
    const overlap = this.overlapBySlot[slot]!;
    if (!this.predictedAny || this.load.fallback[slot] !== 1) return overlap;
    return Math.max(overlap, this.predictedBySlot[slot]!);
  }

  /** `blocks` as the router trusts them on `slot`: a degraded worker's discounted. */
  private trusted(slot: number, blocks: number): number {
    return this.load.degraded[slot] === 1 ? blocks * this.weights.degradedOverlapWeight : blocks;
  }

  /** The lower tiers' credit on `slot` in device blocks (reference §5.1), trusted. */
  private lowerTrusted(slot: number): number {
    const { hostCacheHitWeight, diskCacheHitWeight } = this.weights;
    const lower = this.diskBySlot[slot]! + this.externalBySlot[slot]!;
    return this.trusted(
      slot,
      hostCacheHitWeight * this.hostBySlot[slot]! + diskCacheHitWeight * lower,
    );
  }

  /** Time to copy `slot`'s lower-tier blocks of the request back to the device (ms), trusted. */
  private reloadMs(slot: number): number {
    if (!this.tiered) return 0;
    const lower = this.diskBySlot[slot]! + this.externalBySlot[slot]!;
    const ms = reloadMsOf(this.ttft, this.hostBySlot[slot]!, lower, this.load.blockSize);
    return this.trusted(slot, ms);
  }

  /**
   * Blocks of the request being decided that count as cached on `slot`: its overlap
   * (discounted when degraded), or, with pending credit, the blocks its active requests
   * cover if more (kvedge's own knowledge, whatever the engine's stream says).
   */
  private creditedBlocks(slot: number): number {
    const trusted = this.heldTrusted(slot);
    return this.pendingCredit ? Math.max(trusted, this.depthBySlot[slot]!) : trusted;
  }

  /**
   * What admission asks before routing (./admission.ts): the shortest predicted wait
   * over the workers (predicted TTFT less the request's own prefill there: the part
   * holding it can shorten), and its own prefill on the worker it would be routed to
   * now. Nothing is recorded.
   */
  assess(request: RouteRequest, overlaps: Overlaps): { waitMs: number; prefillMs: number } {
    const best = this.evaluate(request, overlaps);
    const slots = this.load.liveSlots;
    const prefillMs = this.parts.prefillMs;
    const predictedAll = this.policy === "ttft";
    let waitMs = Infinity;
    for (let i = 0; i < this.load.liveCount; i++) {
      const slot = slots[i]!;
      const ttft = predictedAll ? this.ttftBySlot[slot]! : this.predict(slot, request.tokenCount);
      waitMs = Math.min(waitMs, ttft - prefillMs[slot]!);
    }
    return { waitMs, prefillMs: prefillMs[best]! };
  }

  /**
   * How far ahead of the next the cheapest worker is for this request now: (second −
   * first) / first of the costs a decision would weigh (Infinity with one worker). A
   * small margin is a contested decision, one that a concurrent decision elsewhere
   * could turn (several processes deciding as one: src/cluster). Nothing is recorded.
   */
  margin(request: RouteRequest, overlaps: Overlaps): number {
    this.fillCosts(request, overlaps);
    const slots = this.load.liveSlots;
    const costs = this.costBySlot;
    let first = Infinity;
    let second = Infinity;
    for (let i = 0; i < this.load.liveCount; i++) {
      const cost = costs[slots[i]!]!;
      if (cost < first) {
        second = first;
        first = cost;
      } else if (cost < second) second = cost;
    }
    if (second === Infinity) return Infinity;
    return (second - first) / Math.max(Math.abs(first), 1e-9);
  }

  /**
   * Validates the request, fills every live worker's cost, and returns the chosen slot:
   * with pacing, costed again at the spill weight when that slot's backlog is long
   * (./pacing.ts says why).
   */
  private evaluate(request: RouteRequest, overlaps: Overlaps): number {
    const best = this.pick(this.fillCosts(request, overlaps));
    const paced = this.paced;
    if (paced === null || this.policy !== "ttft" || (paced.backlog[best] ?? 0) < SPILL_BACKLOG)
      return best;
    this.spillWeight = this.ttft.recomputeWeight * SPILL_WEIGHT_FRACTION;
    try {
      return this.pick(this.fillCosts(request, overlaps));
    } finally {
      this.spillWeight = null;
    }
  }

  /**
   * The slots a router told these engine constants (the same for every worker, no
   * calibration) would find cheapest now, exact ties included; nothing is recorded and
   * no random number drawn. The virtual-time study compares calibrated decisions with
   * those of the true constants through it.
   */
  cheapestUnder(request: RouteRequest, overlaps: Overlaps, times: EngineTimes): number[] {
    this.uniformTimes = times;
    try {
      this.fillCosts(request, overlaps);
    } finally {
      this.uniformTimes = null;
    }
    const slots = this.load.liveSlots;
    const costs = this.costBySlot;
    let min = Infinity;
    for (let i = 0; i < this.load.liveCount; i++) min = Math.min(min, costs[slots[i]!]!);
    const cheapest: number[] = [];
    for (let i = 0; i < this.load.liveCount; i++) {
      if (costs[slots[i]!] === min) cheapest.push(slots[i]!);
    }
    return cheapest;
  }

  /** Validates the request, fills every live worker's cost; returns the temperature to pick by. */
  private fillCosts(request: RouteRequest, overlaps: Overlaps): number {
    const load = this.load;
    const blockCount = request.blockCount;
    const tokenCount = request.tokenCount;
    const blockSize = load.blockSize;
    checkCounts(request, blockSize);
    const credit = override(
      request.overlapScoreCredit,
      this.weights.overlapScoreCredit,
      "overlap_score_credit",
    );
    const scale = override(
      request.prefillLoadScale,
      this.weights.prefillLoadScale,
      "prefill_load_scale",
    );
    const temperature = override(request.temperature, this.weights.temperature, "temperature");

    this.decidedMs = load.expireDue();
    load.syncSlots();
    const liveCount = load.liveCount;
    if (liveCount === 0) throw new KvedgeError("no_workers", "no workers to route to");
    this.prepare(request.chain, blockCount, overlaps);

    const slots = load.liveSlots;
    const prefill = load.activePrefillTokens;
    const decode = load.activeDecodeBlocks;
    const active = load.activeRequests;
    const depth = this.depthBySlot;
    const costs = this.costBySlot;
    const decay = this.weights.overlapScoreCreditDecay;
    const requestWeight = this.weights.decodeActiveRequestWeight;
    // The decay term's constant part; 0 = no decay (the default).
    const decayScale =
      decay > 0 && tokenCount > 0 ? decay / (blockSize * Math.ceil(tokenCount / blockSize)) : 0;
    let minPrefill = 0;
    if (decayScale > 0) {
      minPrefill = Infinity;
      for (let i = 0; i < liveCount; i++) minPrefill = Math.min(minPrefill, prefill[slots[i]!]!);
    }
    this.calibration?.sync(load);
    if (this.policy === "ttft") {
      this.ttftCosts(tokenCount);
      return temperature;
    }
    const degraded = load.degraded;
    const overlap = this.overlapBySlot;
    const tiered = this.tiered;
    for (let i = 0; i < liveCount; i++) {
      const slot = slots[i]!;
      const slotPrefill = prefill[slot]!;
      let held = degraded[slot] === 1 ? this.deviceTrusted(slot) : overlap[slot]!;
      if (decayScale > 0) held /= 1 + decayScale * (slotPrefill - minPrefill);
      const raw = (slotPrefill + tokenCount) / blockSize - credit * held;
      const prefillCost = scale * Math.max(0, tiered ? raw - this.lowerTrusted(slot) : raw);
      costs[slot] =
        prefillCost + decode[slot]! + (blockCount - depth[slot]!) + requestWeight * active[slot]!;
    }
    return temperature;
  }

  private pick(temperature: number): number {
    const best = temperature === 0 ? this.cheapest() : this.sample(temperature);
    if (best < 0) throw new Error("routing found no candidate (a cost is NaN)");
    return best;
  }

  /** The `ttft` cost of every live worker: predicted TTFT (and parts) + recompute charge. */
  private ttftCosts(tokenCount: number): void {
    const load = this.load;
    const slots = load.liveSlots;
    const prefill = load.activePrefillTokens;
    const active = load.activeRequests;
    const decode = load.activeDecodeBlocks;
    const blockSize = load.blockSize;
    const pending = this.depthBySlot;
    const pendingCredit = this.pendingCredit;
    const costs = this.costBySlot;
    const predicted = this.ttftBySlot;
    const ttft = this.ttft;
    const parts = this.parts;
    const weight = this.spillWeight ?? ttft.recomputeWeight;
    // What `predict` uses, hoisted out of the loop (the same arithmetic, so the same bits).
    const times = this.uniformTimes ?? ttft;
    const calibration = this.uniformTimes === null ? this.calibration : null;
    const prefillPerMs = times.prefillTokensPerSecond / 1000;
    const stepBaseMs = times.stepBaseMs;
    const speedFactor = calibration?.speedFactor;
    const stepFactor = calibration?.stepFactor;
    const tiered = this.tiered;
    // Blocks cached somewhere, and credited somewhere (cached or pending): recomputing
    // what is only pending elsewhere is charged at the pending weight (see below).
    const pendingRelief = pendingCredit ? weight - this.pendingRecomputeWeight : 0;
    const { cachedMax, creditedMax } = pendingRelief > 0 ? this.creditedMaxima() : NO_MAXIMA;
    for (let i = 0; i < load.liveCount; i++) {
      const slot = slots[i]!;
      const trusted = this.heldTrusted(slot);
      const held = pendingCredit && pending[slot]! > trusted ? pending[slot]! : trusted;
      const cached = Math.min(tokenCount, held * blockSize);
      const slotPrefillPerMs =
        calibration === null ? prefillPerMs : calibration.prefillPerMs * speedFactor![slot]!;
      predicted[slot] = predictTtft(
        ttft,
        parts,
        slot,
        tokenCount,
        cached,
        prefill[slot]!,
        active[slot]!,
        decode[slot]!,
        blockSize,
        slotPrefillPerMs,
        calibration === null ? stepBaseMs : calibration.stepBaseMs * stepFactor![slot]!,
        tiered ? this.reloadMs(slot) : 0,
      );
      costs[slot] = predicted[slot]! + weight * parts.prefillMs[slot]!;
      if (pendingRelief > 0) {
        const onlyPending =
          Math.min(creditedMax * blockSize, tokenCount) - Math.max(cachedMax, held) * blockSize;
        if (onlyPending > 0) costs[slot]! -= (pendingRelief * onlyPending) / slotPrefillPerMs;
      }
    }
  }

  /**
   * Over the live slots: the most blocks of the request cached on one worker (trusted
   * overlap), and the most credited on one (cached or pending).
   */
  private creditedMaxima(): { cachedMax: number; creditedMax: number } {
    const load = this.load;
    const pending = this.depthBySlot;
    let cachedMax = 0;
    let creditedMax = 0;
    for (let i = 0; i < load.liveCount; i++) {
      const slot = load.liveSlots[i]!;
      const trusted = this.heldTrusted(slot);
      if (trusted > cachedMax) cachedMax = trusted;
      const held = pending[slot]! > trusted ? pending[slot]! : trusted;
      if (held > creditedMax) creditedMax = held;
    }
    this.maxima.cachedMax = cachedMax;
    this.maxima.creditedMax = creditedMax;
    return this.maxima;
  }

  /**
   * One worker's predicted TTFT for the request being decided (its parts go into the
   * scratch at `slot`). The `ttft` policy predicts every worker; `dynamo` only the
   * workers an answer lists.
   */
  private predict(slot: number, tokenCount: number): number {
    const load = this.load;
    const ttft = this.ttft;
    const calibration = this.calibration;
    const uniform = this.uniformTimes;
    const cached = Math.min(tokenCount, this.creditedBlocks(slot) * load.blockSize);
    return predictTtft(
      ttft,
      this.parts,
      slot,
      tokenCount,
      cached,
      load.activePrefillTokens[slot]!,
      load.activeRequests[slot]!,
      load.activeDecodeBlocks[slot]!,
      load.blockSize,
      uniform !== null
        ? uniform.prefillTokensPerSecond / 1000
        : calibration === null
          ? ttft.prefillTokensPerSecond / 1000
          : calibration.prefillPerMs * calibration.speedFactor[slot]!,
      uniform !== null
        ? uniform.stepBaseMs
        : calibration === null
          ? ttft.stepBaseMs
          : calibration.stepBaseMs * calibration.stepFactor[slot]!,
      this.reloadMs(slot),
    );
  }

  /** A worker's learned engine times (null when calibration is off). */
  learnedTimes(slot: number): LearnedTimes | null {
    if (this.calibration === null) return null;
    this.calibration.sync(this.load);
    return this.calibration.learned(slot);
  }

  /** What the chosen worker's predicted TTFT was made of, for calibration (before admission changes the load). */
  private noteFeatures(slot: number, tokenCount: number, cachedTokens: number): void {
    const load = this.load;
    const tokens = load.activePrefillTokens[slot]! + ownPrefillTokens(tokenCount, cachedTokens);
    const steps = stepsUntilFirstToken(this.ttft, tokens, load.activeRequests[slot]!);
    this.features.tokens = tokens;
    this.features.steps = steps;
    this.features.kvMs =
      steps * kvReadMs(this.ttft, load.activeDecodeBlocks[slot]!, load.blockSize);
  }

  /** Fills the per-slot overlap and shared-depth scratch for this request. */
  private prepare(chain: Uint32Array, blockCount: number, overlaps: Overlaps): void {
    const capacity = this.load.slotCapacity;
    if (this.overlapBySlot.length < capacity) {
      this.overlapBySlot = new Float64Array(capacity);
      this.depthBySlot = new Uint32Array(capacity);
      this.costBySlot = new Float64Array(capacity);
      this.ttftBySlot = new Float64Array(capacity);
      this.parts.ensure(capacity);
    }
    this.overlapBySlot.fill(0, 0, capacity);
    this.depthBySlot.fill(0, 0, capacity);
    const live = this.load.live;
    for (let i = 0; i < overlaps.count; i++) {
      const slot = overlaps.slots[i]!;
      if (!(slot >= 0 && slot < capacity && live[slot] === 1)) continue;
      const blocks = Math.min(blockCount, overlaps.blocks[i]!);
      if (blocks > this.overlapBySlot[slot]!) this.overlapBySlot[slot] = blocks;
    }
    if (this.tiered || overlaps.host !== undefined) this.prepareTiers(blockCount, overlaps);
    if (this.predictedAny || overlaps.predicted !== undefined)
      this.preparePredicted(blockCount, overlaps);
    this.load.blocks.sharedDepths(chain, blockCount, this.depthBySlot);
  }

  /** Degraded workers' predicted blocks by slot (zeroed again after a decision that had some). */
  private preparePredicted(blockCount: number, overlaps: Overlaps): void {
    const capacity = this.load.slotCapacity;
    if (this.predictedBySlot.length < capacity) this.predictedBySlot = new Float64Array(capacity);
    this.predictedBySlot.fill(0, 0, capacity);
    this.predictedAny = false;
    const predicted = overlaps.predicted;
    if (predicted === undefined) return;
    const live = this.load.live;
    for (let i = 0; i < overlaps.count; i++) {
      const slot = overlaps.slots[i]!;
      if (!(slot >= 0 && slot < capacity && live[slot] === 1) || !(predicted[i]! > 0)) continue;
      this.predictedBySlot[slot] = Math.min(blockCount, predicted[i]!);
      this.predictedAny = true;
    }
  }

  /** The lower tiers' blocks by slot (zeroed again after a decision that had some). */
  private prepareTiers(blockCount: number, overlaps: Overlaps): void {
    const capacity = this.load.slotCapacity;
    if (this.hostBySlot.length < capacity) {
      this.hostBySlot = new Float64Array(capacity);
      this.diskBySlot = new Float64Array(capacity);
      this.externalBySlot = new Float64Array(capacity);
    }
    this.hostBySlot.fill(0, 0, capacity);
    this.diskBySlot.fill(0, 0, capacity);
    this.externalBySlot.fill(0, 0, capacity);
    this.tiered = false;
    const { host, disk, external } = overlaps;
    if (host === undefined || disk === undefined || external === undefined) return;
    const live = this.load.live;
    for (let i = 0; i < overlaps.count; i++) {
      const slot = overlaps.slots[i]!;
      if (!(slot >= 0 && slot < capacity && live[slot] === 1)) continue;
      // Never past the prompt: the device's blocks first, then each tier's.
      let left = blockCount - Math.min(blockCount, overlaps.blocks[i]!);
      const take = (blocks: number) => {
        const taken = Math.min(left, blocks);
        left -= taken;
        return taken;
      };
      this.hostBySlot[slot] = take(host[i]!);
      this.diskBySlot[slot] = take(disk[i]!);
      this.externalBySlot[slot] = take(external[i]!);
      if (host[i]! + disk[i]! + external[i]! > 0) this.tiered = true;
    }
  }

  /** The lowest cost; exact ties broken uniformly (reservoir sampling: the k-th tie replaces the pick with probability 1/k). */
  private cheapest(): number {
    const slots = this.load.liveSlots;
    const liveCount = this.load.liveCount;
    const costs = this.costBySlot;
    let best = -1;
    let bestCost = Infinity;
    let ties = 0;
    for (let i = 0; i < liveCount; i++) {
      const slot = slots[i]!;
      const cost = costs[slot]!;
      if (cost < bestCost) {
        best = slot;
        bestCost = cost;
        ties = 1;
      } else if (cost === bestCost && this.random() * ++ties < 1) {
        best = slot;
      }
    }
    return best;
  }

  /** Softmax sample over the live slots' costs (reference §5.3). */
  private sample(temperature: number): number {
    const slots = this.load.liveSlots;
    const liveCount = this.load.liveCount;
    const costs = this.costBySlot;
    let minCost = Infinity;
    let maxCost = -Infinity;
    for (let i = 0; i < liveCount; i++) {
      const cost = costs[slots[i]!]!;
      if (cost < minCost) minCost = cost;
      if (cost > maxCost) maxCost = cost;
    }
    if (Number.isNaN(minCost + maxCost)) return -1;
    // Equal costs: every weight is 1 (uniform). An infinite range is first scaled down
    // by the largest magnitude.
    const uniform = minCost === maxCost;
    const magnitude = Number.isFinite(maxCost - minCost)
      ? 1
      : Math.max(Math.abs(minCost), Math.abs(maxCost));
    const low = minCost / magnitude;
    const scale = uniform ? 0 : -1 / ((maxCost / magnitude - low) * temperature);
    let sum = 0;
    for (let i = 0; i < liveCount; i++)
      sum += Math.exp((costs[slots[i]!]! / magnitude - low) * scale);
    // The first index whose cumulative probability reaches u.
    const u = this.random();
    let cumulative = 0;
    for (let i = 0; i < liveCount; i++) {
      const slot = slots[i]!;
      cumulative += Math.exp((costs[slot]! / magnitude - low) * scale) / sum;
      if (u <= cumulative) return slot;
    }
    return slots[liveCount - 1]!;
  }

  /**
   * The lowest-cost candidates of the decision being made, cheapest first; equal costs
   * keep the live-slot order (a stable sort's order). Insertion into a list of at most
   * `max`: the list is short, so this beats sorting every worker.
   */
  private listCandidates(max: number, list: CandidateList, tokenCount: number): void {
    const load = this.load;
    const slots = load.liveSlots;
    const liveCount = load.liveCount;
    const costs = this.costBySlot;
    const limit = Math.min(Math.max(0, max), liveCount);
    if (this.order.length < limit) this.order = new Int32Array(load.slotCapacity);
    const order = this.order;
    let size = 0;
    for (let i = 0; i < liveCount && limit > 0; i++) {
      const slot = slots[i]!;
      const cost = costs[slot]!;
      if (size === limit && !(cost < costs[order[size - 1]!]!)) continue;
      let at = size < limit ? size++ : size - 1;
      while (at > 0 && cost < costs[order[at - 1]!]!) {
        order[at] = order[at - 1]!;
        at--;
      }
      order[at] = slot;
    }
    list.reset(size);
    const predictedAll = this.policy === "ttft";
    for (let i = 0; i < size; i++) {
      const slot = order[i]!;
      if (!predictedAll) this.ttftBySlot[slot] = this.predict(slot, tokenCount);
      list.slots[i] = slot;
      list.workerIds[i] = load.table.workerIdOf(slot);
      list.dpRanks[i] = load.dpRanks[slot]!;
      list.overlapBlocks[i] = this.reportedOverlap(slot);
      list.overlapKinds[i] = overlapKindOf(load, slot);
      list.pendingBlocks[i] = this.depthBySlot[slot]!;
      list.hostBlocks[i] = this.tiered ? this.hostBySlot[slot]! : 0;
      list.diskBlocks[i] = this.tiered ? this.diskBySlot[slot]! : 0;
      list.externalBlocks[i] = this.tiered ? this.externalBySlot[slot]! : 0;
      list.costs[i] = costs[slot]!;
      list.degraded[i] = load.degraded[slot]!;
      list.activePrefillTokens[i] = load.activePrefillTokens[slot]!;
      list.activeDecodeBlocks[i] = load.activeDecodeBlocks[slot]!;
      list.activeRequests[i] = load.activeRequests[slot]!;
      list.predictedTtftMs[i] = this.ttftBySlot[slot]!;
      list.queueMs[i] = this.parts.queueMs[slot]!;
      list.reloadMs[i] = this.parts.reloadMs[slot]!;
      list.prefillMs[i] = this.parts.prefillMs[slot]!;
      list.stepsMs[i] = this.parts.stepsMs[slot]!;
    }
    list.count = size;
  }

  private requestIdOf(requestId: string | null | undefined): string {
    if (requestId === undefined || requestId === null) return this.load.newRequestId();
    if (requestId.length === 0 || requestId.length > REQUEST_ID_LENGTH_MAX) {
      throw new KvedgeError(
        "bad_request",
        `request_id must be 1 to ${REQUEST_ID_LENGTH_MAX} characters`,
      );
    }
    if (this.load.isActive(requestId))
      throw new KvedgeError("duplicate_request", `request ${requestId} is already active`);
    return requestId;
  }
}

function override(value: number | null | undefined, fallback: number, name: string): number {
  if (value === undefined || value === null) return fallback;
  if (!Number.isFinite(value) || value < 0)
    throw new KvedgeError("bad_request", `${name} must be a finite number >= 0, got ${value}`);
  return value;
}

function checkWeights(weights: RouteWeights): void {
  for (const [name, value] of Object.entries(weights)) {
    if (!Number.isFinite(value) || value < 0)
      throw new RangeError(`route weight ${name} must be a finite number >= 0`);
  }
  if (weights.degradedOverlapWeight > 1)
    throw new RangeError("route weight degradedOverlapWeight must be at most 1");
}

/** The request's counts, checked before anything is computed from them. */
function checkCounts(request: RouteRequest, blockSize: number): void {
  const { blockCount, tokenCount } = request;
  if (!Number.isInteger(blockCount) || blockCount < 0 || request.chain.length < 2 * blockCount) {
    throw new KvedgeError("bad_request", `block count ${blockCount} does not fit the chain`);
  }
  if (!Number.isInteger(tokenCount) || tokenCount < blockCount * blockSize) {
    throw new KvedgeError(
      "bad_request",
      `token count ${tokenCount} is less than ${blockCount} blocks`,
    );
  }
  const expected = request.expectedOutputTokens ?? 0;
  if (!Number.isInteger(expected) || expected < 0 || expected > EXPECTED_OUTPUT_TOKENS_MAX) {
    throw new KvedgeError(
      "bad_request",
      `expected_output_tokens must be an integer in [0, 2^31], got ${expected}`,
    );
  }
}
