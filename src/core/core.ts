/**
 * The core: the worker table, the index, the request router and the engine sources
 * that feed the index, behind the operations the HTTP and WebSocket APIs expose, with
 * no transport in it (README.md in this folder). Data flows one way: sources -> index;
 * requests -> (hash, index match, route) -> decision. Index and router share one
 * worker numbering (WorkerTable), so a match result is a router slot as it is; with a
 * writer thread its index is in the same numbering (its table follows this one).
 * Workers are named by slot throughout; the core gives slots and ends their lives
 * (`endSlots`, the one place a slot leaves every per-slot state). Refusals are
 * KvedgeErrors with codes; the server maps them to statuses.
 */
import type { Config } from "../config";
import { type WorkerEntry, wildcardProblem } from "../config/workers";
import { blockSeed, ChainBuffer, LoraAdapters } from "../hash";
import type { KvIndex } from "../index";
import { createIndex, MatchResult } from "../index";
import { defaultIndexBudgetBytes, IndexBudget } from "../index/budget";
import { WritePause } from "../index/write-pause";
import type { KvEventSink } from "../ingest/normalize";
import {
  EngineSource,
  type SourceConfig,
  type SourceOptions,
  type SourcePosition,
  type SourceState,
} from "../ingest/source";
import {
  CandidateList,
  type Overlaps,
  PromptHasher,
  type RouteDecision,
  Router,
  type RouterOptions,
} from "../route";
import type { PromptHashes } from "../route/input";
import { Admission } from "../route/admission";
import { Pacing } from "../route/pacing";
import { bufferBudget } from "../util/buffer-budget";
import type { LifecycleResult } from "../route/load";
import { type CachedReport, ObservedHits, type ObservedHitsView } from "./observed-hits";
import { DEFAULT_PREDICTED_MAX_BLOCKS, Predictions } from "../route/predictions";
import { CAPACITY_FLOOR_BLOCKS } from "../route/predicted-blocks";
import { DegradedFallback } from "./fallback";
import { OVERLAP_KINDS, type OverlapKind, overlapKindOf } from "../route/router";
import { RouteOverlaps } from "./overlaps";
import type { Logger } from "../util/log";
import type { ZmtpOptions } from "../wire/zmtp";
import { BUDGET_REFUSAL, budgetedSink } from "../ingest/budgeted-sink";
import { KvedgeError } from "../domain/errors";
import { shuttingDown } from "../http/errors";
import { type SlotColumn, WorkerTable } from "../domain/worker-table";
import { attach } from "../index/crtc/shared";
import { ThreadedIndex } from "../index/threaded-index";
import type { WriterThread } from "../runtime/writer-thread";

export interface MatchScore {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Device blocks: the prompt's longest prefix the worker holds. */
  readonly blocks: number;
  /** What the blocks rest on: the engine's events, kvedge's predictions, or events it lost. */
  readonly kind: OverlapKind;
  /** Lower-tier blocks right after them (host memory, then disk, then external). */
  readonly hostBlocks: number;
  readonly diskBlocks: number;
  readonly externalBlocks: number;
}

export interface RouteInput {
  readonly tokens: Uint32Array;
  readonly requestId: string | null;
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
  readonly expectedOutputTokens: number | null;
  readonly overlapScoreCredit: number | null;
  readonly prefillLoadScale: number | null;
  readonly temperature: number | null;
  /** The prompt's hashes if the caller has them (a route lane hashed it), else hashed here. */
  readonly prompt?: PromptHashes;
  /** The prompt's matches if the caller looked them up (a lane, on the writer's shared index). */
  readonly matched?: MatchedWorkers;
}

/**
 * Matches another thread looked up (a lane, on the writer's shared index): slots of this
 * table with the generation stamp each had then (WorkerTable.stampOf), and blocks.
 */
export interface MatchedWorkers {
  readonly slots: Uint32Array;
  readonly stamps: Uint32Array;
  readonly blocks: Uint32Array;
}

/**
 * An active request as a snapshot keeps it (warm restart): its worker, id, prompt tokens
 * still in prefill, expected output blocks, time since its last lifecycle call, and its
 * chain of `blocks` sequence hashes (valid during the call it is passed to).
 */
export type ActiveRequest = [
  workerId: bigint,
  dpRank: number,
  id: string,
  prefillTokens: number,
  outputBlocks: number,
  idleMs: number,
  chain: Uint32Array,
  blocks: number,
];

/** A route decision and its prompt's length in blocks; the candidates are valid until the next route. */
export interface RouteOutcome {
  readonly decision: RouteDecision;
  readonly queryBlocks: number;
}

/** A route call as admission holds it: what to route, and how the transport answers it. */
export interface RouteCall {
  readonly input: RouteInput;
  readonly candidatesMax: number;
  /** Called once, synchronously with the decision (its candidates are reused by the next route). */
  answer(outcome: RouteOutcome): void;
  /** Called once instead of `answer`: 429 past admission's bounds, or the route's own refusal. */
  fail(error: unknown): void;
}

/** How often held calls are looked at when no lifecycle call arrives (expiries free workers too). */
const HELD_POLL_MS = 100;
/**
 * A decision whose two cheapest workers are within this fraction of each other is
 * contested: with replicas (cluster.stagger_ms), it waits for this replica's turn.
 */
export const CONTESTED_MARGIN = 0.05;
/** Handles of calls waiting for their turn start here (admission's are slot numbers below it). */
const TURN_HANDLES = 2 ** 31;
/** The handle of a call pacing holds (found by the call itself: see dropHeld). */
const PACED_HANDLE = TURN_HANDLES - 1;

export interface WorkerView {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Null for workers known only from events (another dp rank of a configured engine). */
  readonly endpoint: string | null;
  readonly replayEndpoint: string | null;
  readonly topic: string | null;
  readonly state: SourceState | "unmanaged";
  readonly degraded: boolean;
  /** Why it is degraded, in words: lost events, a failed probe, the budget, its hits... */
  readonly degradedReason: string | null;
  readonly blocks: number;
  readonly activeRequests: number;
  readonly activePrefillTokens: number;
  readonly activeDecodeBlocks: number;
  /** Of activeRequests / activePrefillTokens: the part peers routed (several processes as one). */
  readonly peerActiveRequests: number;
  readonly peerActivePrefillTokens: number;
  readonly routedTotal: number;
  readonly lastSeq: number;
  readonly lostBatches: number;
  /** How long after the engine's timestamp its last batch was applied (ms), if it had one. */
  readonly eventLagMs: number | null;
  /** The engine's OpenAI-compatible server (where the proxy forwards), if configured. */
  readonly httpEndpoint: string | null;
  /** exact: known from its KV events; approximate: predicted from kvedge's own decisions. */
  readonly mode: "exact" | "approximate";
  /**
   * An approximate worker's predictions, or a degraded one's routed on predictions
   * (route.degraded_fallback): blocks predicted and the capacity they are held to (null: unknown, TTL).
   */
  readonly predicted: { readonly blocks: number; readonly capacityBlocks: number | null } | null;
  readonly observed: ObservedHitsView;
  readonly times: WorkerTimes;
}

