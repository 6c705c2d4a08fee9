/**
 * `kvedge replay`: drives an already running kvedge with a trace, for users with a
 * real fleet (or a fleet of `kvedge mock-engine`s).
 *
 * Each request is routed at its scaled arrival time (WebSocket API, requests in
 * flight concurrently), then:
 * - with an engine mapping (worker id → engine URL), sent to the chosen engine's
 *   `POST /v1/generate` (the mock engine's API, ./engine-server.ts) with "stream":
 *   prefill_done is called at its first token, done when it finishes;
 * - without one, prefill_done and done are called after the durations the time model
 *   gives the request alone on an engine (its predicted cached prefix counted as
 *   cached), so kvedge's load tracking still sees requests come and go.
 *
 * Reported per target: decisions, failures, route latency (client-measured), the hit
 * rate kvedge predicted (Σ overlap_blocks × block_size / Σ prompt tokens), requests per
 * worker, and with engines what they measured (cached tokens, modeled TTFT).
 */
import { KvedgeClient } from "./kvedge-client";
import { percentile } from "./outcome";
import { requestTokens } from "./simulator";
import { soloDurations, type TimeModel } from "./time-model";
import type { Trace } from "./trace";

export interface ReplayOptions {
  readonly trace: Trace;
  readonly target: string;
  /** Worker id (decimal) → engine base URL; null: modeled durations. */
  readonly engines: ReadonlyMap<string, string> | null;
  readonly speedup: number;
  readonly time: TimeModel;
  readonly vocabSize: number;
  /** Prefix of request ids (unique per run, so runs never collide in kvedge). */
  readonly requestPrefix: string;
  readonly progress?: (routed: number, total: number) => void;
}

export interface EngineSideReport {
  readonly completed: number;
  readonly failed: number;
  readonly hit_rate: number;
  readonly ttft_p50_ms: number;
  readonly ttft_p99_ms: number;
}

export interface TargetReport {
  readonly target: string;
  readonly requests: number;
  readonly decisions: number;
  readonly route_failures: number;
  readonly route_latency_p50_ms: number;
  readonly route_latency_p99_ms: number;
  readonly predicted_hit_rate: number;
  readonly requests_per_worker: Record<string, number>;
  readonly lifecycle_calls: number;
  readonly lifecycle_errors: number;
  /** Decisions naming a worker with no --engine mapping (their request ended at once). */
  readonly unmapped_workers: number;
  readonly engines: EngineSideReport | null;
  readonly wall_s: number;
  /** First failure message, if any. */
  readonly first_error: string | null;
}

/** Most routed requests in flight at once; beyond it arrivals wait (a stuck target). */
const IN_FLIGHT_MAX = 50_000;

