/**
 * The main thread's side of the route lanes (./lane.ts): starts them on the public
 * port, routes the hashed requests they post through the core (admission included),
 * and posts the answers back, one message per batch. The load tracker, the index and
 * admission stay the main thread's, so every lane sees one consistent load
 * (docs/decisions.md#route-lanes says why and what it costs).
 */
import type { KvedgeCore, RouteCall } from "../core/core";
import { type KvedgeThread, startThread } from "../runtime/threads";
import type { SharedIndexDescriptor } from "../index/crtc/shared";
import type { Logger } from "../util/log";
import type { OpenAiProxy } from "../proxy/proxy";
import { RemoteRequests } from "../proxy/remote";
import { routeAnswer } from "./route-answer";
import { STATUS_OF, wireError } from "../http/errors";
import type { LaneAnswer, LaneRoute, LaneStart, LaneToMain, LaneWarmup, MainToLane } from "./lane";
import type { ServerMetrics } from "./metrics";
import type { Surface } from "./surface";

export interface LanesOptions {
  readonly host: string;
  readonly port: number;
  /** Where lanes proxy every other endpoint: the main thread's server on loopback. */
  readonly mainUrl: string;
  readonly bodyLimitBytes: number;
  readonly core: KvedgeCore;
  readonly metrics: ServerMetrics;
  readonly log: Logger;
  /** Per lane, its CPUs (null = not pinned). */
  readonly cpus: readonly (readonly number[] | null)[];
  /** The writer thread's shared index, which lanes then look matches up in (else: null). */
  readonly index: SharedIndexDescriptor | null;
  /** `proxy`: the lanes serve `serve --proxy`'s port, where the control plane is refused. */
  readonly surface: Surface;
  /** With `serve --proxy`: the proxy whose requests the lanes carry (src/proxy/remote.ts). */
  readonly proxy: OpenAiProxy | null;
  /** With `serve --proxy`: what each lane warms its path with before it listens (./lane.ts). */
  readonly warmup: LaneStart["warmup"];
}

const ROUTE_LABEL = "/v1/route";

export class RouteLanes {
  private constructor(
    readonly port: number,
    private readonly threads: KvedgeThread[],
  ) {}

  /**
   * Starts every lane, lets them warm up at once (each its own VM), then has them listen
   * one after another: the first picks the port when it is 0, the rest share it.
   */
  static async start(options: LanesOptions): Promise<RouteLanes> {
    const threads: KvedgeThread[] = [];
    let port = options.port;
    const start: LaneStart = {
      host: options.host,
      mainUrl: options.mainUrl,
      bodyLimitBytes: options.bodyLimitBytes,
      blockSize: options.core.blockSize,
      loraAdapters: options.core.lora.adapters,
      // A call that may be held is matched afresh each time it is looked at, here.
      index: options.core.mayHold ? null : options.index,
      surface: options.surface,
      warmup: options.warmup,
    };
    try {
      const warming: Promise<{ warmup: LaneWarmup | null }>[] = [];
      for (const cpus of options.cpus) {
        const thread = await startThread({ role: "lane", cpus, data: start });
        threads.push(thread);
        // At once: a lane with nothing to warm says so as soon as it is ready.
        warming.push(laneMessage(thread, "warm"));
      }
      const warmups = await Promise.all(warming);
      for (const [lane, { warmup }] of warmups.entries()) logWarmup(options.log, lane, warmup);
      for (const thread of threads) {
        thread.post({ t: "listen", port } satisfies MainToLane);
        port = (await laneMessage(thread, "listening")).port;
        serveLane(thread, options);
      }
    } catch (error) {
      await Promise.all(threads.map((thread) => thread.stop()));
      throw error;
    }
    return new RouteLanes(port, threads);
  }

  get count(): number {
    return this.threads.length;
  }

  /** Per lane, the CPUs it may run on (after pinning itself). */
  get cpus(): readonly (readonly number[])[] {
    return this.threads.map((thread) => thread.ready.cpus);
  }

