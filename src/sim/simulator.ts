/**
 * Discrete-event replay of a trace over N mock engines under one routing policy, in
 * virtual time: deterministic for a given seed, and as fast as the cache bookkeeping
 * allows (no clock, no sockets). What is reported is described in ./outcome.ts.
 *
 * Order of events: at equal times, engine step ends (engines in index order) come
 * before arrivals, so a router sees every completion that happened up to the instant
 * it routes. The real-time replay (./realtime.ts) keeps the same order.
 */
import { blockCount, chainHashes, DEFAULT_SEED, hashBlocks } from "../hash";
import { DEFAULT_BLOCK_SIZE, EngineCache, type KvEventBatch } from "./engine-cache";
import { MockEngine } from "./engine";
import {
  createPolicy,
  type ApproxPrefixConfig,
  type KvAwareConfig,
  type KvAwareModel,
  type PolicyName,
  type PolicyOptions,
  type RouteQuery,
  type RoutingPolicy,
} from "./policies";
import { LostStreams, type StreamCut } from "./lost-streams";
import { ReplicatedKvAware } from "./replicas";
import { RunRecorder, percentile, type PolicyReport } from "./outcome";
import { createRng, randomU64 } from "./random";
import { DEFAULT_TIME_MODEL, checkTimeModel, type TimeModel } from "./time-model";
import { DEFAULT_VOCAB_SIZE, writeOutputTokens, writePromptTokens } from "./tokens";
import { requestIds, type Trace } from "./trace";
import { VERIFY } from "../util/verify";

export interface SimOptions {
  readonly policy: PolicyName;
  readonly workers?: number;
  /** KV capacity of each engine, in blocks of `blockSize` tokens. */
  readonly capacityBlocks?: number;
  /** Each engine's CPU offload tier, in blocks (0 or absent: none). */
  readonly cpuCapacityBlocks?: number;
  readonly blockSize?: number;
  readonly time?: TimeModel;
  readonly seed?: number;
  readonly vocabSize?: number;
  readonly approxPrefix?: ApproxPrefixConfig;
  readonly kvAware?: KvAwareConfig;
  /** Engines whose event streams are cut (kvedge's index of them loses a window; ./lost-streams.ts). */
  readonly streamCut?: StreamCut;
  /** Receives every engine's KV event batches in order (off: events are not built). */
  readonly onBatch?: (worker: number, batch: KvEventBatch) => void;
  /** Told each decision: request index and worker (bench/burst.ts counts workers per prefix). */
  readonly onRouted?: (request: number, worker: number) => void;
  /** Called with the policy once the replay ends (to read what it learned). */
  readonly onFinish?: (policy: RoutingPolicy) => void;
  /** Called with the engines once the replay ends (to compare their caches with an index). */
  readonly onEngines?: (engines: readonly MockEngine[]) => void;
  /** Run the O(capacity) cache consistency checks at the end (default: KVEDGE_VERIFY=1). */
  readonly verify?: boolean;
}

export const DEFAULT_WORKERS = 8;
export const DEFAULT_CAPACITY_BLOCKS = 16_384;
export const DEFAULT_SEED_VALUE = 42;
/** Bound on engines (policies scan every worker per request). */
export const WORKERS_MAX = 4096;

/** One policy's replay: see ./outcome.ts. */
export type SimResult = PolicyReport;

export { percentile };

/** Prompt ‖ output tokens of trace request i. */
export function requestTokens(trace: Trace, i: number, vocabSize: number): Uint32Array {
  const input = trace.inputLength[i]!;
  const tokens = new Uint32Array(input + trace.outputLength[i]!);
  writePromptTokens(requestIds(trace, i), trace.blockTokens, input, vocabSize, tokens);
  writeOutputTokens(i, trace.outputLength[i]!, vocabSize, tokens, input);
  return tokens;
}

/** What a router is given for request `id`: its prompt and the prompt's kvedge path hashes. */
export function routeQuery(
  id: number,
  tokens: Uint32Array,
  promptLength: number,
  blockSize: number,
): RouteQuery {
  const prompt = tokens.subarray(0, promptLength);
  const promptBlocks = blockCount(promptLength, blockSize);
  const path = new Uint32Array(2 * promptBlocks);
  hashBlocks(prompt, blockSize, DEFAULT_SEED, path);
  chainHashes(path, promptBlocks, path);
  return { id, promptLength, path, promptBlocks, tokens };
}

