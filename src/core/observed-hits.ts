/**
 * Predicted vs observed cached tokens, per worker. The router predicts, at each
 * decision, how many prompt tokens the chosen worker will serve from its cache (its
 * overlap); the engine's answer says how many it did (`usage.prompt_tokens_details.
 * cached_tokens`). A gap that persists means the index does not describe that engine:
 * a different tokenizer or chat template, block size, hash inputs, events not flushed.
 *
 * The check: over answers that predicted a hit, exponentially weighted sums (window
 * `window` answers) of predicted and observed tokens, the observed capped at the
 * predicted per answer (a surplus from a concurrent request must not hide misses).
 * Once at least `window` such answers were seen, a ratio below `floor` flags the worker
 * (the router then discounts its overlap as for a degraded one); a ratio back above
 * the midpoint of floor and 1 clears it. Answers without `cached_tokens` are counted
 * and judge nothing (the engine may not report it: vLLM needs
 * --enable-prompt-tokens-details), until the worker has reported it once: from then on
 * a usage without it is a miss (vLLM before its newest layout and SGLang leave the
 * field out when nothing was cached). A count that cannot be true (not an integer in
 * [0, the prompt's tokens]) is a bad answer: counted, logged once, and ignored.
 *
 * The other way round, an engine that serves far more from its cache than the router
 * predicted (under half, over every answer) is what a tokenizer or chat-template
 * mismatch looks like: the index holds the engine's tokens, the router queries with
 * others. That is logged and shown (`underPredicted`); discounting would not help.
 *
 * Kept per worker slot, in a column of the core's worker table: a removed worker's
 * record goes with its slot, and the next worker in the slot starts afresh.
 */
import type { SlotColumn, WorkerTable } from "../domain/worker-table";
import type { Logger } from "../util/log";

export interface ObservedHitsOptions {
  /** Fraction of the predicted tokens under which a worker is flagged (0: never). */
  readonly floor: number;
  /** Answers the weighted sums span, and the fewest judged on. */
  readonly window: number;
  readonly log: Logger;
  /** The worker numbering answers are recorded by (slots); it names them in log lines. */
  readonly table: WorkerTable;
  /** Told when a worker's flag changes. */
  readonly onChange: (slot: number, suspect: boolean) => void;
}

/**
 * What an answer said of its cached prompt tokens: a count, or its usage had none
 * ("absent"), or it had no usage ("no_usage"), or the count cannot be true ("bad").
 */
export type CachedReport = number | "absent" | "no_usage" | "bad";

export interface ObservedHitsView {
  /** Answers recorded (with usage or not). */
  readonly answers: number;
  readonly answersWithoutUsage: number;
  /** Answers whose cached count could not be true (ignored). */
  readonly badAnswers: number;
  /** Prompt tokens of the answers with usage. */
  readonly promptTokens: number;
  readonly predictedTokens: number;
  readonly observedTokens: number;
  /** Weighted observed / predicted over the recent answers that predicted a hit; null before any. */
  readonly recentRatio: number | null;
  readonly suspect: boolean;
  /** The engine serves persistently more than predicted: likely not the engine's tokens. */
  readonly underPredicted: boolean;
}

interface WorkerHits {
  answers: number;
  withoutUsage: number;
  bad: number;
  /** The worker has reported cached_tokens: a usage without it is then 0. */
  reportsCached: boolean;
  prompt: number;
  predicted: number;
  observed: number;
  judged: number;
  weightedPredicted: number;
  weightedObserved: number;
  suspect: boolean;
  /** Over every answer with usage: weighted predicted and (uncapped) observed. */
  allPredicted: number;
  allObserved: number;
  underPredicted: boolean;
}

const EMPTY: ObservedHitsView = {
  answers: 0,
  answersWithoutUsage: 0,
  badAnswers: 0,
  promptTokens: 0,
  predictedTokens: 0,
  observedTokens: 0,
  recentRatio: null,
  suspect: false,
  underPredicted: false,
};

export class ObservedHits {
  private readonly workers: SlotColumn<WorkerHits>;
  private readonly decay: number;

  constructor(private readonly options: ObservedHitsOptions) {
    this.decay = 1 - 1 / options.window;
    this.workers = options.table.column();
  }

