/**
 * One engine event source: the KV-event stream of one publisher (one (worker, dp rank)
 * in vLLM terms), from the wire to the writer (the index).
 *
 *   SUB socket ─ 3 frames [topic, seq (u64 BE), payload] ─▶ Sequencer ─▶ Normalizer ─▶ writer (index)
 *                                       ▲                 (gap)
 *   DEALER to the engine's replay ROUTER ┘  [empty, start] → [empty, (topic,) seq, payload]…, seq −1
 *
 * The endpoint `tcp://*:PORT` binds (the engine connects to us); any other endpoint
 * connects (the engine binds, vLLM's default). Malformed messages are counted and
 * logged once per kind; they never stop the stream.
 */
import type { Logger } from "../util/log";
import { OnceLog } from "../util/log";
import { DealerSocket, type FrameList, type PeerInfo, SubSocket, type ZmtpOptions } from "../wire/zmtp";
import { type KvEventTap, type KvEventWriter, KvEventNormalizer } from "./normalize";
import { Sequencer, type SequencerEvent, type SequencerOptions } from "./sequencer";

export interface SourceConfig {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** Where the engine publishes: `tcp://host:port` (connect), `tcp://*:port` (bind), `ipc:///path`. */
  readonly endpoint: string;
  /** The engine's replay ROUTER endpoint, if it has one. */
  readonly replayEndpoint: string | null;
  /** Subscription prefix ("" = everything). */
  readonly topic: string;
}

export interface SourceOptions {
  /** The index block size; stores of another size are rejected. */
  readonly blockSize: number;
  /** Where the stream's operations go (the index). */
  readonly writer: KvEventWriter;
  /** Sees each applied operation with its decoded event (capture). */
  readonly tap?: KvEventTap;
  readonly log: Logger;
  readonly zmtp?: ZmtpOptions;
  readonly sequencer?: Partial<SequencerOptions>;
  /** Called when the source's state, trust or dp ranks change (connected, degraded, a new rank, ...). */
  readonly onChange?: (source: EngineSource) => void;
}

/**
 * connecting: never connected yet; connected: a publisher is attached;
 * disconnected: it was, and we are reconnecting; stopped: closed for good.
 */
export type SourceState = "connecting" | "connected" | "disconnected" | "stopped";

export class SourceCounters {
  /** Live messages received (before sequencing). */
  messages = 0;
  /** Messages without exactly 3 frames, or with a bad sequence frame. */
  malformedMessages = 0;
  replayReplies = 0;
  malformedReplayReplies = 0;
  connects = 0;
  disconnects = 0;
  /** Batches whose applying threw (e.g. out of memory): counted lost, worker degraded. */
  applyErrors = 0;
}

const SEQ_BYTES = 8;
/** Sequence numbers at or above 2^53 are refused (they cannot occur from a counter from 0). */
const SEQ_HI_MAX = 0x1f_ffff;
const END_OF_REPLAY = -1;

/** Reads an 8-byte big-endian sequence frame: a number, END_OF_REPLAY, or null if malformed. */
function readSeq(frames: FrameList, index: number): number | null {
  if (frames.size(index) !== SEQ_BYTES) return null;
  const bytes = frames.buffer(index);
  const at = frames.start(index);
  const hi = ((bytes[at]! << 24) | (bytes[at + 1]! << 16) | (bytes[at + 2]! << 8) | bytes[at + 3]!) >>> 0;
  const lo = ((bytes[at + 4]! << 24) | (bytes[at + 5]! << 16) | (bytes[at + 6]! << 8) | bytes[at + 7]!) >>> 0;
  if (hi === 0xffff_ffff && lo === 0xffff_ffff) return END_OF_REPLAY;
  if (hi > SEQ_HI_MAX) return null;
  return hi * 0x1_0000_0000 + lo;
}

function seqFrame(seq: number): Uint8Array {
  const frame = new Uint8Array(SEQ_BYTES);
  new DataView(frame.buffer).setBigUint64(0, BigInt(seq));
  return frame;
}

const EMPTY = new Uint8Array(0);

export class EngineSource {
  readonly counters = new SourceCounters();
  readonly sequencer: Sequencer;
  readonly normalizer: KvEventNormalizer;
  private stateNow: SourceState = "connecting";
  private readonly sub: SubSocket;
  private dealer: DealerSocket | null = null;
  private readonly log: Logger;
  private readonly problems: OnceLog;

  constructor(readonly config: SourceConfig, private readonly options: SourceOptions) {
    this.log = options.log.child({ worker_id: config.workerId, dp_rank: config.dpRank });
    this.problems = new OnceLog(this.log);
    this.normalizer = new KvEventNormalizer({
      workerId: config.workerId, dpRank: config.dpRank, blockSize: options.blockSize, writer: options.writer, log: this.log,
      ...(options.tap === undefined ? {} : { tap: options.tap }),
    });
    this.sequencer = new Sequencer({
      apply: (_seq, payload) => this.apply(payload),
      reset: (reason) => this.reset(reason),
      requestReplay: config.replayEndpoint === null ? undefined : (start) => this.requestReplay(start),
      cancelReplay: () => this.dropDealer(),
      event: (kind, fields) => this.sequencerEvent(kind, fields),
    }, options.sequencer);
    this.sub = new SubSocket({ ...options.zmtp, logger: this.log });
    this.sub.onFrames = (frames) => this.live(frames);
    this.sub.onPeer = (event, peer) => this.peer(event, peer);
    this.sub.onSkipped = () => this.sequencer.skipped();
  }

