/**
 * `kvedge serve --proxy`: an OpenAI-compatible front for the fleet. Per request:
 *
 *   prepare (parse, check, tokenize with the model's tokenizer and chat template; a
 *   large body on a tokenizer thread: ./preparer.ts) -> route through admission (the
 *   real router, held or refused at saturation as /v1/route is; the request becomes the
 *   chosen worker's load) -> an engine connection slot (./upstream.ts) -> forward the
 *   client's bytes to the worker's http_endpoint (kvedge's own client,
 *   src/http/client.ts) -> relay the answer as it comes (./relay.ts). The client's
 *   connection, the engine's and the relay are the transport's (./transport.ts): this
 *   thread's, or the route lane's the client came to (./remote.ts), which does the I/O
 *   on order and reports; everything below is decided here either way.
 *
 * One `ProxiedRequest` owns each request's lifecycle and ends it exactly once, whatever
 * ends it: the answer's end, the client leaving in any phase (held, queued, connecting,
 * waiting for the answer, streaming), an engine error, a timeout, kvedge stopping. Ending
 * gives back everything the request holds: its load (prefill_done at the answer's first
 * byte, done at its end), its admission place, its connection slot, the engine
 * connection (closed, which is how the engine learns to stop). A worker that cannot be
 * connected to is skipped for the next candidate, its load moving with the request;
 * once connected, the request may have been delivered and is never sent elsewhere.
 *
 * The answer's usage is checked against the prediction (src/core/observed-hits.ts). For
 * that a streamed request that did not ask for usage gets `stream_options.include_usage`
 * spliced in, and the usage chunk it then receives is not passed on.
 */
import { KvedgeError } from "../domain/errors";
import { clientClosed, shuttingDown } from "../http/errors";
import {
  type ExchangeRequest,
  type ExchangeTimeouts,
  type Origin,
  originOf,
  type ResponseHead,
  type UpstreamError,
} from "../http/client";
import { reply } from "../http/http";
import type { Config } from "../config";
import type { KvedgeCore, RouteCall, RouteInput } from "../core/core";
import type { RouteDecision } from "../route";
import type { Logger } from "../util/log";
import { cachedReport, type OpenAiPath } from "./openai";
import type { PrepareOptions, Prepared } from "./prepare";
import type { Preparer } from "./preparer";
import type { PromptTokenizer } from "./tokenizer";
import type { RelayOwner } from "./relay";
import { type AnswerSpec, type EngineLink, LocalTransport, type ProxyTransport } from "./transport";
import { UpstreamSlots } from "./upstream";
import { TurnGate } from "../util/turn-gate";

export interface ProxyOptions {
  readonly core: KvedgeCore;
  readonly preparer: Preparer;
  readonly model: string;
  readonly bodyLimitBytes: number;
  readonly timeouts: ExchangeTimeouts;
  /** proxy.upstream_connections and proxy.upstream_queue_timeout_ms. */
  readonly upstreamConnections: number;
  readonly upstreamQueueMs: number;
  readonly log: Logger;
}

/** The model `serve --proxy` serves: proxy.model, else the tokenizer's, else "default". */
export function servedModel(config: Config, tokenizer: PromptTokenizer | null): string {
  return config.proxy.model ?? tokenizer?.model ?? "default";
}

/** How requests are prepared, from the settings: `model` and its LoRA adapters served. */
export function prepareOptionsOf(
  config: Config,
  model: string,
  adapters: readonly string[],
): PrepareOptions {
  const settings = config.proxy;
  return {
    model,
    adapters,
    forwardTokenIds: settings.forward_token_ids,
    limits: { bytes: settings.max_prompt_bytes, tokens: settings.max_prompt_tokens },
  };
}

/** The proxy's options on `core` with `preparer`, from the settings. */
export function proxyOptionsOf(
  config: Config,
  core: KvedgeCore,
  preparer: Preparer,
  log: Logger,
): ProxyOptions {
  const settings = config.proxy;
  return {
    core,
    preparer,
    model: preparer.model,
    bodyLimitBytes: config.server.body_limit_bytes,
    timeouts: {
      connectMs: settings.connect_timeout_ms,
      firstByteMs: settings.first_byte_timeout_ms,
      idleMs: settings.idle_timeout_ms,
    },
    upstreamConnections: settings.upstream_connections,
    upstreamQueueMs: settings.upstream_queue_timeout_ms,
    log,
  };
}

/** Requests that start their costly part (parse, route, connect) per event-loop turn. */
const REQUESTS_PER_TURN = 16;

/** Engine endpoints whose origins are kept parsed. */
const ORIGINS_MAX = 1024;

/** Workers tried per request: the pick, then the next cheapest candidates. */
const ATTEMPTS_MAX = 3;