  /**
   * One answer: its prompt's tokens, those predicted cached at routing, and what it
   * reported. Returns the cached count it judged by (null: none).
   */
  record(slot: number, prompt: number, predicted: number, report: CachedReport): number | null {
    const hits = this.hitsOf(slot);
    hits.answers++;
    if (report === "bad") {
      if (hits.bad++ === 0) {
        this.options.log.warn(
          "an answer's usage.prompt_tokens_details.cached_tokens is not an integer in [0, prompt tokens]: ignored",
          this.named(slot),
        );
      }
      return null;
    }
    if (report === "absent" && hits.reportsCached) report = 0;
    if (typeof report !== "number") {
      if (hits.withoutUsage++ === 0) {
        this.options.log.warn(
          "an answer carries no usage.prompt_tokens_details.cached_tokens: observed hits unknown for this worker" +
            " (vLLM reports it with --enable-prompt-tokens-details)",
          this.named(slot),
        );
      }
      return null;
    }
    hits.reportsCached = true;
    const observed = report;
    hits.prompt += prompt;
    hits.predicted += predicted;
    hits.observed += observed;
    hits.allPredicted = hits.allPredicted * this.decay + predicted;
    hits.allObserved = hits.allObserved * this.decay + observed;
    this.checkUnderPredicted(slot, hits);
    if (predicted <= 0) return observed;
    hits.judged++;
    hits.weightedPredicted = hits.weightedPredicted * this.decay + predicted;
    hits.weightedObserved = hits.weightedObserved * this.decay + Math.min(observed, predicted);
    this.judge(slot, hits);
    return observed;
  }

  private hitsOf(slot: number): WorkerHits {
    let hits = this.workers.get(slot);
    if (hits === undefined) {
      hits = {
        answers: 0,
        withoutUsage: 0,
        bad: 0,
        reportsCached: false,
        prompt: 0,
        predicted: 0,
        observed: 0,
        judged: 0,
        weightedPredicted: 0,
        weightedObserved: 0,
        suspect: false,
        allPredicted: 0,
        allObserved: 0,
        underPredicted: false,
      };
      this.workers.set(slot, hits);
    }
    return hits;
  }

  view(slot: number): ObservedHitsView {
    const hits = this.workers.get(slot);
    if (hits === undefined) return EMPTY;
    return {
      answers: hits.answers,
      answersWithoutUsage: hits.withoutUsage,
      badAnswers: hits.bad,
      promptTokens: hits.prompt,
      predictedTokens: hits.predicted,
      observedTokens: hits.observed,
      recentRatio:
        hits.weightedPredicted > 0 ? hits.weightedObserved / hits.weightedPredicted : null,
      suspect: hits.suspect,
      underPredicted: hits.underPredicted,
    };
  }

  isSuspect(slot: number): boolean {
    return this.workers.get(slot)?.suspect === true;
  }

  /** Workers tracked (for tests of bounded state). */
  get size(): number {
    return this.workers.size;
  }

  /** A slot's worker, as log lines name it. */
  private named(slot: number): { worker_id: bigint; dp_rank: number } {
    const table = this.options.table;
    return { worker_id: table.workerIdOf(slot), dp_rank: table.dpRankOf(slot) };
  }

  private checkUnderPredicted(slot: number, hits: WorkerHits): void {
    if (hits.answers - hits.withoutUsage - hits.bad < this.options.window) return;
    const under = hits.allObserved > 0 && hits.allPredicted < hits.allObserved / 2;
    if (under === hits.underPredicted) return;
    hits.underPredicted = under;
    if (!under) return;
    this.options.log.warn(
      "the engine serves far more from its cache than the router predicted: the router's tokens are likely not" +
        " the engine's (check proxy.tokenizer and the chat template against the engine's model)",
      { ...this.named(slot), predicted_tokens: hits.predicted, observed_tokens: hits.observed },
    );
  }

  private judge(slot: number, hits: WorkerHits): void {
    const { floor, window } = this.options;
    if (floor <= 0 || hits.judged < window) return;
    const ratio = hits.weightedObserved / hits.weightedPredicted;
    const suspect = hits.suspect ? ratio < (floor + 1) / 2 : ratio < floor;
    if (suspect === hits.suspect) return;
    hits.suspect = suspect;
    const fields = {
      ...this.named(slot),
      observed_ratio: Number(ratio.toFixed(3)),
      floor,
      predicted_tokens: hits.predicted,
      observed_tokens: hits.observed,
    };
    if (suspect) {
      this.options.log.warn(
        "observed cached tokens fall persistently below the predicted ones: discounting this worker's overlap" +
          " (a tokenizer, chat template, block size or hash-input mismatch, or events the engine does not publish)",
        fields,
      );
    } else {
      this.options.log.info(
        "observed cached tokens match the predicted ones again: trusting this worker's overlap",
        fields,
      );
    }
    this.options.onChange(slot, suspect);
  }
}
