/**
 * Routing policies the simulator compares. Each sees what its real counterpart sees:
 *
 * - `round_robin`, `random` (seeded): nothing.
 * - `least_loaded`: its own count of in-flight requests per worker (routed, not
 *   finished); ties broken at random, so no worker is favoured.
 * - `approx_prefix`: SGLang / SMG `cache_aware`, which learns only from its own
 *   decisions (an approximate radix tree per worker, never told about evictions);
 *   defaults are SMG's command-line defaults (see ApproxPrefixConfig).
 * - `kv_aware_model`: kvedge's real router (src/route) told each engine's published
 *   cache contents, both tiers (what an exact event-fed index holds: a step's blocks once
 *   the step has run, without network lag), or for engines without events its own
 *   predictions, deciding by its route policy (ttft by default, or Dynamo's cost) over
 *   its own load bookkeeping.
 *
 * The simulator calls `route` on arrival, `prefillDone` at the first token and
 * `finished` at the end, which is the request lifecycle a router is told about.
 */
import {
  type EngineTimes,
  type Overlaps,
  Router,
  type RoutePolicy,
  type RouteWeights,
  type TtftSettings,
} from "../route";
import { Admission, type AdmissionSettings } from "../route/admission";
import { DEFAULT_PACING, Pacing, type PacingSettings } from "../route/pacing";
import type { PredictAt } from "../route/predictions";
import { WorkerTable } from "../domain/worker-table";
import { DEFAULT_FLEET_PREDICTIONS, PredictedFleet } from "./predicted-fleet";
import { DegradedFleet, type DegradedFallbackMode } from "./degraded-fleet";
import { PairTable } from "../util/tables";
import { createRng, randomInt, type Rng } from "./random";
import type { TimeModel } from "./time-model";

export const POLICY_NAMES = [
  "kv_aware_model",
  "round_robin",
  "random",
  "least_loaded",
  "approx_prefix",
] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

export function isPolicyName(value: string): value is PolicyName {
  return (POLICY_NAMES as readonly string[]).includes(value);
}

/** What a router knows about a request when it routes it. */
export interface RouteQuery {
  readonly id: number;
  readonly promptLength: number;
  /** kvedge sequence hashes of the full prompt blocks, (hi, lo) pairs: computed from tokens. */
  readonly path: Uint32Array;
  readonly promptBlocks: number;
  /** Prompt tokens are [0, promptLength). */
  readonly tokens: Uint32Array;
}

export interface RoutingPolicy {
  readonly name: PolicyName;
  /** Picks a worker for the request and records the decision; -1 = held or rejected (see `takeAnswers`). */
  route(query: RouteQuery, nowMs: number): number;
  /** `cachedTokens`: what the engine served from its cache (its answer's usage says so). */
  prefillDone(id: number, nowMs: number, cachedTokens?: number): void;
  finished(id: number, nowMs: number): void;
  /** Held requests answered since the last call (worker -1 = rejected); admission only. */
  takeAnswers?(): HeldAnswer[];
  /** When a held request reaches the longest hold (Infinity: none held). */
  nextDueMs?(): number;
  /** Answers what is due at `nowMs`. */
  advance?(nowMs: number): void;
}

/** A held request's answer. */
export interface HeldAnswer {
  readonly query: RouteQuery;
  readonly worker: number;
}

/**
 * A worker's cached prefix of a prompt, in blocks, as an index fed by its events knows it
 * (the simulator asks the engine's published view).
 */
export type CacheProbe = (worker: number, query: RouteQuery) => number;
/** The (published) CPU tier's blocks right after the device hit of the worker's last probe. */
export type HostProbe = (worker: number) => number;

/** In-flight requests per worker, as the router counts them. */
class InFlight {
  readonly perWorker: Int32Array;
  private readonly workerOf = new Map<number, number>();

  constructor(workers: number) {
    this.perWorker = new Int32Array(workers);
  }

