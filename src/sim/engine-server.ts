/**
 * A standalone mock engine: a NetworkedEngine run in real time by a Pacer, taking
 * requests over a small HTTP API (`kvedge mock-engine`), so `kvedge replay` (or any
 * client) can drive a fleet of them like real engines.
 *
 *   POST /v1/generate {"request_id"?: "...", "token_ids": [...], "max_tokens": N, "stream"?: bool}
 *     → when done: {"request_id", "prompt_tokens", "cached_tokens", "output_tokens",
 *                   "ttft_ms", "e2e_ms"}            (model ms from arrival)
 *     → with "stream": true, NDJSON: {"event":"first_token", "request_id", "ttft_ms",
 *       "cached_tokens"} at the first token, then {"event":"done", …the fields above}.
 *     The engine generates exactly max_tokens synthetic tokens (unique per request).
 *     413 if prompt + max_tokens can never fit in the engine's cache.
 *   POST /v1/completions, /v1/chat/completions, GET /v1/models: OpenAI-compatible,
 *     with usage.prompt_tokens_details.cached_tokens from the cache (./engine-openai.ts)
 *   POST /v1/reset   vLLM's reset_prefix_cache: AllBlocksCleared (409 while requests run)
 *   GET  /v1/stats   engine, cache and publisher counters
 *   GET  /v1/cache   every cached block's external hash (decimal), the copies of those held
 *                    more than once, the CPU tier's blocks, and the last published seq: the
 *                    truth a router's index is compared with
 *   GET  /healthz
 *
 * Requests arrive at the engine's current model time (model ms = wall ms × speedup
 * since start); TTFT and e2e come from the engine model, not from the wall clock.
 */
import { INTERNAL_ERROR } from "../http/errors";
import { KvedgeError } from "../domain/errors";
import type { Server } from "bun";
import {
  asObject,
  errorReply,
  optionalInt,
  optionalString,
  readBody,
  reply,
  tokenIds,
} from "../http/http";
import type { Logger } from "../util/log";
import type { EngineRequest } from "./engine";
import type { NetworkedEngine } from "./networked-engine";
import { Pacer } from "./pacer";
import { writeOutputTokens } from "./tokens";
import { CHAT_PATH, COMPLETIONS_PATH, MAX_TOKENS_MAX } from "../proxy/openai";
import { EngineOpenAi, type OpenAiEngineOptions, type Submitted } from "./engine-openai";

export interface EngineServerOptions {
  readonly networked: NetworkedEngine;
  readonly speedup: number;
  readonly host: string;
  readonly port: number;
  readonly vocabSize: number;
  readonly log: Logger;
  readonly bodyLimitBytes?: number;
  /** The OpenAI-compatible API's tokenizer and model name (default: token-id prompts only, model "mock"). */
  readonly openAi?: Partial<OpenAiEngineOptions>;
}

export { MAX_TOKENS_MAX };
/** Most requests in the engine at once (running + queued); beyond it: 503. */
export const IN_FLIGHT_MAX = 100_000;
const BODY_LIMIT_BYTES = 64 * 1024 * 1024;

interface InFlight {
  readonly requestId: string;
  readonly arrivalMs: number;
  readonly promptTokens: number;
  readonly outputTokens: number;
  cachedTokens: number;
  firstTokenMs: number;
  finishMs: number;
  readonly onFirstToken: () => void;
  readonly resolveDone: () => void;
}

/** A request in the engine, as `submit` returns it: its figures fill in as it runs (model ms). */
export class EngineServer {
  private readonly pacer: Pacer;
  private readonly inFlight = new Map<number, InFlight>();
  private nextId = 0;
  private server: Server<undefined> | null = null;
  readonly counters = { requests: 0, completed: 0, rejected: 0 };

  constructor(private readonly options: EngineServerOptions) {
    const networked = options.networked;
    this.pacer = new Pacer([networked], options.speedup);
    networked.listener = {
      prefillDone: (request: EngineRequest, nowMs: number, cachedTokens: number) => {
        const entry = this.inFlight.get(request.id);
        if (entry === undefined) return;
        entry.cachedTokens = cachedTokens;
        entry.firstTokenMs = nowMs;
        entry.onFirstToken();
      },
      finished: (request: EngineRequest, nowMs: number) => {
        const entry = this.inFlight.get(request.id);
        if (entry === undefined) return;
        entry.finishMs = nowMs;
        this.inFlight.delete(request.id);
        this.counters.completed++;
        entry.resolveDone();
      },
    };
  }

