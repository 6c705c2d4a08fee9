/**
 * Per-source sequencing and continuity of KV-event batches: one sequencer per engine
 * publisher (one (worker, dp rank) stream with its own sequence counter from 0).
 *
 * Sequence numbers alone cannot tell a restarted engine from the old one (a new
 * engine can publish past the old `last`), so on every (re)connection the sequencer
 * first establishes what the engine holds (a *probe*), and only then calls the
 * worker exact. The states and transitions are in ./README.md; in short:
 *
 *   connect, replay endpoint   probe: ask the replay ring from 0, hold live batches
 *     empty ring               the engine holds nothing: clear, exact
 *     ring holds `last` with the fingerprint of the batch we applied as `last`
 *                              same stream: apply what follows, trust unchanged
 *     ring starts at 0         rebuild: clear, apply the whole ring, exact
 *     ring starts at last + 1  contiguous: continue
 *     otherwise                the early history is gone: (clear if proven restarted)
 *                              apply the ring, count the loss, degraded
 *   connect, no replay         unknown (degraded) until a batch 0 or AllBlocksCleared
 *   live, seq = last + 1       apply
 *   live, seq <= last          a duplicate (a replay can overtake live batches in flight;
 *                              a restarted engine always comes on a new connection)
 *   live, seq > last + 1       gap: replay from last + 1 (hold live meanwhile), else loss
 *   live, seq > last + jumpMax a stray sequence number: skipped and counted, unless
 *                              the next batch confirms the new position
 *   quiet for idleProbeMs      idle probe: ask the ring from `last`; if it holds `last`
 *                              with our fingerprint, apply what follows (a tail the
 *                              engine's PUB dropped); if not, degraded
 *
 * Replays have an idle timeout, an overall deadline and a byte cap on what they hold;
 * any of them ending a replay counts as a failure (degraded, losses counted).
 * "Degraded" means the index may be missing or keeping blocks of this worker.
 *
 * Transport-free: the caller feeds live and replayed batches in and performs the
 * replay request; timers are injectable for tests.
 */

/** What the sequencer asks of the source that owns it. */
export interface SequencerHooks {
  /**
   * Decodes and applies one batch. Returns false if it could not be walked at all and
   * was dropped (its events are then lost: the source becomes degraded); a batch
   * applied without an event it could not read is the caller's to report (`incomplete`).
   */
  apply(seq: number, payload: Uint8Array, replayed: boolean): boolean;
  /** Forget everything this source published (the engine restarted, or a rebuild begins). */
  reset(reason: string): void;
  /** Sends a replay request for batches from `start` on; absent when no replay endpoint. */
  requestReplay?: (start: number) => void;
  /** Abandons the replay in flight (e.g. reconnect the DEALER so late replies are not mistaken). */
  cancelReplay?: () => void;
  /** State changes worth a log line (gap, loss, restart, replay outcome). */
  event?: (kind: SequencerEvent, fields: Record<string, number | string>) => void;
}

export type SequencerEvent =
  | "gap"
  | "loss"
  | "restart"
  | "rebuild"
  | "continued"
  | "replay_started"
  | "replay_done"
  | "replay_failed"
  | "stray_seq"
  | "degraded"
  | "exact";

export interface SequencerOptions {
  /** Give up on a replay when no reply arrives for this long. */
  readonly replayTimeoutMs: number;
  /** Give up on a replay that has not ended this long after it was asked for. */
  readonly replayDeadlineMs: number;
  /** After a failed replay, don't ask again for this long (gaps meanwhile are losses). */
  readonly replayCooldownMs: number;
  /** Payload bytes held while a replay runs (live batches, and probe replies awaiting a decision). */
  readonly replayBufferBytes: number;
  /** A forward jump larger than this is a stray sequence number until the next batch confirms it. */
  readonly seqJumpMax: number;
  /**
   * A stream quiet this long asks the replay ring for what follows its last batch (a lost
   * tail shows now, not at the engine's next publish); again every as long while quiet.
   * 0 = never.
   */
  readonly idleProbeMs: number;
  readonly now?: () => number;
  readonly setTimer?: (callback: () => void, ms: number) => unknown;
  readonly clearTimer?: (timer: unknown) => void;
}

