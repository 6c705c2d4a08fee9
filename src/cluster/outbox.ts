/**
 * This replica's own facts on their way to the bus: the load tracker reports each change
 * of an own request (`OwnFacts`), the outbox writes it into the current batch, and a
 * batch goes out (`publish`) at the end of the event-loop turn that wrote its first
 * fact, but not sooner than BATCH_MS after the batch before: a lone route's facts leave
 * at once, a busy replica sends at most one batch a millisecond (what a message costs
 * the sender, every peer and the server is mostly per message: a publish cost a replica
 * about as much as encoding the few hundred routes' facts it carried). A batch that
 * reaches BATCH_FACTS_MAX facts or BATCH_BYTES_MAX bytes goes at once. Every batch takes
 * the next seq, sent or not (a batch the bus could not take is a gap its receivers see).
 *
 * It also writes the messages that describe the whole set: heartbeats (the seq so far)
 * and snapshots (every own active request, as of that seq), and sync requests.
 */
import type { EndReason, LoadTracker, OwnFacts } from "../route/load";
import type { PredictionShare, Predictions } from "../route/predictions";
import {
  CHAIN_BLOCKS_MAX,
  KIND,
  LAST_CHUNK,
  LEAVING,
  MessageEncoder,
  WITH_PREDICTIONS,
  type WorkerIdentity,
} from "./codec";
import { wallClockMs } from "./peers";

/** A batch goes out at the end of the turn, at least this long after the batch before… */
export const BATCH_MS = 1;
/** …or at once at this many facts (a millisecond's at about 1.3 million routes a second)… */
export const BATCH_FACTS_MAX = 4096;
/** …or this many bytes. */
export const BATCH_BYTES_MAX = 64 * 1024;
/** A snapshot chunk is closed past this many bytes. */
export const CHUNK_BYTES = 256 * 1024;
/** A joining replica is sent at most this many predicted blocks (8 MiB of local hashes). */
export const SNAPSHOT_PREDICTED_BLOCKS_MAX = 1 << 20;

export interface OutboxOptions {
  readonly replicaId: string;
  readonly epoch: number;
  readonly workers: WorkerIdentity;
  /** Sends one batch of `facts` facts (false: the bus could not take it). */
  readonly publish: (message: Uint8Array, facts: number) => boolean;
  /** Runs `flush` later (0 ms: at the end of this turn; `onTheLoop` does); null: the owner flushes. */
  readonly schedule?: ((flush: () => void, ms: number) => void) | null;
  /** Monotonic ms (the pace of batches). */
  readonly now?: () => number;
  /** Wall-clock ms, stamped on every message (receivers measure lag with it). */
  readonly wallNow?: () => number;
  /**
   * Ship each routed request's chain (the `dynamo` policy weighs the blocks of a prompt
   * already active on a worker, so peers need the chains); without, only the decode
   * blocks it adds as this replica counts them: tens of bytes instead of 8 per block.
   */
  readonly chains?: boolean;
}

/** Runs `run` after `ms` on the event loop, at the end of this turn for 0: what a replica schedules with. */
export function onTheLoop(run: () => void, ms: number): void {
  if (ms === 0) setImmediate(run);
  else setTimeout(run, ms);
}

export class Outbox implements OwnFacts, PredictionShare {
  /** The seq of the last batch (0: none yet). */
  seq = 0;
  readonly counters = {
    batches: 0,
    facts: 0,
    unsent: 0,
    unsentFacts: 0,
    bytes: 0,
    /** Predictions shared, and of them those cut to their first CHAIN_BLOCKS_MAX new blocks; corrections shared. */
    predictions: 0,
    predictionsTruncated: 0,
    corrections: 0,
    /** Predicted blocks sent to joining replicas. */
    predictionsSnapshotted: 0,
  };
  private readonly encoder: MessageEncoder;
  private readonly control: MessageEncoder;
  private armed = false;
  /** The scheduled flush (one function for every batch). */
  private readonly flushLater = (): void => {
    this.armed = false;
    this.flush();
  };
  /** Monotonic ms of the last batch sent. */
  private lastBatchMs = -Infinity;
  private readonly wallNow: () => number;
  private readonly now: () => number;

  constructor(private readonly options: OutboxOptions) {
    this.encoder = new MessageEncoder(options.replicaId, options.epoch, options.workers);
    this.control = new MessageEncoder(options.replicaId, options.epoch, options.workers);
    this.wallNow = options.wallNow ?? wallClockMs;
    this.now = options.now ?? (() => performance.now());
  }

  routed(
    handle: number,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    added: number,
  ): void {
    this.open();
    if (this.options.chains === true)
      this.encoder.routed(handle, slot, chain, blocks, prefillTokens, outputBlocks);
    else this.encoder.routedFlat(handle, slot, prefillTokens, outputBlocks, added);
    this.wrote();
  }

  prefillDone(handle: number): void {
    this.open();
    this.encoder.prefillDone(handle);
    this.wrote();
  }

  ended(handle: number, reason: EndReason, freed: number): void {
    this.open();
    this.encoder.ended(handle, reason, freed);
    this.wrote();
  }