/** How each proxied request ended: one outcome per request. */
export interface ProxyCounters {
  requests: number;
  /** Answers relayed to the end with a 2xx status. */
  completed: number;
  /** Answers the engine gave with an error status, relayed to the end. */
  errorAnswers: number;
  /** The client went away before the answer ended (in any phase). */
  clientAborts: number;
  /** The engine failed after taking the request: before its answer (502) or in it (cut). */
  engineErrors: number;
  /** No answer within proxy.first_byte_timeout_ms (504). */
  engineTimeouts: number;
  /** The answer paused past proxy.idle_timeout_ms (cut). */
  stalls: number;
  /** No candidate could be connected to (502), or none has an http_endpoint. */
  unreachable: number;
  /** No engine connection slot in time (503), or the buffered-bytes budget full. */
  busy: number;
  /** Refused before routing (bad request, tokenizer, prompt limits). */
  rejected: number;
  /** Refused at routing: no workers, or admission's 429 (route.admission). */
  refused: number;
  /** Ended by kvedge stopping. */
  shutdowns: number;
  /** A worker could not be connected to and the next candidate was tried (not an outcome). */
  failovers: number;
}

export type Outcome = Exclude<keyof ProxyCounters, "requests" | "failovers">;

/** A candidate engine, by identity: a slot may be another worker's after an await. */
interface Target {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly overlapBlocks: number;
  /** Blocks the router counted as cached there: the overlap, or its active requests' if more. */
  readonly creditedBlocks: number;
}

export class OpenAiProxy {
  readonly counters: ProxyCounters = {
    requests: 0,
    completed: 0,
    errorAnswers: 0,
    clientAborts: 0,
    engineErrors: 0,
    engineTimeouts: 0,
    stalls: 0,
    unreachable: 0,
    busy: 0,
    rejected: 0,
    refused: 0,
    shutdowns: 0,
    failovers: 0,
  };
  readonly slots: UpstreamSlots;
  /** A burst of requests is prepared, routed and connected over many event-loop turns. */
  readonly gate = new TurnGate(REQUESTS_PER_TURN);
  /** Requests not ended yet. */
  readonly live = new Set<ProxiedRequest>();
  stopping = false;
  private readonly created = Math.floor(Date.now() / 1000);
  /** Engine endpoints parsed (few: one per engine; cleared if workers come and go a lot). */
  private readonly origins = new Map<string, Origin>();

  constructor(readonly options: ProxyOptions) {
    this.slots = new UpstreamSlots(options.upstreamConnections, options.upstreamQueueMs);
  }

  get preparer(): Preparer {
    return this.options.preparer;
  }

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
  handle(request: Request, path: OpenAiPath): Promise<Response> {
    return this.carry(new LocalTransport(request), path) as Promise<Response>;
  }

  /**
   * A request whose client and engine connection `transport` carries: the Response for
   * the client, or null when the transport gives the client its answer (a route lane).
   */
  carry(transport: ProxyTransport, path: OpenAiPath): Promise<Response | null> {
    this.counters.requests++;
    return new ProxiedRequest(this, transport, path).run();
  }

  /** An engine endpoint's origin, parsed once. */
  originOf(endpoint: string): Origin {
    let origin = this.origins.get(endpoint);
    if (origin === undefined) {
      if (this.origins.size >= ORIGINS_MAX) this.origins.clear();
      origin = originOf(endpoint);
      this.origins.set(endpoint, origin);
    }
    return origin;
  }

  /** Ends every request still running (kvedge stops): engine connections closed, streams cut. */
  stop(): number {
    this.stopping = true;
    const ended = this.live.size;
    for (const request of [...this.live]) request.shutdown();
    return ended;
  }
}

type Phase = "preparing" | "held" | "queued" | "connecting" | "streaming" | "ended";

/** One proxied request, from its body to its answer's end: the one owner of its lifecycle. */
class ProxiedRequest implements RelayOwner {
  private phase: Phase = "preparing";
  private requestId: string | null = null;
  private prefilled = false;
  private slotHeld = false;
  private link: EngineLink | null = null;
  /** Leaves the current wait (admission's queue, the slot queue) with an error. */
  private leave: ((error: KvedgeError) => void) | null = null;
  private target: Target | null = null;
  private prepared: Prepared | null = null;
  private status = 0;

  constructor(
    private readonly proxy: OpenAiProxy,
    private readonly transport: ProxyTransport,
    private readonly path: OpenAiPath,
  ) {
    proxy.live.add(this);
    transport.watch(() => this.clientLeft());
  }

