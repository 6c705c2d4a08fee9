/**
 * The exact engines an in-process kvedge router holds degraded in a virtual-time run
 * (their event streams cut: ./lost-streams.ts), treated as the core treats them: the
 * router's degraded flag set from the cut on, and, with route.degraded_fallback =
 * predictions, kvedge's predictions of them made and merged by the core's own code
 * (src/core/fallback.ts), told each request's lifecycle at the moments the core is.
 * Nothing here decides anything.
 */
import { DegradedFallback } from "../core/fallback";
import type { WorkerTable } from "../domain/worker-table";
import { DEFAULT_SEED, hashBlocks } from "../hash";
import { MatchResult } from "../index";
import type { Overlaps, RouteDecision, Router } from "../route";
import {
  DEFAULT_PREDICTED_MAX_BLOCKS,
  DEFAULT_PREDICTED_TTL_MS,
  type PredictAt,
} from "../route/predictions";
import type { DEGRADED_FALLBACKS } from "../route/router";

/** What a decision is about (the simulator's RouteQuery). */
interface Query {
  readonly id: number;
  readonly tokens: Uint32Array;
  readonly promptLength: number;
  /** Sequence hashes of the prompt's full blocks. */
  readonly path: Uint32Array;
  readonly promptBlocks: number;
}

export type DegradedFallbackMode = (typeof DEGRADED_FALLBACKS)[number];

export interface DegradedFleetOptions {
  readonly blockSize: number;
  /** Route degraded engines on predictions too (route.degraded_fallback = predictions). */
  readonly fallback: boolean;
  /** What predictions are held to (route.predicted_capacity_blocks; null: the TTL). */
  readonly capacityBlocks: number | null;
  readonly predictAt: PredictAt;
  readonly ttlMs?: number;
  /** Correct by the engines' reported cached tokens. */
  readonly correct: boolean;
  /** Engines that publish no events at all (never degraded here). */
  readonly approximate: (worker: number) => boolean;
  readonly now: () => number;
}

export class DegradedFleet {
  private readonly fallback: DegradedFallback | null;
  private readonly matches = new MatchResult(16);
  private local = new Uint32Array(2 * 1024);

  constructor(
    private readonly router: Router,
    table: WorkerTable,
    private readonly slots: Int32Array,
    private readonly degradedAt: (worker: number, nowMs: number) => boolean,
    private readonly options: DegradedFleetOptions,
  ) {
    this.fallback = options.fallback
      ? new DegradedFallback(
          table,
          options.blockSize,
          {
            blockSize: options.blockSize,
            predictAt: options.predictAt,
            capacityBlocks: options.capacityBlocks,
            ttlMs: options.ttlMs ?? DEFAULT_PREDICTED_TTL_MS,
            maxBlocks: DEFAULT_PREDICTED_MAX_BLOCKS,
            requestTtlMs: Number.MAX_SAFE_INTEGER,
            maxPending: 1 << 24,
            correct: options.correct,
          },
          options.now,
        )
      : null;
  }

  /**
   * Before a decision: each engine's trust at `nowMs` (as KvedgeCore.setTrust), then the
   * overlaps (one entry per engine) as routing takes them: with kvedge's predictions of
   * the degraded engines routed on them (`Overlaps.predicted`).
   */
  overlaps(query: Query, nowMs: number, overlaps: Overlaps): Overlaps {
    const load = this.router.load;
    const fallback = this.fallback;
    for (let w = 0; w < this.slots.length; w++) {
      const slot = this.slots[w]!;
      const degraded = !this.options.approximate(w) && this.degradedAt(w, nowMs);
      load.setDegraded(slot, degraded);
      if (fallback === null || degraded === fallback.isOn(slot)) continue;
      fallback.set(slot, degraded, this.options.capacityBlocks);
      load.setFallback(slot, degraded);
    }
    if (fallback === null || !fallback.active) return overlaps;
    // Every engine has its entry: the lookup adds none.
    const matches = this.matches;
    matches.ensure(this.slots.length);
    matches.count = this.slots.length;
    matches.workers.set(this.slots);
    fallback.lookUp(matches, this.localHashes(query), query.promptBlocks, query.path, load);
    return fallback.withPredicted(overlaps, load);
  }

  routed(query: Query, decision: RouteDecision): void {
    const fallback = this.fallback;
    if (fallback === null || !fallback.active) return;
    fallback.predictions.routed(
      String(query.id),
      decision.slot,
      this.localHashes(query),
      query.path,
      query.promptBlocks,
      query.promptLength,
      decision.overlapBlocks,
      decision.creditedBlocks,
    );
  }

  prefillDone(id: number, cachedTokens: number | undefined): void {
    const reported = this.options.correct && cachedTokens !== undefined ? cachedTokens : null;
    this.fallback?.predictions.prefillDone(String(id), reported);
  }

  done(id: number): void {
    this.fallback?.predictions.done(String(id));
  }

  /** The local hashes of the prompt's full blocks (its chain is `query.path`), in the scratch. */
  private localHashes(query: Query): Uint32Array {
    const words = 2 * query.promptBlocks;
    if (this.local.length < words)
      this.local = new Uint32Array(Math.max(words, 2 * this.local.length));
    const prompt = query.tokens.subarray(0, query.promptLength);
    hashBlocks(prompt, this.options.blockSize, DEFAULT_SEED, this.local);
    return this.local;
  }
}
