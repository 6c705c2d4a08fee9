/**
 * Per-source sequencing of KV-event batches: one sequencer per engine publisher
 * (one (worker, dp rank) stream with its own sequence counter).
 *
 * Every batch carries the publisher's sequence number, starting at 0 when the engine
 * starts. The sequencer applies batches in order exactly once:
 *
 *   seq = last + 1          apply
 *   seq = last              duplicate: skip
 *   seq < last, or seq ≤ last on a new connection
 *                           the engine restarted: reset the worker, start over
 *   seq > last + 1 (a gap)  ask the engine's replay endpoint for last+1.., buffer live
 *                           batches meanwhile, apply the replay then the buffer in
 *                           order; without replay (or if it fails or starts late)
 *                           count the lost batches and mark the source degraded
 *
 * A source that starts listening mid-stream sees its first seq > 0 as a gap from 0.
 * "Degraded" means the index may be missing or keeping blocks of this worker; it
 * clears when the worker's state becomes known again (a reset or an applied
 * AllBlocksCleared, reported through `markExact`).
 *
 * Transport-free: the caller feeds live and replayed batches in and performs the
 * replay request; timers are injectable for tests.
 */

/** What the sequencer asks of the source that owns it. */
export interface SequencerHooks {
  /**
   * Decodes and applies one batch whole. Returns false if it was malformed and
   * dropped (its events are then lost: the source becomes degraded).
   */
  apply(seq: number, payload: Uint8Array, replayed: boolean): boolean;
  /** The engine restarted: forget everything this source published. */
  reset(reason: string): void;
  /** Sends a replay request for batches from `start` on; absent when no replay endpoint. */
  requestReplay?: (start: number) => void;
  /** Abandons the replay in flight (e.g. reconnect the DEALER so late replies are not mistaken). */
  cancelReplay?: () => void;
  /** State changes worth a log line (gap, loss, restart, replay outcome). */
  event?: (kind: SequencerEvent, fields: Record<string, number | string>) => void;
}

export type SequencerEvent =
  | "gap" | "loss" | "restart" | "replay_started" | "replay_done" | "replay_failed" | "degraded" | "exact";

export interface SequencerOptions {
  /** Give up on a replay when no reply arrives for this long. */
  readonly replayTimeoutMs: number;
  /** After a failed replay, don't ask again for this long (gaps meanwhile are losses). */
  readonly replayCooldownMs: number;
  /** Live batches buffered while a replay runs; beyond this they are dropped (then counted lost). */
  readonly replayBufferMax: number;
  readonly now?: () => number;
  readonly setTimer?: (callback: () => void, ms: number) => unknown;
  readonly clearTimer?: (timer: unknown) => void;
}

export const SEQUENCER_DEFAULTS: SequencerOptions = {
  replayTimeoutMs: 2_000,
  replayCooldownMs: 30_000,
  replayBufferMax: 100_000,
};

/** Counters for the metrics layer. Batches, not events. */
export class SequencerCounters {
  applied = 0;
  replayed = 0;
  duplicates = 0;
  gaps = 0;
  lost = 0;
  malformed = 0;
  restarts = 0;
  replaysRequested = 0;
  replaysCompleted = 0;
  replaysFailed = 0;
  bufferedMax = 0;
  bufferDropped = 0;
}

const NONE = -1;

export class Sequencer {
  readonly counters = new SequencerCounters();
  /** Last applied (or accounted-for) sequence number; -1 before the first batch. */
  private last = NONE;
  private connection = NONE;
  private reconnected = false;
  private degraded = false;
  /** Live batches held while a replay runs, in arrival order. */
  private buffer: { seq: number; payload: Uint8Array }[] = [];
  private replaying = false;
  /** Applying the buffer after a replay: a gap left now is a loss, not a reason to ask again. */
  private draining = false;
  private replayTimer: unknown = null;
  private cooldownUntil = 0;
  private readonly options: Required<SequencerOptions>;

  constructor(private readonly hooks: SequencerHooks, options: Partial<SequencerOptions> = {}) {
    this.options = {
      ...SEQUENCER_DEFAULTS,
      now: () => performance.now(),
      setTimer: (callback, ms) => setTimeout(callback, ms),
      clearTimer: (timer) => clearTimeout(timer as ReturnType<typeof setTimeout>),
      ...options,
    } as Required<SequencerOptions>;
  }

  get lastSeq(): number {
    return this.last;
  }

  get isDegraded(): boolean {
    return this.degraded;
  }

  get isReplaying(): boolean {
    return this.replaying;
  }

  /** A (re)connection to the publisher; `id` changes with every new TCP/IPC connection. */
  connected(id: number): void {
    if (this.connection !== NONE && id !== this.connection) this.reconnected = true;
    this.connection = id;
  }