  add(id: number, worker: number): void {
    if (this.workerOf.has(id)) throw new Error(`request ${id} routed twice`);
    this.workerOf.set(id, worker);
    this.perWorker[worker]!++;
  }

  /** Forgets a finished request; returns its worker. */
  remove(id: number): number {
    const worker = this.workerOf.get(id);
    if (worker === undefined) throw new Error(`request ${id} finished but was never routed`);
    this.workerOf.delete(id);
    this.perWorker[worker]!--;
    return worker;
  }
}

/** argmin of `values` over [0, n), ties broken uniformly at random (reservoir sampling). */
function argminRandomTies(values: ArrayLike<number>, n: number, rng: Rng): number {
  let best = 0;
  let ties = 1;
  for (let w = 1; w < n; w++) {
    const value = values[w]!;
    if (value < values[best]!) {
      best = w;
      ties = 1;
    } else if (value === values[best]! && rng() * ++ties < 1) {
      best = w;
    }
  }
  return best;
}

/** argmin of `values` over [0, n), the first on ties (what `min_by_key` does). */
function argminFirst(values: ArrayLike<number>, n: number): number {
  let best = 0;
  for (let w = 1; w < n; w++) if (values[w]! < values[best]!) best = w;
  return best;
}

class RoundRobin implements RoutingPolicy {
  readonly name = "round_robin";
  private next = 0;
  constructor(private readonly workers: number) {}
  route(): number {
    const worker = this.next;
    this.next = (this.next + 1) % this.workers;
    return worker;
  }
  prefillDone(): void {}
  finished(): void {}
}

class RandomPolicy implements RoutingPolicy {
  readonly name = "random";
  constructor(
    private readonly workers: number,
    private readonly rng: Rng,
  ) {}
  route(): number {
    return randomInt(this.rng, this.workers);
  }
  prefillDone(): void {}
  finished(): void {}
}

class LeastLoaded implements RoutingPolicy {
  readonly name = "least_loaded";
  private readonly inFlight: InFlight;
  constructor(
    private readonly workers: number,
    private readonly rng: Rng,
  ) {
    this.inFlight = new InFlight(workers);
  }
  route(query: RouteQuery): number {
    const worker = argminRandomTies(this.inFlight.perWorker, this.workers, this.rng);
    this.inFlight.add(query.id, worker);
    return worker;
  }
  prefillDone(): void {}
  finished(id: number): void {
    this.inFlight.remove(id);
  }
}

/**
 * SGLang / SMG `cache_aware` (sgl-router `policies/cache_aware.rs`), on a token tree:
 *
 * 1. Imbalanced (max load − min load > balanceAbs AND max > balanceRel × min, load =
 *    in-flight requests at this router): the least loaded worker (first on ties).
 * 2. Else the longest prefix any worker's tree holds; if matched / prompt tokens >
 *    cacheThreshold, the worker holding it (the most recently used one on ties; SGLang
 *    takes an arbitrary map entry), else the worker with the smallest tree.
 * 3. The prompt is inserted into the chosen worker's tree, either way.
 * 4. Every evictionInterval, a tree larger than maxTreeTokens drops least recently
 *    used leaves until it fits.
 *
 * The tree here is a per-worker map from block path hash (16-token pages, as SGLang's
 * gRPC token tree) to a last-use tick; a path is touched leaf first with increasing
 * ticks, so ancestors are always more recent than descendants and removing the oldest
 * ticks removes leaves first, as SGLang's leaf LRU does.
 */
export interface ApproxPrefixConfig {
  readonly cacheThreshold: number;
  readonly balanceAbsThreshold: number;
  readonly balanceRelThreshold: number;
  readonly evictionIntervalMs: number;
  readonly maxTreeTokens: number;
}

/** SMG's command-line defaults (`smg --policy cache_aware`, sglang_router.launch_router). */
export const DEFAULT_APPROX_PREFIX: ApproxPrefixConfig = {
  cacheThreshold: 0.3,
  balanceAbsThreshold: 64,
  balanceRelThreshold: 1.5,
  evictionIntervalMs: 120_000,
  maxTreeTokens: 2 ** 26,
};