  async run(): Promise<Response | null> {
    try {
      const { preparer, bodyLimitBytes } = this.proxy.options;
      const body = await this.transport.body(bodyLimitBytes);
      await this.proxy.gate.pass();
      this.checkGoing();
      const prepared = await preparer.prepare(body, this.path);
      this.prepared = prepared;
      this.checkGoing();
      const targets = await this.admit(prepared);
      this.checkGoing();
      this.phase = "queued";
      const wait = this.proxy.slots.acquire();
      this.leave = (error) => wait.cancel(error);
      await wait.ready;
      this.slotHeld = true;
      this.leave = null;
      this.checkGoing();
      const head = await this.connect(prepared, targets);
      this.checkGoing(); // the client may have left as the answer's head came
      return this.respond(head);
    } catch (error) {
      this.end(this.transport.gone ? "clientAborts" : outcomeOf(error));
      throw error;
    }
  }

  /** The client went away: whatever the request waits for is let go. */
  private clientLeft(): void {
    if (this.phase === "streaming") this.end("clientAborts");
    else if (this.phase === "connecting") this.link?.abort();
    else this.leave?.(clientClosed());
  }

  /** kvedge stops: the request ends now, in whatever phase. */
  shutdown(): void {
    const phase = this.phase;
    this.end("shutdowns");
    if (phase === "held" || phase === "queued") this.leave?.(shuttingDown());
  }

  /** Throws if the request ended or its client left while it was waiting. */
  private checkGoing(): void {
    if (this.transport.gone) throw clientClosed();
    if (this.phase === "ended" || this.proxy.stopping) throw shuttingDown();
  }

  /**
   * Routes through admission (route.admission), as POST /v1/route is: at once, or held
   * until a worker frees (let go if the client leaves), or refused (429, Retry-After).
   */
  private admit(prepared: Prepared): Promise<Target[]> {
    const { core } = this.proxy.options;
    this.phase = "held";
    return new Promise<Target[]>((resolve, reject) => {
      const call: RouteCall = {
        input: routeInput(prepared),
        candidatesMax: ATTEMPTS_MAX + 1,
        // Synchronous with the decision: the candidate list is reused by the next route.
        answer: ({ decision }) => {
          this.leave = null;
          this.requestId = decision.requestId;
          resolve(targetsOf(decision));
        },
        fail: (error) => {
          this.leave = null;
          reject(error);
        },
      };
      const handle = core.submitRoute(call);
      if (handle < 0) return; // answered (or failed) already
      this.leave = (error) => {
        this.leave = null;
        if (core.dropHeld(handle, call)) reject(error);
      };
    });
  }

  /** Connects to the first candidate that can be reached; the answer's head. */
  private async connect(prepared: Prepared, targets: Target[]): Promise<ResponseHead> {
    const { core, timeouts, log } = this.proxy.options;
    const tried: string[] = [];
    this.phase = "connecting";
    let admittedOn = targets[0]!;
    for (const target of targets.slice(0, ATTEMPTS_MAX)) {
      const endpoint = core.httpEndpointOf(target.workerId, target.dpRank);
      if (endpoint === null) continue;
      if (target !== admittedOn) {
        // The load goes from the worker the request was admitted on to this one.
        const { workerId, dpRank, overlapBlocks } = target;
        if (
          !core.moveRequest(this.requestId!, routeInput(prepared), workerId, dpRank, overlapBlocks)
        )
          continue; // removed since the decision
        admittedOn = target;
      }
      this.target = target;
      tried.push(target.workerId.toString());
      const origin = this.proxy.originOf(endpoint);
      const request = forwardRequest(origin, this.path, prepared, target);
      this.link = this.transport.open(request, timeouts, this.answerSpec(prepared, target));
      try {
        return await this.link.head;
      } catch (error) {
        const failure = error as UpstreamError;
        this.checkGoing();
        if (failure.sent) throw engineFailure(failure, target);
        this.proxy.counters.failovers++;
        log.warn("engine unreachable; trying the next candidate", {
          worker_id: target.workerId,
          dp_rank: target.dpRank,
          endpoint,
          error: failure.message,
        });
      }
    }
    throw new KvedgeError(
      "engine_unreachable",
      `no engine could be reached for this request (workers tried: ${tried.join(", ") || "none"}; each needs an http_endpoint)`,
    );
  }

  /** kvedge's headers on the answer, and whether it drops the usage chunk it asked for. */
  private answerSpec(prepared: Prepared, target: Target): AnswerSpec {
    const headers = {
      "x-kvedge-worker-id": target.workerId.toString(),
      "x-kvedge-dp-rank": String(target.dpRank),
      "x-kvedge-request-id": this.requestId!,
    };
    return { headers, stripUsage: prepared.stripUsage };
  }

  private respond(head: ResponseHead): Response | null {
    this.status = head.status;
    this.phase = "streaming";
    return this.link!.answer(head, this);
  }

  firstByte(): void {
    if (this.prefilled || this.phase !== "streaming") return;
    this.prefilled = true;
    this.proxy.options.core.prefillDone(this.requestId!);
  }

