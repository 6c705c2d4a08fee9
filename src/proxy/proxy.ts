/**
 * `kvedge serve --proxy`: an OpenAI-compatible front for the fleet. Per request:
 *
 *   tokenize (the model's tokenizer and chat template, ./openai.ts) -> route through
 *   admission (the real router, held or refused at saturation as /v1/route is; the
 *   request becomes the chosen worker's load) -> forward the client's body
 *   to the worker's http_endpoint -> stream the answer back as it comes.
 *
 * The proxy drives the request's lifecycle itself: prefill_done at the answer's first
 * byte, done when it ends, when the client goes away, or when the engine fails. A
 * worker that cannot be reached (connection refused, reset before any answer) is
 * skipped for the next candidate, the request's load moving with it. The answer's
 * `usage.prompt_tokens_details.cached_tokens` is compared with the prediction
 * (src/core/observed-hits.ts). For that, a streamed request that does not ask for usage gets
 * `stream_options.include_usage` added, and the usage-only chunk it then receives is
 * not passed on: the client sees the stream it asked for.
 */
import { KvedgeError } from "../domain/errors";
import { receiveBody, reply } from "../http/http";
import type { KvedgeCore, RouteCall, RouteInput } from "../core/core";
import type { Logger } from "../util/log";
import {
  cachedTokensOf,
  COMPLETIONS_PATH,
  includesUsage,
  isStream,
  maxTokensOf,
  type OpenAiPath,
  promptTokens,
} from "./openai";
import type { PromptTokenizer } from "./tokenizer";

export interface ProxyOptions {
  readonly core: KvedgeCore;
  readonly tokenizer: PromptTokenizer | null;
  readonly model: string;
  readonly forwardTokenIds: boolean;
  readonly bodyLimitBytes: number;
  readonly log: Logger;
}

/** Workers tried per request: the pick, then the next cheapest candidates. */
const ATTEMPTS_MAX = 3;
/** An SSE event longer than this without its blank line is passed on unparsed. */
const EVENT_BYTES_MAX = 1 << 20;

export interface ProxyCounters {
  requests: number;
  /** Answers relayed to the end (any status the engine gave). */
  completed: number;
  /** Client went away before the answer ended. */
  clientAborts: number;
  /** The engine failed mid-answer. */
  engineErrors: number;
  /** A worker could not be reached and the next candidate was tried. */
  failovers: number;
  /** No candidate could be reached (502) or none has an http_endpoint. */
  unreachable: number;
  /** Refused before routing (bad request, tokenizer). */
  rejected: number;
  /** Refused at routing: no workers, or admission's 429 (route.admission). */
  refused: number;
}

interface Target {
  readonly slot: number;
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly overlapBlocks: number;
}

export class OpenAiProxy {
  readonly counters: ProxyCounters = {
    requests: 0,
    completed: 0,
    clientAborts: 0,
    engineErrors: 0,
    failovers: 0,
    unreachable: 0,
    rejected: 0,
    refused: 0,
  };
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(private readonly options: ProxyOptions) {}

  /**
   * GET /v1/models: the model this proxy serves, and its LoRA adapters
   * (`index.lora_adapters`), each with the base model as `parent`, as vLLM lists them.
   */
  models(request: Request): Response {
    const { model, core } = this.options;
    const entry = (id: string, parent: string | null) => ({
      id,
      object: "model",
      created: this.created,
      owned_by: "kvedge",
      ...(parent === null ? {} : { parent }),
    });
    return reply(request, 200, {
      object: "list",
      data: [entry(model, null), ...core.lora.adapters.map(({ name }) => entry(name, model))],
    });
  }

