/**
 * Real-time replay: a trace's requests go to a router at their (scaled) arrival times
 * and then to the engine it picks; the router hears `prefillDone` and `done` when the
 * engine model says they happen. Engines are paced (./pacer.ts) and held at the next
 * unrouted arrival, so results depend on the engine model and the router's decisions,
 * not on wall-clock jitter; a router slower than the replay only stretches wall time.
 *
 * With an in-process policy this reproduces `simulate()` exactly (a test checks it);
 * with kvedge behind a socket the router sees the engines' KV events over ZMQ with
 * whatever lag the real transport has.
 */
import type { EngineListener } from "./engine";
import type { NetworkedEngine } from "./networked-engine";
import { RunRecorder, type PolicyReport } from "./outcome";
import { Pacer } from "./pacer";
import type { RouteQuery, RoutingPolicy } from "./policies";
import { requestTokens, routeQuery, submit } from "./simulator";
import type { Trace } from "./trace";

/** A router as the replay drives it. Lifecycle calls must reach it in call order. */
export interface RouterClient {
  /** The engine (index) for a request; may wait on the network. */
  route(query: RouteQuery, nowMs: number): Promise<number> | number;
  prefillDone(id: number, nowMs: number): void;
  done(id: number, nowMs: number): void;
}

/** A routing policy of ./policies.ts as a RouterClient (in-process, no network). */
export function policyClient(policy: RoutingPolicy): RouterClient {
  return {
    route: (query, nowMs) => policy.route(query, nowMs),
    prefillDone: (id, nowMs) => policy.prefillDone(id, nowMs),
    done: (id, nowMs) => policy.finished(id, nowMs),
  };
}

export interface RealtimeProgress {
  readonly routed: number;
  readonly total: number;
  /** Model ms since the first arrival that the engines have reached. */
  readonly modelMs: number;
  readonly spanMs: number;
}

export interface RealtimeOptions {
  readonly trace: Trace;
  readonly engines: readonly NetworkedEngine[];
  readonly router: RouterClient;
  readonly speedup: number;
  readonly blockSize: number;
  readonly vocabSize: number;
  readonly verify?: boolean;
  /** Polled by the caller's progress display. */
  readonly progress?: (progress: RealtimeProgress) => void;
}

export interface RealtimeResult {
  readonly report: PolicyReport;
  readonly wallMs: number;
  /** Model span of the replay / wall time: the speed-up actually achieved. */
  readonly achievedSpeedup: number;
  readonly steps: number;
}

/** Replays `trace` over fresh `engines` (idle, caches as the caller wants them) in real time. */
export async function replayRealtime(policyName: string, options: RealtimeOptions): Promise<RealtimeResult> {
  const { trace, engines, router } = options;
  const recorder = new RunRecorder(trace, {
    prefillDone: (request, nowMs) => router.prefillDone(request.id, nowMs),
    finished: (request, nowMs) => router.done(request.id, nowMs),
  });
  const listener: EngineListener = recorder.listener;
  for (const networked of engines) {
    if (!networked.engine.idle) throw new Error(`engine ${networked.engine.index} is busy before the replay`);
    networked.listener = listener;
  }
  const pacer = new Pacer(engines, options.speedup);
  const first = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  const spanMs = trace.count > 0 ? trace.arrivalMs[trace.count - 1]! - first : 0;
  const started = performance.now();
  let routed = 0;
  const report = (): void => options.progress?.({
    routed, total: trace.count, modelMs: Math.min(pacer.modelNow(), pacer.hold) - first, spanMs,
  });
  const ticker = options.progress === undefined ? null : setInterval(report, 100);
  try {
    pacer.hold = first;
    pacer.start(first);
    for (let i = 0; i < trace.count; i++) {
      const arrivalMs = trace.arrivalMs[i]!;
      pacer.hold = arrivalMs;
      await pacer.until(arrivalMs);
      const tokens = requestTokens(trace, i, options.vocabSize);
      const query = routeQuery(i, tokens, trace.inputLength[i]!, options.blockSize);
      const worker = await router.route(query, arrivalMs);
      if (!Number.isInteger(worker) || worker < 0 || worker >= engines.length) {
        throw new Error(`the router chose engine ${worker} of ${engines.length}`);
      }
      const target = engines[worker]!;
      submit(target.engine, recorder, query, worker, arrivalMs, () => router.done(i, arrivalMs));
      target.publish();
      routed++;
    }
    pacer.hold = Infinity;
    await pacer.whenIdle();
  } finally {
    pacer.stop();
    if (ticker !== null) clearInterval(ticker);
  }
  report();
  const wallMs = performance.now() - started;
  return {
    report: recorder.report(policyName, engines.map((networked) => networked.engine), options.verify ?? false),
    wallMs,
    achievedSpeedup: wallMs === 0 ? Infinity : (recorder.lastMs - first) / wallMs,
    steps: pacer.steps,
  };
}
