/**
 * A client of a running `kvedge serve` over its WebSocket API (`/v1/ws`, MessagePack
 * frames): route, prefill_done and done on one connection, so the router receives
 * lifecycle calls and routing requests in the order they are made. Answers are
 * matched by id; route latency is measured from send to answer.
 */
import { Packr } from "msgpackr";
import type { RouteQuery } from "./policies";
import type { RouterClient } from "./realtime";

const packr = new Packr({ useRecords: false, mapsAsObjects: true, int64AsType: "string" });

/** Most requests a client keeps unanswered before `route` refuses (a stuck router). */
const PENDING_MAX = 100_000;

export interface RouteAnswer {
  readonly workerId: string;
  /** Blocks of the prompt the worker holds: the device's and the lower tiers' after them. */
  readonly overlapBlocks: number;
  readonly queryBlocks: number;
}

interface Pending {
  readonly resolve: (answer: Record<string, unknown>) => void;
  readonly reject: (error: Error) => void;
}

/** kvedge answered a route with an error status (429: admission refused it). */
export class RouteRefused extends Error {
  override readonly name = "RouteRefused";
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export class KvedgeClientCounters {
  routes = 0;
  lifecycleCalls = 0;
  /** Lifecycle answers other than 200 (e.g. 404: the router had forgotten the request). */
  lifecycleErrors = 0;
  /** Last lifecycle error message, for the report. */
  lastLifecycleError = "";
}

export class KvedgeClient {
  readonly counters = new KvedgeClientCounters();
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closedError: Error | null = null;

  private constructor(private readonly ws: WebSocket) {
    ws.binaryType = "arraybuffer";
    ws.onmessage = (event) => this.answer(event.data);
    ws.onclose = () => this.fail(new Error("the kvedge WebSocket closed"));
    ws.onerror = () => this.fail(new Error("the kvedge WebSocket failed"));
  }

