/**
 * `kvedge demo --proxy`: the kv_aware run with kvedge as the OpenAI-compatible proxy.
 * Every mock engine also serves the OpenAI API over HTTP (./engine-openai.ts); one
 * `kvedge serve --proxy` child subscribes to their KV events and knows their
 * http_endpoints. Each trace request is sent at its scaled arrival time to the proxy's
 * `POST /v1/completions` (the prompt as token ids, streamed, usage asked for): kvedge
 * routes it, forwards it and drives its lifecycle; the client only reads the answer.
 *
 * The engines' modeled times come back in each answer (`kvedge_mock`), so the report
 * is built by the same code as every other policy's (./outcome.ts), which also checks
 * that every request reached exactly one engine (prompt tokens are conserved).
 */
import type { DemoOptions } from "./demo-options";
import { EngineServer } from "./engine-server";
import { NetworkedEngine } from "./networked-engine";
import { percentile, type PolicyReport, RunRecorder } from "./outcome";
import { startServeChild, type ServeChild, waitReady, withServeTail } from "./serve-process";
import { engineSeeds, requestTokens } from "./simulator";
import { silentLogger } from "../util/log";

export interface ProxyReport {
  readonly requests: number;
  readonly failed: number;
  /** Σ usage cached_tokens / Σ prompt tokens, as the clients saw it. */
  readonly observed_hit_rate: number;
  /** Σ predicted cached tokens / Σ prompt tokens, as kvedge's observed-hit check recorded it. */
  readonly predicted_hit_rate: number;
  /** Client-measured, wall ms: request sent → first byte of the answer (router + engine). */
  readonly ttfb_p50_ms: number;
  readonly ttfb_p99_ms: number;
  readonly failovers: number;
  readonly suspect_workers: number;
  readonly degraded_workers: number;
  /** Requests kvedge still counts as active at the end (0: every lifecycle ended). */
  readonly active_at_end: number;
  readonly achieved_speedup: number;
}

interface Fleet {
  readonly networked: NetworkedEngine[];
  readonly servers: EngineServer[];
  readonly https: string[];
}

async function startFleet(options: DemoOptions): Promise<Fleet> {
  const seeds = engineSeeds(options.seed, options.workers);
  const fleet: Fleet = { networked: [], servers: [], https: [] };
  for (let w = 0; w < options.workers; w++) {
    const networked = await new NetworkedEngine({
      index: w,
      capacityBlocks: options.capacityBlocks,
      blockSize: options.blockSize,
      hashSeed: seeds[w]!,
      time: options.time,
      endpoint: "tcp://127.0.0.1:0",
      replayEndpoint: "tcp://127.0.0.1:0",
      form: options.form,
    }).start();
    fleet.networked.push(networked);
    const server = new EngineServer({
      networked,
      speedup: options.speedup,
      host: "127.0.0.1",
      port: 0,
      vocabSize: options.vocabSize,
      log: silentLogger,
    });
    fleet.https.push(server.start());
    fleet.servers.push(server);
  }
  return fleet;
}

async function stopFleet(fleet: Fleet): Promise<void> {
  await Promise.all(fleet.servers.map((server) => server.stop()));
  await Promise.all(fleet.networked.map((networked) => networked.close()));
}

interface Answer {
  readonly worker: number;
  readonly ttfbMs: number;
  readonly cachedTokens: number;
  readonly ttftMs: number;
  readonly e2eMs: number;
}

/** One request through the proxy; the usage chunk's figures, or an Error. */
async function send(url: string, prompt: Uint32Array, maxTokens: number): Promise<Answer | Error> {
  const started = performance.now();
  let response: Response;
  try {
    response = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: Array.from(prompt),
        max_tokens: maxTokens,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
  } catch (error) {
    return error as Error;
  }
  if (!response.ok || response.body === null)
    return new Error(`HTTP ${response.status}: ${await response.text()}`);
  const reader = response.body.getReader();
  let ttfbMs = Number.NaN;
  let text = "";
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (Number.isNaN(ttfbMs)) ttfbMs = performance.now() - started;
    text += decoder.decode(value, { stream: true });
  }
  const usage = text
    .split("\n\n")
    .map((event) => event.slice(6))
    .filter((data) => data.includes('"usage"'))
    .at(-1);
  if (usage === undefined) return new Error("the answer has no usage chunk");
  const chunk = JSON.parse(usage) as {
    usage: { prompt_tokens_details: { cached_tokens: number } };
    kvedge_mock: { ttft_ms: number; e2e_ms: number };
  };
  return {
    worker: Number(response.headers.get("x-kvedge-worker-id")),
    ttfbMs,
    cachedTokens: chunk.usage.prompt_tokens_details.cached_tokens,
    ttftMs: chunk.kvedge_mock.ttft_ms,
    e2eMs: chunk.kvedge_mock.e2e_ms,
  };
}

