/**
 * A route lane: a thread (src/cli/thread-main.ts, role "lane") with a `Bun.serve`
 * of its own on the public host and port, shared with the other lanes (`reusePort`:
 * the kernel spreads connections over them). A lane does the per-request work that
 * needs nothing shared: Bun's HTTP handling, the guard, reading and parsing the body,
 * hashing the prompt, and, when the writer thread owns the index, looking its matches
 * up in the shared crtc. The decision (load tracker, admission, costs; the match too
 * when the index is the main thread's) is the main thread's: a lane posts the route
 * there and answers with what comes back (./lanes.ts is the other end). Route requests
 * of one event-loop turn go in one message, like the main thread's turn batches; a
 * client that goes away unanswered is posted too, and the main thread drops its route
 * if admission holds it. With admission on a lane looks no matches up: a held route is
 * matched afresh each time it is looked at. With `serve --proxy`, a lane carries its
 * OpenAI requests' I/O (src/proxy/lane-end.ts): the main thread decides and accounts
 * for each, the lane connects to the engine and relays the answer
 * (docs/decisions.md#lane-relays). Every other endpoint, WebSocket included, is proxied
 * to the main thread's own server on a loopback port. See docs/decisions.md#route-lanes.
 * Before it listens, a lane of `serve --proxy` warms its proxied path through its own
 * handler (src/proxy/warmup.ts, docs/decisions.md#proxy-warm-up), every lane at once;
 * then the main thread gives it the port, one lane after another.
 */
import type { Server, ServerWebSocket } from "bun";
import type { MatchedWorkers, RouteInput } from "../core/core";
import { MatchResult } from "../index/types";
import { attach, type SharedIndexDescriptor, type SharedIndexReader } from "../index/crtc/shared";
import { blockSeed, type LoraAdapter, LoraAdapters } from "../hash";
import { PromptHasher } from "../route/input";
import { parseRoute } from "./api";
import { RequestGuard, requestPath } from "./guard";
import { controlRefusal, isControlPath, type Surface } from "./surface";
import { LaneEnd } from "../proxy/lane-end";
import { isOpenAiPath, type OpenAiPath } from "../proxy/openai";
import type { ProxyEvent, ProxyOrder } from "../proxy/remote";
import {
  errorReply,
  parseBody,
  type ReceivedBody,
  receiveBody,
  receiveBytes,
  reply,
  UNLIMITED_BODY,
} from "../http/http";
import { clientError, fromWire, INTERNAL_ERROR, type WireError } from "../http/errors";
import { TurnGate } from "../util/turn-gate";
import type { Config } from "../config";
import { warmUpProxy } from "../proxy/warmup";

export interface LaneStart {
  /** The public host, shared by every lane (the port comes once the lane is warm). */
  readonly host: string;
  /** The main thread's own server, where everything but routes goes. */
  readonly mainUrl: string;
  readonly bodyLimitBytes: number;
  readonly blockSize: number;
  /** `index.lora_adapters`: how requests' LoRA ids name adapters. */
  readonly loraAdapters: readonly LoraAdapter[];
  /** The writer thread's shared index: matches are looked up here (null: on the main thread). */
  readonly index: SharedIndexDescriptor | null;
  /** `proxy`: the port of `serve --proxy`, where the control plane is refused (./surface.ts). */
  readonly surface: Surface;
  /** With `serve --proxy`: proxy.warmup_streams, and the settings the warm-up's scratch core takes. */
  readonly warmup: { readonly streams: number; readonly config: Config } | null;
}

/** A lane's warm-up before it listened: what it ran, or why it failed. */
export interface LaneWarmup {
  readonly requests: number;
  readonly ms: number;
  readonly error: string | null;
}

/** One route, hashed, as the main thread routes it. */
export interface LaneRoute {
  readonly id: number;
  readonly input: RouteInput;
  readonly candidatesMax: number;
}

export type LaneToMain =
  /** Warmed up (or not: `warmup` null), ready to listen. */
  | { readonly t: "warm"; readonly warmup: LaneWarmup | null }
  | { readonly t: "listening"; readonly port: number }
  | { readonly t: "routes"; readonly routes: LaneRoute[] }
  /** The client of route `id` went away unanswered: dropped if it is held. */
  | { readonly t: "abort"; readonly id: number }
  /** News of the lane's proxied requests (src/proxy/remote.ts). */
  | { readonly t: "proxy"; readonly events: ProxyEvent[] }
  | { readonly t: "stopped" };

