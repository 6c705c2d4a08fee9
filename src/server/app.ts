/**
 * The HTTP and WebSocket server (Bun.serve): routes to the API operations, JSON or
 * MessagePack, admin auth, metrics per request, errors as `{"error": "..."}`. It all
 * runs on the process's one JavaScript thread: see docs/decisions.md#one-thread.
 */
import { KvedgeError } from "../domain/errors";
import type { Server } from "bun";
import { timingSafeEqual } from "node:crypto";
import type { Logger } from "../util/log";
import {
  addWorkerOp,
  decideRoute,
  lifecycleOp,
  matchOp,
  removeWorkerOp,
  submitRoute,
  workersOp,
} from "./api";
import { routeAnswer, writeRouteAnswer } from "./route-answer";
import type { RouteOutcome } from "../core/core";
import { DumpStreamer } from "./dump-stream";
import { RequestGuard, requestPath } from "./guard";
import {
  CONTROL_PATHS,
  controlRefusal,
  isControlPath,
  PROXY_PORT_PATHS,
  type Surface,
} from "./surface";
import { clientError, INTERNAL_ERROR } from "../http/errors";
import {
  errorReply,
  msgpackReply,
  parseBody,
  readBody,
  receiveBody,
  reply,
  type ReceivedBody,
  wantsMsgpack,
} from "../http/http";
import { ServerMetrics } from "./metrics";
import { UNLIMITED_BODY } from "../http/http";
import type { MetricsRegistry } from "../util/metrics";
import type { KvedgeCore } from "../core/core";
import type { Cluster } from "../cluster/cluster";
import { statusOp, statusPage } from "./status";
import { StatusHistory } from "./status-history";
import { TurnBatch } from "./turn";
import { CHAT_PATH, COMPLETIONS_PATH, type OpenAiPath } from "../proxy/openai";
import type { OpenAiProxy } from "../proxy/proxy";
import { newWsData, type WsData, websocketHandlers } from "./ws";

export interface AppOptions {
  readonly host: string;
  readonly port: number;
  /**
   * `serve --proxy`: the control listener. `host:port` then serves only what OpenAI
   * clients need and refuses the control plane (./surface.ts); this one serves all.
   */
  readonly control?: { readonly host: string; readonly port: number } | null;
  readonly bodyLimitBytes: number;
  readonly adminToken: string | null;
  readonly core: KvedgeCore;
  readonly registry: MetricsRegistry;
  readonly log: Logger;
  /** `serve --proxy`: the OpenAI-compatible endpoints. */
  readonly proxy?: OpenAiProxy | null;
  /** `serve --cluster-nats`: this process's part in the fleet's shared view. */
  readonly cluster?: Cluster | null;
  /** A dump whose client reads nothing for this long is cut (default DUMP_STALL_MS). */
  readonly dumpStallMs?: number;
}

type Handler = (
  request: Request,
  params: Record<string, string>,
  server: Server<WsData>,
) => Promise<Response> | Response;

/**
 * A hot endpoint run in the turn batch (./turn.ts), once its body (if it reads one) has
 * arrived. It answers synchronously (or, a route held by admission, later); errors
 * become JSON responses.
 */
interface Batched {
  /** "optional": read when the request has one (Content-Length > 0 or chunked). */
  readonly readsBody: boolean | "optional";
  readonly op: (
    request: Request,
    params: Record<string, string>,
    body: ReceivedBody | null,
  ) => Response | Promise<Response>;
}

/** Path template → method → handler. Templates are also the metrics' route label. */
type RouteTable = Record<string, Partial<Record<string, Handler | Batched>>>;

export interface App {
  /** The first listener: the proxy's port with a control listener, else the only one. */
  readonly server: Server<WsData>;
  readonly url: string;
  /** Where the control plane is served: the control listener, else `url`. */
  readonly controlUrl: string;
  /** The request metrics (route lanes report theirs here too). */
  readonly metrics: ServerMetrics;
  /** Stops accepting, lets in-flight requests finish (up to `graceMs`), closes the rest. */
  stop(graceMs: number): Promise<void>;
}