export const SEQUENCER_DEFAULTS: SequencerOptions = {
  replayTimeoutMs: 2_000,
  replayDeadlineMs: 30_000,
  replayCooldownMs: 30_000,
  replayBufferBytes: 64 * 1024 * 1024,
  seqJumpMax: 1 << 20,
  idleProbeMs: 0,
};

/** Counters for the metrics layer. Batches, not events. */
export class SequencerCounters {
  applied = 0;
  replayed = 0;
  duplicates = 0;
  gaps = 0;
  lost = 0;
  malformed = 0;
  /** Batches applied without some of their events (they could not be read): degraded. */
  incomplete = 0;
  /** Engine restarts detected (a new stream proven: sequence backwards, fingerprint mismatch, empty ring). */
  restarts = 0;
  /** Workers rebuilt from a replay ring that starts at 0. */
  rebuilds = 0;
  /** Probes that proved the old stream continues. */
  continued = 0;
  /** Connection probes asked for (replay from 0 at connect). */
  probes = 0;
  /** Idle probes asked for (the stream was quiet: replay from its last batch). */
  idleProbes = 0;
  /** Batches idle probes applied: a tail the live stream had lost. */
  idleProbeBatches = 0;
  replaysRequested = 0;
  replaysCompleted = 0;
  replaysFailed = 0;
  /** Batches skipped for an implausible sequence jump. */
  straySeqs = 0;
  /** Messages over the size limit skipped on the wire (live or replayed): each a gap to replay. */
  oversize = 0;
  bufferedMax = 0;
  bufferedBytesMax = 0;
  bufferDropped = 0;
}

const NONE = -1;
/** `lastPrint` while only the bytes of batch `last` are kept (see LastBatch). */
const PENDING = -2;

/** A cheap identity of a batch's bytes: the replay ring serves the very bytes published live. */
export function fingerprint(payload: Uint8Array): number {
  return Bun.hash.xxHash32(payload) >>> 0;
}

/** Below this the copy's buffer is never shrunk. */
const LAST_BYTES_MIN = 4096;
/** Batches in a row that would fit an eighth of the buffer before it shrinks. */
const LAST_SHRINK_AFTER = 64;

/**
 * A copy of the last applied batch, whose fingerprint is only read by a connect probe
 * or a snapshot: copying costs about a fifth of hashing (xxHash32 runs at ~4.5 GB/s
 * here, in Bun or in C), and the caller's bytes may be a receive buffer or the event
 * ring, reused once the call returns. The buffer follows the batches: it grows to the
 * largest and shrinks after a run of much smaller ones.
 */
class LastBatch {
  private bytes = new Uint8Array(LAST_BYTES_MIN);
  private length = 0;
  private smallRun = 0;

  keep(payload: Uint8Array): void {
    const capacity = this.bytes.length;
    if (payload.length > capacity) this.bytes = new Uint8Array(grownTo(capacity, payload.length));
    else if (capacity > LAST_BYTES_MIN && 8 * payload.length < capacity) {
      if (++this.smallRun >= LAST_SHRINK_AFTER) {
        this.bytes = new Uint8Array(grownTo(LAST_BYTES_MIN, payload.length));
        this.smallRun = 0;
      }
    } else this.smallRun = 0;
    this.bytes.set(payload);
    this.length = payload.length;
  }

  fingerprint(): number {
    return fingerprint(this.bytes.subarray(0, this.length));
  }
}

function grownTo(capacity: number, needed: number): number {
  while (capacity < needed) capacity *= 2;
  return capacity;
}

type Mode = "idle" | "gap" | "probe" | "tail";
/** How a probe's replies are used once the first one arrives. */
type ProbePlan = "undecided" | "verify" | "apply";
/** An idle probe: check its first reply is our `last`, then apply what follows. */
type TailPlan = "verify" | "apply";

interface Held {
  readonly seq: number;
  readonly payload: Uint8Array;
}