/** The answer to one route: its body, or the error the main thread refused it with. */
export type LaneAnswer =
  | { readonly id: number; readonly body: unknown; readonly error: null }
  | { readonly id: number; readonly body: null; readonly error: WireError };

export type MainToLane =
  /** Listen on this port (0: pick one), shared with the other lanes. */
  | { readonly t: "listen"; readonly port: number }
  | { readonly t: "answers"; readonly answers: LaneAnswer[] }
  | { readonly t: "proxy"; readonly orders: ProxyOrder[] }
  | { readonly t: "stop"; readonly graceMs: number };

interface Pending {
  readonly request: Request;
  readonly resolve: (response: Response) => void;
}

/** Headers the lane has judged (the guard) and must not pass on as if from the client. */
const JUDGED = new Set(["host", "origin", "sec-fetch-site", "connection", "content-length"]);

interface Piped {
  upstream: WebSocket | null;
  queued: (string | Uint8Array)[];
  queuedBytes: number;
}

/** Runs a lane until told to stop; `send` posts to the main thread (`transfer` moved with it). */
export async function runLane(
  start: LaneStart,
  send: (message: LaneToMain, transfer?: ArrayBuffer[]) => void,
  listen: (handler: (message: MainToLane) => void) => void,
): Promise<void> {
  const guard = new RequestGuard(start.host);
  const warmup = await warmUpLane(start, guard);
  const port = await new Promise<number>((resolve) => {
    listen((message) => {
      if (message.t === "listen") resolve(message.port);
    });
    send({ t: "warm", warmup });
  });
  const routes = new LaneRoutes(start, send, guard);
  const proxied =
    start.surface === "proxy"
      ? new LaneEnd((events, transfer) => send({ t: "proxy", events }, transfer))
      : null;
  const server: Server<Piped> = Bun.serve<Piped>({
    hostname: start.host,
    port,
    reusePort: true,
    development: false,
    maxRequestBodySize: UNLIMITED_BODY,
    routes:
      start.surface === "all"
        ? { "/v1/route": { POST: (request: Request) => routes.route(request) } }
        : {},
    fetch: laneFetch(start, guard, proxied),
    websocket: pipeHandlers(start.mainUrl, start.bodyLimitBytes),
  });
  listen((message) => {
    if (message.t === "answers") routes.answer(message.answers);
    else if (message.t === "proxy") proxied?.orders(message.orders);
    else if (message.t === "stop")
      void stopLane(server, message.graceMs, proxied).then(() => send({ t: "stopped" }));
  });
  send({ t: "listening", port: server.port! });
}

/**
 * A lane's handler of every request but a route: OpenAI requests carried on `proxied`
 * (with `serve --proxy`), WebSocket upgrades piped, the rest passed to the main thread.
 */
function laneFetch(start: LaneStart, guard: RequestGuard, proxied: LaneEnd | null) {
  const gate = new TurnGate(REQUESTS_PER_TURN);
  return (request: Request, server: Server<Piped>): Response | Promise<Response> => {
    let path: string;
    try {
      path = requestPath(request);
      if (start.surface === "proxy" && isControlPath(path)) throw controlRefusal();
    } catch (error) {
      return failure(request, error);
    }
    if (path === "/v1/ws" && request.headers.get("upgrade") !== null) {
      try {
        guard.check(request, true);
      } catch (error) {
        return failure(request, error);
      }
      if (server.upgrade(request, { data: { upstream: null, queued: [], queuedBytes: 0 } })) {
        return undefined as unknown as Response;
      }
    }
    // The main thread's server keeps its own timeouts (a proxied completion may pause
    // long); a dump keeps the lane's, which cut a client that stopped reading it.
    if (path !== "/v1/dump") server.timeout(request, 0);
    if (proxied !== null && request.method === "POST" && isOpenAiPath(path))
      return carry(request, path, proxied, start.bodyLimitBytes, guard, gate);
    return proxy(request, start.mainUrl, start.bodyLimitBytes, guard);
  };
}

/**
 * With `serve --proxy`, before the lane listens: its proxied requests' path warmed on
 * scratch pieces through this lane's own handler (src/proxy/warmup.ts); what it did, or
 * why it failed (the lane then serves cold), for the main thread to log.
 */