/** What the handlers share: the core, metrics, the dump streamer and the turn batch. */
interface AppContext {
  readonly core: KvedgeCore;
  readonly cluster: Cluster | null;
  readonly log: Logger;
  readonly metrics: ServerMetrics;
  readonly registry: MetricsRegistry;
  readonly limit: number;
  readonly dumps: DumpStreamer;
  // HTTP match, route and lifecycle calls run in turn batches (./turn.ts says why);
  // WebSocket frames drain the batch, then run inline.
  readonly batch: TurnBatch;
  /** Throws 401 unless the request carries the admin token (when one is set). */
  readonly requireAdmin: (request: Request) => void;
  /** The status page's history (sampled while the app runs) and the proxy's counters. */
  readonly history: StatusHistory;
  readonly proxyCounters: object | null;
}

/** One Bun.serve: where it listens, what it serves, its guard (which depends on its host). */
interface Listener {
  readonly host: string;
  readonly port: number;
  readonly surface: Surface;
  readonly guard: RequestGuard;
}

export function startApp(options: AppOptions): App {
  const context = appContext(options);
  options.core.onDecision = (seconds) => context.metrics.observeRouteDecision(seconds);
  const table: RouteTable = { ...apiRoutes(context), ...opsRoutes(context) };
  if (options.proxy) addProxyRoutes(table, options.proxy);
  for (const template of Object.keys(table)) {
    if (!PROXY_PORT_PATHS.has(template) && !CONTROL_PATHS.includes(template))
      throw new Error(`${template} is on neither surface (src/server/surface.ts)`);
  }
  const control = options.control ?? null;
  const listener = (host: string, port: number, surface: Surface): Listener => ({
    host,
    port,
    surface,
    guard: new RequestGuard(host),
  });
  const first = serveOne(
    context,
    table,
    listener(options.host, options.port, control === null ? "all" : "proxy"),
  );
  let second: Server<WsData> | null = null;
  try {
    if (control !== null)
      second = serveOne(context, table, listener(control.host, control.port, "all"));
  } catch (error) {
    void first.stop(true);
    throw error;
  }
  const servers = second === null ? [first] : [first, second];
  context.history.start();
  const url = `http://${hostForUrl(options.host)}:${first.port}`;
  return {
    server: first,
    metrics: context.metrics,
    url,
    controlUrl: second === null ? url : `http://${hostForUrl(control!.host)}:${second.port}`,
    async stop(graceMs) {
      context.history.stop();
      const closing = Promise.all(servers.map((server) => server.stop(false)));
      const deadline = new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref());
      await Promise.race([closing, deadline]);
      await Promise.all(servers.map((server) => server.stop(true)));
    },
  };
}

function serveOne(context: AppContext, table: RouteTable, listener: Listener): Server<WsData> {
  const served: RouteTable = {};
  for (const [template, methods] of Object.entries(table)) {
    if (listener.surface === "all" || PROXY_PORT_PATHS.has(template)) served[template] = methods;
  }
  const routes = bunRoutes(context, served, listener.guard);
  const matchers = Object.keys(table).map((template) => ({
    template,
    pattern: new RegExp(`^${template.replace(/:[a-z]+/g, "[^/]+")}$`),
  }));
  const { log } = context;
  return Bun.serve<WsData>({
    hostname: listener.host,
    port: listener.port,
    // Bun defaults to development mode unless NODE_ENV=production (even in a compiled
    // binary): error pages with stack traces. Never for a server in front of a fleet.
    development: false, // see docs/decisions.md#bun-serve-production
    // Never Bun's limit (an empty 413 and a reset): ours answers a JSON 413 (http.ts).
    maxRequestBodySize: UNLIMITED_BODY,
    routes: routes as never,
    fetch: (request, bun) => unrouted(context, listener, served, matchers, request, bun),
    websocket: websocketHandlers(context.core, log, context.metrics, context.batch),
    error(error) {
      log.error("unhandled server error", { error: error.message });
      return errorReply(null, INTERNAL_ERROR);
    },
  });
}

