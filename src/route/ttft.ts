/**
 * The time-based cost (`route.policy = "ttft"`): each worker's predicted time to first
 * token for this request, from the router's own view of the worker's queue and an
 * engine time model, plus a charge for the prefill this choice makes the fleet do.
 *
 * The engine is assumed to run vLLM V1's loop (continuous batching, chunked prefill,
 * FCFS): prefill work routed before this request is computed first, every step spends
 * one token of its `maxBatchedTokens` budget per running request and reads the weights
 * and the KV of its running requests. For a worker w, with
 *
 *   ahead   = active_prefill_tokens[w]            (routed, prefill not done yet)
 *   own     = max(1, isl − cached tokens on w)    (vLLM always computes one token; cached
 *             counts the device's blocks and the lower tiers' after them)
 *   budget  = max(1, max_batched_tokens − active_requests[w])
 *   steps   = ceil((ahead + own) / budget)
 *   step_ms = step_base_ms + kv_read_ms_per_M × active_decode_blocks[w] × bs / 1e6
 *
 *   queue_ms   = ahead / prefill_tokens_per_ms
 *   reload_ms  = host tokens × host_reload_ms_per_M / 1e6 + disk and external tokens ×
 *                disk_reload_ms_per_M / 1e6   (a lower tier's hit is copied back, not
 *                recomputed: docs/decisions.md#lower-tiers)
 *   prefill_ms = own / prefill_tokens_per_ms
 *   steps_ms   = steps × step_ms
 *   ttft_ms    = queue_ms + reload_ms + prefill_ms + steps_ms
 *   cost       = ttft_ms + recompute_weight × prefill_ms
 *
 * `recompute_weight` is the stickiness with a load guard in one term: leaving the
 * worker that holds a prefix costs the prefill of what it held, in time, so the holder
 * keeps the request unless its queue is longer than `recompute_weight` × the time its
 * cache saves. A small shared prefix saves little and so earns little: it cannot pull
 * traffic onto a busy worker (the failure of a max-overlap rule).
 */

/** What the router assumes of an engine's speed (the sim's `TimeModel` fits this shape). */
export interface EngineTimeModel {
  readonly prefillTokensPerSecond: number;
  readonly stepBaseMs: number;
  readonly kvReadMsPerMillionTokens: number;
  readonly maxBatchedTokens: number;
}

export const ROUTE_POLICIES = ["ttft", "dynamo"] as const;
export type RoutePolicy = (typeof ROUTE_POLICIES)[number];

export interface TtftSettings extends EngineTimeModel {
  /** Cost per ms of prefill this choice adds, on top of the request's own TTFT. */
  readonly recomputeWeight: number;
  /** Time to copy the KV of 1M tokens from host memory back to the device, ms. */
  readonly hostReloadMsPerMillionTokens: number;
  /** The same from disk or external storage, ms. */
  readonly diskReloadMsPerMillionTokens: number;
}

/**
 * An ~8B model on one H100 (src/sim/time-model.ts cites each constant). Reloads: 128 KiB
 * of KV per token (Llama-3-8B in BF16: 2 × 32 layers × 8 KV heads × 128 dims × 2
 * bytes), so 1M tokens are 131 GB: 2,600 ms over the H100's PCIe Gen5 x16 link at the
 * ~50 GB/s pinned host copies reach (64 GB/s raw), 18,700 ms from one NVMe Gen4 drive at
 * ~7 GB/s; prefilling them takes 66,700 ms at 15,000 tokens/s.
 */
export const DEFAULT_TTFT_SETTINGS: TtftSettings = {
  prefillTokensPerSecond: 15_000,
  stepBaseMs: 5,
  kvReadMsPerMillionTokens: 39,
  maxBatchedTokens: 8192,
  recomputeWeight: 12,
  hostReloadMsPerMillionTokens: 2_600,
  diskReloadMsPerMillionTokens: 18_700,
};

export function checkTtftSettings(settings: TtftSettings): void {
  for (const [name, value] of Object.entries(settings)) {
    if (!Number.isFinite(value) || value < 0)
      throw new RangeError(`ttft setting ${name} must be a finite number >= 0`);
  }
  if (!(settings.prefillTokensPerSecond > 0))
    throw new RangeError("ttft setting prefillTokensPerSecond must be > 0");
  if (!(settings.maxBatchedTokens >= 1))
    throw new RangeError("ttft setting maxBatchedTokens must be >= 1");
}

/** The parts of one worker's predicted TTFT, by slot; filled by `predictTtft`. */
export class TtftParts {
  queueMs = new Float64Array(0);
  reloadMs = new Float64Array(0);
  prefillMs = new Float64Array(0);
  stepsMs = new Float64Array(0);

  ensure(capacity: number): void {
    if (this.queueMs.length >= capacity) return;
    this.queueMs = new Float64Array(capacity);
    this.reloadMs = new Float64Array(capacity);
    this.prefillMs = new Float64Array(capacity);
    this.stepsMs = new Float64Array(capacity);
  }
}

/**
 * Predicted TTFT of a request of `tokenCount` tokens on `slot` when `cachedTokens` of
 * it are cached there (lower tiers included, which take `reloadMs` to copy back);
 * writes the parts at `slot` and returns the total in ms. `prefillPerMs` and
 * `stepBaseMs` are per slot (calibrated values or the settings).
 */
export function predictTtft(
  settings: TtftSettings,
  parts: TtftParts,
  slot: number,
  tokenCount: number,
  cachedTokens: number,
  aheadTokens: number,
  activeRequests: number,
  activeBlocks: number,
  blockSize: number,
  prefillPerMs: number,
  stepBaseMs: number,
  reloadMs = 0,
): number {
  const own = ownPrefillTokens(tokenCount, cachedTokens);
  const steps = stepsUntilFirstToken(settings, aheadTokens + own, activeRequests);
  const stepMs = stepBaseMs + kvReadMs(settings, activeBlocks, blockSize);
  const queueMs = aheadTokens / prefillPerMs;
  const prefillMs = own / prefillPerMs;
  const stepsMs = steps * stepMs;
  parts.queueMs[slot] = queueMs;
  parts.reloadMs[slot] = reloadMs;
  parts.prefillMs[slot] = prefillMs;
  parts.stepsMs[slot] = stepsMs;
  return queueMs + reloadMs + prefillMs + stepsMs;
}

/** Time to copy lower-tier blocks back to the device, ms. */
export function reloadMsOf(
  settings: TtftSettings,
  hostBlocks: number,
  diskBlocks: number,
  blockSize: number,
): number {
  return (
    (hostBlocks * blockSize * settings.hostReloadMsPerMillionTokens +
      diskBlocks * blockSize * settings.diskReloadMsPerMillionTokens) /
    1e6
  );
}

/** Prompt tokens the engine computes: vLLM always computes at least the last one. */
export function ownPrefillTokens(tokenCount: number, cachedTokens: number): number {
  return Math.max(1, tokenCount - cachedTokens);
}

/** Scheduler steps until `tokens` of prefill are done, one budget token per running request taken by decode. */
export function stepsUntilFirstToken(
  settings: EngineTimeModel,
  tokens: number,
  activeRequests: number,
): number {
  return Math.ceil(tokens / Math.max(1, settings.maxBatchedTokens - activeRequests));
}

/** Per-step time to read the KV of a worker's active blocks, ms. */
export function kvReadMs(
  settings: EngineTimeModel,
  activeBlocks: number,
  blockSize: number,
): number {
  return (settings.kvReadMsPerMillionTokens * activeBlocks * blockSize) / 1e6;
}