  /** POST /v1/completions and /v1/chat/completions. */
  async handle(request: Request, path: OpenAiPath): Promise<Response> {
    this.counters.requests++;
    let parsed: Parsed;
    try {
      parsed = await this.parse(request, path);
    } catch (error) {
      this.counters.rejected++;
      throw error;
    }
    const { core } = this.options;
    // A refusal (no workers, admission's 429) is a KvedgeError: the server answers its status.
    const { requestId, targets } = await this.admit(parsed, request.signal);
    const lifecycle = new Lifecycle(core, requestId);
    let admittedOn = targets[0]!;
    try {
      for (let attempt = 0; attempt < targets.length && attempt < ATTEMPTS_MAX; attempt++) {
        const target = targets[attempt]!;
        const endpoint = core.httpEndpointOf(target.workerId, target.dpRank);
        if (endpoint === null) continue;
        if (target !== admittedOn) {
          // The load goes from the worker the request was admitted on to this one.
          core.moveRequest(requestId, routeInput(parsed), target.slot, target.overlapBlocks);
          admittedOn = target;
        }
        const upstream = await this.forward(endpoint, path, parsed, target, request.signal);
        if (upstream === null) {
          this.counters.failovers++;
          continue;
        }
        return this.relay(upstream, parsed, target, lifecycle, request.signal);
      }
    } catch (error) {
      lifecycle.done();
      throw error;
    }
    lifecycle.done();
    this.counters.unreachable++;
    const tried = targets
      .slice(0, ATTEMPTS_MAX)
      .map((t) => t.workerId.toString())
      .join(", ");
    throw new KvedgeError(
      "engine_unreachable",
      `no engine could be reached for this request (workers tried: ${tried}; each needs an http_endpoint)`,
    );
  }

  /**
   * Routes the request through admission (route.admission), as POST /v1/route is: at
   * once, or held until a worker frees (a client that goes away meanwhile is dropped
   * from the queue, 499), or refused (429 with Retry-After).
   */
  private admit(parsed: Parsed, client: AbortSignal): Promise<Admitted> {
    const { core } = this.options;
    return new Promise((resolve, reject) => {
      const call: RouteCall = {
        input: routeInput(parsed),
        candidatesMax: ATTEMPTS_MAX + 1,
        // Synchronous with the decision: the candidate list is reused by the next route.
        answer: ({ decision }) => {
          resolve({ requestId: decision.requestId, targets: targetsOf(decision) });
        },
        fail: (error) => {
          this.counters.refused++;
          reject(error);
        },
      };
      const handle = core.submitRoute(call);
      if (handle < 0) return;
      client.addEventListener(
        "abort",
        () => {
          if (!core.dropHeld(handle, call)) return; // answered already: the forward sees the abort
          this.counters.clientAborts++;
          reject(
            new KvedgeError(
              "client_closed",
              "the client closed the request while it was held for a worker",
            ),
          );
        },
        { once: true },
      );
    });
  }

  /**
   * The LoRA adapter a request's model names (null: the served model itself); a model
   * that is neither the served one nor a configured adapter is refused.
   */
  private loraOf(model: unknown): string | null {
    if (model === undefined || model === this.options.model) return null;
    if (typeof model === "string" && this.options.core.lora.has(model)) return model;
    throw new KvedgeError(
      "unknown_model",
      `The model \`${String(model)}\` does not exist (this proxy serves ${this.options.model}).`,
    );
  }

