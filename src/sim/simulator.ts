/**
 * Discrete-event replay of a trace over N mock engines under one routing policy, in
 * virtual time: deterministic for a given seed, and as fast as the cache bookkeeping
 * allows (no clock, no sockets).
 *
 * Order of events: at equal times, engine events (finishes, then prefill ends; engines
 * in index order) come before arrivals, so a router sees every completion that
 * happened up to the instant it routes.
 *
 * Reported per run:
 * - hit_rate = prompt tokens served from cache / prompt tokens (admitted requests);
 * - prefill_tokens = prompt tokens computed (the work routing tries to save);
 * - TTFT p50 / p99 / mean in model ms (arrival → first token: queueing + prefill);
 * - load_spread = max / mean over workers of prefill tokens computed (1 = perfectly
 *   even work; 8 with 8 workers = one worker did everything);
 * - per-worker requests and prefill tokens, evictions, rejections, makespan.
 */
import { blockCount, chainHashes, DEFAULT_SEED, hashBlocks } from "../hash";
import { DEFAULT_BLOCK_SIZE, EngineCache, type KvEventBatch } from "./engine-cache";
import { MockEngine, type EngineRequest } from "./engine";
import {
  createPolicy, type ApproxPrefixConfig, type KvAwareConfig, type PolicyName, type RouteQuery,
} from "./policies";
import { createRng, randomU64 } from "./random";
import { DEFAULT_TIME_MODEL, checkTimeModel, type TimeModel } from "./time-model";
import { DEFAULT_VOCAB_SIZE, writeOutputTokens, writePromptTokens } from "./tokens";
import { requestIds, type Trace } from "./trace";

export interface SimOptions {
  readonly policy: PolicyName;
  readonly workers?: number;
  /** KV capacity of each engine, in blocks of `blockSize` tokens. */
  readonly capacityBlocks?: number;
  readonly blockSize?: number;
  readonly time?: TimeModel;
  readonly seed?: number;
  readonly vocabSize?: number;
  readonly approxPrefix?: ApproxPrefixConfig;
  readonly kvAware?: KvAwareConfig;
  /** Receives every engine's KV event batches in order (off: events are not built). */
  readonly onBatch?: (worker: number, batch: KvEventBatch) => void;
  /** Run the O(capacity) cache consistency checks at the end (default: KVEDGE_VERIFY=1). */
  readonly verify?: boolean;
}

export const DEFAULT_WORKERS = 8;
export const DEFAULT_CAPACITY_BLOCKS = 16_384;
export const DEFAULT_SEED_VALUE = 42;
/** Bound on engines (policies scan every worker per request). */
export const WORKERS_MAX = 4096;

export interface SimResult {
  readonly policy: PolicyName;
  readonly workers: number;
  readonly capacity_blocks: number;
  readonly requests: number;
  readonly completed: number;
  /** Requests larger than an engine's whole cache. */
  readonly rejected: number;
  readonly prompt_tokens: number;
  readonly cached_tokens: number;
  readonly hit_rate: number;
  readonly prefill_tokens: number;
  readonly ttft_p50_ms: number;
  readonly ttft_p99_ms: number;
  readonly ttft_mean_ms: number;
  readonly load_spread: number;
  readonly worker_requests: number[];
  readonly worker_prefill_tokens: number[];
  /** Blocks in each engine's prefix cache at the end. */
  readonly worker_cached_blocks: number[];
  readonly evicted_blocks: number;
  /** Admission attempts that waited for free KV blocks. */
  readonly blocked_admissions: number;
  /** Model ms from the first arrival to the last finish. */
  readonly makespan_ms: number;
}

interface SimState {
  readonly trace: Trace;
  readonly ttftMs: Float64Array;
  readonly workerOf: Int32Array;
  completed: number;
  rejected: number;
}