export interface WorkerTimes {
  readonly prefillTokensPerSecond: number;
  readonly stepBaseMs: number;
  /** Lifecycle timings learned from (0 when not calibrating). */
  readonly samples: number;
  readonly learned: boolean;
}

export interface CoreOptions {
  readonly config: Config;
  readonly log: Logger;
  /**
   * runtime.index_threads = 1: the writer thread that owns the index (its crtc in
   * shared memory, read here without locks); sources hand their batches to it.
   */
  readonly writer?: WriterThread;
  /** For tests: a fixed random source for tie-breaks and softmax. */
  readonly random?: () => number;
  /** For tests: admission's clock (ms; default `performance.now`), so its order is not a race. */
  readonly admissionClock?: () => number;
}

/** Index writes held during a sliced copy before the copy is finished at once. */
const HELD_WRITES_BYTES = 64 * 1024 * 1024;

function overBudget(): KvedgeError {
  return new KvedgeError(
    "overloaded",
    `kvedge holds its limit of ${bufferBudget.limitBytes} bytes of unfinished requests; try again`,
    { retryAfterSecs: 1 },
  );
}

export class KvedgeCore {
  /** The one worker numbering, shared by the index (the writer thread's too) and the router. */
  readonly workerTable: WorkerTable;
  readonly index: KvIndex;
  readonly router: Router;
  readonly blockSize: number;
  readonly budget: IndexBudget;
  /** Slots with stores refused at the budget: degraded until their worker's cache is cleared. */
  private readonly incomplete: SlotColumn<true>;
  /** Index writes, held while the index is copied in slices (GET /v1/dump, snapshots). */
  readonly writes: WritePause;
  /** What sources write to: the index, behind the memory budget. */
  private readonly sink: KvEventSink;
  /** Every source, configured or added. */
  private readonly sources = new Set<EngineSource>();
  /** Per slot: the source configured for exactly that (worker, dp rank), if any. */
  private readonly ownSource: SlotColumn<EngineSource>;
  /** Predicted vs observed cached tokens per worker (fed by the proxy); a persistent gap is distrusted like lost events. */
  readonly observedHits: ObservedHits;
  /** What approximate workers (no event endpoint) are predicted to cache, in the index (src/route/predictions.ts). */
  readonly predictions: Predictions;
  /** Degraded exact workers' predictions (route.degraded_fallback = predictions; ./fallback.ts), else null. */
  readonly fallback: DegradedFallback | null;
  /** Where requests' lifecycles go: the approximate workers' predictions, with the degraded ones' or not. */
  private readonly predictors: { readonly one: Predictions[]; readonly both: Predictions[] };
  /** Per slot: the engine's OpenAI server, where the proxy forwards. */
  private readonly httpEndpoints: SlotColumn<string>;
  /** Over every decision: prompt tokens, and those the chosen worker was predicted to hold (the status page's hit rate). */
  readonly routeTotals = { decisions: 0, promptTokens: 0, predictedCachedTokens: 0 };
  /** Per slot: a saved source position (warm restart), taken up by its source as it is added. */
  private readonly restoredPositions: SlotColumn<SourcePosition>;
  private readonly matches = new MatchResult(64);
  /** A /v1/match query's sequence hashes when it came as local hashes. */
  private readonly chain = new ChainBuffer();
  /** Device matches and the lower tiers after them, as the router takes them. */
  private readonly overlaps: RouteOverlaps;
  private readonly hasher = new PromptHasher();
  private readonly candidates = new CandidateList();
  /** Route calls held at saturation (route.admission; src/route/admission.ts). */
  readonly admission: Admission<RouteCall>;
  private readonly admissionClock: () => number;
  /** Routed calls waiting for a place at their engine (route.pacing; src/route/pacing.ts). */
  readonly pacing: Pacing<RouteCall>;
  /** The decisions of calls that pacing holds, answered when they are sent. */
  private readonly pacedOutcomes = new Map<RouteCall, RouteOutcome>();
  /** How LoRA ids name adapters (`index.lora_adapters`), for streams and queries alike. */
  readonly lora: LoraAdapters;
  private heldTimer: ReturnType<typeof setTimeout> | null = null;
  /** Held calls, whose token bytes are counted in the process-wide buffer budget until answered. */
  private readonly heldCalls = new Set<RouteCall>();
  /** The client ids of held calls: a second call with one of them is refused at once. */
  private readonly heldIds = new Set<string>();
  private readonly zmtp: ZmtpOptions;
  private readonly log: Logger;
  private stopped = false;
  /**
   * Several processes deciding as one: this replica's contested routes wait rank ×
   * staggerMs before they are decided (cluster.stagger_ms; 0: never). The cluster sets
   * `replicaRank` (this replica's place among the fleet's replica ids, 0 = first).
   */
  replicaRank: () => number = () => 0;
  /** Calls waiting for their turn, by handle. */
  private readonly turns = new Map<
    number,
    { call: RouteCall; timer: ReturnType<typeof setTimeout> }
  >();
  private turnSerial = 0;
  /** Calls that waited for their turn and were then held by admission: their admission handle. */
  private readonly turnedToAdmission = new Map<RouteCall, number>();

  constructor(private readonly options: CoreOptions) {
    const { config } = options;
    this.log = options.log;
    const table = (this.workerTable = options.writer?.workers ?? new WorkerTable());
    this.incomplete = table.column();
    this.ownSource = table.column();
    this.httpEndpoints = table.column();
    this.restoredPositions = table.column();
    this.blockSize = config.index.block_size;
    this.lora = new LoraAdapters(config.index.lora_adapters);
    this.index = this.createIndex(config, options.writer);
    this.overlaps = new RouteOverlaps(this.index, config.route.lower_tiers);
    this.budget = new IndexBudget(
      this.index,
      config.index.memory_budget_bytes ?? defaultIndexBudgetBytes(),
    );
    this.sink = this.budgetedSink((this.writes = new WritePause(this.index, HELD_WRITES_BYTES)));
    this.router = new Router(routerOptionsOf(config, this.workerTable, options.random));
    this.admissionClock = options.admissionClock ?? (() => performance.now());
    this.admission = this.createAdmission(config);
    this.pacing = this.createPacing(config);
    if (this.pacing.enabled) this.router.paced = this.pacing;
    this.zmtp = zmtpOptionsOf(config.ingest);
    this.predictions = predictionsOf(config, this.sink);
    this.fallback =
      config.route.degraded_fallback === "predictions"
        ? new DegradedFallback(table, this.blockSize, predictionSettingsOf(config), () =>
            performance.now(),
          )
        : null;
    this.predictors = {
      one: [this.predictions],
      both:
        this.fallback === null ? [this.predictions] : [this.predictions, this.fallback.predictions],
    };
    this.observedHits = new ObservedHits({
      floor: config.proxy.observed_hit_floor,
      window: config.proxy.observed_window,
      log: this.log.child({ component: "observed-hits" }),
      table,
      onChange: (slot) => this.refreshDegraded(slot),
    });
  }