class ApproxPrefix implements RoutingPolicy {
  readonly name = "approx_prefix";
  private readonly inFlight: InFlight;
  private readonly trees: PairTable[] = [];
  private readonly treeTokens: Float64Array;
  private tick = 0;
  private nextEvictionMs: number;
  private holders: number[] = [];
  private survivors: number[] = [];

  constructor(
    private readonly workers: number,
    private readonly blockSize: number,
    private readonly config: ApproxPrefixConfig,
  ) {
    this.inFlight = new InFlight(workers);
    for (let w = 0; w < workers; w++) this.trees.push(new PairTable());
    this.treeTokens = new Float64Array(workers);
    this.nextEvictionMs = config.evictionIntervalMs;
  }

  route(query: RouteQuery, nowMs: number): number {
    this.evictDue(nowMs);
    const loads = this.inFlight.perWorker;
    let max = loads[0]!;
    let min = loads[0]!;
    for (let w = 1; w < this.workers; w++) {
      max = Math.max(max, loads[w]!);
      min = Math.min(min, loads[w]!);
    }
    const config = this.config;
    let worker: number;
    if (max - min > config.balanceAbsThreshold && max > config.balanceRelThreshold * min) {
      worker = argminFirst(loads, this.workers);
    } else {
      const matchedBlocks = this.match(query.path, query.promptBlocks);
      const rate = (matchedBlocks * this.blockSize) / query.promptLength;
      worker =
        matchedBlocks > 0 && rate > config.cacheThreshold
          ? this.mostRecentHolder(query.path, matchedBlocks)
          : argminFirst(this.treeTokens, this.workers);
    }
    this.insert(worker, query.path, query.promptBlocks);
    this.inFlight.add(query.id, worker);
    return worker;
  }

  prefillDone(): void {}

  finished(id: number): void {
    this.inFlight.remove(id);
  }

  /** Tree entries of a worker (tests check the bound). */
  treeBlocks(worker: number): number {
    return this.trees[worker]!.size;
  }

  /** Longest prefix, in blocks, that some worker's tree holds; leaves the holders in `holders`. */
  private match(path: Uint32Array, blocks: number): number {
    let holders = this.holders;
    holders.length = 0;
    if (blocks === 0) return 0;
    for (let w = 0; w < this.workers; w++)
      if (this.trees[w]!.has(path[0]!, path[1]!)) holders.push(w);
    let depth = holders.length > 0 ? 1 : 0;
    let survivors = this.survivors;
    while (depth < blocks && holders.length > 0) {
      const hi = path[2 * depth]!;
      const lo = path[2 * depth + 1]!;
      survivors.length = 0;
      for (const w of holders) if (this.trees[w]!.has(hi, lo)) survivors.push(w);
      if (survivors.length === 0) break;
      [holders, survivors] = [survivors, holders];
      depth++;
    }
    this.holders = holders;
    this.survivors = survivors;
    return depth;
  }

  private mostRecentHolder(path: Uint32Array, depth: number): number {
    const hi = path[2 * depth - 2]!;
    const lo = path[2 * depth - 1]!;
    let best = this.holders[0]!;
    for (const w of this.holders)
      if (this.trees[w]!.get(hi, lo) > this.trees[best]!.get(hi, lo)) best = w;
    return best;
  }

  private insert(worker: number, path: Uint32Array, blocks: number): void {
    const tree = this.trees[worker]!;
    for (let i = blocks - 1; i >= 0; i--) {
      if (tree.set(path[2 * i]!, path[2 * i + 1]!, this.nextTick()))
        this.treeTokens[worker]! += this.blockSize;
    }
  }