function appContext(options: AppOptions): AppContext {
  const adminToken = options.adminToken === null ? null : Buffer.from(options.adminToken);
  const metrics = new ServerMetrics(options.registry);
  return {
    core: options.core,
    cluster: options.cluster ?? null,
    log: options.log,
    metrics,
    registry: options.registry,
    limit: options.bodyLimitBytes,
    dumps: new DumpStreamer(options.dumpStallMs),
    batch: new TurnBatch(options.log),
    history: new StatusHistory({
      core: options.core,
      proxyCounters: options.proxy?.counters ?? null,
      decisions: () => metrics.routeDecisions,
    }),
    proxyCounters: options.proxy?.counters ?? null,
    requireAdmin: (request) => {
      if (adminToken === null) return;
      const header = request.headers.get("authorization") ?? "";
      const given = Buffer.from(header.startsWith("Bearer ") ? header.slice(7) : "");
      if (given.length !== adminToken.length || !timingSafeEqual(given, adminToken)) {
        throw new KvedgeError(
          "unauthorized",
          "this endpoint needs Authorization: Bearer <admin token>",
        );
      }
    },
  };
}

/** The API: match, route, lifecycle, workers. */
function apiRoutes(context: AppContext): RouteTable {
  const { core, limit, requireAdmin } = context;
  const lifecycle = (op: "prefill_done" | "done"): Batched => ({
    // prefill_done may say how many prompt tokens the engine served from cache.
    readsBody: op === "prefill_done" ? "optional" : false,
    op: (request, params, body) =>
      reply(
        request,
        200,
        lifecycleOp(core, params.id!, op, body === null ? null : parseBody(body)),
      ),
  });
  return {
    // Parsed with transient token arrays: the op hashes them before the next parse.
    "/v1/match": {
      POST: {
        readsBody: true,
        op: (request, _params, body) => reply(request, 200, matchOp(core, parseBody(body!, true))),
      },
    },
    "/v1/route": {
      POST: {
        readsBody: true,
        op: (request, _params, body) => {
          const parsed = parseBody(body!, true);
          if (core.mayHold) return admittedRoute(context, request, parsed);
          return routeReply(core, request, decideRoute(core, parsed));
        },
      },
    },
    "/v1/requests/:id/prefill_done": { POST: lifecycle("prefill_done") },
    "/v1/requests/:id/done": { POST: lifecycle("done") },
    "/v1/workers": {
      GET: (request) => reply(request, 200, workersOp(core, context.cluster)),
      POST: async (request) => {
        requireAdmin(request);
        return reply(request, 201, await addWorkerOp(core, await readBody(request, limit)));
      },
    },
    "/v1/workers/:id": {
      DELETE: async (request, params) => {
        requireAdmin(request);
        return reply(request, 200, await removeWorkerOp(core, params.id!));
      },
    },
  };
}

/** Operations: dump, status, health, readiness, metrics, the status page. */
function opsRoutes(context: AppContext): RouteTable {
  const { core, registry } = context;
  return {
    "/v1/dump": {
      GET: (request, _params, server) => {
        context.requireAdmin(request);
        const response = context.dumps.response(core.index, core.writes);
        server.timeout(request, context.dumps.idleSecs);
        return response;
      },
    },
    "/v1/status": {
      GET: (request) => {
        const since = Number(new URL(request.url).searchParams.get("since") ?? 0);
        const body = statusOp(
          core,
          context.history,
          context.proxyCounters,
          since || 0,
          context.cluster,
        );
        return reply(request, 200, body);
      },
    },
    "/healthz": { GET: (request) => reply(request, 200, { status: "ok" }) },
    "/readyz": {
      GET: (request) => {
        const readiness = core.readiness();
        const body = { ready: readiness.ready, sources: readiness.states };
        return reply(request, readiness.ready ? 200 : 503, body);
      },
    },
    "/metrics": {
      GET: async () =>
        new Response(await registry.metrics(), {
          headers: { "content-type": registry.contentType },
        }),
    },
    "/": {
      GET: () =>
        new Response(statusPage(), {
          headers: { "content-type": "text/html; charset=utf-8" },
        }),
    },
  };
}