export async function replayTarget(options: ReplayOptions): Promise<TargetReport> {
  const { trace } = options;
  const workers = await fetch(`${options.target.replace(/\/$/, "")}/v1/workers`).then(
    async (response) => {
      if (!response.ok)
        throw new Error(`GET ${options.target}/v1/workers: HTTP ${response.status}`);
      return (await response.json()) as { block_size: number };
    },
  );
  const blockSize = workers.block_size;
  const client = await KvedgeClient.connect(options.target);
  const latency: number[] = [];
  const perWorker: Record<string, number> = {};
  const engineTtft: number[] = [];
  let overlapTokens = 0;
  let promptTokens = 0;
  let routeFailures = 0;
  let unmapped = 0;
  let engineCompleted = 0;
  let engineFailed = 0;
  let engineCached = 0;
  let enginePrompt = 0;
  let firstError: string | null = null;
  let routed = 0;
  let inFlight = 0;
  const failed = (message: string): void => {
    firstError ??= message;
  };

  const handle = async (i: number): Promise<void> => {
    const tokens = requestTokens(trace, i, options.vocabSize);
    const prompt = tokens.subarray(0, trace.inputLength[i]!);
    const outputTokens = Math.max(1, trace.outputLength[i]!);
    const requestId = `${options.requestPrefix}${i}`;
    const started = performance.now();
    let answer: Awaited<ReturnType<typeof client.route>>;
    try {
      answer = await client.route(prompt, requestId);
    } catch (error) {
      routeFailures++;
      failed(`route ${requestId}: ${(error as Error).message}`);
      return;
    }
    latency.push(performance.now() - started);
    perWorker[answer.workerId] = (perWorker[answer.workerId] ?? 0) + 1;
    overlapTokens += Math.min(answer.overlapBlocks * blockSize, prompt.length);
    promptTokens += prompt.length;
    if (options.engines === null) {
      const cached = Math.min(answer.overlapBlocks * blockSize, prompt.length - 1);
      const { ttftMs, decodeMs } = soloDurations(options.time, prompt.length, cached, outputTokens);
      await Bun.sleep(ttftMs / options.speedup);
      client.lifecycle("prefill_done", requestId);
      await Bun.sleep(decodeMs / options.speedup);
      client.lifecycle("done", requestId);
      return;
    }
    const engine = options.engines.get(answer.workerId);
    if (engine === undefined) {
      unmapped++;
      failed(`kvedge chose worker ${answer.workerId}, which has no --engine mapping`);
      client.lifecycle("done", requestId);
      return;
    }
    try {
      const result = await generate(engine, requestId, prompt, outputTokens, () =>
        client.lifecycle("prefill_done", requestId),
      );
      engineCompleted++;
      engineCached += result.cached_tokens;
      enginePrompt += prompt.length;
      engineTtft.push(result.ttft_ms);
    } catch (error) {
      engineFailed++;
      failed(`engine ${engine} for ${requestId}: ${(error as Error).message}`);
    } finally {
      client.lifecycle("done", requestId);
    }
  };

  const started = performance.now();
  const first = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  const tasks: Promise<void>[] = [];
  const ticker =
    options.progress === undefined
      ? null
      : setInterval(() => options.progress!(routed, trace.count), 100);
  try {
    for (let i = 0; i < trace.count; i++) {
      const dueWall = started + (trace.arrivalMs[i]! - first) / options.speedup;
      const wait = dueWall - performance.now();
      if (wait > 0) await Bun.sleep(wait);
      while (inFlight >= IN_FLIGHT_MAX) await Bun.sleep(5);
      inFlight++;
      routed++;
      tasks.push(
        handle(i).finally(() => {
          inFlight--;
        }),
      );
    }
    await Promise.all(tasks);
    await client.settle();
  } finally {
    if (ticker !== null) clearInterval(ticker);
    client.close();
  }
  options.progress?.(routed, trace.count);
  const sortedLatency = Float64Array.from(latency).sort();
  const sortedTtft = Float64Array.from(engineTtft).sort();
  if (client.counters.lifecycleErrors > 0) failed(client.counters.lastLifecycleError);
  return {
    target: options.target,
    requests: trace.count,
    decisions: latency.length,
    route_failures: routeFailures,
    route_latency_p50_ms: percentile(sortedLatency, 0.5),
    route_latency_p99_ms: percentile(sortedLatency, 0.99),
    predicted_hit_rate: promptTokens === 0 ? 0 : overlapTokens / promptTokens,
    requests_per_worker: perWorker,
    lifecycle_calls: client.counters.lifecycleCalls,
    lifecycle_errors: client.counters.lifecycleErrors,
    unmapped_workers: unmapped,
    engines:
      options.engines === null
        ? null
        : {
            completed: engineCompleted,
            failed: engineFailed,
            hit_rate: enginePrompt === 0 ? 0 : engineCached / enginePrompt,
            ttft_p50_ms: percentile(sortedTtft, 0.5),
            ttft_p99_ms: percentile(sortedTtft, 0.99),
          },
    wall_s: (performance.now() - started) / 1000,
    first_error: firstError,
  };
}

interface GenerateResult {
  readonly cached_tokens: number;
  readonly ttft_ms: number;
}

/** Most bytes of NDJSON one generate answer may stream. */
const ANSWER_BYTES_MAX = 1 << 20;

/** POST /v1/generate with "stream": calls `onFirstToken` at the first token; resolves when done. */
async function generate(
  engine: string,
  requestId: string,
  prompt: Uint32Array,
  maxTokens: number,
  onFirstToken: () => void,
): Promise<GenerateResult> {
  const response = await fetch(`${engine.replace(/\/$/, "")}/v1/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      request_id: requestId,
      token_ids: Array.from(prompt),
      max_tokens: maxTokens,
      stream: true,
    }),
  });
  if (!response.ok || response.body === null)
    throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 200)}`);
  const decoder = new TextDecoder();
  let pending = "";
  let received = 0;
  let firstSeen = false;
  for await (const chunk of response.body) {
    received += chunk.byteLength;
    if (received > ANSWER_BYTES_MAX)
      throw new Error(`the engine's answer is over ${ANSWER_BYTES_MAX} bytes`);
    pending += decoder.decode(chunk, { stream: true });
    for (let newline = pending.indexOf("\n"); newline >= 0; newline = pending.indexOf("\n")) {
      const line = JSON.parse(pending.slice(0, newline)) as Record<string, unknown>;
      pending = pending.slice(newline + 1);
      if (line.event === "first_token" && !firstSeen) {
        firstSeen = true;
        onFirstToken();
      } else if (line.event === "done") {
        if (!firstSeen) onFirstToken();
        return { cached_tokens: Number(line.cached_tokens), ttft_ms: Number(line.ttft_ms) };
      }
    }
  }
  throw new Error("the engine closed the stream before the request was done");
}