  private evictDue(nowMs: number): void {
    if (nowMs < this.nextEvictionMs) return;
    this.nextEvictionMs = nowMs + this.config.evictionIntervalMs;
    const limitBlocks = Math.floor(this.config.maxTreeTokens / this.blockSize);
    for (let w = 0; w < this.workers; w++) {
      const tree = this.trees[w]!;
      const excess = tree.size - limitBlocks;
      if (excess <= 0) continue;
      // Ticks are unique, so the `excess` oldest entries are those at or below the
      // excess-th smallest tick.
      const ticks = new Float64Array(tree.size);
      let n = 0;
      tree.forEach((_hi, _lo, tick) => {
        ticks[n++] = tick;
      });
      ticks.sort();
      const cutoff = ticks[excess - 1]!;
      const doomed: number[] = [];
      tree.forEach((hi, lo, tick) => {
        if (tick <= cutoff) doomed.push(hi, lo);
      });
      for (let i = 0; i < doomed.length; i += 2) tree.delete(doomed[i]!, doomed[i + 1]!);
      this.treeTokens[w] = tree.size * this.blockSize;
    }
  }

  private nextTick(): number {
    if (this.tick === 0xffff_ffff) throw new Error("approx_prefix tick counter exhausted");
    return ++this.tick;
  }
}

/**
 * kvedge's router (src/route) in-process: the real `Router`, told each engine's published
 * cached prefix (both tiers) as the overlaps an exact index without network lag would
 * report, and the request lifecycle at the engine's modeled moments, on the simulator's
 * clock.
 */
export interface KvAwareConfig {
  readonly policy: RoutePolicy;
  readonly weights?: Partial<RouteWeights>;
  readonly ttft?: Partial<TtftSettings>;
  /** Learn each engine's prefill speed and step cost from lifecycle timings. */
  readonly calibrate?: boolean;
  /** Count active requests' blocks as cached for requests sharing them (default on; RouterOptions.pendingCredit). */
  readonly pendingCredit?: boolean;
  /** RouterOptions.pendingRecomputeWeight. */
  readonly pendingRecomputeWeight?: number;
  /** Hold or reject requests at saturation (src/route/admission.ts); off by default. */
  readonly admission?: Partial<AdmissionSettings>;
  /** Send each engine few prefills at a time (src/route/pacing.ts); off by default. */
  readonly pacing?: Partial<PacingSettings>;
  /**
   * The engines' true constants: when given, every decision is also checked against
   * the cheapest workers under them on the same state (`KvAwareModel.agreed`).
   */
  readonly reference?: EngineTimes;
  /**
   * Engines that publish no KV events: kvedge predicts their caches from its own
   * decisions into a real index (src/route/predictions.ts), and routes on that.
   */
  readonly approximate?: readonly number[];
  readonly predictions?: {
    /** Capacity of an approximate worker, blocks (null: unknown, TTL). */
    readonly capacityBlocks?: number | null;
    readonly predictAt?: PredictAt;
    readonly ttlMs?: number;
    /** Correct predictions by the cached tokens each engine reports at the first token (the proxy reads them from usage). */
    readonly correct?: boolean;
  };
  /**
   * What a degraded engine (its event stream cut, ./lost-streams.ts) is routed on
   * (route.degraded_fallback): predictions (default) or its discounted overlap only.
   */
  readonly degradedFallback?: DegradedFallbackMode;
  /** Route on the engines' CPU tiers too (default true); false: the device tier only. */
  readonly lowerTiers?: boolean;
  /**
   * Several routers deciding as replicas (./replicas.ts): request i goes to router
   * i mod replicas, its lifecycle calls too. Default 1.
   */
  readonly replicas?: number;
  /** With replicas: each router applies its peers' facts this many ms late; null = never (no bus). */
  readonly syncDelayMs?: number | null;
  /** With replicas: replica k answers each route k × this many ms late (cluster.stagger_ms). */
  readonly staggerMs?: number;
}

export const DEFAULT_KV_AWARE: KvAwareConfig = { policy: "ttft" };

/** What the router is told each decision: per worker, the blocks each tier holds. */
interface ProbedOverlaps {
  count: number;
  slots: Int32Array;
  blocks: Float64Array;
  host?: Float64Array;
  disk?: Float64Array;
  external?: Float64Array;
}