  /**
   * The index: this thread's own, or the writer thread's as this thread reads it (its
   * refusals counted in `budget`).
   */
  private createIndex(config: Config, writer: WriterThread | undefined): KvIndex {
    const workers = this.workerTable;
    if (writer === undefined) return createIndex(config.index.backend, this.blockSize, { workers });
    if (writer.descriptor === null) throw new Error("the writer thread shares no index to read");
    const index = new ThreadedIndex(this.blockSize, workers, attach(writer.descriptor));
    writer.onIndex = (status) => {
      index.mirror(status);
      this.budget.refusedEvents = status.refusedEvents;
      this.budget.refusedBlocks = status.refusedBlocks;
    };
    return index;
  }

  /** Starts a source for every configured worker (connections complete in the background). */
  async start(): Promise<void> {
    for (const entry of this.options.config.workers) await this.addWorker(entry);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.heldTimer !== null) clearTimeout(this.heldTimer);
    this.heldTimer = null;
    const waiting = [...this.turns.values()];
    this.turns.clear();
    for (const { timer } of waiting) clearTimeout(timer);
    for (const call of this.pacing.takeAll()) {
      this.pacedOutcomes.delete(call);
      call.fail(shuttingDown());
    }
    for (const call of [...this.admission.takeAll(), ...waiting.map((entry) => entry.call)]) {
      this.unhold(call);
      call.fail(shuttingDown());
    }
    await Promise.all([...this.sources].map((source) => source.stop()));
    this.sources.clear();
  }

  // ---- Matching and routing ----

  /** A prompt's local block hashes (as the index keys them) and chain; valid until the next call. */
  hash(tokens: Uint32Array, loraName: string | null, cacheSalt: string | null) {
    return this.hasher.hash(tokens, this.blockSize, blockSeed(loraName, cacheSalt));
  }

  /**
   * Per-worker matched prefix length in blocks, and the lower tiers' after it, sorted as
   * `kvedge apply` sorts; a degraded worker routed on predictions has the larger of its
   * indexed and predicted blocks (./fallback.ts).
   */
  match(local: Uint32Array, count: number, chain?: Uint32Array): MatchScore[] {
    this.index.findMatches(local, count, this.matches, chain);
    const sequence = chain ?? this.chain.of(local, count);
    const overlaps = this.overlapsOf(this.matches, local, count, sequence);
    const scores: MatchScore[] = [];
    for (let i = 0; i < overlaps.count; i++) {
      const slot = overlaps.slots[i]!;
      scores.push({
        workerId: this.workerTable.workerIdOf(slot),
        dpRank: this.workerTable.dpRankOf(slot),
        blocks: Math.max(overlaps.blocks[i]!, overlaps.predicted?.[i] ?? 0),
        kind: this.overlapKindOf(slot),
        hostBlocks: overlaps.host?.[i] ?? 0,
        diskBlocks: overlaps.disk?.[i] ?? 0,
        externalBlocks: overlaps.external?.[i] ?? 0,
      });
    }
    return scores.sort(
      (a, b) =>
        b.blocks - a.blocks ||
        (a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : 0) ||
        a.dpRank - b.dpRank,
    );
  }

  /** exact, approximate or degraded: what a slot's overlap rests on. */
  overlapKindOf(slot: number): OverlapKind {
    const load = this.router.load;
    load.syncSlots();
    return OVERLAP_KINDS[
      slot < load.slotCapacity && load.live[slot] === 1 ? overlapKindOf(load, slot) : 0
    ]!;
  }

  /**
   * Told how long each decision took (seconds), whoever asked for it (the API, a lane,
   * the proxy, a held call released): the server's route latency histogram.
   */
  onDecision: ((seconds: number) => void) | null = null;

  /** Picks a worker now, whatever admission says; the decision's candidates are valid until the next call. */
  route(input: RouteInput, candidatesMax: number): RouteOutcome {
    const started = this.onDecision === null ? 0 : performance.now();
    const { request, overlaps, blockCount, prompt } = this.routeRequest(input, candidatesMax);
    const decision = this.router.route(request, overlaps, this.candidates);
    this.onDecision?.((performance.now() - started) / 1000);
    for (const predictions of this.predictorsNow())
      predictions.routed(
        decision.requestId,
        decision.slot,
        prompt.local,
        prompt.chain,
        blockCount,
        input.tokens.length,
        decision.overlapBlocks,
        decision.creditedBlocks,
      );
    const totals = this.routeTotals;
    totals.decisions++;
    totals.promptTokens += input.tokens.length;
    const held =
      decision.overlapBlocks + decision.hostBlocks + decision.diskBlocks + decision.externalBlocks;
    totals.predictedCachedTokens += Math.min(held, blockCount) * this.blockSize;
    return { decision, queryBlocks: blockCount };
  }

  /** cluster.stagger_ms, with a cluster (0: no turns). */
  get staggerMs(): number {
    const cluster = this.options.config.cluster;
    return cluster.nats_url === null ? 0 : cluster.stagger_ms;
  }

  /** Whether a route call may be answered later (admission, or replicas taking turns). */
  get mayHold(): boolean {
    return this.admission.enabled || this.pacing.enabled || this.staggerMs > 0;
  }

  /**
   * A route call through admission (and, with replicas, this replica's turn): answered
   * now, or held (returns its handle for `dropHeld`) and answered when a worker frees or
   * its turn comes, or refused. Bad input throws here.
   */
  submitRoute(call: RouteCall): number {
    if (!this.mayHold) {
      this.answerCall(call);
      return -1;
    }
    // A call that may be held is matched afresh each time it is looked at, so it carries
    // no matches found on arrival (lanes skip their lookup when calls may be held).
    if (call.input.matched !== undefined) {
      throw new Error("a route that may be held must not carry matches");
    }
    const requestId = call.input.requestId;
    if (requestId !== null && this.router.load.isActive(requestId)) {
      throw new KvedgeError("duplicate_request", `request ${requestId} is already active`);
    }
    if (requestId !== null && this.heldIds.has(requestId)) {
      const message = `request ${requestId} is already held, waiting for a worker`;
      throw new KvedgeError("duplicate_held_request", message);
    }
    const delay = this.turnDelayMs(call);
    return delay > 0 ? this.waitTurn(call, delay) : this.admit(call);
  }

  /** Through admission (if on): routed now, held (its handle), or refused. */
  private admit(call: RouteCall): number {
    if (!this.admission.enabled) return this.answerCall(call) ? PACED_HANDLE : -1;
    const { request, overlaps } = this.routeRequest(call.input, 0);
    const { waitMs, prefillMs } = this.router.assess(request, overlaps);
    const handle = this.admission.submit(call, waitMs, prefillMs);
    // Let through at once, it may wait for a place at its engine (pacing).
    if (handle < 0) return this.pacedOutcomes.has(call) ? PACED_HANDLE : handle;
    if (!this.takeHeld(call)) {
      this.admission.drop(handle, call);
      throw overBudget();
    }
    this.pollHeld();
    return handle;
  }

  /** Counts a held call's token bytes in the buffer budget and notes its id; false if over. */
  private takeHeld(call: RouteCall): boolean {
    if (!bufferBudget.take(call.input.tokens.byteLength)) return false;
    this.heldCalls.add(call);
    if (call.input.requestId !== null) this.heldIds.add(call.input.requestId);
    return true;
  }

  /**
   * This replica's turn for a call, in ms: rank × staggerMs for a contested decision on
   * a replica other than the first, else 0 (a clear decision no concurrent one would turn).
   */
  private turnDelayMs(call: RouteCall): number {
    if (this.staggerMs === 0) return 0;
    const rank = this.replicaRank();
    if (rank <= 0) return 0;
    const { request, overlaps } = this.routeRequest(call.input, 0);
    return this.router.margin(request, overlaps) <= CONTESTED_MARGIN ? rank * this.staggerMs : 0;
  }

  /** Holds a call until its turn; then it goes through admission like any other. */
  private waitTurn(call: RouteCall, delayMs: number): number {
    if (!this.takeHeld(call)) throw overBudget();
    const handle = TURN_HANDLES + (this.turnSerial++ % TURN_HANDLES);
    const timer = setTimeout(() => {
      if (!this.turns.delete(handle)) return;
      this.unhold(call);
      try {
        const held = this.admit(call);
        if (held >= 0) this.turnedToAdmission.set(call, held);
      } catch (error) {
        call.fail(error);
      }
    }, delayMs);
    this.turns.set(handle, { call, timer });
    return handle;
  }

  /** A held call whose client went away: never answered. False if not held (answered already). */
  dropHeld(handle: number, call: RouteCall): boolean {
    // Whichever held it first (admission, a turn), a call may be paced now.
    if (this.dropPaced(call)) return true;
    if (handle >= TURN_HANDLES) {
      const waiting = this.turns.get(handle);
      if (waiting === undefined || waiting.call !== call) {
        // Its turn came and admission holds it now, or it was answered.
        const held = this.turnedToAdmission.get(call);
        return held !== undefined && this.dropHeld(held, call);
      }
      clearTimeout(waiting.timer);
      this.turns.delete(handle);
    } else if (!this.admission.drop(handle, call)) return false;
    this.unhold(call);
    return true;
  }

  /** A paced call whose client went away: never sent, its request ended. */
  private dropPaced(call: RouteCall): boolean {
    const outcome = this.pacedOutcomes.get(call);
    if (outcome === undefined || !this.pacing.drop(call)) return false;
    this.pacedOutcomes.delete(call);
    this.done(outcome.decision.requestId);
    return true;
  }

  /** Gives a held call's bytes back to the buffer budget (once). */
  private unhold(call: RouteCall): void {
    this.turnedToAdmission.delete(call);
    if (!this.heldCalls.delete(call)) return;
    bufferBudget.give(call.input.tokens.byteLength);
    if (call.input.requestId !== null) this.heldIds.delete(call.input.requestId);
  }

  /**
   * The request's first token. `cachedTokens`, when the caller knows it (the engine's
   * `usage.prompt_tokens_details.cached_tokens`), corrects an approximate worker's
   * predictions before its prompt joins them.
   */
  prefillDone(requestId: string, cachedTokens: number | null = null): LifecycleResult {
    const result = this.router.load.prefillDone(requestId);
    for (const predictions of this.predictorsNow())
      predictions.prefillDone(requestId, cachedTokens);
    this.pacing.release();
    this.admission.release();
    return result;
  }

  done(requestId: string): LifecycleResult {
    const result = this.router.load.done(requestId);
    for (const predictions of this.predictorsNow()) predictions.done(requestId);
    this.pacing.release();
    this.admission.release();
    return result;
  }

  /**
   * Peers' facts changed the load (src/cluster applies them to `router.load` under each
   * peer's origin): held calls are looked at again, as after a local done.
   */
  peerLoadChanged(): void {
    this.pacing.release();
    this.admission.release();
  }

  /**
   * An engine's answer reported its cached prompt tokens (`report`: a count, none, or one
   * that cannot be true) where `predicted` were expected: the observed-hit check, and,
   * with the count it judged by, the correction of an approximate worker's predictions.
   */
  recordAnswer(
    requestId: string,
    workerId: bigint,
    dpRank: number,
    promptTokens: number,
    predicted: number,
    report: CachedReport,
  ): void {
    // A worker removed since its request was routed: nothing to judge any more.
    const slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0) return;
    const observed = this.observedHits.record(slot, promptTokens, predicted, report);
    if (observed !== null)
      for (const predictions of this.predictorsNow()) predictions.observed(requestId, observed);
  }

  /**
   * Moves an active request's load to worker (`workerId`, `dpRank`), which holds
   * `overlapBlocks` of its prompt (the proxy's failover: the engine it was routed to
   * could not be reached). An id no longer active is admitted there anew. Returns false,
   * moving nothing, when that worker is gone (the caller held it across an await).
   */
  moveRequest(
    requestId: string,
    input: RouteInput,
    workerId: bigint,
    dpRank: number,
    overlapBlocks: number,
  ): boolean {
    const slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0) return false;
    const load = this.router.load;
    load.done(requestId);
    const prompt = this.hash(input.tokens, input.loraName, input.cacheSalt);
    for (const predictions of this.predictorsNow()) {
      predictions.done(requestId);
      predictions.routed(
        requestId,
        slot,
        prompt.local,
        prompt.chain,
        prompt.blockCount,
        input.tokens.length,
        overlapBlocks,
        overlapBlocks,
      );
    }
    load.admit(
      requestId,
      slot,
      prompt.chain,
      prompt.blockCount,
      input.tokens.length,
      overlapBlocks * this.blockSize,
      input.expectedOutputTokens ?? 0,
    );
    return true;
  }

  private routeRequest(input: RouteInput, candidatesMax: number) {
    const prompt = input.prompt ?? this.hash(input.tokens, input.loraName, input.cacheSalt);
    const matches = this.matches;
    if (input.matched !== undefined) this.currentMatches(input.matched, matches);
    else this.index.findMatches(prompt.local, prompt.blockCount, matches, prompt.chain);
    // Index slots are router slots: the matches (and lower tiers after them) are the overlaps.
    const overlaps = this.overlapsOf(matches, prompt.local, prompt.blockCount, prompt.chain);
    const request = {
      chain: prompt.chain,
      blockCount: prompt.blockCount,
      tokenCount: input.tokens.length,
      requestId: input.requestId,
      expectedOutputTokens: input.expectedOutputTokens,
      overlapScoreCredit: input.overlapScoreCredit,
      prefillLoadScale: input.prefillLoadScale,
      temperature: input.temperature,
      candidatesMax,
    };
    return { request, overlaps, blockCount: prompt.blockCount, prompt };
  }

  /**
   * The predictions told a request's lifecycle: the degraded workers' only while one is
   * routed on them or a request routed there is not done (no hash per call otherwise).
   */
  private predictorsNow(): readonly Predictions[] {
    const fallback = this.fallback;
    const busy = fallback !== null && (fallback.active || fallback.predictions.records > 0);
    return busy ? this.predictors.both : this.predictors.one;
  }

  /**
   * The overlaps of a query whose index matches are `matches`: the lower tiers after
   * them, and kvedge's predictions of degraded workers routed on them (./fallback.ts).
   */
  private overlapsOf(
    matches: MatchResult,
    local: Uint32Array,
    count: number,
    chain: Uint32Array,
  ): Overlaps {
    const fallback = this.fallback;
    if (fallback === null || !fallback.active) return this.overlaps.of(matches, chain, count);
    const load = this.router.load;
    load.syncSlots();
    fallback.lookUp(matches, local, count, chain, load);
    return fallback.withPredicted(this.overlaps.of(matches, chain, count), load);
  }

  /** Another thread's matches whose slots still name the workers they named then. */
  private currentMatches(matched: MatchedWorkers, out: MatchResult): void {
    const table = this.workerTable;
    const count = matched.slots.length;
    out.ensure(count);
    let n = 0;
    for (let i = 0; i < count; i++) {
      const slot = matched.slots[i]!;
      if (!table.isCurrent(slot, matched.stamps[i]!)) continue;
      out.workers[n] = slot;
      out.blocks[n++] = matched.blocks[i]!;
    }
    out.count = n;
  }

  /**
   * Routes the call and answers it now, or, when pacing holds its request back, keeps
   * the decision to answer when it is sent (true).
   */
  private answerCall(call: RouteCall): boolean {
    let outcome: RouteOutcome;
    try {
      outcome = this.route(call.input, call.candidatesMax);
    } catch (error) {
      call.fail(error);
      return false;
    }
    const { decision } = outcome;
    if (this.pacing.submit(call, decision.requestId, decision.slot)) {
      call.answer(outcome);
      return false;
    }
    const kept = { ...decision, candidates: decision.candidates.copy() };
    this.pacedOutcomes.set(call, { decision: kept, queryBlocks: outcome.queryBlocks });
    this.pollHeld();
    return true;
  }

  /** Route calls held at saturation: released through answerCall, refused with 429. */
  private createAdmission(config: Config): Admission<RouteCall> {
    const route = config.route;
    const settings = {
      mode: route.admission,
      boundMs: route.admission_bound_ms,
      maxHoldMs: route.admission_max_hold_ms,
      maxHeld: route.admission_max_held,
      prefillWeight: route.admission_prefill_weight,
    };
    const port = {
      waitMs: (call: RouteCall) => this.heldWaitMs(call),
      route: (call: RouteCall) => {
        this.unhold(call);
        this.answerCall(call);
      },
      reject: (call: RouteCall, retryAfterSecs: number, reason: string) => {
        this.unhold(call);
        call.fail(new KvedgeError("overloaded", reason, { retryAfterSecs }));
      },
    };
    return new Admission<RouteCall>(settings, port, this.admissionClock);
  }

  /** Routed calls that wait for a place at their engine; the router spills by their backlog. */
  private createPacing(config: Config): Pacing<RouteCall> {
    const route = config.route;
    const settings = {
      mode: route.pacing,
      perWorker: route.pacing_per_worker,
      maxHoldMs: route.pacing_max_hold_ms,
      maxHeld: route.admission_max_held,
      stepTokens: route.max_batched_tokens,
    };
    const pacing = new Pacing<RouteCall>(
      settings,
      {
        prefillTokens: (requestId) => this.router.load.prefillTokensOf(requestId),
        send: (call) => this.sendPaced(call),
      },
      this.admissionClock,
    );
    if (pacing.enabled) this.router.paced = pacing;
    return pacing;
  }

  /** A paced call's turn: its decision answered, or, if its request ended meanwhile (its worker removed), routed afresh. */
  private sendPaced(call: RouteCall): void {
    const outcome = this.pacedOutcomes.get(call)!;
    this.pacedOutcomes.delete(call);
    if (this.router.load.isActive(outcome.decision.requestId)) call.answer(outcome);
    else this.answerCall(call);
  }

  /** A held call's shortest predicted wait now; one that cannot be assessed (no workers left) goes to be refused by its route. */
  private heldWaitMs(call: RouteCall): number {
    try {
      const { request, overlaps } = this.routeRequest(call.input, 0);
      return this.router.assess(request, overlaps).waitMs;
    } catch {
      return -Infinity;
    }
  }

  /** While calls are held, releases what is due at least every HELD_POLL_MS (longest hold, expiries). */
  private pollHeld(): void {
    if (this.heldTimer !== null || this.admission.held + this.pacing.held === 0) return;
    const due = Math.min(this.admission.nextDueMs(), this.pacing.nextDueMs());
    const delay = Math.max(0, Math.min(HELD_POLL_MS, due - this.admissionClock()));
    this.heldTimer = setTimeout(() => {
      this.heldTimer = null;
      this.pacing.release();
      this.admission.release();
      this.pollHeld();
    }, delay);
  }

  /** A slot's worker id as decimal text (route answers carry it). */
  workerIdTextOf(slot: number): string {
    return this.workerTable.workerIdTextOf(slot);
  }

  // ---- Warm restart and warm-up ----

  /** Requests routed and not yet done, expired or dropped. */
  get activeRequestCount(): number {
    return this.router.load.activeRequestCount;
  }

  /** Every active request, least recently touched first (what a snapshot keeps). */
  forEachActiveRequest(visit: (...request: ActiveRequest) => void): void {
    const table = this.workerTable;
    this.router.load.forEachActive((slot, id, prefill, output, idleMs, chain, blocks) =>
      visit(
        table.workerIdOf(slot),
        table.dpRanks[slot]!,
        id,
        prefill,
        output,
        idleMs,
        chain,
        blocks,
      ),
    );
  }

  /**
   * Takes back an active request a snapshot saved, idle for `idleMs` already: its load
   * counts again until it finishes or the rest of its TTL runs out. False (nothing
   * changed) when its worker is not here, its TTL has passed, or its id is active.
   */
  restoreRequest(...request: ActiveRequest): boolean {
    const [workerId, dpRank, id, prefillTokens, outputBlocks, idleMs, chain, blocks] = request;
    const slot = this.workerTable.find(workerId, dpRank);
    if (slot < 0) return false;
    return this.router.load.restore(id, slot, chain, blocks, prefillTokens, outputBlocks, idleMs);
  }

  /**
   * A source position a snapshot saved, for the configured source of (workerId, dpRank)
   * to start from when it is added (before `start`). Its worker takes its slot now.
   */
  restorePosition(position: SourcePosition): void {
    const slot = this.addSlot(position.workerId, position.dpRank);
    this.restoredPositions.set(slot, position);
  }

  /** The saved position waiting for (or taken up by) the source of (workerId, dpRank). */
  restoredPositionOf(workerId: bigint, dpRank: number): SourcePosition | undefined {
    return this.restoredPositions.get(this.workerTable.find(workerId, dpRank));
  }

  /**
   * Warm-up (and tests): (workerId, dpRank), a routing candidate from now on, holds
   * `tokens`' blocks as if its engine had stored them (their local hashes stand for the
   * engine's own).
   */
  seedWorker(workerId: bigint, dpRank: number, tokens: Uint32Array): void {
    const slot = this.addSlot(workerId, dpRank);
    const { local, blockCount } = this.hash(tokens, null, null);
    const external = local.slice(0, 2 * blockCount);
    this.sink.storeAt(slot, false, 0, 0, external, local, blockCount, 0);
  }

  // ---- Workers ----

  /** A worker endpoint naming a wildcard address: 403 unless ingest.allow_wildcard_endpoints. */
  private refuseWildcard(entry: WorkerEntry): void {
    if (this.options.config.ingest.allow_wildcard_endpoints) return;
    const problem = wildcardProblem(entry);
    if (problem !== null)
      throw new KvedgeError("forbidden", problem.message, { param: problem.field });
  }

  /**
   * Adds an engine: with an event endpoint, starts listening to it (exact); without
   * one, predicts its cache from kvedge's decisions (approximate). A worker that exists
   * in the other mode moves to this one (its load stays; its index slot starts over);
   * `worker_exists` if it exists in this mode already.
   */
  async addWorker(entry: WorkerEntry): Promise<"added" | "switched"> {
    if (this.stopped) throw shuttingDown();
    const known = this.workerTable.find(entry.worker_id, entry.dp_rank);
    const approximate = known >= 0 && this.predictions.isApproximate(known);
    const exact = this.ownSource.get(known) !== undefined;
    if ((entry.endpoint === null && approximate) || (entry.endpoint !== null && exact)) {
      throw new KvedgeError(
        "worker_exists",
        `worker ${entry.worker_id} dp_rank ${entry.dp_rank} already exists`,
      );
    }
    this.refuseWildcard(entry);
    if (entry.endpoint === null) {
      if (this.options.writer !== undefined) {
        throw new KvedgeError(
          "unsupported",
          "approximate workers (no event endpoint) need runtime.index_threads = 0: predictions are written on the main thread",
        );
      }
      if (exact) await this.stopOwnSource(known);
      this.addApproximate(entry);
      return exact ? "switched" : "added";
    }
    if (!approximate) {
      await this.addExact(entry, entry.endpoint, known);
      return "added";
    }
    const capacity = this.predictions.blocks.configuredOf(known);
    this.leaveApproximate(known);
    try {
      await this.addExact(entry, entry.endpoint, known);
    } catch (error) {
      this.addApproximate({ ...entry, endpoint: null, capacity_blocks: capacity });
      throw error;
    }
    return "switched";
  }

  /** An engine without events: its slot's blocks are kvedge's predictions from now on. */
  private addApproximate(entry: WorkerEntry): void {
    const slot = this.addSlot(entry.worker_id, entry.dp_rank);
    // Nothing the slot held (a snapshot, its events as an exact worker) is known any more.
    this.sink.clearAt(slot);
    this.predictions.enable(slot, entry.capacity_blocks ?? null);
    this.router.load.setApproximate(slot, true);
    if (entry.http_endpoint != null) this.httpEndpoints.set(slot, entry.http_endpoint);
    this.refreshDegraded(slot);
    this.log.info("approximate worker added", {
      worker_id: entry.worker_id,
      dp_rank: entry.dp_rank,
      capacity_blocks: this.predictions.blocks.capacityOf(slot),
    });
  }

  /** An approximate worker becomes exact: its predictions leave the index (its events rebuild it). */
  private leaveApproximate(slot: number): void {
    this.predictions.disable(slot);
    this.router.load.setApproximate(slot, false);
  }

  /** Stops the source of exactly this slot (the worker becomes approximate); its index slot is cleared next. */
  private async stopOwnSource(slot: number): Promise<void> {
    const source = this.ownSource.get(slot)!;
    this.sources.delete(source);
    this.ownSource.delete(slot);
    this.incomplete.delete(slot);
    await source.stop();
  }

  private async addExact(entry: WorkerEntry, endpoint: string, known: number): Promise<void> {
    const config = {
      workerId: entry.worker_id,
      dpRank: entry.dp_rank,
      endpoint,
      replayEndpoint: entry.replay_endpoint,
      topic: entry.topic,
    };
    const source = new EngineSource(config, this.sourceOptions(config));
    const saved = this.restoredPositions.get(known);
    if (saved !== undefined) source.restore(saved);
    const slot = this.addSlot(entry.worker_id, entry.dp_rank);
    this.sources.add(source);
    this.ownSource.set(slot, source);
    if (entry.http_endpoint != null) this.httpEndpoints.set(slot, entry.http_endpoint);
    this.sourceChanged(source);
    try {
      const endpoint = await source.start();
      this.log.info("worker added", {
        worker_id: entry.worker_id,
        dp_rank: entry.dp_rank,
        endpoint,
      });
    } catch (error) {
      this.sources.delete(source);
      this.ownSource.delete(slot);
      this.httpEndpoints.delete(slot);
      await source.stop();
      // A slot this call took ends with it; one that was there (another source's rank) stays.
      if (known < 0) this.endSlots(null, [slot]);
      throw new KvedgeError(
        "cannot_listen",
        `cannot listen to ${entry.endpoint}: ${(error as Error).message}`,
      );
    }
  }

  private sourceOptions(config: SourceConfig): SourceOptions {
    const ingest = this.options.config.ingest;
    return {
      blockSize: this.blockSize,
      sink: this.sink,
      log: this.log.child({ component: "ingest" }),
      zmtp: this.zmtp,
      lora: this.lora,
      sequencer: {
        replayTimeoutMs: ingest.replay_timeout_ms,
        replayDeadlineMs: ingest.replay_deadline_ms,
        replayBufferBytes: ingest.replay_buffer_bytes,
        idleProbeMs: ingest.idle_probe_ms,
      },
      onChange: (changed) => this.sourceChanged(changed),
      ...(this.options.writer === undefined ? {} : { input: this.options.writer.input(config) }),
    };
  }

  /** Removes every dp rank of a worker: stops its sources, then ends its slots' lives. */
  async removeWorker(workerId: bigint): Promise<boolean> {
    const stopping: Promise<void>[] = [];
    for (const source of this.sources) {
      if (source.config.workerId !== workerId) continue;
      this.sources.delete(source);
      stopping.push(source.stop());
    }
    await Promise.all(stopping);
    const slots = this.workerTable.slotsOf(workerId);
    this.endSlots(workerId, slots);
    const found = slots.length > 0 || stopping.length > 0;
    if (found) this.log.info("worker removed", { worker_id: workerId });
    return found;
  }

  /**
   * The one place a slot's life ends (a worker removed, `workerId`; or a slot an add took
   * and gave back): its requests and load go, its predictions, its blocks in the index
   * and, as the table retires it, every per-slot column. The slot is then free for the
   * next worker at once, or, with a writer thread, once the writer's index let go of it
   * too (WriterThread.release; lookups meanwhile leave a retired slot out).
   */
  private endSlots(workerId: bigint | null, slots: readonly number[]): void {
    for (const slot of slots) {
      this.router.load.dropSlot(slot);
      this.predictions.disable(slot);
    }
    this.fallback?.dropSlots(slots);
    const writer = this.options.writer;
    if (writer !== undefined) return writer.release(workerId, slots);
    this.writes.settle(); // a change that does not wait for a copy in progress
    if (workerId !== null) this.index.removeWorker(workerId);
    for (const slot of slots) {
      this.index.dropSlot(slot);
      this.workerTable.release(slot);
    }
  }

  /** The slot of (workerId, dpRank), taken if it has none (a routing candidate from now on). */
  private addSlot(workerId: bigint, dpRank: number): number {
    const slot = this.workerTable.acquire(workerId, dpRank);
    if (slot < 0) throw new RangeError(`more than ${this.workerTable.maxSlots} workers`);
    return slot;
  }

  /** The engine time model the router uses for a worker: learned when calibrating, else configured. */
  timesOf(slot: number): WorkerTimes {
    const router = this.router;
    const learned = router.learnedTimes(slot);
    return learned === null
      ? {
          prefillTokensPerSecond: router.ttft.prefillTokensPerSecond,
          stepBaseMs: router.ttft.stepBaseMs,
          samples: 0,
          learned: false,
        }
      : { ...learned, learned: true };
  }

  workers(): WorkerView[] {
    const blocks = new Map<number, number>();
    for (const info of this.index.workers())
      blocks.set(this.workerTable.find(info.workerId, info.dpRank), info.blocks);
    const views: WorkerView[] = [];
    for (const load of this.router.load.workers()) {
      const source = this.sourceOf(load.slot);
      views.push({
        workerId: load.workerId,
        dpRank: load.dpRank,
        endpoint: source?.config.endpoint ?? null,
        replayEndpoint: source?.config.replayEndpoint ?? null,
        topic: source?.config.topic ?? null,
        state: source?.state ?? "unmanaged",
        degraded: load.degraded,
        degradedReason: load.degraded ? this.distrustReason(load.slot) : null,
        blocks: blocks.get(load.slot) ?? 0,
        activeRequests: load.activeRequests,
        activePrefillTokens: load.activePrefillTokens,
        activeDecodeBlocks: load.activeDecodeBlocks,
        peerActiveRequests: load.peerRequests,
        peerActivePrefillTokens: load.peerPrefillTokens,
        routedTotal: load.routedTotal,
        lastSeq: source?.sequencer.lastSeq ?? -1,
        lostBatches: source?.sequencer.counters.lost ?? 0,
        eventLagMs: lagOf(source),
        httpEndpoint: this.httpEndpointOf(load.workerId, load.dpRank),
        mode: this.predictions.isApproximate(load.slot) ? "approximate" : "exact",
        predicted: this.predictedView(load.slot),
        observed: this.observedHits.view(load.slot),
        times: this.timesOf(load.slot),
      });
    }
    return views.sort((a, b) =>
      a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : a.dpRank - b.dpRank,
    );
  }

  /** The predictions a slot is routed on: an approximate worker's, a degraded one's (route.degraded_fallback), or none. */
  private predictedView(slot: number): WorkerView["predicted"] {
    const blocks = this.predictions.isApproximate(slot)
      ? this.predictions.blocks
      : this.fallback?.isOn(slot) === true
        ? this.fallback.predictions.blocks
        : null;
    return blocks === null
      ? null
      : { blocks: blocks.heldBy(slot), capacityBlocks: blocks.capacityOf(slot) };
  }

  /**
   * Where the proxy sends a request for (worker, dp rank): its own http_endpoint, else
   * that of another rank of the same engine (one server fronts all its ranks).
   */
  httpEndpointOf(workerId: bigint, dpRank: number): string | null {
    const own = this.httpEndpoints.get(this.workerTable.find(workerId, dpRank));
    if (own !== undefined) return own;
    for (const slot of this.workerTable.slotsOf(workerId)) {
      const endpoint = this.httpEndpoints.get(slot);
      if (endpoint !== undefined) return endpoint;
    }
    return null;
  }

  /** Every source, for metrics and readiness. */
  get engineSources(): readonly EngineSource[] {
    return [...this.sources];
  }

  /** Ready when every configured source has connected at least once. */
  readiness(): { ready: boolean; states: Record<SourceState, number> } {
    const states: Record<SourceState, number> = {
      connecting: 0,
      connected: 0,
      disconnected: 0,
      stopped: 0,
    };
    for (const source of this.sources) states[source.state]++;
    return { ready: !this.stopped && states.connecting === 0, states };
  }

  /**
   * Whether the router should discount a slot's overlap: events lost, stores refused by
   * the memory budget, or hits observed persistently below predicted.
   */
  private distrusted(slot: number): boolean {
    return (
      this.sourceOf(slot)?.degraded === true ||
      this.incomplete.get(slot) === true ||
      // An approximate worker's shortfalls correct its predictions instead.
      (!this.predictions.isApproximate(slot) && this.observedHits.isSuspect(slot))
    );
  }

  /** Why `distrusted(slot)` holds, in words, the first cause found. */
  private distrustReason(slot: number): string {
    const source = this.sourceOf(slot);
    if (source !== undefined && source.state !== "connected")
      return `engine not connected (${source.state}): what it holds is unknown`;
    const sequenced = source?.sequencer.degradedReason ?? null;
    if (sequenced !== null) return sequenced;
    if (this.incomplete.get(slot) === true) return BUDGET_REFUSAL;
    const observed = this.observedHits.view(slot);
    if (observed.suspect) {
      const ratio =
        observed.recentRatio === null ? "" : ` (${Math.round(100 * observed.recentRatio)}%)`;
      return `observed hits far below predicted${ratio}: the engine does not serve what its events say`;
    }
    return "degraded";
  }

  /** The source publishing a slot: its own, or the worker's source that reported that rank. */
  private sourceOf(slot: number): EngineSource | undefined {
    const own = this.ownSource.get(slot);
    if (own !== undefined) return own;
    const workerId = this.workerTable.workerIdOf(slot);
    const dpRank = this.workerTable.dpRankOf(slot);
    for (const source of this.sources) {
      if (source.config.workerId === workerId && source.ranks.includes(dpRank)) return source;
    }
    return undefined;
  }

  /**
   * A source's state, trust or ranks changed: each of its ranks is a routing candidate
   * (a rank first seen in its events gets its slot here, before its first operation
   * is written) with the source's trust.
   */
  private sourceChanged(source: EngineSource): void {
    for (const dpRank of source.ranks) {
      this.setTrust(this.addSlot(source.config.workerId, dpRank));
    }
  }

  /**
   * The index as sources write to it: behind the memory budget (src/ingest/budgeted-sink.ts),
   * through the write pause of copies in progress (src/index/write-pause.ts).
   */
  private budgetedSink(writes: WritePause): KvEventSink {
    return budgetedSink(writes, this.budget, this.workerTable, {
      refused: (slot, blocks) => this.refuseStore(slot, blocks),
      // Holding nothing is known exactly: refused stores no longer matter.
      cleared: (slot) => {
        if (this.incomplete.get(slot) === undefined) return;
        this.incomplete.delete(slot);
        this.refreshDegraded(slot);
      },
    });
  }

  private refuseStore(slot: number, blocks: number): void {
    this.budget.refuse(blocks);
    if (this.incomplete.get(slot) === true) return;
    this.incomplete.set(slot, true);
    this.log.warn("index memory budget reached: stores refused, worker degraded", {
      worker_id: this.workerTable.workerIdOf(slot),
      dp_rank: this.workerTable.dpRankOf(slot),
      budget_bytes: this.budget.budgetBytes,
    });
    this.refreshDegraded(slot);
  }

  private refreshDegraded(slot: number): void {
    if (this.workerTable.isLive(slot)) this.setTrust(slot);
  }

  /**
   * A slot's trust: degraded or not (`distrusted`); a degraded exact worker is routed on
   * predictions with route.degraded_fallback (held to route.predicted_capacity_blocks,
   * else to the blocks its index held when it degraded), and no longer once it is exact.
   */
  private setTrust(slot: number): void {
    const degraded = this.distrusted(slot);
    const load = this.router.load;
    load.setDegraded(slot, degraded);
    const fallback = this.fallback;
    if (fallback === null) return;
    const on = degraded && !this.predictions.isApproximate(slot);
    if (on === fallback.isOn(slot)) return;
    fallback.set(slot, on, on ? this.fallbackCapacity(slot) : null);
    load.setFallback(slot, on);
  }

  /** What a degraded worker's predictions are held to: the fleet default, else what its index holds now. */
  private fallbackCapacity(slot: number): number | null {
    const configured = this.options.config.route.predicted_capacity_blocks;
    if (configured !== null) return configured;
    const workerId = this.workerTable.workerIdOf(slot);
    const dpRank = this.workerTable.dpRankOf(slot);
    const held = this.index.workers().find((w) => w.workerId === workerId && w.dpRank === dpRank);
    return held === undefined || held.blocks === 0
      ? null
      : Math.max(CAPACITY_FLOOR_BLOCKS, held.blocks);
  }
}

