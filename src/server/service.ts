/**
 * The router service: the index, the request router, and the engine sources that feed
 * the index, behind the operations the HTTP and WebSocket APIs expose. Data flows one
 * way: sources -> index; requests -> (hash, index match, route) -> decision.
 */
import type { Config } from "../config";
import type { WorkerEntry } from "../config/workers";
import { blockSeed } from "../hash";
import type { KvIndex } from "../index";
import { createIndex, MatchResult } from "../index";
import type { KvEventSink } from "../ingest/normalize";
import { EngineSource, type SourceState } from "../ingest/source";
import { CandidateList, PromptHasher, type RouteDecision, Router, type Overlaps } from "../route";
import type { LifecycleResult } from "../route/load";
import { ObservedHits, type ObservedHitsView } from "../proxy/observed-hits";
import type { Logger } from "../util/log";
import type { ZmtpOptions } from "../wire/zmtp";
import { HttpError } from "./http";

export interface MatchScore {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly blocks: number;
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
}

export interface WorkerView {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Null for workers known only from events (another dp rank of a configured engine). */
  readonly endpoint: string | null;
  readonly replayEndpoint: string | null;
  readonly topic: string | null;
  readonly state: SourceState | "unmanaged";
  readonly degraded: boolean;
  readonly blocks: number;
  readonly activeRequests: number;
  readonly activePrefillTokens: number;
  readonly activeDecodeBlocks: number;
  readonly routedTotal: number;
  readonly lastSeq: number;
  readonly lostBatches: number;
  /** The engine's OpenAI-compatible server (where the proxy forwards), if configured. */
  readonly httpEndpoint: string | null;
  readonly observed: ObservedHitsView;
}

export interface ServiceOptions {
  readonly config: Config;
  readonly log: Logger;
  /** For tests: a fixed random source for tie-breaks and softmax. */
  readonly random?: () => number;
}

/** slotByHandle: not resolved yet. */
const UNKNOWN_SLOT = -2;

const sourceKey = (workerId: bigint, dpRank: number): string => `${workerId}:${dpRank}`;

export class KvRouterService {
  readonly index: KvIndex;
  readonly router: Router;
  readonly blockSize: number;
  private readonly sources = new Map<string, EngineSource>();
  /** Predicted vs observed cached tokens per worker (fed by the proxy); a persistent gap is distrusted like lost events. */
  readonly observedHits: ObservedHits;
  private readonly httpEndpoints = new Map<string, string>();
  /** Over every decision: prompt tokens, and those the chosen worker was predicted to hold (the status page's hit rate). */
  readonly routeTotals = { decisions: 0, promptTokens: 0, predictedCachedTokens: 0 };
  private readonly matches = new MatchResult(64);
  private readonly hasher = new PromptHasher();
  private readonly candidates = new CandidateList();
  private overlapSlots = new Int32Array(64);
  private overlapBlocks = new Float64Array(64);
  private slotByHandle = new Int32Array(0);
  private slotsVersion = -1;
  private slotsIndexVersion = -1;
  /** Counts index.removeWorker calls (the only way index handles get recycled). */
  private indexWorkersVersion = 0;
  private readonly sink: KvEventSink;
  private readonly zmtp: ZmtpOptions;
  private readonly log: Logger;
  private stopped = false;