/** `serve --proxy`: the OpenAI-compatible endpoints. */
function addProxyRoutes(table: RouteTable, proxy: OpenAiProxy): void {
  // A streamed answer may pause longer than Bun's idle timeout (a long prefill, a queue).
  const proxied =
    (path: OpenAiPath): Handler =>
    (request, _params, server) => {
      server.timeout(request, 0);
      return proxy.handle(request, path);
    };
  table[COMPLETIONS_PATH] = { POST: proxied(COMPLETIONS_PATH) };
  table[CHAT_PATH] = { POST: proxied(CHAT_PATH) };
  table["/v1/models"] = { GET: (request) => proxy.models(request) };
}

function routeReply(core: KvedgeCore, request: Request, outcome: RouteOutcome): Response {
  return wantsMsgpack(request)
    ? msgpackReply(200, (encoder) => writeRouteAnswer(encoder, core, outcome))
    : reply(null, 200, routeAnswer(core, outcome));
}

/**
 * A route through admission: answered now or, held, when a worker frees; a client
 * that goes away is dropped from the queue.
 */
function admittedRoute(context: AppContext, request: Request, parsed: unknown): Promise<Response> {
  const { core, log } = context;
  let resolve!: (response: Response) => void;
  const answered = new Promise<Response>((settle) => {
    resolve = settle;
  });
  const { handle, call } = submitRoute(
    core,
    parsed,
    (outcome) => resolve(routeReply(core, request, outcome)),
    (error) => resolve(failure(request, error, log)),
  );
  if (handle >= 0) {
    request.signal.addEventListener("abort", () => core.dropHeld(handle, call), { once: true });
  }
  return answered;
}

// Both wrappers time every response and turn errors into JSON ones.
type BunRequest = Request & { params?: Record<string, string> };
type BunHandler = (request: Request, server: Server<WsData>) => Promise<Response> | Response;

/** The table as Bun's routes: each handler wrapped, or run in the turn batch. */
function bunRoutes(
  context: AppContext,
  table: RouteTable,
  guard: RequestGuard,
): Record<string, Record<string, BunHandler>> {
  const routes: Record<string, Record<string, BunHandler>> = {};
  for (const [template, methods] of Object.entries(table)) {
    routes[template] = {};
    for (const [method, handler] of Object.entries(methods)) {
      const label = metricsLabel(template);
      routes[template]![method] =
        typeof handler === "function"
          ? wrapped(context, guard, label, handler)
          : batched(context, guard, label, handler!);
    }
  }
  return routes;
}

/**
 * A batched endpoint is one promise, resolved from inside the batch: no async
 * functions, no promise returned from a callback (each costs microtasks per request).
 */
function batched(
  context: AppContext,
  guard: RequestGuard,
  template: string,
  { readsBody, op }: Batched,
) {
  const { metrics, log, batch, limit } = context;
  return (request: BunRequest): Promise<Response> => {
    const started = performance.now();
    const params = request.params ?? {};
    return new Promise<Response>((resolve) => {
      const finish = (response: Response): void => {
        metrics.observeHttp(template, response.status, (performance.now() - started) / 1000);
        resolve(response);
      };
      const run = (body: ReceivedBody | null): void =>
        batch.post(() => {
          let response: Response | Promise<Response>;
          try {
            response = op(request, params, body);
          } catch (error) {
            response = failure(request, error, log);
          }
          if (response instanceof Response) finish(response);
          else void response.then(finish);
        });
      try {
        guard.check(request, true);
      } catch (error) {
        finish(failure(request, error, log));
        return;
      }
      if (!readsBody || (readsBody === "optional" && !hasBody(request))) run(null);
      else {
        const refused = (error: unknown): void => finish(failure(request, error, log));
        receiveBody(request, limit).then(run, refused);
      }
    });
  };
}