  /** Starts the clock and the HTTP server; resolves with its URL. */
  start(): string {
    this.pacer.start(0);
    const openAi = new EngineOpenAi(this, {
      tokenizer: this.options.openAi?.tokenizer ?? null,
      model: this.options.openAi?.model ?? "mock",
    });
    const limit = this.options.bodyLimitBytes ?? BODY_LIMIT_BYTES;
    // A streamed answer pauses from its first token to the request's end (the model
    // reports those two moments), longer than Bun's idle timeout at low speedups.
    const untimed = (request: Request): Request => {
      this.server?.timeout(request, 0);
      return request;
    };
    const wrap =
      (handler: (request: Request) => Promise<Response> | Response) => async (request: Request) => {
        try {
          return await handler(request);
        } catch (error) {
          if (error instanceof KvedgeError) return errorReply(request, error);
          this.options.log.error("request failed", {
            error: error instanceof Error ? (error.stack ?? error.message) : String(error),
          });
          return errorReply(request, INTERNAL_ERROR);
        }
      };
    this.server = Bun.serve({
      hostname: this.options.host,
      port: this.options.port,
      development: false, // as kvedge serve (src/server/app.ts)
      maxRequestBodySize: limit + 1024 * 1024,
      routes: {
        "/v1/generate": {
          POST: wrap(
            async (request) => await this.generate(request, await readBody(request, limit)),
          ),
        },
        [COMPLETIONS_PATH]: {
          POST: wrap(
            async (request) =>
              await openAi.complete(
                untimed(request),
                COMPLETIONS_PATH,
                await readBody(request, limit),
              ),
          ),
        },
        [CHAT_PATH]: {
          POST: wrap(
            async (request) =>
              await openAi.complete(untimed(request), CHAT_PATH, await readBody(request, limit)),
          ),
        },
        "/v1/models": { GET: wrap((request) => openAi.models(request)) },
        "/v1/reset": { POST: wrap((request) => this.reset(request)) },
        "/v1/stats": { GET: wrap((request) => reply(request, 200, this.stats())) },
        "/v1/cache": { GET: wrap((request) => reply(request, 200, this.cache())) },
        "/healthz": { GET: wrap((request) => reply(request, 200, { status: "ok" })) },
      },
      fetch: (request) =>
        errorReply(
          request,
          new KvedgeError("not_found", `no such endpoint: ${new URL(request.url).pathname}`),
        ),
    });
    const host = this.options.host.includes(":") ? `[${this.options.host}]` : this.options.host;
    return `http://${host}:${this.server.port}`;
  }

  async stop(): Promise<void> {
    this.pacer.stop();
    await this.server?.stop(true);
    this.server = null;
  }

  stats() {
    const { networked } = this.options;
    const engine = networked.engine;
    return {
      model_ms: this.pacer.modelNow(),
      speedup: this.pacer.speedup,
      requests: this.counters,
      engine: { ...engine.counters, running: engine.runningCount, waiting: engine.waitingCount },
      cache: {
        ...engine.cache.counters,
        capacity_blocks: engine.cache.capacityBlocks,
        block_size: engine.cache.blockSize,
        cached_blocks: engine.cache.cachedBlocks,
        used_blocks: engine.cache.usedBlocks,
      },
      publisher: {
        ...networked.counters,
        last_seq: networked.lastSeq,
        subscribers: networked.subscribers,
      },
    };
  }

  /**
   * The cached blocks by external hash, with the seq of the batch that last changed them,
   * and the copies of those cached more than once (vLLM's duplicates).
   */
  cache() {
    const { networked } = this.options;
    const blocks = networked.engine.cache.snapshot();
    const copies: Record<string, number> = {};
    for (const block of blocks) if (block.copies > 1) copies[block.hash.toString()] = block.copies;
    const host = networked.engine.cache.hostSnapshot();
    return {
      last_seq: networked.lastSeq,
      block_hashes: blocks.map((block) => block.hash.toString()),
      copies,
      host_block_hashes: host.map((block) => block.hash.toString()),
    };
  }

