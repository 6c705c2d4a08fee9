/**
 * The status page's history, kept on the server so a page opened (or reloaded) now
 * draws the last few minutes at once: every SAMPLE_MS a sample of the cumulative
 * counters and the gauges (the page turns counters into rates), in a ring of
 * HISTORY_SAMPLES. Memory is bounded by the ring: about 0.33 KB a sample, 100 KB in all
 * (measured with ten proxy counters).
 */
import type { KvedgeCore } from "../core/core";

export const SAMPLE_MS = 1000;
/** Five minutes at one sample a second. */
export const HISTORY_SAMPLES = 300;

/** One sample: cumulative counters and gauges at `t` (ms since the epoch). */
export interface StatusSample {
  readonly t: number;
  /** Routing decisions, their prompt tokens and the tokens predicted cached. */
  readonly decisions: number;
  readonly route_prompt_tokens: number;
  readonly route_predicted_tokens: number;
  /** Proxied answers that carried usage: prompt tokens, predicted and observed cached ones. */
  readonly answers: number;
  readonly answer_prompt_tokens: number;
  readonly answer_predicted_tokens: number;
  readonly answer_observed_tokens: number;
  /** KV events applied (stored, removed, cleared). */
  readonly events: number;
  /** Batches with an engine timestamp and the sum of their lags (ms): the event lag. */
  readonly lag_batches: number;
  readonly lag_sum_ms: number;
  readonly active_requests: number;
  readonly degraded_workers: number;
  /** Admission: calls held now; refused with 429, routed past the longest hold (cumulative). */
  readonly held: number;
  readonly rejected: number;
  readonly overdue: number;
  /** Decisions timed since the previous sample, and their p50 and p99 (µs; null: none, or past the last bucket). */
  readonly timed_decisions: number;
  readonly decision_p50_us: number | null;
  readonly decision_p99_us: number | null;
  /** The proxy's counters as they stand (its every numeric counter), or null without the proxy. */
  readonly proxy: Readonly<Record<string, number>> | null;
}

export interface StatusSources {
  readonly core: KvedgeCore;
  /** The proxy's counters object, or null. */
  readonly proxyCounters: object | null;
  /** The route decision histogram (per-bucket counts, bounds in seconds). */
  readonly decisions: () => { readonly bounds: readonly number[]; readonly counts: Float64Array };
}

export class StatusHistory {
  private readonly ring: (StatusSample | undefined)[] = new Array(HISTORY_SAMPLES);
  private next = 0;
  private size = 0;
  private lastDecisions: Float64Array | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;

  constructor(private readonly sources: StatusSources) {}

  /** Samples now and every `intervalMs` until stopped. */
  start(intervalMs = SAMPLE_MS): void {
    this.sample();
    this.timer = setInterval(() => this.sample(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  get length(): number {
    return this.size;
  }

  /** Samples taken after `t`, oldest first. */
  since(t: number): StatusSample[] {
    const out: StatusSample[] = [];
    for (let i = 0; i < this.size; i++) {
      const sample = this.ring[(this.next - this.size + i + HISTORY_SAMPLES) % HISTORY_SAMPLES]!;
      if (sample.t > t) out.push(sample);
    }
    return out;
  }

  sample(now = Date.now()): void {
    const { core, proxyCounters } = this.sources;
    const totals = statusTotals(core);
    const admission = core.admission;
    this.ring[this.next] = {
      t: now,
      decisions: core.routeTotals.decisions,
      route_prompt_tokens: core.routeTotals.promptTokens,
      route_predicted_tokens: core.routeTotals.predictedCachedTokens,
      answers: totals.answers,
      answer_prompt_tokens: totals.promptTokens,
      answer_predicted_tokens: totals.predicted,
      answer_observed_tokens: totals.observed,
      events: totals.events,
      lag_batches: totals.lagBatches,
      lag_sum_ms: totals.lagSumMs,
      active_requests: totals.active,
      degraded_workers: totals.degraded,
      held: admission.held,
      rejected: admission.counts.rejected,
      overdue: admission.counts.overdue,
      ...this.decisionTimes(),
      proxy: proxyCounters === null ? null : numbersOf(proxyCounters),
    };
    this.next = (this.next + 1) % HISTORY_SAMPLES;
    this.size = Math.min(this.size + 1, HISTORY_SAMPLES);
  }

  /** The decisions timed since the last sample, and their quantiles (bucket upper bounds). */
  private decisionTimes() {
    const { bounds, counts } = this.sources.decisions();
    const last = this.lastDecisions;
    const delta = counts.map((count, i) => Math.max(0, count - (last?.[i] ?? 0)));
    this.lastDecisions = counts.slice();
    const total = delta.reduce((sum, count) => sum + count, 0);
    const quantile = (q: number): number | null => {
      let seen = 0;
      for (let i = 0; i < delta.length; i++) {
        seen += delta[i]!;
        if (seen >= q * total) return Math.round(bounds[i]! * 1e6 * 100) / 100;
      }
      return null; // past the last bucket
    };
    const timed = last === null ? 0 : total;
    return {
      timed_decisions: timed,
      decision_p50_us: timed > 0 ? quantile(0.5) : null,
      decision_p99_us: timed > 0 ? quantile(0.99) : null,
    };
  }
}

/** Every numeric own property of an object (the proxy's counters, whatever they are). */
export function numbersOf(object: object): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, value] of Object.entries(object))
    if (typeof value === "number") out[key] = value;
  return out;
}

/** Totals over the workers and the engine streams, as the status op and the samples report them. */
export function statusTotals(core: KvedgeCore) {
  const index = core.index.counters;
  const totals = {
    answers: 0,
    promptTokens: 0,
    predicted: 0,
    observed: 0,
    active: 0,
    degraded: 0,
    events: index.storedEvents + index.removedEvents + index.clearedEvents,
    lagBatches: 0,
    lagSumMs: 0,
  };
  for (const worker of core.workers()) {
    const hits = worker.observed;
    totals.answers += hits.answers - hits.answersWithoutUsage - hits.badAnswers;
    totals.promptTokens += worker.observed.promptTokens;
    totals.predicted += worker.observed.predictedTokens;
    totals.observed += worker.observed.observedTokens;
    totals.active += worker.activeRequests;
    if (worker.degraded) totals.degraded++;
  }
  for (const source of core.engineSources) {
    totals.lagBatches += source.normalizer.counters.lagBatches;
    totals.lagSumMs += source.normalizer.counters.lagSumMs;
  }
  return totals;
}