  get state(): SourceState {
    return this.stateNow;
  }

  /** Whether routing should discount this worker's overlap: lost events, or no publisher. */
  get degraded(): boolean {
    return this.sequencer.isDegraded || this.stateNow !== "connected";
  }

  /** Dp ranks seen from this publisher (the configured one first): an engine restart clears them all. */
  get ranks(): number[] {
    return [...this.normalizer.rankSlots.ranks];
  }

  /** Counters of the SUB socket (and of the replay DEALER, when one is open). */
  get socketCounters(): { sub: SubSocket["counters"]; dealer: DealerSocket["counters"] | null } {
    return { sub: this.sub.counters, dealer: this.dealer?.counters ?? null };
  }

  /** Subscribes and connects (or binds); resolves with the endpoint actually used. */
  async start(): Promise<string> {
    this.sub.subscribe(this.config.topic);
    if (/^tcp:\/\/\*:/.test(this.config.endpoint)) return this.sub.bind(this.config.endpoint);
    this.sub.connect(this.config.endpoint);
    return this.config.endpoint;
  }

  async stop(): Promise<void> {
    if (this.stateNow === "stopped") return;
    this.stateNow = "stopped";
    this.sequencer.close();
    const dealer = this.dealer;
    this.dealer = null;
    await Promise.all([this.sub.close(), dealer?.close()]);
  }

  private live(frames: FrameList): void {
    this.counters.messages++;
    if (frames.count !== 3) {
      this.malformed("frame_count", `a live message has ${frames.count} frames, expected 3`);
      return;
    }
    const seq = readSeq(frames, 1);
    if (seq === null || seq === END_OF_REPLAY) {
      this.malformed("bad_seq", `a sequence frame of ${frames.size(1)} bytes is not a valid u64 below 2^53`);
      return;
    }
    this.sequencer.live(seq, frames.frame(2));
  }

  private malformed(kind: string, message: string): void {
    this.counters.malformedMessages++;
    this.problems.report(kind, message);
  }

  private peer(event: string, peer: PeerInfo): void {
    if (this.stateNow === "stopped") return;
    if (event === "connected") {
      this.counters.connects++;
      this.stateNow = "connected";
      this.log.info("publisher connected", { endpoint: peer.endpoint, remote: peer.remoteAddress, connection: peer.id });
      // What the engine holds is unknown until the sequencer's connect probe (or batch 0) says.
      this.sequencer.connected();
    } else if (event === "disconnected") {
      this.counters.disconnects++;
      if (this.sub.peers.length === 0) this.stateNow = "disconnected";
      this.log.warn("publisher disconnected", { endpoint: peer.endpoint, connection: peer.id });
    } else {
      return;
    }
    this.options.onChange?.(this);
  }

  /**
   * One sequenced batch to the index. After it: an AllBlocksCleared in it made the state
   * exact again; a dp rank first seen in it is announced (its slot is already taken).
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
    if (normalizer.rankSlots.ranks.size !== ranks) this.options.onChange?.(this);
    return applied;
  }

  private reset(reason: string): void {
    this.log.info("clearing the worker's blocks", { reason });
    this.normalizer.reset();
    const rankSlots = this.normalizer.rankSlots;
    for (const dpRank of rankSlots.ranks) this.options.writer.clearAt(rankSlots.slotOf(dpRank));
  }

  /** Each replay gets its own DEALER connection, so replies of an earlier one cannot be mistaken. */
  private requestReplay(start: number): void {
    this.dropDealer();
    const dealer = new DealerSocket({ ...this.options.zmtp, logger: this.log });
    this.dealer = dealer;
    dealer.onSkipped = () => this.sequencer.skipped();
    dealer.onFrames = (frames) => {
      if (this.dealer === dealer) this.replayReply(frames);
    };
    dealer.connect(this.config.replayEndpoint!);
    dealer.send([EMPTY, seqFrame(start)]);
  }

  private replayReply(frames: FrameList): void {
    this.counters.replayReplies++;
    // [empty, topic, seq, payload] (vLLM ≥ #45177) or [empty, seq, payload] (before).
    const seqAt = frames.count === 4 ? 2 : frames.count === 3 ? 1 : -1;
    const seq = seqAt < 0 || frames.size(0) !== 0 ? null : readSeq(frames, seqAt);
    if (seq === null) {
      this.counters.malformedReplayReplies++;
      this.problems.report("bad_replay_reply", `a replay reply of ${frames.count} frames is malformed`);
      this.sequencer.replayFailed("malformed reply");
      return;
    }
    if (seq === END_OF_REPLAY) this.sequencer.replayEnd();
    else this.sequencer.replayBatch(seq, frames.frame(seqAt + 1));
  }

  /** Closes the replay connection so late replies of an abandoned replay cannot be mistaken. */
  private dropDealer(): void {
    const dealer = this.dealer;
    this.dealer = null;
    void dealer?.close();
  }

  private sequencerEvent(kind: SequencerEvent, fields: Record<string, number | string>): void {
    if (kind === "gap" || kind === "replay_started" || kind === "replay_done" || kind === "continued") this.log.info(kind, fields);
    else this.log.warn(kind, fields);
    if (kind === "degraded" || kind === "exact" || kind === "replay_started" || kind === "replay_done"
      || kind === "replay_failed") this.options.onChange?.(this);
  }
}