/** The router as configured, on the core's worker numbering. */
function routerOptionsOf(
  config: Config,
  workers: WorkerTable,
  random: (() => number) | undefined,
): RouterOptions {
  const route = config.route;
  return {
    workers,
    blockSize: config.index.block_size,
    requestTtlMs: route.request_ttl_secs * 1000,
    maxActiveRequests: route.max_active_requests,
    trackOutputBlocks: route.track_output_blocks,
    policy: route.policy,
    calibrate: route.calibrate,
    pendingCredit: route.pending_credit,
    pendingRecomputeWeight: route.pending_recompute_weight,
    ttft: {
      prefillTokensPerSecond: route.prefill_tokens_per_sec,
      stepBaseMs: route.step_base_ms,
      kvReadMsPerMillionTokens: route.kv_read_ms_per_million_tokens,
      maxBatchedTokens: route.max_batched_tokens,
      recomputeWeight: route.recompute_weight,
      hostReloadMsPerMillionTokens: route.host_reload_ms_per_million_tokens,
      diskReloadMsPerMillionTokens: route.disk_reload_ms_per_million_tokens,
    },
    weights: {
      overlapScoreCredit: route.overlap_score_credit,
      overlapScoreCreditDecay: route.overlap_score_credit_decay,
      prefillLoadScale: route.prefill_load_scale,
      decodeActiveRequestWeight: route.decode_active_request_weight,
      temperature: route.temperature,
      degradedOverlapWeight: route.degraded_overlap_weight,
      hostCacheHitWeight: route.host_cache_hit_weight,
      diskCacheHitWeight: route.disk_cache_hit_weight,
    },
    ...(random === undefined ? {} : { random }),
  };
}

