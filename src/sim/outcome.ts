/**
 * What happened to each request of a replay, and the per-policy report built from it.
 * Shared by the virtual-time simulator and the real-time replays, so every policy is
 * measured by the same code.
 *
 * Reported:
 * - hit_rate = prompt tokens served from cache / prompt tokens (admitted requests);
 * - prefill_tokens = prompt tokens computed (the work routing tries to save);
 * - TTFT p50 / p99 / mean in model ms (arrival → end of the step that computes the last
 *   prompt token: queueing, chunked prefill, and the decode work sharing those steps);
 * - TPOT p50 / p99 in model ms (time per output token after the first, per request with
 *   at least 2 output tokens: how much the batch's decode load and other requests'
 *   prefill chunks slow generation);
 * - load_spread = max / mean over workers of prefill tokens computed (1 = perfectly
 *   even work; N with N workers = one worker did everything);
 * - per-worker requests, prefill tokens and cached blocks, evictions, rejections, makespan.
 */
import type { MockEngine, EngineListener, EngineRequest } from "./engine";
import type { Trace } from "./trace";

export interface PolicyReport {
  readonly policy: string;
  readonly workers: number;
  readonly capacity_blocks: number;
  readonly requests: number;
  readonly completed: number;
  /** Requests larger than an engine's whole cache. */
  readonly rejected: number;
  readonly prompt_tokens: number;
  readonly cached_tokens: number;
  /** Of those, loaded back from a CPU offload tier (0 without one). */
  readonly host_cached_tokens: number;
  readonly hit_rate: number;
  readonly prefill_tokens: number;
  readonly ttft_p50_ms: number;
  readonly ttft_p99_ms: number;
  readonly ttft_mean_ms: number;
  readonly tpot_p50_ms: number;
  readonly tpot_p99_ms: number;
  readonly load_spread: number;
  readonly worker_requests: number[];
  readonly worker_prefill_tokens: number[];
  /** Blocks in each engine's prefix cache at the end. */
  readonly worker_cached_blocks: number[];
  readonly evicted_blocks: number;
  /** Scheduler steps whose queue head waited for free KV blocks. */
  readonly blocked_admissions: number;
  /** Model ms from the first arrival to the last finish. */
  readonly makespan_ms: number;
}

/** Nearest-rank percentile of sorted values (NaN when empty). */
export function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil(p * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

export class RunRecorder {
  readonly firstTokenMs: Float64Array;
  readonly finishMs: Float64Array;
  readonly workerOf: Int32Array;
  completed = 0;
  rejected = 0;
  lastMs: number;

  constructor(
    readonly trace: Trace,
    private readonly hooks: Partial<EngineListener> = {},
  ) {
    this.firstTokenMs = new Float64Array(trace.count).fill(Number.NaN);
    this.finishMs = new Float64Array(trace.count).fill(Number.NaN);
    this.workerOf = new Int32Array(trace.count).fill(-1);
    this.lastMs = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  }

  /** The listener every engine of the run reports to. */
  readonly listener: EngineListener = {
    prefillDone: (request: EngineRequest, nowMs: number, cachedTokens: number): void => {
      this.firstTokenMs[request.id] = nowMs;
      this.hooks.prefillDone?.(request, nowMs, cachedTokens);
    },
    finished: (request: EngineRequest, nowMs: number): void => {
      this.finishMs[request.id] = nowMs;
      this.completed++;
      this.lastMs = Math.max(this.lastMs, nowMs);
      this.hooks.finished?.(request, nowMs);
    },
  };

  routed(id: number, worker: number): void {
    this.workerOf[id] = worker;
  }

  rejectedAt(nowMs: number): void {
    this.rejected++;
    this.lastMs = Math.max(this.lastMs, nowMs);
  }

  /** The report; throws if an invariant of the run does not hold. */
  report(policy: string, engines: readonly MockEngine[], verify: boolean): PolicyReport {
    const { trace } = this;
    let promptTokens = 0;
    const {
      cachedTokens,
      hostTokens,
      prefillTokens,
      evicted,
      blocked,
      workerRequests,
      workerPrefill,
      workerCached,
    } = engineTotals(engines, verify);
    const ttft: number[] = [];
    const tpot: number[] = [];
    for (let i = 0; i < trace.count; i++) {
      const first = this.firstTokenMs[i]!;
      if (Number.isNaN(first)) continue;
      ttft.push(first - trace.arrivalMs[i]!);
      promptTokens += trace.inputLength[i]!;
      const output = trace.outputLength[i]!;
      if (output >= 2) tpot.push((this.finishMs[i]! - first) / (output - 1));
    }
    if (this.completed + this.rejected !== trace.count) {
      throw new Error(
        `${trace.count} requests, ${this.completed} completed, ${this.rejected} rejected`,
      );
    }
    if (cachedTokens + prefillTokens !== promptTokens) {
      throw new Error(
        `prompt tokens not conserved: ${cachedTokens} cached + ${prefillTokens} computed` +
          ` ≠ ${promptTokens}`,
      );
    }
    const sortedTtft = Float64Array.from(ttft).sort();
    const sortedTpot = Float64Array.from(tpot).sort();
    const meanPrefill = prefillTokens / engines.length;
    return {
      policy,
      workers: engines.length,
      capacity_blocks: engines[0]?.cache.capacityBlocks ?? 0,
      requests: trace.count,
      completed: this.completed,
      rejected: this.rejected,
      prompt_tokens: promptTokens,
      cached_tokens: cachedTokens,
      host_cached_tokens: hostTokens,
      hit_rate: promptTokens === 0 ? 0 : cachedTokens / promptTokens,
      prefill_tokens: prefillTokens,
      ttft_p50_ms: percentile(sortedTtft, 0.5),
      ttft_p99_ms: percentile(sortedTtft, 0.99),
      ttft_mean_ms: ttft.length === 0 ? Number.NaN : ttft.reduce((a, b) => a + b, 0) / ttft.length,
      tpot_p50_ms: percentile(sortedTpot, 0.5),
      tpot_p99_ms: percentile(sortedTpot, 0.99),
      load_spread: meanPrefill === 0 ? 1 : Math.max(...workerPrefill) / meanPrefill,
      worker_requests: workerRequests,
      worker_prefill_tokens: workerPrefill,
      worker_cached_blocks: workerCached,
      evicted_blocks: evicted,
      blocked_admissions: blocked,
      makespan_ms: trace.count === 0 ? 0 : this.lastMs - trace.arrivalMs[0]!,
    };
  }
}

/** What the engines did, summed (and checked: idle, nothing pinned, consistent). */
function engineTotals(engines: readonly MockEngine[], verify: boolean) {
  let cachedTokens = 0;
  let hostTokens = 0;
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
    hostTokens += engine.cache.counters.hostHitBlocks * engine.cache.blockSize;
    prefillTokens += c.computedTokens;
    evicted += engine.cache.counters.evictedBlocks;
    blocked += c.blockedAdmissions;
    workerRequests.push(c.submitted - c.rejected);
    workerPrefill.push(c.computedTokens);
    workerCached.push(engine.cache.cachedBlocks);
  }
  return {
    cachedTokens,
    hostTokens,
    prefillTokens,
    evicted,
    blocked,
    workerRequests,
    workerPrefill,
    workerCached,
  };
}
