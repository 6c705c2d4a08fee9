/**
 * How long a mock engine's scheduler steps take, in model milliseconds (virtual time;
 * a real-time replay divides every duration by its speed-up).
 *
 * The engine runs vLLM V1's loop: continuous batching with chunked prefill. Each step
 * schedules up to `maxBatchedTokens` tokens: one for every request that is decoding,
 * then prefill chunks of requests still prefilling (oldest first), then new requests
 * from the queue (FCFS) while the budget and `maxRunning` allow. A step costs
 *
 *   step_ms = stepBaseMs
 *           + prefill tokens in the step / prefill tokens per ms
 *           + kvReadMsPerMillionTokens × (KV tokens the step's decodes read) / 1e6
 *
 * - stepBaseMs: reading the weights once per step (decode is memory-bound). An ~8B
 *   model in BF16 is ~16 GB; at an H100 SXM's 3.35 TB/s that is 4.8 ms: 5 ms.
 * - prefillTokensPerSecond: compute-bound prefill. ~2 × 8e9 FLOPs per token at 30–40% of
 *   ~990 dense BF16 TFLOP/s gives 15–25 k tokens/s, less on long prompts where
 *   attention grows; published vLLM/SGLang numbers for 8B models on one H100 land at
 *   10–20 k: 15,000.
 * - kvReadMsPerMillionTokens: every decode step reads the KV of each decoding request's
 *   whole context. Llama-3-8B keeps 2 × 32 layers × 8 KV heads × 128 dims × 2 bytes =
 *   128 KiB per token; 1 M tokens = 131 GB, 39 ms at 3.35 TB/s. (A full 512k-token
 *   cache, about one 80 GB GPU's worth for this model, reads in ~20 ms.)
 * - maxBatchedTokens 8,192 and maxRunning 1,024: vLLM's defaults for the OpenAI server
 *   on large-memory GPUs (`max_num_batched_tokens`, `max_num_seqs`).
 * - longPrefillTokens (off by default, as in vLLM unless set): the most prompt tokens one
 *   request is given in a step (vLLM `long_prefill_token_threshold`), so several long
 *   prompts prefill side by side. Requests sharing a prompt then leapfrog: one admitted
 *   after another reuses the blocks the other has scheduled, computes the next chunk
 *   first, and the earlier one, which looked the cache up only when it was admitted,
 *   computes that chunk again: vLLM keeps both copies (./engine-cache.ts).
 * - hostReloadMsPerMillionTokens (a CPU offload tier): a request whose prefix continues
 *   in host memory has it copied back: 128 KiB a token, 1 M tokens = 131 GB, 2,600 ms
 *   over PCIe Gen5 x16 at the ~50 GB/s pinned copies reach (64 GB/s raw); prefilling
 *   them would take 66,700 ms. The copy adds to the step that admits the request (the
 *   engine waits for it; the step's other requests wait too: a little pessimistic).
 *
 * TTFT = arrival → end of the step that computes the request's last prompt token.
 * Omitted (README.md lists them): compute/memory overlap inside a step (the terms add
 * instead of taking a max), attention FLOPs growing with context in prefill, sampling
 * and CPU overheads, preemption (blocks for the whole output are reserved at admission).
 */

export interface TimeModel {
  /** Fixed cost of one scheduler step (weights read), ms. */
  readonly stepBaseMs: number;
  /** Prompt tokens prefilled per second (cached tokens cost nothing). */
  readonly prefillTokensPerSecond: number;
  /** Step time to read the KV of one million context tokens, ms. */
  readonly kvReadMsPerMillionTokens: number;
  /** Token budget of one step (vLLM `max_num_batched_tokens`). */
  readonly maxBatchedTokens: number;
  /** Most requests running at once (vLLM `max_num_seqs`). */
  readonly maxRunning: number;
  /** Most prompt tokens one request gets per step (vLLM `long_prefill_token_threshold`; 0 or absent: no cap). */
  readonly longPrefillTokens?: number;
  /** Time to copy the KV of one million tokens from the CPU tier back, ms (default 2,600). */
  readonly hostReloadMsPerMillionTokens?: number;
}