export class Sequencer {
  readonly counters = new SequencerCounters();
  /** Last applied (or accounted-for) sequence number; -1 before the first batch. */
  private last = NONE;
  /** Fingerprint of batch `last` as applied; NONE if unknown, PENDING if `lastBatch` holds its bytes. */
  private lastPrint = NONE;
  private readonly lastBatch = new LastBatch();
  private degraded = false;
  /** What made the worker degraded (while `degraded`): the status page and /v1/workers say it. */
  private degradedBy = "";
  /** After a connect without a probe: trust is unknown until a batch 0 or a clear. */
  private awaitingFirst = false;
  /** A saved position (warm restart) no connection has checked yet: not exact. */
  private unconfirmed = false;
  private mode: Mode = "idle";
  /** Live batches held while a replay runs, in arrival order. */
  private buffer: Held[] = [];
  /** Probe replies at or before `last`, held until the fingerprint of `last` decides. */
  private probeHeld: Held[] = [];
  private heldBytes = 0;
  private probePlan: ProbePlan = "undecided";
  private probeFirst = NONE;
  private tailPlan: TailPlan = "verify";
  /** When a live batch last arrived or a replay last ended (the quiet period starts then). */
  private lastActivity = 0;
  private quietTimer: unknown = null;
  /** Idle probes are on: a replay endpoint and idleProbeMs > 0. */
  private readonly probesIdle: boolean;
  /** Applying the buffer after a replay: a gap left now is a loss, not a reason to ask again. */
  private draining = false;
  private idleTimer: unknown = null;
  private deadlineTimer: unknown = null;
  private cooldownUntil = 0;
  /** Highest live seq dropped at the byte cap during the current replay. */
  private droppedUpTo = NONE;
  /** The sequence a stray batch would be followed by, if it was the stream's real position. */
  private strayNext = NONE;
  /** A message was skipped for its size since the last loss: the next loss is put down to it. */
  private oversizePending = false;
  private readonly options: Required<SequencerOptions>;

  constructor(
    private readonly hooks: SequencerHooks,
    options: Partial<SequencerOptions> = {},
  ) {
    this.options = {
      ...SEQUENCER_DEFAULTS,
      now: () => performance.now(),
      setTimer: (callback, ms) => setTimeout(callback, ms),
      clearTimer: (timer) => clearTimeout(timer as ReturnType<typeof setTimeout>),
      ...options,
    } as Required<SequencerOptions>;
    this.probesIdle = this.options.idleProbeMs > 0 && hooks.requestReplay !== undefined;
  }

  get lastSeq(): number {
    return this.last;
  }

  /** Fingerprint of the last applied batch (-1 if unknown); saved in snapshots. */
  get lastFingerprint(): number {
    if (this.lastPrint === PENDING) this.lastPrint = this.lastBatch.fingerprint();
    return this.lastPrint;
  }

  /** Lost events, or the engine's state not established yet (connect probe running, or no replay). */
  get isDegraded(): boolean {
    return this.degraded || this.awaitingFirst || this.unconfirmed || this.mode === "probe";
  }

  /** Why the worker is degraded, in words (null when it is not). */
  get degradedReason(): string | null {
    if (this.degraded) return this.degradedBy;
    if (this.mode === "probe") return "connect probe running: the engine's state is not known yet";
    if (this.awaitingFirst)
      return "connected without a replay endpoint: state unknown until batch 0 or a clear";
    return null;
  }

  get isReplaying(): boolean {
    return this.mode !== "idle";
  }

  /**
   * Starts from a saved position (warm restart): unconfirmed, so not exact, until a
   * connection's continuity check (the probe, or batch 0 / a clear without replay) says.
   */
  restore(last: number, lastPrint: number, degraded: boolean): void {
    this.unconfirmed = true;
    this.last = last;
    // PENDING is this object's state, not a fingerprint: like any non-fingerprint, it matches nothing.
    this.lastPrint = lastPrint === PENDING ? NONE : lastPrint;
    this.degraded = degraded;
    this.degradedBy = "degraded when the snapshot was saved";
  }