  /** Connects to `${baseUrl}/v1/ws` (baseUrl: http://host:port). */
  static async connect(baseUrl: string, timeoutMs = 10_000): Promise<KvedgeClient> {
    const url = `${baseUrl.replace(/^http/, "ws").replace(/\/$/, "")}/v1/ws`;
    const ws = new WebSocket(url);
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no WebSocket connection to ${url} within ${timeoutMs} ms`)),
        timeoutMs,
      );
      ws.onopen = () => {
        clearTimeout(timer);
        resolve();
      };
      ws.onerror = () => {
        clearTimeout(timer);
        reject(new Error(`cannot open a WebSocket to ${url}`));
      };
    });
    return new KvedgeClient(ws);
  }

  /** POST /v1/route's operation: the worker for a prompt, recorded as its load under `requestId`. */
  async route(tokens: Uint32Array, requestId: string): Promise<RouteAnswer> {
    this.counters.routes++;
    const result = await this.call({
      op: "route",
      request_id: requestId,
      token_ids: Array.from(tokens),
    });
    if (result.status !== 200) {
      const message = `kvedge refused to route ${requestId}: ${String(result.error)}`;
      throw new RouteRefused(Number(result.status), message);
    }
    const body = result.result as Record<string, unknown>;
    // Blocks the chosen worker holds in every tier (the lower tiers' after the device's).
    const tiers = [body.host_pinned_blocks, body.disk_blocks, body.external_blocks];
    const lower = tiers.reduce((sum: number, blocks) => sum + (Number(blocks) || 0), 0);
    return {
      workerId: String(body.worker_id),
      overlapBlocks: Number(body.overlap_blocks) + lower,
      queryBlocks: Number(body.query_blocks),
    };
  }

  /** prefill_done / done; the answer is checked when it arrives (errors are counted). */
  /** A lifecycle call; prefill_done may carry the cached tokens the engine reported. */
  lifecycle(op: "prefill_done" | "done", requestId: string, cachedTokens?: number): void {
    this.counters.lifecycleCalls++;
    const body =
      cachedTokens === undefined
        ? { op, request_id: requestId }
        : { op, request_id: requestId, cached_tokens: cachedTokens };
    this.call(body).then(
      (result) => {
        if (result.status === 200) return;
        this.counters.lifecycleErrors++;
        this.counters.lastLifecycleError = `${op} ${requestId}: ${String(result.error)}`;
      },
      (error: Error) => {
        this.counters.lifecycleErrors++;
        this.counters.lastLifecycleError = `${op} ${requestId}: ${error.message}`;
      },
    );
  }

  /** Resolves when every call made so far has its answer. */
  async settle(timeoutMs = 10_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (this.pending.size > 0) {
      if (this.closedError !== null) throw this.closedError;
      if (performance.now() > deadline)
        throw new Error(`${this.pending.size} kvedge calls unanswered after ${timeoutMs} ms`);
      await Bun.sleep(5);
    }
  }

  close(): void {
    this.ws.close();
  }

  private call(body: Record<string, unknown>): Promise<Record<string, unknown>> {
    if (this.closedError !== null) return Promise.reject(this.closedError);
    if (this.pending.size >= PENDING_MAX)
      return Promise.reject(new Error(`${PENDING_MAX} kvedge calls unanswered`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(packr.pack({ id, ...body }));
    });
  }

  private answer(data: unknown): void {
    let message: unknown;
    try {
      message =
        data instanceof ArrayBuffer ? packr.unpack(new Uint8Array(data)) : JSON.parse(String(data));
    } catch (error) {
      this.fail(new Error(`kvedge sent a malformed frame: ${(error as Error).message}`));
      return;
    }
    const answer = message as Record<string, unknown>;
    const pending = typeof answer.id === "number" ? this.pending.get(answer.id) : undefined;
    if (pending === undefined) {
      this.fail(
        new Error(`kvedge answered an unknown request: ${JSON.stringify(answer).slice(0, 200)}`),
      );
      return;
    }
    this.pending.delete(answer.id as number);
    pending.resolve(answer);
  }

  private fail(error: Error): void {
    if (this.closedError !== null) return;
    this.closedError = error;
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
  }
}

/** Per-request numbers a kvedge-backed replay collects. */
export interface KvedgeRouteStats {
  readonly latencyMs: Float64Array;
  readonly overlapBlocks: Float64Array;
  readonly promptTokens: Float64Array;
}

/**
 * kvedge as the RouterClient of a replay: request ids are `${prefix}${id}`, worker ids
 * map to engine indexes through `workerIds` (engine i is `workerIds[i]`). A route
 * answered 429 (admission) is the replay's -1: refused. With `reportCached`,
 * prefill_done carries the cached tokens the engine reported (`cached_tokens`). With
 * several clients (kvedge replicas), request i and its lifecycle calls go to client
 * i mod their number, as a plain load balancer would send them.
 */
export function kvedgeRouter(
  clients: KvedgeClient | readonly KvedgeClient[],
  workerIds: readonly string[],
  count: number,
  prefix: string,
  reportCached = false,
): { router: RouterClient; stats: KvedgeRouteStats } {
  const all = Array.isArray(clients) ? clients : [clients as KvedgeClient];
  const clientOf = (id: number): KvedgeClient => all[id % all.length]!;
  const indexOf = new Map(workerIds.map((id, i) => [id, i]));
  const stats: KvedgeRouteStats = {
    latencyMs: new Float64Array(count).fill(Number.NaN),
    overlapBlocks: new Float64Array(count),
    promptTokens: new Float64Array(count),
  };
  const router: RouterClient = {
    async route(query: RouteQuery): Promise<number> {
      const started = performance.now();
      let answer: RouteAnswer;
      try {
        const prompt = query.tokens.subarray(0, query.promptLength);
        answer = await clientOf(query.id).route(prompt, `${prefix}${query.id}`);
      } catch (error) {
        if (error instanceof RouteRefused && error.status === 429) return -1;
        throw error;
      }
      stats.latencyMs[query.id] = performance.now() - started;
      stats.overlapBlocks[query.id] = answer.overlapBlocks;
      stats.promptTokens[query.id] = query.promptLength;
      const index = indexOf.get(answer.workerId);
      if (index === undefined)
        throw new Error(`kvedge chose worker ${answer.workerId}, which is not one of the engines`);
      return index;
    },
    // With `reportCached`, prefill_done says what the engine served from its cache.
    prefillDone: (id, _nowMs, cached) =>
      clientOf(id).lifecycle("prefill_done", `${prefix}${id}`, reportCached ? cached : undefined),
    done: (id) => clientOf(id).lifecycle("done", `${prefix}${id}`),
  };
  return { router, stats };
}