export async function runProxyReplay(
  options: DemoOptions,
): Promise<{ report: PolicyReport; proxy: ProxyReport }> {
  const fleet = await startFleet(options);
  let serve: ServeChild | null = null;
  try {
    options.progress?.("kv_aware (proxy): starting kvedge serve --proxy…");
    const workers = fleet.networked
      .map(
        (engine, w) =>
          `${w}=${engine.endpoint};replay=${engine.replayEndpoint};http=${fleet.https[w]}`,
      )
      .join(",");
    serve = await startServeChild({
      args: [
        "--proxy",
        "--workers",
        workers,
        "--block-size",
        String(options.blockSize),
        "--log-level",
        "info",
        ...options.serveArgs,
      ],
      ...(options.kvedgeCommand === undefined ? {} : { command: options.kvedgeCommand }),
    });
    await waitReady(serve.url, fleet.networked);
    const { trace } = options;
    const recorder = new RunRecorder(trace);
    const ttfb: number[] = [];
    let failed = 0;
    let firstError: Error | null = null;
    let promptTokens = 0;
    let observed = 0;
    const startedMs = performance.now();
    const t0 = trace.count > 0 ? trace.arrivalMs[0]! : 0;
    const inFlight: Promise<void>[] = [];
    for (let i = 0; i < trace.count; i++) {
      const due = startedMs + (trace.arrivalMs[i]! - t0) / options.speedup;
      const wait = due - performance.now();
      if (wait > 1) await Bun.sleep(wait);
      const tokens = requestTokens(trace, i, options.vocabSize);
      const input = trace.inputLength[i]!;
      const output = Math.max(1, trace.outputLength[i]!);
      inFlight.push(
        send(serve.url, tokens.subarray(0, input), output).then((answer) => {
          if (answer instanceof Error) {
            // 413 (larger than an engine's cache) counts as rejected, like the other policies.
            if (answer.message.startsWith("HTTP 413")) recorder.rejectedAt(trace.arrivalMs[i]!);
            else {
              failed++;
              firstError ??= answer;
            }
            return;
          }
          const request = { id: i, tokens, promptLength: input };
          recorder.routed(i, answer.worker);
          recorder.listener.prefillDone(
            request,
            trace.arrivalMs[i]! + answer.ttftMs,
            answer.cachedTokens,
          );
          recorder.listener.finished(request, trace.arrivalMs[i]! + answer.e2eMs);
          ttfb.push(answer.ttfbMs);
          promptTokens += input;
          observed += answer.cachedTokens;
        }),
      );
      if ((i & 31) === 0) options.progress?.(`kv_aware (proxy): ${i}/${trace.count} requests sent`);
    }
    await Promise.all(inFlight);
    options.progress?.("");
    if (failed > 0)
      throw new Error(`${failed} proxied requests failed; the first: ${firstError!.message}`);
    const wallMs = performance.now() - startedMs;
    const report = recorder.report(
      "kv_aware",
      fleet.networked.map((n) => n.engine),
      false,
    );
    const side = (await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as {
      workers: {
        active_requests: number;
        degraded: boolean;
        observed_hits: { predicted_cached_tokens: number; suspect: boolean };
      }[];
    };
    const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
    const failovers = Number(/^kvedge_proxy_failovers_total (\S+)$/m.exec(metrics)?.[1] ?? 0);
    const sorted = Float64Array.from(ttfb).sort();
    const predicted = side.workers.reduce(
      (sum, w) => sum + w.observed_hits.predicted_cached_tokens,
      0,
    );
    return {
      report,
      proxy: {
        requests: trace.count,
        failed,
        observed_hit_rate: promptTokens === 0 ? 0 : observed / promptTokens,
        predicted_hit_rate: promptTokens === 0 ? 0 : predicted / promptTokens,
        ttfb_p50_ms: percentile(sorted, 0.5),
        ttfb_p99_ms: percentile(sorted, 0.99),
        failovers,
        suspect_workers: side.workers.filter((w) => w.observed_hits.suspect).length,
        degraded_workers: side.workers.filter((w) => w.degraded).length,
        active_at_end: side.workers.reduce((sum, w) => sum + w.active_requests, 0),
        achieved_speedup: trace.count === 0 ? 0 : (trace.arrivalMs[trace.count - 1]! - t0) / wallMs,
      },
    };
  } catch (error) {
    throw withServeTail(error, serve);
  } finally {
    await serve?.stop();
    await stopFleet(fleet);
  }
}
