/**
 * Runs mock engines in real time: model time = start + (wall time since start) ×
 * speedup. Engine steps end when model time reaches them; after each step (and each
 * submission) the engine's events are published.
 *
 * A replay that knows its next arrival sets `hold` to it: engines never run past an
 * arrival that has not been routed yet, so a slow router delays the replay instead of
 * the request (TTFT stays what the engine model says, whatever the wall-clock jitter),
 * and at equal times step ends come before arrivals, as in the virtual-time simulator.
 * A standalone engine leaves `hold` at Infinity and submits at `modelNow()`.
 */

/** What the pacer drives: an engine to step, and what to do after each step. */
export interface PacedEngine {
  readonly engine: { nextEventMs(): number; step(): number };
  /** Called after every step (publishes the step's events). */
  publish(): unknown;
}

/** Longest single sleep, so a changed clock or a missed kick is noticed. */
const SLEEP_MAX_MS = 50;

export class Pacer {
  readonly speedup: number;
  /** Engines do not run past this model time. */
  private holdMs = Infinity;
  private wall0 = 0;
  private model0 = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private running = false;
  /** Model time while the clock is paused (NaN: running). */
  private pausedAt = Number.NaN;
  private idleWaiters: (() => void)[] = [];
  /** Steps processed (all engines). */
  steps = 0;

  constructor(
    private readonly engines: readonly PacedEngine[],
    speedup: number,
  ) {
    if (!(speedup > 0) || !Number.isFinite(speedup))
      throw new RangeError(`speedup must be > 0, got ${speedup}`);
    this.speedup = speedup;
  }

  /** Starts the clock at model time `modelStartMs` and steps engines in the background. */
  start(modelStartMs: number): void {
    this.wall0 = performance.now();
    this.model0 = modelStartMs;
    this.running = true;
    this.kick();
  }

  stop(): void {
    this.running = false;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  modelNow(): number {
    if (!Number.isNaN(this.pausedAt)) return this.pausedAt;
    return this.model0 + (performance.now() - this.wall0) * this.speedup;
  }

  /** Stops model time (a replay waiting for a router); `resume` goes on from the same instant. */
  pause(): void {
    if (Number.isNaN(this.pausedAt)) this.pausedAt = this.modelNow();
  }

  resume(): void {
    if (Number.isNaN(this.pausedAt)) return;
    this.model0 = this.pausedAt;
    this.wall0 = performance.now();
    this.pausedAt = Number.NaN;
    this.kick();
  }

  get hold(): number {
    return this.holdMs;
  }

  set hold(ms: number) {
    this.holdMs = ms;
    this.kick();
  }

  /** Processes every step that ends at or before min(now, hold); returns how many. */
  advance(): number {
    const limit = Math.min(this.modelNow(), this.holdMs);
    let steps = 0;
    for (const paced of this.engines) {
      const engine = paced.engine;
      while (engine.nextEventMs() <= limit) {
        engine.step();
        paced.publish();
        steps++;
      }
    }
    this.steps += steps;
    if (this.idleWaiters.length > 0 && this.idle) {
      const waiters = this.idleWaiters;
      this.idleWaiters = [];
      for (const resolve of waiters) resolve();
    }
    return steps;
  }

  /** No engine has a step in flight. */
  get idle(): boolean {
    for (const paced of this.engines) if (paced.engine.nextEventMs() !== Infinity) return false;
    return true;
  }

  /** Resolves once model time has reached `ms` and every step up to it (within the hold) is done. */
  async until(ms: number): Promise<void> {
    for (;;) {
      const ahead = ms - this.modelNow();
      if (ahead <= 0) break;
      await Bun.sleep(Math.min(SLEEP_MAX_MS, ahead / this.speedup));
    }
    this.advance();
  }

  /** Resolves when no engine has work left (the hold must not stop them). */
  whenIdle(): Promise<void> {
    this.advance();
    if (this.idle) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Re-plans the background timer (after a submission or a hold change). */
  kick(): void {
    if (!this.running) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.advance();
    let due = Infinity;
    for (const paced of this.engines) due = Math.min(due, paced.engine.nextEventMs());
    // Held engines wait for the next kick (a hold change); otherwise sleep until the next step end.
    if (due === Infinity || due > this.holdMs) return;
    const wallMs = Math.max(0, Math.min(SLEEP_MAX_MS, (due - this.modelNow()) / this.speedup));
    this.timer = setTimeout(() => {
      this.timer = null;
      this.kick();
    }, wallMs);
  }
}