  /**
   * A live batch. `payload` may be a view into a receive buffer: it is used before
   * return, or copied if it has to wait for a replay.
   */
  live(seq: number, payload: Uint8Array): void {
    const reconnected = this.reconnected;
    this.reconnected = false;
    if (this.last !== NONE && (seq < this.last || (reconnected && seq <= this.last))) {
      this.restart(seq, reconnected ? "sequence did not advance after a reconnect" : "sequence went backwards");
    }
    if (this.replaying) {
      this.hold(seq, payload);
      return;
    }
    this.accept(seq, payload, false);
  }

  /** One batch of a replay in progress. */
  replayBatch(seq: number, payload: Uint8Array): void {
    if (!this.replaying) return;
    this.armReplayTimer();
    this.accept(seq, payload, true);
  }

  /** The replay's end marker arrived: apply what was buffered. */
  replayEnd(): void {
    if (!this.replaying) return;
    this.counters.replaysCompleted++;
    this.finishReplay();
    this.hooks.event?.("replay_done", { last: this.last });
  }

  /** The replay could not be done (transport error); timeouts are detected here. */
  replayFailed(reason: string): void {
    if (!this.replaying) return;
    this.counters.replaysFailed++;
    this.cooldownUntil = this.options.now() + this.options.replayCooldownMs;
    this.hooks.cancelReplay?.();
    this.hooks.event?.("replay_failed", { reason, last: this.last });
    this.finishReplay();
  }

  /** The worker's state is known exactly again (an AllBlocksCleared was applied). */
  markExact(): void {
    if (!this.degraded) return;
    this.degraded = false;
    this.hooks.event?.("exact", { last: this.last });
  }

  /** Stops timers; buffered batches are dropped. */
  close(): void {
    if (this.replayTimer !== null) this.options.clearTimer(this.replayTimer);
    this.replayTimer = null;
    this.replaying = false;
    this.buffer = [];
  }

  private accept(seq: number, payload: Uint8Array, replayed: boolean): void {
    const expected = this.last + 1;
    if (seq < expected) {
      this.counters.duplicates++;
      return;
    }
    if (seq > expected) {
      this.counters.gaps++;
      this.hooks.event?.("gap", { expected, got: seq });
      if (!replayed && this.tryReplay(expected)) {
        this.hold(seq, payload);
        return;
      }
      this.lose(seq - expected, replayed ? "replay started after the gap" : "no replay");
    }
    this.last = seq;
    if (!this.hooks.apply(seq, payload, replayed)) {
      this.counters.malformed++;
      this.lose(1, "malformed batch");
      return;
    }
    if (replayed) this.counters.replayed++;
    else this.counters.applied++;
  }

  private tryReplay(start: number): boolean {
    if (this.hooks.requestReplay === undefined || this.draining) return false;
    if (this.options.now() < this.cooldownUntil) return false;
    this.replaying = true;
    this.counters.replaysRequested++;
    this.armReplayTimer();
    this.hooks.event?.("replay_started", { start });
    this.hooks.requestReplay(start);
    return true;
  }

  private hold(seq: number, payload: Uint8Array): void {
    if (this.buffer.length >= this.options.replayBufferMax) {
      this.counters.bufferDropped++;
      return;
    }
    this.buffer.push({ seq, payload: payload.slice() });
    if (this.buffer.length > this.counters.bufferedMax) this.counters.bufferedMax = this.buffer.length;
  }

  private finishReplay(): void {
    if (this.replayTimer !== null) this.options.clearTimer(this.replayTimer);
    this.replayTimer = null;
    this.replaying = false;
    const held = this.buffer;
    this.buffer = [];
    this.draining = true;
    try {
      for (const batch of held) this.accept(batch.seq, batch.payload, false);
    } finally {
      this.draining = false;
    }
  }

  private armReplayTimer(): void {
    if (this.replayTimer !== null) this.options.clearTimer(this.replayTimer);
    this.replayTimer = this.options.setTimer(() => {
      this.replayTimer = null;
      this.replayFailed("timeout");
    }, this.options.replayTimeoutMs);
  }

  private lose(batches: number, reason: string): void {
    this.counters.lost += batches;
    this.hooks.event?.("loss", { batches, reason });
    if (!this.degraded) {
      this.degraded = true;
      this.hooks.event?.("degraded", { reason });
    }
  }

  private restart(seq: number, reason: string): void {
    this.counters.restarts++;
    this.hooks.event?.("restart", { reason, last: this.last, got: seq });
    if (this.replaying) {
      this.hooks.cancelReplay?.();
      this.close();
    }
    this.last = NONE;
    this.hooks.reset(reason);
    // The restarted engine's cache starts empty, which is what we now hold.
    this.markExact();
  }
}