/**
 * The policy of a replay: with kvAware.replicas > 1, kvedge's router as that many
 * replicas (./replicas.ts), each seeded apart (replica 0 as a lone router).
 */
function createRouting(name: PolicyName, options: PolicyOptions): RoutingPolicy {
  const replicas = options.kvAware?.replicas ?? 1;
  if (name !== "kv_aware_model" || replicas <= 1) return createPolicy(name, options);
  const models = Array.from(
    { length: replicas },
    (_, i) => createPolicy(name, { ...options, seed: options.seed + i }) as KvAwareModel,
  );
  return new ReplicatedKvAware(models, {
    syncDelayMs: options.kvAware?.syncDelayMs ?? null,
    staggerMs: options.kvAware?.staggerMs ?? 0,
  });
}

function checkOptions(options: SimOptions): void {
  const workers = options.workers ?? DEFAULT_WORKERS;
  if (!Number.isSafeInteger(workers) || workers < 1 || workers > WORKERS_MAX) {
    throw new RangeError(`workers must be an integer in [1, ${WORKERS_MAX}], got ${workers}`);
  }
  checkTimeModel(options.time ?? DEFAULT_TIME_MODEL);
}

/** Replays `trace` under `options.policy` and reports what happened. */
export function simulate(trace: Trace, options: SimOptions): SimResult {
  checkOptions(options);
  const workers = options.workers ?? DEFAULT_WORKERS;
  const capacity = options.capacityBlocks ?? DEFAULT_CAPACITY_BLOCKS;
  const blockSize = options.blockSize ?? DEFAULT_BLOCK_SIZE;
  const time = options.time ?? DEFAULT_TIME_MODEL;
  const seed = options.seed ?? DEFAULT_SEED_VALUE;
  const vocabSize = options.vocabSize ?? DEFAULT_VOCAB_SIZE;
  const onBatch = options.onBatch;
  const engines: MockEngine[] = [];
  const lost = options.streamCut === undefined ? null : new LostStreams(options.streamCut, workers);
  const hostProbe = (worker: number) => engines[worker]!.cache.lastHostBlocks;
  const policy = createRouting(options.policy, {
    workers,
    blockSize,
    seed,
    approxPrefix: options.approxPrefix,
    kvAware: options.kvAware,
    time,
    ...probesOf(engines, lost),
    ...((options.cpuCapacityBlocks ?? 0) > 0 ? { hostProbe } : {}),
  });
  const recorder = new RunRecorder(trace, {
    prefillDone: (request, nowMs, cachedTokens) =>
      policy.prefillDone(request.id, nowMs, cachedTokens),
    finished: (request, nowMs) => policy.finished(request.id, nowMs),
  });
  engines.push(...makeEngines(options, capacity, blockSize, seed, recorder, lost));
  const flush = flusher(engines, lost, onBatch);

  // Held requests (admission) answered by a step's lifecycle calls or by the longest hold.
  const dispatch = (nowMs: number): void =>
    dispatchHeld(policy, engines, recorder, nowMs, flush, options.onRouted);
  for (let next = 0; ; ) {
    const engineIndex = nextEngine(engines);
    const engineMs = engineIndex < 0 ? Infinity : engines[engineIndex]!.nextEventMs();
    const arrivalMs = next < trace.count ? trace.arrivalMs[next]! : Infinity;
    const heldMs = policy.nextDueMs?.() ?? Infinity;
    if (heldMs <= engineMs && heldMs <= arrivalMs && heldMs < Infinity) {
      policy.advance!(heldMs);
      dispatch(heldMs);
    } else if (engineIndex >= 0 && engineMs <= arrivalMs) {
      const nowMs = engines[engineIndex]!.step();
      flush(engineIndex, nowMs);
      dispatch(nowMs);
    } else if (next < trace.count) {
      const tokens = requestTokens(trace, next, vocabSize);
      const query = routeQuery(next, tokens, trace.inputLength[next]!, blockSize);
      const worker = policy.route(query, arrivalMs);
      if (worker >= 0) {
        options.onRouted?.(next, worker);
        checkWorker(policy, worker, workers);
        submit(engines[worker]!, recorder, query, worker, arrivalMs, () =>
          policy.finished(query.id, arrivalMs),
        );
        flush(worker, arrivalMs);
      }
      dispatch(arrivalMs);
      next++;
    } else {
      break;
    }
  }
  options.onFinish?.(policy);
  options.onEngines?.(engines);
  return recorder.report(options.policy, engines, options.verify ?? VERIFY);
}