  finished(usage: unknown): void {
    const ok = this.status >= 200 && this.status < 300;
    if (ok && this.phase === "streaming") this.observe(usage);
    this.end(ok ? "completed" : "errorAnswers");
  }

  broke(error: UpstreamError): void {
    if (this.phase !== "streaming") return; // ended already (the client left, kvedge stops)
    if (this.transport.gone) {
      this.end("clientAborts");
      return;
    }
    this.proxy.options.log.warn("the engine's answer broke off", {
      worker_id: this.target!.workerId,
      error: error.message,
    });
    this.end(error.failure === "idle_timeout" ? "stalls" : "engineErrors");
  }

  cancelled(): void {
    this.end("clientAborts");
  }

  private observe(usage: unknown): void {
    const { core } = this.proxy.options;
    const target = this.target!;
    const promptTokens = this.prepared!.tokens.length;
    const reusable = Math.floor((promptTokens - 1) / core.blockSize) * core.blockSize;
    const predicted = Math.min(target.creditedBlocks * core.blockSize, reusable);
    const report = cachedReport(usage, promptTokens);
    const { workerId, dpRank } = target;
    core.recordAnswer(this.requestId!, workerId, dpRank, promptTokens, predicted, report);
  }

  /** Ends the request, once: its outcome counted, everything it holds given back. */
  private end(outcome: Outcome): void {
    if (this.phase === "ended") return;
    this.phase = "ended";
    const { proxy } = this;
    proxy.counters[outcome]++;
    proxy.live.delete(this);
    this.transport.unwatch();
    this.link?.abort();
    if (this.slotHeld) proxy.slots.release();
    this.slotHeld = false;
    if (this.requestId !== null) proxy.options.core.done(this.requestId);
  }
}

/** What went wrong with an engine that may have the request: never sent elsewhere. */
function engineFailure(failure: UpstreamError, target: Target): KvedgeError {
  if (failure.failure === "first_byte_timeout") {
    return new KvedgeError(
      "engine_timeout",
      `worker ${target.workerId} sent no answer within proxy.first_byte_timeout_ms`,
    );
  }
  return new KvedgeError(
    "engine_failed",
    `worker ${target.workerId} failed before its answer: ${failure.message}`,
  );
}

/** The outcome a request that failed before its answer is counted under. */
function outcomeOf(error: unknown): Outcome {
  if (!(error instanceof KvedgeError)) return "rejected";
  switch (error.code) {
    case "client_closed":
      return "clientAborts";
    case "shutting_down":
      return "shutdowns";
    case "engine_timeout":
      return "engineTimeouts";
    case "engine_failed":
      return "engineErrors";
    case "engine_unreachable":
      return "unreachable";
    case "busy":
      return "busy";
    case "overloaded":
    case "no_workers":
      return "refused";
    default:
      return "rejected";
  }
}

/** The engine request: the client's bytes (with kvedge's additions), to the target's endpoint. */
function forwardRequest(
  origin: Origin,
  path: OpenAiPath,
  prepared: Prepared,
  target: Target,
): ExchangeRequest {
  const headers: [string, string][] = [
    ["content-type", "application/json"],
    ["accept", prepared.stream ? "text/event-stream" : "application/json"],
  ];
  // vLLM's data-parallel servers take the rank to run on from this header.
  if (target.dpRank !== 0) headers.push(["x-data-parallel-rank", String(target.dpRank)]);
  return {
    origin,
    method: "POST",
    path,
    headers,
    body: prepared.forwarded,
  };
}

/** What the core routes a proxied request by. */
function routeInput(prepared: Prepared): RouteInput {
  return {
    tokens: prepared.tokens,
    requestId: null,
    loraName: prepared.loraName,
    cacheSalt: prepared.cacheSalt,
    expectedOutputTokens: prepared.maxTokens,
    overlapScoreCredit: null,
    prefillLoadScale: null,
    temperature: null,
  };
}

/** The decision's pick, then its other candidates cheapest first (copied: the list is reused). */
function targetsOf(decision: RouteDecision): Target[] {
  const targets: Target[] = [
    {
      workerId: decision.workerId,
      dpRank: decision.dpRank,
      overlapBlocks: decision.overlapBlocks,
      creditedBlocks: decision.creditedBlocks,
    },
  ];
  const list = decision.candidates;
  for (let i = 0; i < list.count; i++) {
    if (list.slots[i] === decision.slot) continue;
    const candidate = list.at(i);
    targets.push({
      workerId: candidate.workerId,
      dpRank: candidate.dpRank,
      overlapBlocks: candidate.overlapBlocks,
      creditedBlocks: Math.max(candidate.overlapBlocks, candidate.pendingBlocks),
    });
  }
  return targets;
}