/** Predictions for approximate workers, written through the core's budgeted sink. */
function predictionsOf(config: Config, sink: KvEventSink): Predictions {
  return new Predictions(sink, predictionSettingsOf(config), () => performance.now());
}

/** How predictions are made, approximate workers' and degraded exact workers' alike. */
function predictionSettingsOf(config: Config) {
  const route = config.route;
  return {
    blockSize: config.index.block_size,
    predictAt: route.predict_at,
    capacityBlocks: route.predicted_capacity_blocks,
    ttlMs: route.predicted_ttl_secs * 1000,
    maxBlocks: DEFAULT_PREDICTED_MAX_BLOCKS,
    requestTtlMs: route.request_ttl_secs * 1000,
    maxPending: route.max_active_requests,
    correct: route.predicted_correction,
  };
}

/** The ZMTP settings of every engine connection. */
function zmtpOptionsOf(ingest: Config["ingest"]): ZmtpOptions {
  return {
    maxMessageBytes: ingest.max_message_bytes,
    heartbeatIntervalMs: ingest.heartbeat_interval_ms,
    heartbeatTimeoutMs: ingest.heartbeat_timeout_ms,
    frameTimeoutMs: ingest.frame_timeout_ms,
    reconnectMinMs: ingest.reconnect_min_ms,
    reconnectMaxMs: ingest.reconnect_max_ms,
  };
}

/** The lag of a source's last timestamped batch (ms), or null when none had a timestamp. */
function lagOf(source: EngineSource | undefined): number | null {
  const counters = source?.normalizer.counters;
  return counters === undefined || counters.lagBatches === 0 ? null : counters.lagLastMs;
}