  /**
   * A (re)connection to the publisher. What the engine holds is unknown until a
   * probe (replay from 0) establishes it, or, without replay, until a batch 0 or a clear.
   */
  connected(): void {
    this.abandonReplay();
    this.strayNext = NONE;
    this.unconfirmed = false; // from here the probe, or the connect rules, decide
    if (this.hooks.requestReplay === undefined) {
      this.awaitingFirst = true;
      this.hooks.event?.("degraded", {
        reason: "connected without a replay endpoint: state unknown until batch 0 or a clear",
      });
      return;
    }
    this.awaitingFirst = false;
    this.counters.probes++;
    this.probePlan = "undecided";
    this.probeFirst = NONE;
    this.startReplay("probe", 0);
  }

  /**
   * A live batch. `payload` may be a view into a receive buffer: it is used before
   * return, or copied if it has to wait for a replay.
   */
  live(seq: number, payload: Uint8Array): void {
    if (this.probesIdle) {
      this.lastActivity = this.options.now();
      if (this.quietTimer === null) this.armQuiet();
    }
    if (this.mode !== "idle") {
      this.hold(this.buffer, seq, payload);
      return;
    }
    // On one connection a lower seq is a late duplicate (a replay overtook it in flight):
    // a restarted engine always comes on a new connection, which the connect rules judge.
    if (this.awaitingFirst) this.firstAfterConnect(seq);
    else if (seq > this.last && this.isStray(seq)) return;
    this.accept(seq, payload, false);
  }

  /** One batch of a replay in progress. */
  replayBatch(seq: number, payload: Uint8Array): void {
    if (this.mode === "idle") return;
    this.armIdleTimer();
    if (this.mode === "probe") this.probeBatch(seq, payload);
    else if (this.mode === "tail") this.tailBatch(seq, payload);
    else this.accept(seq, payload, true);
  }

  /**
   * A message over the size limit was skipped on the wire: its batch is a gap that a
   * replay may fill; if the replayed copy is skipped too, the loss is counted as this.
   */
  skipped(): void {
    this.counters.oversize++;
    this.oversizePending = true;
  }

  /** The replay's end marker arrived: apply what was buffered. */
  replayEnd(): void {
    if (this.mode === "idle") return;
    if (this.mode === "probe") this.probeEnd();
    if (this.mode === "tail") this.tailEnd();
    this.counters.replaysCompleted++;
    this.finishReplay(false);
    this.hooks.event?.("replay_done", { last: this.last });
  }

  /** The replay could not be done (transport error, malformed reply); timeouts are detected here. */
  replayFailed(reason: string): void {
    if (this.mode === "idle") return;
    this.counters.replaysFailed++;
    this.cooldownUntil = this.options.now() + this.options.replayCooldownMs;
    this.hooks.cancelReplay?.();
    this.hooks.event?.("replay_failed", { reason, last: this.last });
    const probe = this.mode === "probe";
    if (probe) this.markDegraded(`connect probe failed (${reason}): state unknown`);
    // A failed probe leaves the engine unknown, as a connect without replay does.
    this.finishReplay(probe);
  }

  /**
   * An applied batch skipped events that could not be read (a store, removal or clear,
   * for all kvedge knows): the worker is degraded until its state is known again.
   */
  incomplete(): void {
    this.counters.incomplete++;
    this.markDegraded("an event could not be read (skipped; the rest of its batch applied)");
  }

  /** The worker's state is known exactly again (an AllBlocksCleared was applied). */
  markExact(): void {
    const was = this.isDegraded;
    this.awaitingFirst = false;
    this.degraded = false;
    if (was && !this.isDegraded) this.hooks.event?.("exact", { last: this.last });
  }

  /** Stops timers; held batches are dropped. */
  close(): void {
    this.clearTimers();
    if (this.quietTimer !== null) this.options.clearTimer(this.quietTimer);
    this.quietTimer = null;
    this.mode = "idle";
    this.dropHeld();
  }

  // ---- Live path ----