  private async parse(request: Request, path: OpenAiPath): Promise<Parsed> {
    const received = await receiveBody(request, this.options.bodyLimitBytes);
    if (!("json" in received))
      throw new KvedgeError("unsupported_media_type", "the OpenAI API takes JSON bodies");
    let body: Record<string, unknown>;
    try {
      const value: unknown = JSON.parse(received.json);
      if (value === null || typeof value !== "object" || Array.isArray(value))
        throw new Error("not a JSON object");
      body = value as Record<string, unknown>;
    } catch (error) {
      throw new KvedgeError("bad_request", `malformed JSON body: ${(error as Error).message}`);
    }
    const lora = this.loraOf(body.model);
    const stream = isStream(body);
    const maxTokens = maxTokensOf(body);
    const salt = body.cache_salt;
    if (salt !== undefined && salt !== null && typeof salt !== "string")
      throw new KvedgeError("bad_request", "cache_salt must be a string");
    const tokens = await promptTokens(this.options.tokenizer, path, body);
    if (tokens.length === 0) throw new KvedgeError("bad_request", "the prompt has no tokens");
    const stripUsage = stream && !includesUsage(body);
    const rewrite = stripUsage || (this.options.forwardTokenIds && path === COMPLETIONS_PATH);
    let forwarded = received.json;
    if (rewrite) {
      const copy: Record<string, unknown> = { ...body };
      if (stripUsage)
        copy.stream_options = {
          ...(body.stream_options as object | undefined),
          include_usage: true,
        };
      if (this.options.forwardTokenIds && path === COMPLETIONS_PATH)
        copy.prompt = Array.from(tokens);
      forwarded = JSON.stringify(copy);
    }
    return {
      tokens,
      stream,
      stripUsage,
      maxTokens,
      loraName: lora,
      cacheSalt: typeof salt === "string" ? salt : null,
      forwarded,
    };
  }

  /** The engine's response, or null if it could not be reached (the caller tries the next one). */
  private async forward(
    endpoint: string,
    path: OpenAiPath,
    parsed: Parsed,
    target: Target,
    client: AbortSignal,
  ): Promise<Response | null> {
    const headers: Record<string, string> = {
      "content-type": "application/json",
      accept: parsed.stream ? "text/event-stream" : "application/json",
    };
    // vLLM's data-parallel servers take the rank to run on from this header.
    if (target.dpRank !== 0) headers["x-data-parallel-rank"] = String(target.dpRank);
    try {
      return await fetch(`${endpoint}${path}`, {
        method: "POST",
        headers,
        body: parsed.forwarded,
        signal: client,
      });
    } catch (error) {
      if (client.aborted) throw new KvedgeError("client_closed", "the client closed the request");
      this.options.log.warn("engine unreachable; trying the next candidate", {
        worker_id: target.workerId,
        dp_rank: target.dpRank,
        endpoint,
        error: (error as Error).message,
      });
      return null;
    }
  }

  private relay(
    upstream: Response,
    parsed: Parsed,
    target: Target,
    lifecycle: Lifecycle,
    client: AbortSignal,
  ): Response {
    const { core } = this.options;
    const promptTokens = parsed.tokens.length;
    const reusable = Math.floor((promptTokens - 1) / core.blockSize) * core.blockSize;
    const predicted = Math.min(target.overlapBlocks * core.blockSize, reusable);
    const headers = new Headers({
      "content-type": upstream.headers.get("content-type") ?? "application/json",
    });
    headers.set("x-kvedge-worker-id", target.workerId.toString());
    headers.set("x-kvedge-dp-rank", String(target.dpRank));
    headers.set("x-kvedge-request-id", lifecycle.requestId);
    const observe = (cached: number | null): void => {
      core.observedHits.record(target.workerId, target.dpRank, promptTokens, predicted, cached);
    };
    const relay = new Relay(
      upstream,
      parsed.stream,
      parsed.stripUsage,
      lifecycle,
      client,
      this.counters,
      observe,
      this.options.log,
      target,
    );
    return new Response(relay.body, { status: upstream.status, headers });
  }
}

/** A routed request: its id and the workers to try, the pick first. */
interface Admitted {
  readonly requestId: string;
  readonly targets: Target[];
}

/** What the core routes a proxied request by. */
function routeInput(parsed: Parsed): RouteInput {
  return {
    tokens: parsed.tokens,
    requestId: null,
    loraName: parsed.loraName,
    cacheSalt: parsed.cacheSalt,
    expectedOutputTokens: parsed.maxTokens,
    overlapScoreCredit: null,
    prefillLoadScale: null,
    temperature: null,
  };
}