async function warmUpLane(start: LaneStart, guard: RequestGuard): Promise<LaneWarmup | null> {
  if (start.surface !== "proxy" || start.warmup === null || start.warmup.streams <= 0) return null;
  try {
    const { requests, ms } = await warmUpProxy({
      config: start.warmup.config,
      requests: start.warmup.streams,
      tokenizer: null,
      paths: ["lane"],
      laneFront: (end) => {
        const fetch = laneFetch(start, guard, end);
        return (request, server) => fetch(request, server as unknown as Server<Piped>);
      },
    });
    return { requests, ms: Math.round(ms), error: null };
  } catch (error) {
    return { requests: 0, ms: 0, error: error instanceof Error ? error.message : String(error) };
  }
}

/** A lane's routes: parsed and hashed here, posted one message per turn, answered when decided. */
class LaneRoutes {
  private readonly hasher = new PromptHasher();
  private readonly reader: SharedIndexReader | null;
  private readonly found = new MatchResult(64);
  private readonly pending = new Map<number, Pending>();
  private readonly lora: LoraAdapters;
  private nextId = 0;
  private batch: LaneRoute[] = [];

  constructor(
    private readonly start: LaneStart,
    private readonly send: (message: LaneToMain) => void,
    private readonly guard: RequestGuard,
  ) {
    this.reader = start.index === null ? null : attach(start.index);
    this.lora = new LoraAdapters(start.loraAdapters);
  }

  route(request: Request): Promise<Response> {
    return new Promise<Response>((resolve) => {
      try {
        this.guard.check(request, true);
      } catch (error) {
        resolve(failure(request, error));
        return;
      }
      receiveBody(request, this.start.bodyLimitBytes)
        .then((body) => {
          this.post(request, resolve, body);
        })
        .catch((error: unknown) => resolve(failure(request, error)));
    });
  }

  answer(answers: readonly LaneAnswer[]): void {
    for (const answer of answers) {
      const waiting = this.pending.get(answer.id);
      if (waiting === undefined) continue;
      this.pending.delete(answer.id);
      const { error } = answer;
      waiting.resolve(
        error === null
          ? reply(waiting.request, 200, answer.body)
          : errorReply(waiting.request, fromWire(error)),
      );
    }
  }

  private post(request: Request, resolve: (response: Response) => void, body: ReceivedBody): void {
    const { input, candidatesMax } = parseRoute(parseBody(body, true), this.lora);
    const seed = blockSeed(input.loraName, input.cacheSalt);
    const hashed = this.hasher.hash(input.tokens, this.start.blockSize, seed);
    const words = 2 * hashed.blockCount;
    const prompt = {
      blockCount: hashed.blockCount,
      local: hashed.local.slice(0, words),
      chain: hashed.chain.slice(0, words),
    };
    const id = this.nextId++;
    this.pending.set(id, { request, resolve });
    request.signal.addEventListener("abort", () => this.abort(id), { once: true });
    if (this.batch.length === 0) setImmediate(this.flush);
    // Copies: the parser's token array is reused by the next request.
    const matched =
      this.reader === null ? undefined : this.match(prompt.local, prompt.chain, prompt.blockCount);
    const copied = {
      ...input,
      tokens: input.tokens.slice(),
      prompt,
      ...(matched === undefined ? {} : { matched }),
    };
    this.batch.push({ id, input: copied, candidatesMax });
  }

  /**
   * The prompt's matches on the writer's index: slots in the main thread's numbering,
   * each with its generation stamp, for the main thread to check it still names the
   * same worker when it decides.
   */
  private match(local: Uint32Array, chain: Uint32Array, count: number): MatchedWorkers {
    const reader = this.reader!;
    const found = this.found;
    reader.findMatches(local, count, found, chain);
    const slots = found.workers.slice(0, found.count);
    const stamps = new Uint32Array(found.count);
    for (let i = 0; i < found.count; i++) stamps[i] = reader.stampOf(slots[i]!);
    return { slots, stamps, blocks: found.blocks.slice(0, found.count) };
  }

  /** A client gone before its answer: the main thread drops its route if held. */
  private abort(id: number): void {
    if (!this.pending.delete(id)) return;
    // The route goes first (messages keep their order), so the abort finds it.
    if (this.batch.some((route) => route.id === id)) this.flush();
    this.send({ t: "abort", id });
  }

