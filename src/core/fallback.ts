/**
 * Degraded exact workers routed on predictions (`route.degraded_fallback = predictions`):
 * an exact worker whose state kvedge does not know (events lost without replay, a
 * connection not proven yet, a failed probe, refused stores, hits far below its
 * events) is degraded until its state is known again. From the
 * moment it degrades, kvedge predicts what it caches from its own decisions, as for an
 * approximate worker (src/route/predictions.ts), in an index of its own beside the
 * main one (the main one keeps the worker's events); the router is given both, and
 * trusts the larger of the predictions and the discounted indexed overlap
 * (src/route/router.ts `fallbackOverlap`); answers show the larger of the two undiscounted.
 * When the worker is exact again its predictions go. They never count as exact: the
 * worker's overlap kind stays `degraded`.
 * See docs/decisions.md#degraded-fallback.
 */
import type { WorkerTable } from "../domain/worker-table";
import { createIndex, type KvIndex, MatchResult } from "../index";
import type { Overlaps } from "../route";
import type { LoadTracker } from "../route/load";
import { type PredictionSettings, Predictions } from "../route/predictions";

export class DegradedFallback {
  readonly predictions: Predictions;
  readonly index: KvIndex;
  private readonly predicted = new MatchResult(64);
  /** `Overlaps.predicted` of the last `withPredicted`. */
  private column = new Uint32Array(64);
  /** Slots routed on predictions now. */
  private live = 0;

  constructor(
    workers: WorkerTable,
    blockSize: number,
    settings: PredictionSettings,
    now: () => number,
  ) {
    this.index = createIndex("crtc", blockSize, { workers });
    this.predictions = new Predictions(this.index, settings, now);
  }

  /** Whether any slot is routed on predictions now. */
  get active(): boolean {
    return this.live > 0;
  }

  isOn(slot: number): boolean {
    return this.predictions.isApproximate(slot);
  }

  /**
   * The slot is routed on predictions from now (`on`: degraded and exact), starting
   * empty, held to `capacityBlocks` (null: unknown, the TTL), or no longer.
   */
  set(slot: number, on: boolean, capacityBlocks: number | null): void {
    if (on === this.isOn(slot)) return;
    if (on) this.predictions.enable(slot, capacityBlocks);
    else this.predictions.disable(slot);
    this.live += on ? 1 : -1;
  }

  /** The slots' lives end (KvedgeCore.endSlots): their predictions and their state here go. */
  dropSlots(slots: readonly number[]): void {
    for (const slot of slots) {
      this.set(slot, false, null);
      this.index.dropSlot(slot);
    }
  }

  /**
   * Before the overlaps are built from the index's matches (`out`): kvedge's predictions
   * of the degraded slots routed on them are looked up, and each such slot the index
   * does not match is added with 0 indexed blocks.
   */
  lookUp(
    out: MatchResult,
    local: Uint32Array,
    count: number,
    chain: Uint32Array | undefined,
    load: LoadTracker,
  ): void {
    if (this.live === 0) return;
    const predicted = this.predicted;
    this.index.findMatches(local, count, predicted, chain);
    const fallback = load.fallback;
    for (let j = 0; j < predicted.count; j++) {
      const slot = predicted.workers[j]!;
      if (fallback[slot] !== 1 || blocksOf(out, slot) >= 0) continue;
      if (out.count === out.workers.length) grow(out);
      out.workers[out.count] = slot;
      out.blocks[out.count++] = 0;
    }
  }

  /**
   * The overlaps with, per entry, the predicted blocks `lookUp` found for a degraded
   * slot routed on predictions (`Overlaps.predicted`: the router trusts such a slot's
   * `fallbackOverlap`, src/route/router.ts).
   */
  withPredicted(overlaps: Overlaps, load: LoadTracker): Overlaps {
    if (this.live === 0) return overlaps;
    if (this.column.length < overlaps.count) this.column = new Uint32Array(2 * overlaps.count);
    const fallback = load.fallback;
    for (let i = 0; i < overlaps.count; i++) {
      const slot = overlaps.slots[i]!;
      this.column[i] = fallback[slot] === 1 ? Math.max(0, blocksOf(this.predicted, slot)) : 0;
    }
    return { ...overlaps, predicted: this.column };
  }
}

/** A slot's blocks in a match result, or -1 when it is not there. */
function blocksOf(matches: MatchResult, slot: number): number {
  for (let i = 0; i < matches.count; i++)
    if (matches.workers[i] === slot) return matches.blocks[i]!;
  return -1;
}

/** Doubles a match result's room, keeping its entries (`ensure` does not keep them). */
function grow(matches: MatchResult): void {
  const workers = new Uint32Array(2 * matches.workers.length);
  const blocks = new Uint32Array(2 * matches.blocks.length);
  workers.set(matches.workers);
  blocks.set(matches.blocks);
  matches.workers = workers;
  matches.blocks = blocks;
}
