/**
 * How long a mock engine takes, in model milliseconds (virtual time; a real-time
 * replay divides every duration by `speedup`).
 *
 * - Prefill is compute-bound and serialized per engine: one request's uncached prompt
 *   tokens at `prefillTokensPerSecond`, requests in arrival order (what chunked
 *   prefill with FCFS scheduling amounts to). Cached tokens cost nothing.
 * - Decode is memory-bound and continuously batched: every running request advances
 *   one token per step of `decodeMsPerToken`, whatever the batch size (a fair
 *   approximation while the batch is far below the compute-bound regime).
 * - TTFT = waiting (for KV blocks and for the prefill server) + prefill time.
 *
 * Default numbers, for a mid-size model (about 8B parameters) on one H100-class GPU:
 * prefill costs about 2 × params FLOPs per token, 16 GFLOP; at a realistic 30–40% of
 * the ~990 dense BF16 TFLOP/s that is 15–25 k tokens/s for short prompts, less for
 * long ones as attention grows with context (published vLLM/SGLang benchmarks land
 * at 10–20 k tokens/s). We take 15,000. Decode steps of 20–50 ms per token are typical
 * at moderate batch sizes; we take 30 ms. Both are options.
 */

export interface TimeModel {
  /** Uncached prompt tokens one engine prefills per second. */
  readonly prefillTokensPerSecond: number;
  /** One decode step (one output token for every running request), in ms. */
  readonly decodeMsPerToken: number;
}

export const DEFAULT_TIME_MODEL: TimeModel = {
  prefillTokensPerSecond: 15_000,
  decodeMsPerToken: 30,
};

/** Model ms to prefill `tokens` uncached prompt tokens. */
export function prefillMs(model: TimeModel, tokens: number): number {
  return (tokens * 1000) / model.prefillTokensPerSecond;
}

/** Model ms to generate `tokens` output tokens (the first comes with prefill). */
export function decodeMs(model: TimeModel, tokens: number): number {
  return Math.max(0, tokens - 1) * model.decodeMsPerToken;
}

export function checkTimeModel(model: TimeModel): void {
  if (!(model.prefillTokensPerSecond > 0) || !Number.isFinite(model.prefillTokensPerSecond)) {
    throw new RangeError(`prefillTokensPerSecond must be > 0, got ${model.prefillTokensPerSecond}`);
  }
  if (!(model.decodeMsPerToken >= 0) || !Number.isFinite(model.decodeMsPerToken)) {
    throw new RangeError(`decodeMsPerToken must be ≥ 0, got ${model.decodeMsPerToken}`);
  }
}