interface Parsed {
  readonly tokens: Uint32Array;
  readonly stream: boolean;
  /** Usage was added to the forwarded request and must not reach the client. */
  readonly stripUsage: boolean;
  readonly maxTokens: number;
  /** The LoRA adapter the request's model names (null: the base model). */
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
  /** The body sent to the engine: the client's, or a rewrite of it. */
  readonly forwarded: string;
}

/** The decision's pick, then its other candidates cheapest first (copied: the list is reused). */
function targetsOf(decision: import("../route").RouteDecision): Target[] {
  const targets: Target[] = [
    {
      slot: decision.slot,
      workerId: decision.workerId,
      dpRank: decision.dpRank,
      overlapBlocks: decision.overlapBlocks,
    },
  ];
  const list = decision.candidates;
  for (let i = 0; i < list.count; i++) {
    if (list.slots[i] === decision.slot) continue;
    const candidate = list.at(i);
    targets.push({
      slot: candidate.slot,
      workerId: candidate.workerId,
      dpRank: candidate.dpRank,
      overlapBlocks: candidate.overlapBlocks,
    });
  }
  return targets;
}

/**
 * One engine answer on its way to the client: passed on as it comes (SSE re-cut at
 * event boundaries), its usage read on the way, the request's lifecycle ended exactly
 * once whatever ends the answer.
 */
/** What the relay reads of the engine's body (fetch's default reader). */
interface UpstreamReader {
  read(): Promise<{ done: true; value?: undefined } | { done: false; value: Uint8Array }>;
  cancel(): Promise<void>;
}

class Relay {
  readonly body: ReadableStream<Uint8Array> | null;
  private readonly reader: UpstreamReader | null;
  private readonly events: SseScanner | null;
  /** A plain answer's bytes, kept (up to EVENT_BYTES_MAX) to read its usage at the end. */
  private readonly whole: Uint8Array[] = [];
  private wholeBytes = 0;
  private ended = false;

  constructor(
    private readonly upstream: Response,
    stream: boolean,
    stripUsage: boolean,
    private readonly lifecycle: Lifecycle,
    private readonly client: AbortSignal,
    private readonly counters: ProxyCounters,
    private readonly observe: (cached: number | null) => void,
    private readonly log: Logger,
    private readonly target: Target,
  ) {
    this.events = stream && upstream.ok ? new SseScanner(stripUsage) : null;
    this.reader = (upstream.body?.getReader() ?? null) as UpstreamReader | null;
    if (this.reader === null) {
      this.end();
      counters.completed++;
      this.body = null;
      return;
    }
    this.body = new ReadableStream<Uint8Array>({
      pull: (controller) => this.pull(controller),
      cancel: () => this.cancel(),
    });
  }

  private async pull(controller: ReadableStreamDefaultController<Uint8Array>): Promise<void> {
    let chunk: Awaited<ReturnType<UpstreamReader["read"]>>;
    try {
      chunk = await this.reader!.read();
    } catch (error) {
      this.broke(controller, error as Error);
      return;
    }
    if (chunk.done) {
      this.finished(controller);
      return;
    }
    this.lifecycle.prefillDone();
    if (this.events !== null) {
      const out = this.events.push(chunk.value);
      if (out.length > 0) controller.enqueue(out);
      return;
    }
    if (this.upstream.ok && this.wholeBytes < EVENT_BYTES_MAX) {
      this.whole.push(chunk.value);
      this.wholeBytes += chunk.value.length;
    }
    controller.enqueue(chunk.value);
  }

  private finished(controller: ReadableStreamDefaultController<Uint8Array>): void {
    if (this.events !== null) {
      const rest = this.events.flush();
      if (rest.length > 0) controller.enqueue(rest);
      this.observe(this.events.cachedTokens);
    } else if (this.upstream.ok) {
      this.observe(cachedTokensOfJson(this.whole, this.wholeBytes));
    }
    this.end();
    this.counters.completed++;
    controller.close();
  }