  constructor(private readonly options: ServiceOptions) {
    const { config } = options;
    this.log = options.log;
    this.blockSize = config.index.block_size;
    this.index = createIndex(config.index.backend, this.blockSize);
    this.router = new Router({
      blockSize: this.blockSize,
      requestTtlMs: config.route.request_ttl_secs * 1000,
      maxActiveRequests: config.route.max_active_requests,
      trackOutputBlocks: config.route.track_output_blocks,
      weights: {
        overlapScoreCredit: config.route.overlap_score_credit,
        overlapScoreCreditDecay: config.route.overlap_score_credit_decay,
        prefillLoadScale: config.route.prefill_load_scale,
        decodeActiveRequestWeight: config.route.decode_active_request_weight,
        temperature: config.route.temperature,
        degradedOverlapWeight: config.route.degraded_overlap_weight,
      },
      ...(options.random === undefined ? {} : { random: options.random }),
    });
    this.zmtp = {
      maxMessageBytes: config.ingest.max_message_bytes,
      heartbeatIntervalMs: config.ingest.heartbeat_interval_ms,
      heartbeatTimeoutMs: config.ingest.heartbeat_timeout_ms,
      reconnectMinMs: config.ingest.reconnect_min_ms,
      reconnectMaxMs: config.ingest.reconnect_max_ms,
    };
    this.observedHits = new ObservedHits({
      floor: config.proxy.observed_hit_floor,
      window: config.proxy.observed_window,
      log: this.log.child({ component: "observed-hits" }),
      onChange: (workerId, dpRank) => {
        const slot = this.router.load.slotOf(workerId, dpRank);
        if (slot >= 0) this.router.load.setDegraded(slot, this.distrusted(workerId, dpRank));
      },
    });
    const index = this.index;
    this.sink = {
      stored: (workerId, dpRank, hasParent, parentHi, parentLo, external, local, start, count) => {
        this.ensureRoutable(workerId, dpRank);
        index.applyStored(workerId, dpRank, hasParent, parentHi, parentLo, external, local, count, start);
      },
      removed: (workerId, dpRank, external, start, count) => {
        index.applyRemoved(workerId, dpRank, external, count, start);
      },
      cleared: (workerId, dpRank) => index.applyCleared(workerId, dpRank),
    };
  }

  /** Starts a source for every configured worker (connections complete in the background). */
  async start(): Promise<void> {
    for (const entry of this.options.config.workers) await this.addWorker(entry);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([...this.sources.values()].map((source) => source.stop()));
    this.sources.clear();
  }

  // ---- Matching and routing ----

  /** A prompt's local block hashes (as the index keys them) and chain; valid until the next call. */
  hash(tokens: Uint32Array, loraName: string | null, cacheSalt: string | null) {
    return this.hasher.hash(tokens, this.blockSize, blockSeed(loraName, cacheSalt));
  }

  /** Per-worker matched prefix length in blocks, sorted as `kvedge apply` sorts. */
  match(local: Uint32Array, count: number): MatchScore[] {
    this.index.findMatches(local, count, this.matches);
    const scores: MatchScore[] = [];
    for (let i = 0; i < this.matches.count; i++) {
      const handle = this.matches.workers[i]!;
      scores.push({
        workerId: this.index.workerIdOf(handle),
        dpRank: this.index.dpRankOf(handle),
        blocks: this.matches.blocks[i]!,
      });
    }
    return scores.sort((a, b) => b.blocks - a.blocks
      || (a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : 0)
      || a.dpRank - b.dpRank);
  }

  /** Picks a worker; the decision's candidates are valid until the next call. */
  route(input: RouteInput, candidatesMax: number): { decision: RouteDecision; queryBlocks: number } {
    const prompt = this.hash(input.tokens, input.loraName, input.cacheSalt);
    const overlaps = this.overlaps(prompt.local, prompt.blockCount);
    const decision = this.router.route({
      chain: prompt.chain,
      blockCount: prompt.blockCount,
      tokenCount: input.tokens.length,
      requestId: input.requestId,
      expectedOutputTokens: input.expectedOutputTokens,
      overlapScoreCredit: input.overlapScoreCredit,
      prefillLoadScale: input.prefillLoadScale,
      temperature: input.temperature,
      candidatesMax,
    }, overlaps, this.candidates);
    const totals = this.routeTotals;
    totals.decisions++;
    totals.promptTokens += input.tokens.length;
    totals.predictedCachedTokens += Math.min(decision.overlapBlocks, prompt.blockCount) * this.blockSize;
    return { decision, queryBlocks: prompt.blockCount };
  }

  prefillDone(requestId: string): LifecycleResult {
    return this.router.load.prefillDone(requestId);
  }

  done(requestId: string): LifecycleResult {
    return this.router.load.done(requestId);
  }