/** Most prompt tokens one request may prefill in a step: the budget, or the long-prefill cap. */
export function prefillChunkMax(model: TimeModel): number {
  const cap = model.longPrefillTokens ?? 0;
  return cap > 0 ? Math.min(cap, model.maxBatchedTokens) : model.maxBatchedTokens;
}

export const DEFAULT_HOST_RELOAD_MS_PER_MILLION_TOKENS = 2_600;

/** Model ms to copy `tokens` of KV back from the CPU tier. */
export function reloadMs(model: TimeModel, tokens: number): number {
  const rate = model.hostReloadMsPerMillionTokens ?? DEFAULT_HOST_RELOAD_MS_PER_MILLION_TOKENS;
  return (rate * tokens) / 1e6;
}

export const DEFAULT_TIME_MODEL: TimeModel = {
  stepBaseMs: 5,
  prefillTokensPerSecond: 15_000,
  kvReadMsPerMillionTokens: 39,
  maxBatchedTokens: 8192,
  maxRunning: 1024,
};

/** Model ms of one step that prefills `prefillTokens` and decodes over `kvTokens` of context. */
export function stepMs(model: TimeModel, prefillTokens: number, kvTokens: number): number {
  return (
    model.stepBaseMs +
    (prefillTokens * 1000) / model.prefillTokensPerSecond +
    (model.kvReadMsPerMillionTokens * kvTokens) / 1e6
  );
}

/**
 * What one request costs on an otherwise idle engine: TTFT (its prefill chunks) and the
 * decode time after the first token. For clients that model durations without an
 * engine (`kvedge replay` without --engine).
 */
export function soloDurations(
  model: TimeModel,
  promptTokens: number,
  cachedTokens: number,
  outputTokens: number,
): { ttftMs: number; decodeMs: number } {
  let ttftMs = 0;
  const chunk = prefillChunkMax(model);
  for (let left = Math.max(1, promptTokens - cachedTokens); left > 0; left -= chunk) {
    ttftMs += stepMs(model, Math.min(left, chunk), 0);
  }
  // Decode steps j = 1 … n−1 each read the prompt and the j tokens generated so far.
  const steps = Math.max(0, outputTokens - 1);
  const kvTokens = steps * promptTokens + (steps * (steps + 1)) / 2;
  const decodeMs = steps * model.stepBaseMs + (model.kvReadMsPerMillionTokens * kvTokens) / 1e6;
  return { ttftMs, decodeMs };
}

const finitePositive = (value: number): boolean => Number.isFinite(value) && value > 0;
const finiteNonNegative = (value: number): boolean => Number.isFinite(value) && value >= 0;

export function checkTimeModel(model: TimeModel): void {
  const problems: string[] = [];
  if (!finiteNonNegative(model.stepBaseMs))
    problems.push(`stepBaseMs must be ≥ 0, got ${model.stepBaseMs}`);
  if (!finitePositive(model.prefillTokensPerSecond)) {
    problems.push(`prefillTokensPerSecond must be > 0, got ${model.prefillTokensPerSecond}`);
  }
  if (!finiteNonNegative(model.kvReadMsPerMillionTokens)) {
    problems.push(`kvReadMsPerMillionTokens must be ≥ 0, got ${model.kvReadMsPerMillionTokens}`);
  }
  if (!Number.isSafeInteger(model.maxBatchedTokens) || model.maxBatchedTokens < 1) {
    problems.push(`maxBatchedTokens must be an integer ≥ 1, got ${model.maxBatchedTokens}`);
  }
  if (!Number.isSafeInteger(model.maxRunning) || model.maxRunning < 1) {
    problems.push(`maxRunning must be an integer ≥ 1, got ${model.maxRunning}`);
  }
  const cap = model.longPrefillTokens ?? 0;
  if (!Number.isSafeInteger(cap) || cap < 0)
    problems.push(`longPrefillTokens must be an integer ≥ 0, got ${model.longPrefillTokens}`);
  // A step of zero duration would let virtual time stand still.
  if (problems.length === 0 && model.stepBaseMs === 0 && model.kvReadMsPerMillionTokens === 0) {
    problems.push(
      "stepBaseMs and kvReadMsPerMillionTokens cannot both be 0 (a decode step would take no time)",
    );
  }
  if (problems.length > 0) throw new RangeError(problems.join("; "));
}
