/**
 * One engine stream's sequencing half: the sequencer and the normalizer of one
 * publisher, from sequenced batches to the sink (the index). Transport-free: the
 * socket half (EngineSource) feeds it what arrives, directly on one thread, or through
 * the event ring on the writer thread (src/runtime/writer.ts); it asks for replays
 * through `ReplayTransport`.
 */
import type { LoraAdapters } from "../hash";
import type { Logger } from "../util/log";
import { OnceLog } from "../util/log";
import { type KvEventTap, type KvEventSink, KvEventNormalizer } from "./normalize";
import { Sequencer, type SequencerEvent, type SequencerOptions } from "./sequencer";

/** What the socket half hands on, in arrival order. */
export interface StreamInput {
  /** A live batch with a valid sequence number. */
  live(seq: number, payload: Uint8Array): void;
  /** The publisher (re)connected: what the engine holds is unknown until established. */
  connected(): void;
  replayBatch(seq: number, payload: Uint8Array): void;
  replayEnd(): void;
  replayFailed(reason: string): void;
  /** A message over the size limit was skipped on the wire (live or replayed). */
  skipped(): void;
  /** Stops timers; nothing more arrives. */
  close(): void;
}

/** Where a stream stood (a snapshot keeps it; a restarted stream resumes from it). */
export interface StreamPosition {
  readonly lastSeq: number;
  /** Fingerprint of batch lastSeq (the sequencer's continuity proof), -1 if unknown. */
  readonly fingerprint: number;
  readonly degraded: boolean;
  /** The dp ranks the stream had published for (the configured one first). */
  readonly ranks: readonly number[];
}

/** How a stream reaches its engine's replay endpoint (the socket half owns the DEALER). */
export interface ReplayTransport {
  /** Absent when the engine has no replay endpoint. */
  readonly requestReplay?: (start: number) => void;
  readonly cancelReplay: () => void;
}

export interface StreamIdentity {
  readonly workerId: bigint;
  readonly dpRank: number;
}

export interface StreamOptions {
  readonly blockSize: number;
  readonly sink: KvEventSink;
  readonly tap?: KvEventTap;
  /** How LoRA ids name adapters (`index.lora_adapters`). */
  readonly lora?: LoraAdapters;
  readonly log: Logger;
  readonly sequencer?: Partial<SequencerOptions>;
  /** Called when trust or dp ranks change (degraded, exact, a new rank, a replay's start / end). */
  readonly onChange?: () => void;
}

const INFO_EVENTS = new Set<SequencerEvent>(["gap", "replay_started", "replay_done", "continued"]);
/** Events after which trust may differ. */
const CHANGE_EVENTS = new Set<SequencerEvent>([
  "degraded",
  "exact",
  "replay_started",
  "replay_done",
  "replay_failed",
]);

export class StreamCounters {
  /** Batches whose applying threw (e.g. out of memory): counted lost, worker degraded. */
  applyErrors = 0;
}

export class EngineStream implements StreamInput {
  readonly sequencer: Sequencer;
  readonly normalizer: KvEventNormalizer;
  readonly counters = new StreamCounters();
  private readonly log: Logger;
  private readonly problems: OnceLog;

  constructor(
    identity: StreamIdentity,
    transport: ReplayTransport,
    private readonly options: StreamOptions,
  ) {
    this.log = options.log;
    this.problems = new OnceLog(this.log);
    this.normalizer = new KvEventNormalizer({
      workerId: identity.workerId,
      dpRank: identity.dpRank,
      blockSize: options.blockSize,
      sink: options.sink,
      log: this.log,
      ...(options.tap === undefined ? {} : { tap: options.tap }),
      ...(options.lora === undefined ? {} : { lora: options.lora }),
    });
    this.sequencer = new Sequencer(
      {
        apply: (_seq, payload) => this.apply(payload),
        reset: (reason) => this.reset(reason),
        requestReplay: transport.requestReplay,
        cancelReplay: transport.cancelReplay,
        event: (kind, fields) => this.sequencerEvent(kind, fields),
      },
      options.sequencer,
    );
  }

  /** Dp ranks seen from this publisher (the configured one first); a restart clears them all. */
  get ranks(): number[] {
    return [...this.normalizer.rankSlots.ranks];
  }

  live(seq: number, payload: Uint8Array): void {
    this.sequencer.live(seq, payload);
  }

  restore(position: StreamPosition): void {
    this.sequencer.restore(position.lastSeq, position.fingerprint, position.degraded);
    const rankSlots = this.normalizer.rankSlots;
    for (const rank of position.ranks) rankSlots.slotOf(rank);
    this.options.onChange?.();
  }

  connected(): void {
    this.sequencer.connected();
  }

  replayBatch(seq: number, payload: Uint8Array): void {
    this.sequencer.replayBatch(seq, payload);
  }

  replayEnd(): void {
    this.sequencer.replayEnd();
  }

  replayFailed(reason: string): void {
    this.sequencer.replayFailed(reason);
  }

  skipped(): void {
    this.sequencer.skipped();
  }

  close(): void {
    this.sequencer.close();
  }

  /**
   * One sequenced batch to the index. After it: an AllBlocksCleared in it made the state
   * exact again, unless an event it could not read came after that (degraded); a dp
   * rank first seen in it is announced (its slot is already taken).
   * An exception (an allocation that failed, a bug) may leave the batch half applied:
   * it is caught, counted, and reported as a lost batch, so the worker is degraded and
   * the process goes on serving.
   */
  private apply(payload: Uint8Array): boolean {
    const normalizer = this.normalizer;
    const clears = normalizer.counters.appliedClears;
    const ranks = normalizer.rankSlots.ranks.size;
    let applied: boolean;
    try {
      applied = normalizer.ingest(payload);
    } catch (error) {
      this.counters.applyErrors++;
      this.problems.report("apply_error", "applying a batch failed: it counts as lost", {
        error: error instanceof Error ? error.message : String(error),
      });
      applied = false;
    }
    if (applied && normalizer.counters.appliedClears !== clears) this.sequencer.markExact();
    // After the clear: an event skipped behind the batch's last clear still counts.
    if (applied && normalizer.incomplete) this.sequencer.incomplete();
    if (normalizer.rankSlots.ranks.size !== ranks) this.options.onChange?.();
    return applied;
  }

  private reset(reason: string): void {
    this.log.info("clearing the worker's blocks", { reason });
    this.normalizer.reset();
    const rankSlots = this.normalizer.rankSlots;
    for (const dpRank of rankSlots.ranks) this.options.sink.clearAt(rankSlots.slotOf(dpRank));
  }

  private sequencerEvent(kind: SequencerEvent, fields: Record<string, number | string>): void {
    if (INFO_EVENTS.has(kind)) this.log.info(kind, fields);
    else this.log.warn(kind, fields);
    if (CHANGE_EVENTS.has(kind)) this.options.onChange?.();
  }
}