  /** The upstream read failed: the client left (its signal aborted the fetch), or the engine did. */
  private broke(controller: ReadableStreamDefaultController<Uint8Array>, error: Error): void {
    if (this.ended) return;
    this.end();
    if (this.client.aborted) {
      this.counters.clientAborts++;
      return;
    }
    this.counters.engineErrors++;
    this.log.warn("the engine's answer broke off", {
      worker_id: this.target.workerId,
      error: error.message,
    });
    controller.error(error);
  }

  private async cancel(): Promise<void> {
    if (!this.ended) {
      this.counters.clientAborts++;
      this.end();
    }
    await this.reader!.cancel().catch(() => {});
  }

  private end(): void {
    this.ended = true;
    this.lifecycle.done();
  }
}

/** prefill_done once, done once: a proxied request's load ends exactly once, whatever ends it. */
class Lifecycle {
  private prefilled = false;
  private finished = false;

  constructor(
    private readonly core: KvedgeCore,
    readonly requestId: string,
  ) {}

  prefillDone(): void {
    if (this.prefilled || this.finished) return;
    this.prefilled = true;
    this.core.prefillDone(this.requestId);
  }

  done(): void {
    if (this.finished) return;
    this.finished = true;
    this.core.done(this.requestId);
  }
}

const utf8 = new TextDecoder();
const encoder = new TextEncoder();

function cachedTokensOfJson(chunks: Uint8Array[], bytes: number): number | null {
  if (bytes >= EVENT_BYTES_MAX) return null;
  try {
    return cachedTokensOf(JSON.parse(utf8.decode(Buffer.concat(chunks))));
  } catch {
    return null;
  }
}

/**
 * Reads a Server-Sent Events stream as it passes: remembers the last `cached_tokens`
 * seen in a usage and, with `stripUsage`, drops the usage-only chunks (`"choices": []`)
 * the proxy asked for on the client's behalf. Everything else passes byte for byte,
 * re-cut at event boundaries.
 */
class SseScanner {
  cachedTokens: number | null = null;
  private pending = "";
  private readonly decoder = new TextDecoder();

  constructor(private readonly stripUsage: boolean) {}

  push(chunk: Uint8Array): Uint8Array {
    this.pending += this.decoder.decode(chunk, { stream: true });
    let out = "";
    let start = 0;
    for (
      let end = this.pending.indexOf("\n\n");
      end >= 0;
      end = this.pending.indexOf("\n\n", start)
    ) {
      const event = this.pending.slice(start, end + 2);
      start = end + 2;
      if (!this.dropped(event)) out += event;
    }
    this.pending = this.pending.slice(start);
    if (this.pending.length > EVENT_BYTES_MAX) {
      out += this.pending;
      this.pending = "";
    }
    return out.length === 0 ? EMPTY : encoder.encode(out);
  }

  /** What is left at the end of the stream (an unterminated last event). */
  flush(): Uint8Array {
    const rest = this.pending + this.decoder.decode();
    this.pending = "";
    if (rest.length === 0 || this.dropped(rest)) return EMPTY;
    return encoder.encode(rest);
  }

  private dropped(event: string): boolean {
    if (!event.includes('"usage"')) return false;
    const data = event.startsWith("data: ") ? event.slice(6).trim() : null;
    if (data === null || data === "[DONE]") return false;
    let chunk: { choices?: unknown } | null;
    try {
      chunk = JSON.parse(data) as { choices?: unknown } | null;
    } catch {
      return false;
    }
    const cached = cachedTokensOf(chunk);
    if (cached !== null) this.cachedTokens = cached;
    return this.stripUsage && Array.isArray(chunk?.choices) && chunk.choices.length === 0;
  }
}

const EMPTY = new Uint8Array(0);