  /** Each lane stops accepting, lets its requests finish (up to `graceMs`), and ends. */
  async stop(graceMs: number): Promise<void> {
    await Promise.all(
      this.threads.map(
        (thread) =>
          new Promise<void>((resolve) => {
            // The lane's proxied requests go on being served while it stops.
            const serving = thread.onMessage;
            const failing = thread.onFailure;
            thread.onMessage = (body) => {
              if ((body as LaneToMain).t === "stopped") resolve();
              else serving(body);
            };
            thread.onFailure = (error) => {
              failing(error);
              resolve();
            };
            thread.post({ t: "stop", graceMs } satisfies MainToLane);
          }),
      ),
    );
    await Promise.all(this.threads.map((thread) => thread.stop()));
  }
}

/** The lane's next message of kind `t` (its start's: "warm", then "listening"). */
function laneMessage<T extends "warm" | "listening">(
  thread: KvedgeThread,
  t: T,
): Promise<Extract<LaneToMain, { t: T }>> {
  return new Promise((resolve, reject) => {
    thread.onMessage = (body) => {
      const message = body as LaneToMain;
      if (message.t === t) resolve(message as Extract<LaneToMain, { t: T }>);
    };
    thread.onFailure = (error) => reject(new Error(error));
  });
}

/** A lane's warm-up, as the main thread's own is logged (src/cli/serve.ts). */
function logWarmup(log: Logger, lane: number, warmup: LaneWarmup | null): void {
  if (warmup === null) return;
  if (warmup.error !== null)
    log.error("warm-up failed; serving without it", { lane, error: warmup.error });
  else log.info("warmed up", { lane, proxy_requests: warmup.requests, ms: warmup.ms });
}

/**
 * Routes what a lane posts; answers given at once go back in one message per batch.
 * A held route whose client goes away (the lane says so) is dropped, as on one thread.
 */
function serveLane(thread: KvedgeThread, options: LanesOptions): void {
  const { core, metrics, log } = options;
  const proxied = remoteRequests(thread, options);
  let batch: LaneAnswer[] | null = null;
  const held = new Map<number, { readonly handle: number; readonly call: RouteCall }>();
  const answer = (lane: LaneAnswer): void => {
    if (batch !== null) batch.push(lane);
    else thread.post({ t: "answers", answers: [lane] } satisfies MainToLane);
  };
  const routeOne = (route: LaneRoute): void => {
    const started = performance.now();
    const finish = (lane: LaneAnswer): void => {
      held.delete(route.id);
      const status = lane.error === null ? 200 : STATUS_OF[lane.error.code];
      metrics.observeHttp(ROUTE_LABEL, status, (performance.now() - started) / 1000);
      answer(lane);
    };
    const call: RouteCall = {
      input: route.input,
      candidatesMax: route.candidatesMax,
      answer: (outcome) => {
        const body = routeAnswer(core, outcome);
        finish({ id: route.id, body, error: null });
      },
      fail: (error) => finish(failed(route.id, error, log)),
    };
    try {
      const handle = core.submitRoute(call);
      if (handle >= 0) held.set(route.id, { handle, call });
    } catch (error) {
      call.fail(error);
    }
  };
  const abort = (id: number): void => {
    const entry = held.get(id);
    if (entry === undefined) return; // answered already
    held.delete(id);
    core.dropHeld(entry.handle, entry.call);
  };
  thread.onMessage = (body) => {
    const message = body as LaneToMain;
    if (message.t === "abort") abort(message.id);
    if (message.t === "proxy") proxied?.events(message.events);
    if (message.t !== "routes") return;
    batch = [];
    for (const route of message.routes) routeOne(route);
    const answers = batch;
    batch = null;
    if (answers.length > 0) thread.post({ t: "answers", answers } satisfies MainToLane);
  };
  thread.onFailure = (error) => {
    log.error("a route lane failed", { error });
    proxied?.laneGone();
  };
}

/** With `serve --proxy`: the lane's proxied requests, on this thread (src/proxy/remote.ts). */
function remoteRequests(thread: KvedgeThread, options: LanesOptions): RemoteRequests | null {
  const { proxy, metrics } = options;
  if (proxy === null) return null;
  return new RemoteRequests(
    proxy,
    (orders) => thread.post({ t: "proxy", orders } satisfies MainToLane),
    (path, status, seconds) => metrics.observeHttp(path, status, seconds),
  );
}

function failed(id: number, error: unknown, log: Logger): LaneAnswer {
  return { id, body: null, error: wireError(error, log) };
}