  /**
   * This replica predicted (or refreshed) blocks [0, count) of a chain on an approximate
   * worker, [0, held) of them held already (`Predictions.onShare`): the new blocks go out
   * after the deepest held one.
   */
  predicted(
    slot: number,
    local: Uint32Array,
    chain: Uint32Array,
    held: number,
    count: number,
  ): void {
    this.open();
    if (this.encoder.predicted(slot, local, chain, held, count) < count - held)
      this.counters.predictionsTruncated++;
    this.counters.predictions++;
    this.wrote();
  }

  /** This replica corrected its predictions of an approximate worker (`Predictions.share`). */
  corrected(slot: number, shortfall: boolean, named: boolean, hi: number, lo: number): void {
    this.open();
    this.encoder.corrected(slot, shortfall, named, hi, lo);
    this.counters.corrections++;
    this.wrote();
  }

  /** Facts written and not yet sent. */
  get pending(): number {
    return this.encoder.facts;
  }

  /** Sends the current batch, if it holds any fact. */
  flush(): void {
    if (this.encoder.facts === 0) return;
    const facts = this.encoder.facts;
    this.lastBatchMs = this.now();
    const message = this.encoder.finish(++this.seq, this.wallNow());
    this.counters.batches++;
    this.counters.facts += facts;
    this.counters.bytes += message.length;
    if (!this.options.publish(message, facts)) {
      this.counters.unsent++;
      this.counters.unsentFacts += facts;
    }
  }

  /** A heartbeat: the seq published so far and the own active requests (leaving: shutting down). */
  heartbeat(activeRequests: number, leaving = false): Uint8Array {
    this.flush();
    const w = this.control;
    w.begin(KIND.heartbeat, leaving ? LEAVING : 0);
    w.u32(activeRequests);
    return w.finish(this.seq, this.wallNow());
  }

  /**
   * A request for `target`'s set (null: every replica's), answered under `nonce`;
   * `withPredictions`: a joining replica, which takes predictions too.
   */
  syncRequest(target: string | null, nonce: number, withPredictions = false): Uint8Array {
    const w = this.control;
    w.begin(KIND.sync, withPredictions ? WITH_PREDICTIONS : 0);
    w.u32(nonce);
    w.shortText(target ?? "");
    return w.finish(this.seq, this.wallNow());
  }

  /**
   * Every own active request as routed facts (with the prefill still to do), in chunks,
   * as of the seq after the pending batch is sent: the answer to a sync under `nonce`.
   * The first chunk names the peers this replica knows. With `predictions`, its
   * predictions follow, newest first (at most SNAPSHOT_PREDICTED_BLOCKS_MAX blocks).
   */
  snapshot(
    load: LoadTracker,
    nonce: number,
    peers: readonly string[],
    predictions: Predictions | null = null,
  ): Uint8Array[] {
    this.flush();
    const w = this.control;
    const chunks: Uint8Array[] = [];
    const start = (): void => {
      w.begin(KIND.snapshot);
      w.u32(nonce);
      w.u32(chunks.length);
      const named = chunks.length === 0 ? peers : [];
      w.u8(named.length & 0xff);
      w.u8(named.length >>> 8);
      for (const id of named) w.shortText(id);
      w.beginFacts();
    };
    start();
    const slots = new Set<number>();
    const chains = this.options.chains === true;
    load.forEachActive((slot, _id, prefill, output, _idleMs, chain, blocks, handle) => {
      if (w.length >= CHUNK_BYTES) {
        chunks.push(w.finish(this.seq, this.wallNow()));
        start();
      }
      if (chains) w.routed(handle, slot, chain, blocks, prefill, output);
      else w.routedFlat(handle, slot, prefill, output, 0);
      slots.add(slot);
    });
    // Without chains, what the requests add per worker, as a whole (it is not a sum of each).
    if (!chains) for (const slot of slots) w.decodeTotal(slot, load.treeBlocksOf(slot));
    predictions?.forEachRun(
      SNAPSHOT_PREDICTED_BLOCKS_MAX,
      CHAIN_BLOCKS_MAX,
      (slot, anchored, hi, lo, local, count, ageMs) => {
        if (w.length >= CHUNK_BYTES) {
          chunks.push(w.finish(this.seq, this.wallNow()));
          start();
        }
        w.predictedOlder(slot, anchored, hi, lo, local, count, ageMs);
        this.counters.predictionsSnapshotted += count;
      },
    );
    chunks.push(w.finish(this.seq, this.wallNow()));
    chunks[chunks.length - 1]![3]! |= LAST_CHUNK;
    return chunks;
  }

  private open(): void {
    if (this.encoder.facts > 0) return;
    this.encoder.begin(KIND.facts);
    this.encoder.beginFacts();
  }

  private wrote(): void {
    const w = this.encoder;
    if (w.facts >= BATCH_FACTS_MAX || w.length >= BATCH_BYTES_MAX) {
      this.flush();
      return;
    }
    const schedule = this.options.schedule;
    if (this.armed || schedule === null || schedule === undefined) return;
    this.armed = true;
    schedule(this.flushLater, Math.max(0, this.lastBatchMs + BATCH_MS - this.now()));
  }
}
