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
 *
 * A router that may hold a route until a worker frees (admission) would deadlock a
 * replay that holds the engines for its answer: with `answerWaitMs`, the engines are
 * held at most that long (wall ms, model time paused meanwhile); an answer that comes
 * later is submitted when it comes, at the model time then (its TTFT still counts from
 * its arrival), and a route the router refused (-1) is counted as rejected.
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
  /** The engine (index) for a request, or -1 if the router refused it; may wait on the network. */
  route(query: RouteQuery, nowMs: number): Promise<number> | number;
  /** `cachedTokens`: what the engine served from its cache (it reports that at the first token). */
  prefillDone(id: number, nowMs: number, cachedTokens?: number): void;
  done(id: number, nowMs: number): void;
}

/** A routing policy of ./policies.ts as a RouterClient (in-process, no network). */
export function policyClient(policy: RoutingPolicy): RouterClient {
  return {
    route: (query, nowMs) => policy.route(query, nowMs),
    prefillDone: (id, nowMs, cachedTokens) => policy.prefillDone(id, nowMs, cachedTokens),
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
  /** Longest the engines are held for a route's answer, wall ms (default: until it comes). */
  readonly answerWaitMs?: number;
}

/** What `race` resolves to when a route's answer takes longer than `answerWaitMs`. */
const LATE = -2;

export interface RealtimeResult {
  readonly report: PolicyReport;
  readonly wallMs: number;
  /** Model span of the replay / wall time: the speed-up actually achieved. */
  readonly achievedSpeedup: number;
  readonly steps: number;
}

/** Replays `trace` over fresh `engines` (idle, caches as the caller wants them) in real time. */
export async function replayRealtime(
  policyName: string,
  options: RealtimeOptions,
): Promise<RealtimeResult> {
  const { trace, engines, router } = options;
  const recorder = new RunRecorder(trace, {
    prefillDone: (request, nowMs, cached) => router.prefillDone(request.id, nowMs, cached),
    finished: (request, nowMs) => router.done(request.id, nowMs),
  });
  const listener: EngineListener = recorder.listener;
  for (const networked of engines) {
    if (!networked.engine.idle)
      throw new Error(`engine ${networked.engine.index} is busy before the replay`);
    networked.listener = listener;
  }
  const pacer = new Pacer(engines, options.speedup);
  const first = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  const spanMs = trace.count > 0 ? trace.arrivalMs[trace.count - 1]! - first : 0;
  const started = performance.now();
  const handoff = new Handoff(engines, recorder, router, pacer);
  const report = (): void =>
    options.progress?.({
      routed: handoff.routed,
      total: trace.count,
      spanMs,
      modelMs: Math.min(pacer.modelNow(), pacer.hold) - first,
    });
  const waitMs = options.answerWaitMs ?? Infinity;
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
      const answer = router.route(query, arrivalMs);
      const waits = waitMs === Infinity || typeof answer === "number";
      const worker = waits ? await answer : await race(answer, waitMs, pacer);
      if (worker === LATE) handoff.placeLate(query, answer as Promise<number>);
      else handoff.place(query, worker, arrivalMs);
    }
    pacer.hold = Infinity;
    await handoff.settle();
    await pacer.whenIdle();
  } finally {
    pacer.stop();
    if (ticker !== null) clearInterval(ticker);
  }
  report();
  const wallMs = performance.now() - started;
  return {
    report: recorder.report(
      policyName,
      engines.map((networked) => networked.engine),
      options.verify ?? false,
    ),
    wallMs,
    achievedSpeedup: wallMs === 0 ? Infinity : (recorder.lastMs - first) / wallMs,
    steps: pacer.steps,
  };
}

/** Hands routed requests to their engines: at their arrival, or when a late answer comes. */
class Handoff {
  routed = 0;
  private readonly late: Promise<void>[] = [];

  constructor(
    private readonly engines: readonly NetworkedEngine[],
    private readonly recorder: RunRecorder,
    private readonly router: RouterClient,
    private readonly pacer: Pacer,
  ) {}

  /** Request `query` to engine `worker` (-1: refused) at model time `nowMs`. */
  place(query: RouteQuery, worker: number, nowMs: number): void {
    this.routed++;
    if (worker === -1) {
      this.recorder.rejectedAt(nowMs);
      return;
    }
    const engines = this.engines;
    if (!Number.isInteger(worker) || worker < 0 || worker >= engines.length) {
      throw new Error(`the router chose engine ${worker} of ${engines.length}`);
    }
    const target = engines[worker]!;
    const ended = () => this.router.done(query.id, nowMs);
    submit(target.engine, this.recorder, query, worker, nowMs, ended);
    target.publish();
  }

  /** A late answer: submitted when it comes, after the steps that ended before then. */
  placeLate(query: RouteQuery, answer: Promise<number>): void {
    const pacer = this.pacer;
    this.late.push(
      answer.then((worker) => {
        pacer.advance();
        this.place(query, worker, Math.min(pacer.modelNow(), pacer.hold));
        pacer.kick();
      }),
    );
  }

  /** Resolves when every late answer is placed. */
  async settle(): Promise<void> {
    await Promise.all(this.late);
  }
}

/**
 * The answer, or LATE if it takes longer than `waitMs`. Model time stands still while
 * the replay waits (the engines are held anyway), so waits do not push the model clock
 * ahead of the engines.
 */
async function race(answer: Promise<number>, waitMs: number, pacer: Pacer): Promise<number> {
  let timer: ReturnType<typeof setTimeout> | null = null;
  const timeout = new Promise<number>((resolve) => {
    timer = setTimeout(() => resolve(LATE), waitMs);
  });
  pacer.pause();
  try {
    return await Promise.race([answer, timeout]);
  } finally {
    if (timer !== null) clearTimeout(timer);
    pacer.resume();
  }
}
