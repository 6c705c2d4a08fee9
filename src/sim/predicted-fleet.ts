/**
 * The approximate workers of an in-process kvedge router (`kv_aware_model` with
 * `approximate` engines, `kvedge demo --virtual --events none|mixed`): engines that
 * publish no KV events, whose caches kvedge predicts from its own decisions. A real
 * index (crtc) on the router's worker numbering, fed by the real `Predictions`
 * (src/route/predictions.ts), which this class only calls at the moments the core
 * does: routed, prefill done (with the engine's cached tokens when it reports them),
 * done. Nothing here decides anything.
 */
import type { WorkerTable } from "../domain/worker-table";
import { DEFAULT_SEED, hashBlocks } from "../hash";
import { createIndex, type KvIndex, MatchResult } from "../index";
import type { RouteDecision } from "../route";
import type { LoadTracker } from "../route/load";
import {
  DEFAULT_PREDICTED_MAX_BLOCKS,
  DEFAULT_PREDICTED_TTL_MS,
  type PredictAt,
  Predictions,
} from "../route/predictions";

export interface PredictedFleetOptions {
  readonly blockSize: number;
  /** Engine indexes that publish no events. */
  readonly approximate: readonly number[];
  /** Each engine's router slot. */
  readonly slots: Int32Array;
  readonly capacityBlocks: number | null;
  readonly predictAt: PredictAt;
  readonly ttlMs: number;
  /** Correct by the engines' reported cached tokens (what the proxy reads from usage). */
  readonly correct: boolean;
  readonly now: () => number;
}

export const DEFAULT_FLEET_PREDICTIONS = {
  capacityBlocks: null,
  predictAt: "prefill_done",
  ttlMs: DEFAULT_PREDICTED_TTL_MS,
  correct: false,
} as const;

export class PredictedFleet {
  readonly index: KvIndex;
  readonly predictions: Predictions;
  private readonly matches = new MatchResult(16);
  private local = new Uint32Array(2 * 1024);
  private readonly approximate: Uint8Array;
  /** Engine index by router slot (-1: none). */
  private readonly workerOf: Int32Array;

  constructor(
    load: LoadTracker,
    workers: WorkerTable,
    private readonly options: PredictedFleetOptions,
  ) {
    this.index = createIndex("crtc", options.blockSize, { workers });
    this.predictions = new Predictions(
      this.index,
      {
        blockSize: options.blockSize,
        predictAt: options.predictAt,
        capacityBlocks: options.capacityBlocks,
        ttlMs: options.ttlMs,
        maxBlocks: DEFAULT_PREDICTED_MAX_BLOCKS,
        requestTtlMs: Number.MAX_SAFE_INTEGER,
        maxPending: 1 << 24,
      },
      options.now,
    );
    this.approximate = new Uint8Array(options.slots.length);
    this.workerOf = new Int32Array(Math.max(0, ...options.slots) + 1).fill(-1);
    options.slots.forEach((slot, w) => {
      this.workerOf[slot] = w;
    });
    for (const w of options.approximate) {
      const slot = options.slots[w]!;
      this.approximate[w] = 1;
      this.predictions.enable(slot, options.capacityBlocks);
      load.setApproximate(slot, true);
    }
  }

  isApproximate(worker: number): boolean {
    return this.approximate[worker] === 1;
  }

  /** Local hashes of a prompt's full blocks (valid until the next call). */
  localHashes(tokens: Uint32Array, promptLength: number): Uint32Array {
    const words = 2 * Math.floor(promptLength / this.options.blockSize);
    if (this.local.length < words)
      this.local = new Uint32Array(Math.max(words, 2 * this.local.length));
    hashBlocks(tokens.subarray(0, promptLength), this.options.blockSize, DEFAULT_SEED, this.local);
    return this.local;
  }

  /** Writes each approximate engine's predicted overlap into `blocks` (by engine index). */
  overlaps(local: Uint32Array, chain: Uint32Array, count: number, blocks: Float64Array): void {
    const slots = this.options.slots;
    for (let w = 0; w < slots.length; w++) if (this.approximate[w] === 1) blocks[w] = 0;
    this.index.findMatches(local, count, this.matches, chain);
    for (let i = 0; i < this.matches.count; i++) {
      const w = this.workerOf[this.matches.workers[i]!] ?? -1;
      if (w >= 0 && this.approximate[w] === 1) blocks[w] = this.matches.blocks[i]!;
    }
  }

  routed(
    id: number,
    decision: RouteDecision,
    local: Uint32Array,
    chain: Uint32Array,
    count: number,
    promptLength: number,
  ): void {
    this.predictions.routed(
      String(id),
      decision.slot,
      local,
      chain,
      count,
      promptLength,
      decision.overlapBlocks,
      decision.creditedBlocks,
    );
  }

  prefillDone(id: number, cachedTokens: number | undefined): void {
    const reported = this.options.correct && cachedTokens !== undefined ? cachedTokens : null;
    this.predictions.prefillDone(String(id), reported);
  }

  done(id: number): void {
    this.predictions.done(String(id));
  }
}