  private firstAfterConnect(seq: number): void {
    if (seq === 0) {
      // Batch 0 opens a new engine's stream: whatever it held before is gone.
      if (this.last !== NONE) this.restart(seq, "batch 0 after a reconnect");
      else this.markExact();
      return;
    }
    if (this.last !== NONE && seq <= this.last) {
      this.restart(seq, "sequence did not advance after a reconnect");
      return;
    }
    // Advancing past `last`: the same engine or a restarted one; no way to tell.
    this.markDegraded("reconnected without a replay endpoint");
    this.awaitingFirst = false;
  }

  /** A jump past seqJumpMax is skipped once; a batch following it confirms the new position. */
  private isStray(seq: number): boolean {
    if (this.last === NONE || seq - this.last <= this.options.seqJumpMax) {
      this.strayNext = NONE;
      return false;
    }
    if (seq === this.strayNext) {
      this.strayNext = NONE;
      return false;
    }
    this.strayNext = seq + 1;
    this.counters.straySeqs++;
    this.hooks.event?.("stray_seq", { last: this.last, got: seq });
    this.lose(1, "stray sequence number");
    return true;
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
      if (!replayed && this.tryGapReplay(expected)) {
        this.hold(this.buffer, seq, payload);
        return;
      }
      const reason = this.oversizePending
        ? "a batch over ingest.max_message_bytes was skipped"
        : replayed
          ? "replay started after the gap"
          : "a gap, and no replay endpoint";
      this.lose(seq - expected, reason);
    }
    this.applyBatch(seq, payload, replayed);
  }

  private applyBatch(seq: number, payload: Uint8Array, replayed: boolean): void {
    this.oversizePending = false; // a skip without a gap after it was not this stream's batch
    this.last = seq;
    this.lastBatch.keep(payload);
    this.lastPrint = PENDING;
    if (!this.hooks.apply(seq, payload, replayed)) {
      this.counters.malformed++;
      this.lose(1, "malformed batch");
      return;
    }
    if (replayed) this.counters.replayed++;
    else this.counters.applied++;
    if (this.mode === "tail") this.counters.idleProbeBatches++;
  }

  // ---- Replays ----

  private tryGapReplay(start: number): boolean {
    if (this.hooks.requestReplay === undefined || this.draining) return false;
    if (this.options.now() < this.cooldownUntil) return false;
    this.startReplay("gap", start);
    return true;
  }

  private startReplay(mode: Mode, start: number): void {
    this.mode = mode;
    this.counters.replaysRequested++;
    this.armIdleTimer();
    this.deadlineTimer = this.options.setTimer(() => {
      this.deadlineTimer = null;
      this.replayFailed("deadline");
    }, this.options.replayDeadlineMs);
    this.hooks.event?.("replay_started", { start, kind: mode });
    this.hooks.requestReplay!(start);
  }

  /** A probe reply: decide from the first one (and `last`'s fingerprint) how to use the ring. */
  private probeBatch(seq: number, payload: Uint8Array): void {
    if (this.probePlan === "apply") {
      this.accept(seq, payload, true);
      return;
    }
    if (this.probePlan === "undecided") {
      this.probeFirst = seq;
      if (this.last !== NONE && seq <= this.last) this.probePlan = "verify";
      else
        return this.decide(
          seq === 0 ? "rebuild" : seq === this.last + 1 ? "continue" : "late",
          seq,
          payload,
        );
    }
    // Verifying: hold replies up to `last`, whose fingerprint says same stream or not.
    if (seq < this.last) {
      this.hold(this.probeHeld, seq, payload);
      return;
    }
    const same = seq === this.last && fingerprint(payload) === this.lastFingerprint;
    if (same && !(this.degraded && this.probeFirst === 0)) {
      this.dropHeld(this.probeHeld);
      this.decide("continue", seq, payload);
      return;
    }
    if (same) this.decide("rebuild", seq, payload);
    else this.decide(this.probeFirst === 0 ? "restart_rebuild" : "restart_late", seq, payload);
  }

  /** The probe's end marker: an empty ring, or a ring that ended before reaching `last`. */
  private probeEnd(): void {
    if (this.probePlan === "apply") return;
    if (this.probePlan === "undecided") {
      // Nothing in the ring: the engine has published nothing since it started, so it holds nothing.
      if (this.last !== NONE) this.restart(NONE, "the engine's replay ring is empty");
      this.markExact();
      return;
    }
    this.decide(this.probeFirst === 0 ? "restart_rebuild" : "restart_late", NONE, null);
  }

  private decide(
    outcome: "continue" | "rebuild" | "late" | "restart_rebuild" | "restart_late",
    seq: number,
    payload: Uint8Array | null,
  ): void {
    this.probePlan = "apply";
    const held = this.takeHeld(this.probeHeld);
    if (outcome === "continue") {
      this.counters.continued++;
      this.hooks.event?.("continued", { last: this.last, first: this.probeFirst });
    } else if (outcome === "rebuild" || outcome === "restart_rebuild") {
      // Forget the worker (a restart does that itself), then apply the whole ring.
      if (outcome === "restart_rebuild")
        this.restart(this.probeFirst, "the replay ring differs from what was applied");
      else this.hooks.reset("rebuilding from the engine's replay ring");
      this.counters.rebuilds++;
      this.hooks.event?.("rebuild", { last: this.last });
      this.last = NONE;
      this.lastPrint = NONE;
      this.markExact();
    } else if (outcome === "restart_late") {
      this.restart(this.probeFirst, "the replay ring differs from what was applied");
      this.last = this.probeFirst - 1;
      this.lose(this.probeFirst, "restarted engine's replay ring starts late");
    }
    // "late": a ring starting past last + 1; accept() counts the gap as lost.
    for (const batch of held) this.accept(batch.seq, batch.payload, true);
    if (payload !== null) this.accept(seq, payload, true);
  }

  // ---- Idle probe ----

  /** Arms the quiet timer for the rest of the current quiet period (nothing without replay). */
  private armQuiet(wait = this.lastActivity + this.options.idleProbeMs - this.options.now()): void {
    if (!this.probesIdle) return;
    if (this.quietTimer !== null) this.options.clearTimer(this.quietTimer);
    this.quietTimer = this.options.setTimer(
      () => {
        this.quietTimer = null;
        this.quiet();
      },
      Math.max(0, wait),
    );
  }

  /**
   * The quiet timer fired: if nothing arrived for idleProbeMs, ask the ring from `last`.
   * Not while a replay runs (its end re-arms), nor while trust is unknown after a connect
   * (batch 0 or a clear decides that), nor in a failed replay's cooldown.
   */
  private quiet(): void {
    const now = this.options.now();
    if (now - this.lastActivity < this.options.idleProbeMs) return this.armQuiet();
    if (this.mode !== "idle" || this.awaitingFirst) return;
    if (now < this.cooldownUntil) return this.armQuiet(this.cooldownUntil - now);
    this.lastActivity = now;
    this.counters.idleProbes++;
    this.tailPlan = this.last === NONE ? "apply" : "verify";
    this.startReplay("tail", this.last === NONE ? 0 : this.last);
  }

  /**
   * An idle probe's reply. The first must be batch `last` with the fingerprint of the
   * batch applied as `last` (the same stream, not a restarted engine this connection has
   * not noticed yet); then what follows is applied in order, gaps counted lost.
   */
  private tailBatch(seq: number, payload: Uint8Array): void {
    if (this.tailPlan === "apply") return this.accept(seq, payload, true);
    if (seq === this.last && fingerprint(payload) === this.lastFingerprint) {
      this.tailPlan = "apply";
      return;
    }
    this.markDegraded("idle probe: the replay ring does not continue the batches applied");
    this.hooks.cancelReplay?.();
    this.counters.replaysCompleted++;
    this.finishReplay(false);
  }

  /** An idle probe's end marker before its first reply: the ring lacks our `last`. */
  private tailEnd(): void {
    if (this.tailPlan === "verify")
      this.markDegraded("idle probe: the replay ring lacks the last applied batch");
  }

  private hold(into: Held[], seq: number, payload: Uint8Array): void {
    if (this.heldBytes + payload.length > this.options.replayBufferBytes) {
      if (into === this.buffer) {
        this.counters.bufferDropped++;
        if (seq > this.droppedUpTo) this.droppedUpTo = seq;
        return;
      }
      // Probe replies can't be dropped one by one (the rebuild would have a hole): give up.
      this.replayFailed("replay buffer full");
      return;
    }
    into.push({ seq, payload: payload.slice() });
    this.heldBytes += payload.length;
    const count = this.buffer.length + this.probeHeld.length;
    if (count > this.counters.bufferedMax) this.counters.bufferedMax = count;
    if (this.heldBytes > this.counters.bufferedBytesMax)
      this.counters.bufferedBytesMax = this.heldBytes;
  }

  private takeHeld(from: Held[]): Held[] {
    const held = from.splice(0);
    for (const batch of held) this.heldBytes -= batch.payload.length;
    return held;
  }

  private dropHeld(from?: Held[]): void {
    if (from === undefined) {
      this.buffer = [];
      this.probeHeld = [];
      this.heldBytes = 0;
    } else this.takeHeld(from);
  }

  /** Applies the live batches held meanwhile; after a failed probe they go through the connect rules. */
  private finishReplay(unknown: boolean): void {
    this.clearTimers();
    this.mode = "idle";
    this.lastActivity = this.options.now();
    this.armQuiet();
    this.dropHeld(this.probeHeld);
    const held = this.takeHeld(this.buffer);
    this.awaitingFirst = unknown;
    this.draining = true;
    try {
      for (const batch of held) {
        if (this.awaitingFirst) this.live(batch.seq, batch.payload);
        else this.accept(batch.seq, batch.payload, false);
      }
    } finally {
      this.draining = false;
    }
    this.recoverDropped();
  }

  /** Live batches dropped at the byte cap that no later batch revealed: replay them, or count them lost. */
  private recoverDropped(): void {
    const upTo = this.droppedUpTo;
    this.droppedUpTo = NONE;
    if (upTo <= this.last || this.mode !== "idle") return;
    if (this.tryGapReplay(this.last + 1)) return;
    this.lose(upTo - this.last, "dropped at the replay buffer cap");
    this.last = upTo;
    this.lastPrint = NONE;
  }

  /** A new connection supersedes a replay in flight: its held live batches belong to the old one. */
  private abandonReplay(): void {
    if (this.mode === "idle") return;
    this.hooks.cancelReplay?.();
    this.close();
  }

  private armIdleTimer(): void {
    if (this.idleTimer !== null) this.options.clearTimer(this.idleTimer);
    this.idleTimer = this.options.setTimer(() => {
      this.idleTimer = null;
      this.replayFailed("timeout");
    }, this.options.replayTimeoutMs);
  }

  private clearTimers(): void {
    if (this.idleTimer !== null) this.options.clearTimer(this.idleTimer);
    if (this.deadlineTimer !== null) this.options.clearTimer(this.deadlineTimer);
    this.idleTimer = null;
    this.deadlineTimer = null;
  }

  // ---- Trust ----

  private lose(batches: number, reason: string): void {
    this.oversizePending = false;
    this.counters.lost += batches;
    this.hooks.event?.("loss", { batches, reason });
    this.markDegraded(`${batches} ${batches === 1 ? "batch" : "batches"} lost: ${reason}`);
  }

  private markDegraded(reason: string): void {
    if (this.degraded) return;
    this.degraded = true;
    this.degradedBy = reason;
    this.hooks.event?.("degraded", { reason });
  }

  /** A new stream is proven: forget the old one. `seq` is what proved it (for the log). */
  private restart(seq: number, reason: string): void {
    this.counters.restarts++;
    this.hooks.event?.("restart", { reason, last: this.last, got: seq });
    if (this.mode === "gap") {
      this.hooks.cancelReplay?.();
      this.close();
    }
    this.last = NONE;
    this.lastPrint = NONE;
    this.hooks.reset(reason);
    // The restarted engine's cache started empty, which is what we now hold.
    this.markExact();
  }
}