  /** The index's matches as router slots (workers the router does not know are skipped). */
  private overlaps(local: Uint32Array, count: number): Overlaps {
    const matches = this.matches;
    this.index.findMatches(local, count, matches);
    if (this.overlapSlots.length < matches.count) {
      this.overlapSlots = new Int32Array(matches.workers.length);
      this.overlapBlocks = new Float64Array(matches.workers.length);
    }
    let n = 0;
    for (let i = 0; i < matches.count; i++) {
      const slot = this.routerSlotOf(matches.workers[i]!);
      if (slot < 0) continue;
      this.overlapSlots[n] = slot;
      this.overlapBlocks[n++] = matches.blocks[i]!;
    }
    return { count: n, slots: this.overlapSlots, blocks: this.overlapBlocks };
  }

  /**
   * The router slot of an index worker handle, or -1, remembered per handle: resolving
   * the bigint id per matched worker and request is a noticeable part of a decision.
   * Index handles are recycled only by `index.removeWorker` (this.removeWorker) and
   * router slots change only with the router's workers, so the memory is dropped when
   * either happens.
   */
  private routerSlotOf(handle: number): number {
    const load = this.router.load;
    if (this.slotsVersion !== load.workersVersion || this.slotsIndexVersion !== this.indexWorkersVersion) {
      this.slotByHandle.fill(UNKNOWN_SLOT);
      this.slotsVersion = load.workersVersion;
      this.slotsIndexVersion = this.indexWorkersVersion;
    }
    if (handle >= this.slotByHandle.length) {
      const grown = new Int32Array(Math.max(64, 2 * handle + 2)).fill(UNKNOWN_SLOT);
      grown.set(this.slotByHandle);
      this.slotByHandle = grown;
    }
    let slot = this.slotByHandle[handle]!;
    if (slot === UNKNOWN_SLOT) {
      slot = load.slotOf(this.index.workerIdOf(handle), this.index.dpRankOf(handle));
      this.slotByHandle[handle] = slot;
    }
    return slot;
  }

  // ---- Workers ----

  /** Adds an engine and starts listening to it. 409 if (worker, dp rank) is already there. */
  async addWorker(entry: WorkerEntry): Promise<void> {
    if (this.stopped) throw new HttpError(503, "the service is shutting down");
    const key = sourceKey(entry.worker_id, entry.dp_rank);
    if (this.sources.has(key)) {
      throw new HttpError(409, `worker ${entry.worker_id} dp_rank ${entry.dp_rank} already exists`);
    }
    const source = new EngineSource({
      workerId: entry.worker_id,
      dpRank: entry.dp_rank,
      endpoint: entry.endpoint,
      replayEndpoint: entry.replay_endpoint,
      topic: entry.topic,
    }, {
      blockSize: this.blockSize,
      sink: this.sink,
      log: this.log.child({ component: "ingest" }),
      zmtp: this.zmtp,
      sequencer: { replayTimeoutMs: this.options.config.ingest.replay_timeout_ms },
      onChange: (changed) => this.trustChanged(changed),
    });
    this.sources.set(key, source);
    if (entry.http_endpoint != null) this.httpEndpoints.set(key, entry.http_endpoint);
    this.ensureRoutable(entry.worker_id, entry.dp_rank);
    this.trustChanged(source);
    try {
      const endpoint = await source.start();
      this.log.info("worker added", { worker_id: entry.worker_id, dp_rank: entry.dp_rank, endpoint });
    } catch (error) {
      this.sources.delete(key);
      this.httpEndpoints.delete(key);
      this.router.load.removeWorker(entry.worker_id, entry.dp_rank);
      await source.stop();
      throw new HttpError(400, `cannot listen to ${entry.endpoint}: ${(error as Error).message}`);
    }
  }

  /** Removes every dp rank of a worker: stops its sources, purges its blocks and load. */
  async removeWorker(workerId: bigint): Promise<boolean> {
    const stopping: Promise<void>[] = [];
    let found = false;
    for (const [key, source] of this.sources) {
      if (source.config.workerId !== workerId) continue;
      found = true;
      this.sources.delete(key);
      this.httpEndpoints.delete(key);
      stopping.push(source.stop());
    }
    await Promise.all(stopping);
    for (const load of this.router.load.workers()) {
      if (load.workerId !== workerId) continue;
      found = true;
      this.router.load.removeWorker(workerId, load.dpRank);
    }
    if (this.index.workers().some((info) => info.workerId === workerId)) found = true;
    this.index.removeWorker(workerId);
    this.indexWorkersVersion++;
    this.observedHits.remove(workerId);
    if (found) this.log.info("worker removed", { worker_id: workerId });
    return found;
  }