/** Overlaps for the workers `slots`, with the lower tiers' arrays when they are probed. */
function probedOverlaps(slots: Int32Array, tiers: boolean): ProbedOverlaps {
  const n = slots.length;
  const overlaps: ProbedOverlaps = { count: n, slots, blocks: new Float64Array(n) };
  if (tiers) {
    overlaps.host = new Float64Array(n);
    overlaps.disk = new Float64Array(n);
    overlaps.external = new Float64Array(n);
  }
  return overlaps;
}

/** Longer than any replay: requests end by `done`, never by expiry. */
const SIM_REQUEST_TTL_MS = 1e15;

/** What kv_aware_model is told of the engines besides their device caches. */
export interface ModelProbes {
  /** The CPU tiers after each probe (none: the device only). */
  readonly host?: HostProbe;
  /** Whether kvedge holds an engine degraded (its events lost) at a time (none: never). */
  readonly degraded?: (worker: number, nowMs: number) => boolean;
}

export class KvAwareModel implements RoutingPolicy {
  readonly name = "kv_aware_model";
  readonly router: Router;
  /** Null when admission is off. */
  readonly admission: Admission<RouteQuery> | null;
  readonly pacing: Pacing<RouteQuery>;
  private nowMs = 0;
  private readonly slots: Int32Array;
  private readonly overlaps: ProbedOverlaps;
  private readonly hostProbe: HostProbe | null;
  private answers: HeldAnswer[] = [];
  /** With pacing: each routed request's worker, until it finishes. */
  private readonly workerOf = new Map<number, number>();
  private readonly reference: EngineTimes | null;
  /** Per decision (with `reference`): 1 if the pick is cheapest under the true constants too. */
  readonly agreed: number[] = [];
  /** The engines that publish no events, predicted (null: every engine is exact). */
  readonly fleet: PredictedFleet | null;
  /** The engines kvedge holds degraded (null: none can be). */
  readonly degraded: DegradedFleet | null;

  constructor(
    workers: number,
    blockSize: number,
    private readonly probe: CacheProbe,
    config: KvAwareConfig,
    rng: Rng,
    probes: ModelProbes = {},
  ) {
    const table = new WorkerTable();
    this.router = new Router({
      blockSize,
      workers: table,
      requestTtlMs: SIM_REQUEST_TTL_MS,
      now: () => this.nowMs,
      random: rng,
      policy: config.policy,
      calibrate: config.calibrate === true,
      pendingCredit: config.pendingCredit ?? true,
      ...(config.pendingRecomputeWeight === undefined
        ? {}
        : { pendingRecomputeWeight: config.pendingRecomputeWeight }),
      ...(config.weights === undefined ? {} : { weights: config.weights }),
      ...(config.ttft === undefined ? {} : { ttft: config.ttft }),
    });
    this.reference = config.reference ?? null;
    this.slots = new Int32Array(workers);
    for (let w = 0; w < workers; w++) this.slots[w] = table.acquire(BigInt(w), 0);
    const approximate = config.approximate ?? [];
    const predictions = { ...DEFAULT_FLEET_PREDICTIONS, ...config.predictions, blockSize };
    const [now, slots] = [() => this.nowMs, this.slots];
    const fleet = { ...predictions, approximate, slots, now };
    this.fleet =
      approximate.length === 0 ? null : new PredictedFleet(this.router.load, table, fleet);
    this.degraded =
      probes.degraded === undefined
        ? null
        : new DegradedFleet(this.router, table, slots, probes.degraded, {
            ...predictions,
            fallback: config.degradedFallback !== "discount",
            approximate: (w) => this.fleet?.isApproximate(w) === true,
            now,
          });
    this.hostProbe = config.lowerTiers === false ? null : (probes.host ?? null);
    this.overlaps = probedOverlaps(this.slots, this.hostProbe !== null);
    this.admission = this.createAdmission(config.admission);
    this.pacing = this.createPacing(config.pacing);
  }

