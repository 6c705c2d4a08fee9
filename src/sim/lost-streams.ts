/**
 * Engines whose KV-event streams are cut in a virtual-time run, and what kvedge's index
 * then holds of them: the fault of an engine without a replay endpoint whose
 * connection drops (src/ingest/README.md, "No replay endpoint"). Until the cut the index
 * is the engine's published view; for the cut's length nothing arrives (the connection
 * is down) and what was published meanwhile is lost; after it the stream comes back and
 * its events are applied to what the index had, which keeps blocks removed during the
 * cut (ghosts) and lacks blocks stored during it. From the cut on the worker is
 * degraded: kvedge cannot know what it missed until the engine clears its cache, which
 * an AllBlocksCleared after the cut says (then it is exact again).
 *
 * The index of a cut engine is kept as the engine's external hashes it holds on the
 * device, with their copies (a block's hash names its whole chain, so "every block of
 * the prefix is held" is what the index's match counts), fed by the engine's batches.
 */
import { PairTable } from "../util/tables";
import type { EngineCache, KvEvent } from "./engine-cache";

export interface StreamCut {
  /** Engine indexes whose streams are cut. */
  readonly workers: readonly number[];
  /** The cut, in model ms: events published in [fromMs, toMs) are lost. */
  readonly fromMs: number;
  readonly toMs: number;
}

export class LostStreams {
  /** Per engine: the external hashes an index fed by its stream holds (null: not cut). */
  private readonly views: (PairTable | null)[];
  /** Per engine: exact again (a clear after the cut). */
  private readonly cleared: Uint8Array;

  constructor(
    private readonly cut: StreamCut,
    engines: number,
  ) {
    if (!(cut.fromMs <= cut.toMs)) throw new RangeError("a stream cut ends before it starts");
    this.views = Array.from({ length: engines }, () => null);
    for (const w of cut.workers) {
      if (!(Number.isInteger(w) && w >= 0 && w < engines))
        throw new RangeError(`no engine ${w} to cut`);
      this.views[w] = new PairTable();
    }
    this.cleared = new Uint8Array(engines);
  }

  isCut(worker: number): boolean {
    return this.views[worker] != null;
  }

  /** Whether kvedge holds the worker degraded at `nowMs`. */
  isDegraded(worker: number, nowMs: number): boolean {
    return this.isCut(worker) && nowMs >= this.cut.fromMs && this.cleared[worker] === 0;
  }

  /** An engine's batch, published at `nowMs`: applied to its view unless the cut loses it. */
  batch(worker: number, nowMs: number, events: readonly KvEvent[]): void {
    const view = this.views[worker];
    if (view == null || (nowMs >= this.cut.fromMs && nowMs < this.cut.toMs)) return;
    for (const event of events) {
      if (event.type === "AllBlocksCleared") {
        view.clear();
        if (nowMs >= this.cut.toMs) this.cleared[worker] = 1;
        continue;
      }
      // The device's blocks, copy by copy (a block is held while a copy is).
      if (event.medium !== "GPU") continue;
      const delta = event.type === "BlockStored" ? 1 : -1;
      for (const hash of event.block_hashes) {
        const hi = Number(hash >> 32n);
        const lo = Number(hash & 0xffff_ffffn);
        // A removal of a copy stored during the cut: the index never had it.
        if (delta > 0 || view.has(hi, lo)) view.adjust(hi, lo, delta);
      }
    }
  }

  /** The leading blocks of a prompt that kvedge's index holds for a cut engine. */
  prefixBlocks(cache: EngineCache, worker: number, tokens: Uint32Array, promptLength: number) {
    const view = this.views[worker];
    if (view == null) throw new Error(`engine ${worker} is not cut`);
    return cache.prefixBlocksIn(tokens, promptLength, (hi, lo) => view.has(hi, lo));
  }
}