  workers(): WorkerView[] {
    const blocks = new Map<string, number>();
    for (const info of this.index.workers()) blocks.set(sourceKey(info.workerId, info.dpRank), info.blocks);
    const views: WorkerView[] = [];
    for (const load of this.router.load.workers()) {
      const key = sourceKey(load.workerId, load.dpRank);
      const source = this.sources.get(key) ?? this.sourceOfWorker(load.workerId, load.dpRank);
      views.push({
        workerId: load.workerId,
        dpRank: load.dpRank,
        endpoint: source?.config.endpoint ?? null,
        replayEndpoint: source?.config.replayEndpoint ?? null,
        topic: source?.config.topic ?? null,
        state: source?.state ?? "unmanaged",
        degraded: load.degraded,
        blocks: blocks.get(key) ?? 0,
        activeRequests: load.activeRequests,
        activePrefillTokens: load.activePrefillTokens,
        activeDecodeBlocks: load.activeDecodeBlocks,
        routedTotal: load.routedTotal,
        lastSeq: source?.sequencer.lastSeq ?? -1,
        lostBatches: source?.sequencer.counters.lost ?? 0,
        httpEndpoint: this.httpEndpointOf(load.workerId, load.dpRank),
        observed: this.observedHits.view(load.workerId, load.dpRank),
      });
    }
    return views.sort((a, b) => (a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : a.dpRank - b.dpRank));
  }

  /**
   * Where the proxy sends a request for (worker, dp rank): its own http_endpoint, else
   * that of another rank of the same engine (one server fronts all its ranks).
   */
  httpEndpointOf(workerId: bigint, dpRank: number): string | null {
    const own = this.httpEndpoints.get(sourceKey(workerId, dpRank));
    if (own !== undefined) return own;
    const prefix = `${workerId}:`;
    for (const [key, endpoint] of this.httpEndpoints) if (key.startsWith(prefix)) return endpoint;
    return null;
  }

  /** Every source, for metrics and readiness. */
  get engineSources(): readonly EngineSource[] {
    return [...this.sources.values()];
  }

  /** Ready when every configured source has connected at least once. */
  readiness(): { ready: boolean; states: Record<SourceState, number> } {
    const states: Record<SourceState, number> = { connecting: 0, connected: 0, disconnected: 0, stopped: 0 };
    for (const source of this.sources.values()) states[source.state]++;
    return { ready: !this.stopped && states.connecting === 0, states };
  }

  /** A worker seen in events (e.g. a batch's own dp rank) becomes a routing candidate. */
  private ensureRoutable(workerId: bigint, dpRank: number): void {
    if (this.router.load.slotOf(workerId, dpRank) >= 0) return;
    const slot = this.router.load.addWorker(workerId, dpRank);
    this.router.load.setDegraded(slot, this.distrusted(workerId, dpRank));
  }

  /** Whether the router should discount the worker's overlap: events lost, or hits observed persistently below predicted. */
  private distrusted(workerId: bigint, dpRank: number): boolean {
    return this.sourceOfWorker(workerId, dpRank)?.degraded === true || this.observedHits.isSuspect(workerId, dpRank);
  }

  /** The source publishing for (worker, dp rank): its own, or the worker's source that reported that rank. */
  private sourceOfWorker(workerId: bigint, dpRank: number): EngineSource | undefined {
    const own = this.sources.get(sourceKey(workerId, dpRank));
    if (own !== undefined) return own;
    for (const source of this.sources.values()) {
      if (source.config.workerId === workerId && source.ranks.includes(dpRank)) return source;
    }
    return undefined;
  }

  private trustChanged(source: EngineSource): void {
    for (const dpRank of source.ranks) {
      const slot = this.router.load.slotOf(source.config.workerId, dpRank);
      if (slot >= 0) this.router.load.setDegraded(slot, this.distrusted(source.config.workerId, dpRank));
    }
  }
}