  private async generate(request: Request, raw: unknown): Promise<Response> {
    const body = asObject(raw);
    const prompt = tokenIds(body);
    const maxTokens = optionalInt(body, "max_tokens", 1, MAX_TOKENS_MAX);
    if (maxTokens === null)
      throw new KvedgeError(
        "bad_request",
        `max_tokens is required (an integer in [1, ${MAX_TOKENS_MAX}])`,
      );
    const requestId = optionalString(body, "request_id");
    const stream = body.stream === true;
    if (body.stream !== undefined && typeof body.stream !== "boolean")
      throw new KvedgeError("bad_request", "stream must be a boolean");
    const submitted = this.submit(prompt, maxTokens, requestId);
    const summary = () => ({
      request_id: submitted.requestId,
      prompt_tokens: submitted.promptTokens,
      cached_tokens: submitted.cachedTokens,
      output_tokens: submitted.outputTokens,
      ttft_ms: submitted.ttftMs,
      e2e_ms: submitted.e2eMs,
    });
    if (!stream) {
      await submitted.done;
      return reply(request, 200, summary());
    }
    const encoder = new TextEncoder();
    const lines = new ReadableStream<Uint8Array>({
      start: (controller) => {
        const line = (value: unknown) =>
          controller.enqueue(encoder.encode(`${JSON.stringify(value)}\n`));
        void submitted.firstToken.then(() =>
          line({
            event: "first_token",
            request_id: submitted.requestId,
            ttft_ms: submitted.ttftMs,
            cached_tokens: submitted.cachedTokens,
          }),
        );
        void submitted.done.then(() => {
          line({ event: "done", ...summary() });
          controller.close();
        });
      },
    });
    return new Response(lines, { headers: { "content-type": "application/x-ndjson" } });
  }

  /**
   * Puts a request into the engine at its current model time. 400 for an empty prompt,
   * 413 if prompt + output can never fit in the cache, 503 when the engine is full.
   */
  submit(prompt: Uint32Array, maxTokens: number, requestId: string | null): Submitted {
    if (prompt.length === 0) throw new KvedgeError("bad_request", "the prompt must not be empty");
    if (this.inFlight.size >= IN_FLIGHT_MAX)
      throw new KvedgeError("busy", `the engine holds ${IN_FLIGHT_MAX} requests already`);
    const engine = this.options.networked.engine;
    const blocks = engine.cache.blocksFor(prompt.length + maxTokens);
    if (blocks > engine.cache.capacityBlocks) {
      this.counters.rejected++;
      throw new KvedgeError(
        "too_large",
        `prompt + max_tokens need ${blocks} KV blocks; the engine has ${engine.cache.capacityBlocks}`,
      );
    }
    const id = this.nextId++;
    const tokens = new Uint32Array(prompt.length + maxTokens);
    tokens.set(prompt);
    writeOutputTokens(id, maxTokens, this.options.vocabSize, tokens, prompt.length);
    this.pacer.advance();
    const arrivalMs = this.pacer.modelNow();
    let resolveDone!: () => void;
    const done = new Promise<void>((resolve) => {
      resolveDone = resolve;
    });
    let resolveFirst!: () => void;
    const firstToken = new Promise<void>((resolve) => {
      resolveFirst = resolve;
    });
    const entry: InFlight = {
      requestId: requestId ?? `req-${id}`,
      arrivalMs,
      promptTokens: prompt.length,
      outputTokens: maxTokens,
      cachedTokens: 0,
      firstTokenMs: Number.NaN,
      finishMs: Number.NaN,
      onFirstToken: resolveFirst,
      resolveDone,
    };
    this.inFlight.set(id, entry);
    this.counters.requests++;
    if (!engine.submit({ id, tokens, promptLength: prompt.length }, arrivalMs)) {
      throw new Error("the engine rejected a request that fits its cache"); // checked above
    }
    this.options.networked.publish();
    this.pacer.kick();
    return {
      get requestId() {
        return entry.requestId;
      },
      get promptTokens() {
        return entry.promptTokens;
      },
      get outputTokens() {
        return entry.outputTokens;
      },
      get cachedTokens() {
        return entry.cachedTokens;
      },
      get ttftMs() {
        return entry.firstTokenMs - arrivalMs;
      },
      get e2eMs() {
        return entry.finishMs - arrivalMs;
      },
      output: tokens.subarray(prompt.length),
      firstToken,
      done,
    };
  }

  private reset(request: Request): Response {
    if (!this.options.networked.reset()) {
      throw new KvedgeError(
        "conflict",
        "requests are running or queued: the prefix cache cannot be reset now",
      );
    }
    return reply(request, 200, { status: "cleared", seq: this.options.networked.lastSeq });
  }
}