/** Whether a request carries a body (a declared non-zero length, or a chunked one). */
function hasBody(request: Request): boolean {
  const length = request.headers.get("content-length");
  if (length !== null) return Number(length) > 0;
  return request.headers.get("transfer-encoding") !== null;
}

function wrapped(context: AppContext, guard: RequestGuard, template: string, handler: Handler) {
  const { metrics, log } = context;
  return (request: BunRequest, server: Server<WsData>): Promise<Response> | Response => {
    const started = performance.now();
    const finish = (response: Response): Response => {
      metrics.observeHttp(template, response.status, (performance.now() - started) / 1000);
      return response;
    };
    let pending: Response | Promise<Response>;
    try {
      guard.check(request, request.method !== "GET" && request.method !== "HEAD");
      pending = handler(request, request.params ?? {}, server);
    } catch (error) {
      pending = failure(request, error, log);
    }
    if (pending instanceof Response) return finish(pending);
    return pending.then(finish, (error: unknown) => finish(failure(request, error, log)));
  };
}

/**
 * Requests no route took: the WebSocket upgrade, 403 for the control plane on the
 * proxy's port, 405 on a known path, else 404.
 */
function unrouted(
  context: AppContext,
  listener: Listener,
  served: RouteTable,
  matchers: readonly { template: string; pattern: RegExp }[],
  request: Request,
  server: Server<WsData>,
): Response {
  const { metrics, log } = context;
  let path: string;
  try {
    path = requestPath(request);
    // CORS does not cover WebSocket handshakes: a page elsewhere could open one.
    const changesState =
      path === "/v1/ws" || (request.method !== "GET" && request.method !== "HEAD");
    listener.guard.check(request, changesState);
  } catch (error) {
    return failure(request, error, log);
  }
  if (listener.surface === "proxy" && isControlPath(path)) {
    const template = matchers.find((matcher) => matcher.pattern.test(path))?.template;
    metrics.observeHttp(template === undefined ? path : metricsLabel(template), 403, 0);
    return errorReply(request, controlRefusal());
  }
  if (path === "/v1/ws") {
    if (request.method !== "GET") {
      return errorReply(
        request,
        new KvedgeError("method_not_allowed", "use GET with Upgrade: websocket"),
      );
    }
    if (server.upgrade(request, { data: newWsData() })) return undefined as unknown as Response;
    return errorReply(request, new KvedgeError("bad_request", "expected a WebSocket upgrade"));
  }
  const known = matchers.find((matcher) => matcher.pattern.test(path));
  if (known !== undefined && served[known.template] !== undefined) {
    const allowed = Object.keys(served[known.template]!).join(", ");
    const text = `${request.method} is not allowed on ${known.template}; use ${allowed}`;
    const response = errorReply(request, new KvedgeError("method_not_allowed", text));
    response.headers.set("allow", allowed);
    metrics.observeHttp(metricsLabel(known.template), 405, 0);
    return response;
  }
  metrics.observeHttp("unknown", 404, 0);
  return errorReply(request, new KvedgeError("not_found", `no such endpoint: ${path}`));
}

/** An IPv6 literal in brackets, as URLs write it. */
function hostForUrl(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/** ":id" → "{id}", the label form the metrics use. */
function metricsLabel(template: string): string {
  return template.replace(/:([a-z]+)/g, "{$1}");
}

function failure(request: Request, error: unknown, log: Logger): Response {
  const client = clientError(error);
  if (client !== null) return errorReply(request, client);
  const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
  log.error("request failed", { error: text });
  return errorReply(request, INTERNAL_ERROR);
}