  private readonly flush = (): void => {
    if (this.batch.length === 0) return; // flushed early by an abort
    const routes = this.batch;
    this.batch = [];
    this.send({ t: "routes", routes });
  };
}

/** Any other request, passed to the main thread's server as it came (the guard judged it here). */
async function proxy(
  request: Request,
  mainUrl: string,
  limitBytes: number,
  guard: RequestGuard,
): Promise<Response> {
  try {
    guard.check(request, request.method !== "GET" && request.method !== "HEAD");
    const url = new URL(request.url);
    const bodiless = request.method === "GET" || request.method === "HEAD";
    const body = bodiless ? null : await receiveBytes(request, limitBytes, false);
    const answer = await fetch(`${mainUrl}${url.pathname}${url.search}`, {
      method: request.method,
      headers: forwardedHeaders(request),
      body,
      redirect: "manual",
      signal: request.signal,
    });
    return new Response(answer.body, { status: answer.status, headers: answer.headers });
  } catch (error) {
    return failure(request, error);
  }
}

/** The client's headers but the ones the lane judged. */
function forwardedHeaders(request: Request): [string, string][] {
  const headers: [string, string][] = [];
  for (const [name, value] of request.headers) {
    if (!JUDGED.has(name)) headers.push([name, value]);
  }
  return headers;
}

/** A proxied OpenAI request: its body read here, its I/O carried here (src/proxy/lane-end.ts). */
async function carry(
  request: Request,
  path: OpenAiPath,
  proxied: LaneEnd,
  limitBytes: number,
  guard: RequestGuard,
  gate: TurnGate,
): Promise<Response> {
  try {
    guard.check(request, true);
    const body = await receiveBytes(request, limitBytes);
    await gate.pass();
    return await proxied.handle(request, path, body);
  } catch (error) {
    return failure(request, error);
  }
}

/** Proxied requests a lane starts per event-loop turn (src/util/turn-gate.ts says why). */
const REQUESTS_PER_TURN = 16;

/** WebSocket clients of a lane are piped, frame for frame, to the main thread's /v1/ws. */
function pipeHandlers(mainUrl: string, limitBytes: number) {
  const target = `${mainUrl.replace(/^http/, "ws")}/v1/ws`;
  // Bounded both ways: frames waiting for the connection to the main thread, and
  // answers a slow client has not read (the main thread bounds its own side).
  const overLimit = (ws: ServerWebSocket<Piped>): boolean => {
    if (ws.data.queuedBytes <= limitBytes && ws.getBufferedAmount() <= limitBytes) return false;
    ws.close(1013, "too much unsent or unread data");
    ws.data.upstream?.close();
    return true;
  };
  return {
    open(ws: ServerWebSocket<Piped>) {
      const upstream = new WebSocket(target);
      upstream.binaryType = "arraybuffer";
      ws.data.upstream = upstream;
      upstream.onopen = () => {
        for (const frame of ws.data.queued) upstream.send(frame);
        ws.data.queued = [];
        ws.data.queuedBytes = 0;
      };
      upstream.onmessage = (event) => {
        const data = event.data as string | ArrayBuffer;
        ws.send(typeof data === "string" ? data : new Uint8Array(data));
        overLimit(ws);
      };
      upstream.onclose = () => ws.close();
      upstream.onerror = () => ws.close(1011, "the main thread's server is unreachable");
    },
    message(ws: ServerWebSocket<Piped>, frame: string | Buffer) {
      const upstream = ws.data.upstream!;
      const data = typeof frame === "string" ? frame : new Uint8Array(frame);
      if (upstream.readyState === WebSocket.OPEN) {
        upstream.send(data);
        return;
      }
      ws.data.queued.push(typeof data === "string" ? data : data.slice());
      ws.data.queuedBytes += typeof data === "string" ? 3 * data.length : data.length;
      overLimit(ws);
    },
    close(ws: ServerWebSocket<Piped>) {
      ws.data.upstream?.close();
    },
  };
}

async function stopLane(
  server: Server<Piped>,
  graceMs: number,
  proxied: LaneEnd | null,
): Promise<void> {
  const closing = server.stop(false);
  const deadline = new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref());
  await Promise.race([closing, deadline]);
  proxied?.stop();
  await server.stop(true);
}

function failure(request: Request, error: unknown): Response {
  const client = clientError(error);
  if (client !== null) return errorReply(request, client);
  return errorReply(request, INTERNAL_ERROR);
}