/** The engine whose step ends first (the lowest index on ties), or -1 when all are idle. */
function nextEngine(engines: readonly MockEngine[]): number {
  let index = -1;
  let ms = Infinity;
  for (let w = 0; w < engines.length; w++) {
    const due = engines[w]!.nextEventMs();
    if (due < ms) {
      ms = due;
      index = w;
    }
  }
  return index;
}

/** The run's engines, their hash seeds from `seed` (the same for every run with it). */
/** Takes an engine's batch after a step to whoever wants it: the caller, a cut stream's model. */
function flusher(
  engines: readonly MockEngine[],
  lost: LostStreams | null,
  onBatch: SimOptions["onBatch"],
): (worker: number, nowMs: number) => void {
  return (worker, nowMs) => {
    if (onBatch === undefined && lost?.isCut(worker) !== true) return;
    const batch = engines[worker]!.takeBatch(nowMs);
    if (batch === null) return;
    lost?.batch(worker, nowMs, batch.events);
    onBatch?.(worker, batch);
  };
}

/**
 * What kvedge's router is told of each engine: its published view, or for an engine
 * whose stream is cut, what an index that lost the cut holds, and that it is degraded.
 */
function probesOf(engines: readonly MockEngine[], lost: LostStreams | null) {
  const probe = (worker: number, query: RouteQuery): number => {
    const cache = engines[worker]!.cache;
    return lost?.isCut(worker) === true
      ? lost.prefixBlocks(cache, worker, query.tokens, query.promptLength)
      : cache.visiblePrefixBlocks(query.tokens, query.promptLength);
  };
  if (lost === null) return { probe };
  return { probe, degraded: (worker: number, nowMs: number) => lost.isDegraded(worker, nowMs) };
}

function makeEngines(
  options: SimOptions,
  capacity: number,
  blockSize: number,
  seed: number,
  recorder: RunRecorder,
  lost: LostStreams | null,
): MockEngine[] {
  const workers = options.workers ?? DEFAULT_WORKERS;
  const seeds = engineSeeds(seed, workers);
  return seeds.map((hashSeed, w) => {
    const cache = new EngineCache({
      capacityBlocks: capacity,
      blockSize,
      hashSeed,
      recordEvents: options.onBatch !== undefined || lost?.isCut(w) === true,
      cpuCapacityBlocks: options.cpuCapacityBlocks ?? 0,
    });
    return new MockEngine(w, cache, options.time ?? DEFAULT_TIME_MODEL, recorder.listener);
  });
}

/** Submits the held requests the policy answered (worker -1: refused) at `nowMs`. */
function dispatchHeld(
  policy: RoutingPolicy,
  engines: MockEngine[],
  recorder: RunRecorder,
  nowMs: number,
  flush: (worker: number, nowMs: number) => void,
  onRouted: ((request: number, worker: number) => void) | undefined,
): void {
  for (const { query, worker } of policy.takeAnswers?.() ?? []) {
    if (worker < 0) {
      recorder.rejectedAt(nowMs);
      continue;
    }
    onRouted?.(query.id, worker);
    checkWorker(policy, worker, engines.length);
    submit(engines[worker]!, recorder, query, worker, nowMs, () =>
      policy.finished(query.id, nowMs),
    );
    flush(worker, nowMs);
  }
}

function checkWorker(policy: RoutingPolicy, worker: number, workers: number): void {
  if (!Number.isInteger(worker) || worker < 0 || worker >= workers)
    throw new Error(`policy ${policy.name} chose worker ${worker}`);
}

/** Per-engine hash seeds, the same for every run with the same seed. */
export function engineSeeds(seed: number, workers: number): bigint[] {
  const rng = createRng(seed);
  return Array.from({ length: workers }, () => randomU64(rng));
}

/**
 * Hands a routed request to its engine and records the decision; a request the engine
 * rejects (larger than its cache) is counted and `onReject` tells the router it ended.
 */
export function submit(
  engine: MockEngine,
  recorder: RunRecorder,
  query: RouteQuery,
  worker: number,
  nowMs: number,
  onReject: () => void,
): void {
  recorder.routed(query.id, worker);
  if (
    !engine.submit({ id: query.id, tokens: query.tokens, promptLength: query.promptLength }, nowMs)
  ) {
    recorder.rejectedAt(nowMs);
    onReject();
  }
}