  route(query: RouteQuery, nowMs: number): number {
    this.nowMs = nowMs;
    if (this.admission === null) return this.place(query);
    const { waitMs, prefillMs } = this.router.assess(this.request(query), this.probed(query));
    this.admission.submit(query, waitMs, prefillMs);
    // Routed at once: its answer is this call's, not a held one's.
    const last = this.answers[this.answers.length - 1];
    if (last !== undefined && last.query === query && last.worker >= 0) {
      this.answers.pop();
      return last.worker;
    }
    return -1;
  }

  prefillDone(id: number, nowMs: number, cachedTokens?: number): void {
    this.nowMs = nowMs;
    if (this.router.load.prefillDone(String(id)) !== "ok")
      throw new Error(`prefill of request ${id} that was never routed`);
    this.fleet?.prefillDone(id, cachedTokens);
    this.degraded?.prefillDone(id, cachedTokens);
    this.pacing.release();
    this.admission?.release();
  }

  finished(id: number, nowMs: number): void {
    this.nowMs = nowMs;
    if (this.router.load.done(String(id)) !== "ok")
      throw new Error(`request ${id} finished but was never routed`);
    this.fleet?.done(id);
    this.degraded?.done(id);
    this.workerOf.delete(id);
    this.pacing.release();
    this.admission?.release();
  }

  takeAnswers(): HeldAnswer[] {
    const answers = this.answers;
    if (answers.length > 0) this.answers = [];
    return answers;
  }

  /** `Router.margin` for the query now: small when its decision is contested. */
  margin(query: RouteQuery, nowMs: number): number {
    this.nowMs = nowMs;
    return this.router.margin(this.request(query), this.probed(query));
  }

  nextDueMs(): number {
    return Math.min(this.admission?.nextDueMs() ?? Infinity, this.pacing.nextDueMs());
  }

  advance(nowMs: number): void {
    this.nowMs = nowMs;
    this.pacing.release();
    this.admission?.release();
  }

  /** Null when off: requests are routed at once. */
  private createAdmission(
    settings: Partial<AdmissionSettings> | undefined,
  ): Admission<RouteQuery> | null {
    if (settings?.mode === undefined || settings.mode === "off") return null;
    const port = {
      waitMs: (query: RouteQuery) =>
        this.router.assess(this.request(query), this.probed(query)).waitMs,
      route: (query: RouteQuery) => {
        const worker = this.place(query);
        if (worker >= 0) this.answer(query, worker);
      },
      reject: (query: RouteQuery) => this.answer(query, -1),
    };
    return new Admission<RouteQuery>(settings, port, () => this.nowMs);
  }

  private createPacing(settings: Partial<PacingSettings> | undefined): Pacing<RouteQuery> {
    const pacing = new Pacing<RouteQuery>(
      { ...DEFAULT_PACING, stepTokens: this.router.ttft.maxBatchedTokens, ...settings },
      {
        prefillTokens: (id) => this.router.load.prefillTokensOf(id),
        send: (query) => this.answer(query, this.workerOf.get(query.id)!),
      },
      () => this.nowMs,
    );
    if (pacing.enabled) this.router.paced = pacing;
    return pacing;
  }

  /** Decides now; the worker, or -1 while pacing holds the request back (answered when sent). */
  private place(query: RouteQuery): number {
    const worker = this.decide(query);
    if (!this.pacing.enabled) return worker;
    this.workerOf.set(query.id, worker);
    return this.pacing.submit(query, String(query.id), this.slots[worker]!) ? worker : -1;
  }

  private answer(query: RouteQuery, worker: number): void {
    this.answers.push({ query, worker });
  }

  private decide(query: RouteQuery): number {
    const request = this.request(query);
    const overlaps = this.probed(query);
    const reference = this.reference;
    const router = this.router;
    const truth = reference === null ? null : router.cheapestUnder(request, overlaps, reference);
    const decision = this.router.route(request, overlaps);
    if (truth !== null) this.agreed.push(truth.includes(decision.slot) ? 1 : 0);
    const fleet = this.fleet;
    if (fleet !== null) {
      const local = fleet.localHashes(query.tokens, query.promptLength);
      fleet.routed(query.id, decision, local, query.path, query.promptBlocks, query.promptLength);
    }
    this.degraded?.routed(query, decision);
    return Number(decision.workerId);
  }