/** Nearest-rank percentile of sorted values (NaN when empty). */
export function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil(p * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

/** Prompt ‖ output tokens of trace request i. */
export function requestTokens(trace: Trace, i: number, vocabSize: number): Uint32Array {
  const input = trace.inputLength[i]!;
  const tokens = new Uint32Array(input + trace.outputLength[i]!);
  writePromptTokens(requestIds(trace, i), trace.blockTokens, input, vocabSize, tokens);
  writeOutputTokens(i, trace.outputLength[i]!, vocabSize, tokens, input);
  return tokens;
}

function routeQuery(id: number, tokens: Uint32Array, promptLength: number, blockSize: number): RouteQuery {
  const prompt = tokens.subarray(0, promptLength);
  const promptBlocks = blockCount(promptLength, blockSize);
  const path = new Uint32Array(2 * promptBlocks);
  hashBlocks(prompt, blockSize, DEFAULT_SEED, path);
  chainHashes(path, promptBlocks, path);
  return { id, promptLength, path, promptBlocks, tokens };
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
  const state: SimState = {
    trace, ttftMs: new Float64Array(trace.count).fill(Number.NaN), workerOf: new Int32Array(trace.count).fill(-1),
    completed: 0, rejected: 0,
  };
  const seeds = createRng(seed);
  const engines: MockEngine[] = [];
  const policy = createPolicy(options.policy, {
    workers, blockSize, seed, approxPrefix: options.approxPrefix, kvAware: options.kvAware,
    probe: (worker, query) => engines[worker]!.cache.cachedPrefixBlocks(query.tokens, query.promptLength),
  });
  const listener = {
    prefillDone(request: EngineRequest, nowMs: number): void {
      state.ttftMs[request.id] = nowMs - trace.arrivalMs[request.id]!;
      policy.prefillDone(request.id, nowMs);
    },
    finished(request: EngineRequest, nowMs: number): void {
      state.completed++;
      policy.finished(request.id, nowMs);
    },
  };
  for (let w = 0; w < workers; w++) {
    const cache = new EngineCache({
      capacityBlocks: capacity, blockSize, hashSeed: randomU64(seeds), recordEvents: onBatch !== undefined,
    });
    engines.push(new MockEngine(w, cache, time, listener));
  }
  const flush = (worker: number, nowMs: number): void => {
    if (onBatch === undefined) return;
    const batch = engines[worker]!.takeBatch(nowMs);
    if (batch !== null) onBatch(worker, batch);
  };

  let lastMs = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  for (let next = 0; ;) {
    let engineIndex = -1;
    let engineMs = Infinity;
    for (let w = 0; w < workers; w++) {
      const due = engines[w]!.nextEventMs();
      if (due < engineMs) {
        engineMs = due;
        engineIndex = w;
      }
    }
    const arrivalMs = next < trace.count ? trace.arrivalMs[next]! : Infinity;
    if (engineIndex >= 0 && engineMs <= arrivalMs) {
      lastMs = engines[engineIndex]!.step();
      flush(engineIndex, lastMs);
    } else if (next < trace.count) {
      arrive(state, next, arrivalMs, { engines, policy, blockSize, vocabSize });
      flush(state.workerOf[next]!, arrivalMs);
      lastMs = Math.max(lastMs, arrivalMs);
      next++;
    } else {
      break;
    }
  }
  return report(state, engines, options.policy, capacity, lastMs, options.verify ?? process.env.KVEDGE_VERIFY === "1");
}

interface ArriveContext {
  readonly engines: readonly MockEngine[];
  readonly policy: ReturnType<typeof createPolicy>;
  readonly blockSize: number;
  readonly vocabSize: number;
}

function arrive(state: SimState, i: number, nowMs: number, context: ArriveContext): void {
  const { trace } = state;
  const tokens = requestTokens(trace, i, context.vocabSize);
  const promptLength = trace.inputLength[i]!;
  const query = routeQuery(i, tokens, promptLength, context.blockSize);
  const worker = context.policy.route(query, nowMs);
  if (!Number.isInteger(worker) || worker < 0 || worker >= context.engines.length) {
    throw new Error(`policy ${context.policy.name} chose worker ${worker}`);
  }
  state.workerOf[i] = worker;
  if (!context.engines[worker]!.submit({ id: i, tokens, promptLength }, nowMs)) {
    state.rejected++;
    context.policy.finished(i, nowMs);
  }
}

function report(
  state: SimState, engines: readonly MockEngine[], policy: PolicyName, capacity: number, lastMs: number,
  verify: boolean,
): SimResult {
  const { trace } = state;
  let promptTokens = 0;
  let cachedTokens = 0;
  let prefillTokens = 0;
  let evicted = 0;
  let blocked = 0;
  const workerRequests: number[] = [];
  const workerPrefill: number[] = [];
  const workerCached: number[] = [];
  for (const engine of engines) {
    if (!engine.idle) throw new Error(`engine ${engine.index} still has work at the end`);
    if (engine.cache.freeBlocks !== engine.cache.capacityBlocks) {
      throw new Error(`engine ${engine.index} leaks ${engine.cache.usedBlocks} pinned blocks`);
    }
    if (verify) engine.cache.verify();
    const c = engine.counters;
    cachedTokens += c.cachedTokens;
    prefillTokens += c.computedTokens;
    evicted += engine.cache.counters.evictedBlocks;
    blocked += c.blockedAdmissions;
    workerRequests.push(c.submitted - c.rejected);
    workerPrefill.push(c.computedTokens);
    workerCached.push(engine.cache.cachedBlocks);
  }
  const ttft: number[] = [];
  for (let i = 0; i < trace.count; i++) {
    if (Number.isNaN(state.ttftMs[i]!)) continue;
    ttft.push(state.ttftMs[i]!);
    promptTokens += trace.inputLength[i]!;
  }
  if (state.completed + state.rejected !== trace.count) {
    throw new Error(`${trace.count} requests, ${state.completed} completed, ${state.rejected} rejected`);
  }
  if (cachedTokens + prefillTokens !== promptTokens) {
    throw new Error(`prompt tokens not conserved: ${cachedTokens} cached + ${prefillTokens} computed`
      + ` ≠ ${promptTokens}`);
  }
  const sorted = Float64Array.from(ttft).sort();
  const meanPrefill = prefillTokens / engines.length;
  return {
    policy,
    workers: engines.length,
    capacity_blocks: capacity,
    requests: trace.count,
    completed: state.completed,
    rejected: state.rejected,
    prompt_tokens: promptTokens,
    cached_tokens: cachedTokens,
    hit_rate: promptTokens === 0 ? 0 : cachedTokens / promptTokens,
    prefill_tokens: prefillTokens,
    ttft_p50_ms: percentile(sorted, 0.5),
    ttft_p99_ms: percentile(sorted, 0.99),
    ttft_mean_ms: ttft.length === 0 ? Number.NaN : ttft.reduce((a, b) => a + b, 0) / ttft.length,
    load_spread: meanPrefill === 0 ? 1 : Math.max(...workerPrefill) / meanPrefill,
    worker_requests: workerRequests,
    worker_prefill_tokens: workerPrefill,
    worker_cached_blocks: workerCached,
    evicted_blocks: evicted,
    blocked_admissions: blocked,
    makespan_ms: trace.count === 0 ? 0 : lastMs - trace.arrivalMs[0]!,
  };
}