  private request(query: RouteQuery) {
    return {
      chain: query.path,
      blockCount: query.promptBlocks,
      tokenCount: query.promptLength,
      requestId: String(query.id),
    };
  }

  /**
   * Each exact engine's published cached prefix of the query and its CPU tier's blocks
   * after it, as an index fed by its events reports them (no network lag), and each
   * approximate engine's predicted prefix (the device tier only).
   */
  private probed(query: RouteQuery): Overlaps {
    const { blocks, host } = this.overlaps;
    const hostProbe = this.hostProbe;
    const fleet = this.fleet;
    for (let w = 0; w < this.slots.length; w++) {
      const exact = fleet === null || !fleet.isApproximate(w);
      if (exact) blocks[w] = this.probe(w, query);
      if (hostProbe !== null) host![w] = exact ? hostProbe(w) : 0;
    }
    if (fleet !== null) {
      const local = fleet.localHashes(query.tokens, query.promptLength);
      fleet.overlaps(local, query.path, query.promptBlocks, blocks);
    }
    return this.degraded?.overlaps(query, this.nowMs, this.overlaps) ?? this.overlaps;
  }
}

export interface PolicyOptions {
  readonly workers: number;
  readonly blockSize: number;
  readonly seed: number;
  /** Needed by kv_aware_model only. */
  readonly probe?: CacheProbe;
  /** kv_aware_model: the engines' CPU tiers after each probe (none: the device only). */
  readonly hostProbe?: HostProbe;
  /** kv_aware_model: whether kvedge holds an engine degraded (its events lost) at a time; default never. */
  readonly degraded?: (worker: number, nowMs: number) => boolean;
  readonly approxPrefix?: ApproxPrefixConfig;
  readonly kvAware?: KvAwareConfig;
  /** The engines' speed: what kv_aware_model's router assumes unless `kvAware.ttft` says otherwise. */
  readonly time?: TimeModel;
}

export function createPolicy(name: PolicyName, options: PolicyOptions): RoutingPolicy {
  const { workers, blockSize } = options;
  const rng = createRng(options.seed ^ 0x5eed_0001);
  switch (name) {
    case "round_robin":
      return new RoundRobin(workers);
    case "random":
      return new RandomPolicy(workers, rng);
    case "least_loaded":
      return new LeastLoaded(workers, rng);
    case "approx_prefix":
      return new ApproxPrefix(workers, blockSize, options.approxPrefix ?? DEFAULT_APPROX_PREFIX);
    case "kv_aware_model": {
      if (options.probe === undefined) throw new Error("kv_aware_model needs a cache probe");
      const config = options.kvAware ?? DEFAULT_KV_AWARE;
      const ttft = { ...engineConstants(options.time), ...config.ttft };
      const probes: ModelProbes = {
        ...(options.hostProbe === undefined ? {} : { host: options.hostProbe }),
        ...(options.degraded === undefined ? {} : { degraded: options.degraded }),
      };
      return new KvAwareModel(workers, blockSize, options.probe, { ...config, ttft }, rng, probes);
    }
  }
}

/** Only the constants a router's time model takes (a sim TimeModel has more). */
function engineConstants(time: TimeModel | undefined): Partial<TtftSettings> {
  if (time === undefined) return {};
  const { prefillTokensPerSecond, stepBaseMs, kvReadMsPerMillionTokens, maxBatchedTokens } = time;
  const hostReload = time.hostReloadMsPerMillionTokens;
  return {
    prefillTokensPerSecond,
    stepBaseMs,
    kvReadMsPerMillionTokens,
    maxBatchedTokens,
    ...(hostReload === undefined ? {} : { hostReloadMsPerMillionTokens: hostReload }),
  };
}
