/**
 * One engine event source: the KV-event stream of one publisher (one (worker, dp rank)
 * in vLLM terms), from the wire to the sink (the index).
 *
 *   SUB socket ─ 3 frames [topic, seq (u64 BE), payload] ─▶ Sequencer ─▶ Normalizer ─▶ sink (index)
 *                                       ▲                 (gap)
 *   DEALER to the engine's replay ROUTER ┘  [empty, start] → [empty, (topic,) seq, payload]…, seq −1
 *
 * The endpoint `tcp://*:PORT` binds (the engine connects to us); any other endpoint
 * connects (the engine binds, vLLM's default). Malformed messages are counted and
 * logged once per kind; they never stop the stream.
 */
import type { LoraAdapters } from "../hash";
import type { Logger } from "../util/log";
import { OnceLog } from "../util/log";
import {
  DealerSocket,
  type FrameList,
  type PeerInfo,
  SubSocket,
  type ZmtpOptions,
} from "../wire/zmtp";
import type { KvEventTap, KvEventSink, NormalizeCounters } from "./normalize";
import type { SequencerCounters, SequencerOptions } from "./sequencer";
import {
  EngineStream,
  type ReplayTransport,
  type StreamCounters,
  type StreamInput,
  type StreamPosition,
} from "./stream";

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
  readonly sink: KvEventSink;
  /** Sees each applied operation with its decoded event (capture). */
  readonly tap?: KvEventTap;
  /** How LoRA ids name adapters (`index.lora_adapters`). */
  readonly lora?: LoraAdapters;
  readonly log: Logger;
  readonly zmtp?: ZmtpOptions;
  readonly sequencer?: Partial<SequencerOptions>;
  /** Called when the source's state, trust or dp ranks change (connected, degraded, a new rank, ...). */
  readonly onChange?: (source: EngineSource) => void;
  /**
   * Where arrivals go instead of a stream of this thread's own (writer-thread mode:
   * the event ring; src/runtime/writer.ts). Given the replay transport it may use.
   */
  readonly input?: (transport: ReplayTransport, changed: () => void) => StreamInput & StreamView;
}

/** What readers of a stream's sequencing see (metrics, /v1/workers, snapshots). */
export interface SequencerView {
  readonly lastSeq: number;
  readonly lastFingerprint: number;
  readonly isDegraded: boolean;
  /** Why it is degraded, in words (null when it is not). */
  readonly degradedReason: string | null;
  readonly counters: SequencerCounters;
}

export interface StreamView {
  readonly sequencer: SequencerView;
  readonly normalizer: { readonly counters: NormalizeCounters };
  readonly counters: StreamCounters;
  /** Dp ranks seen from this publisher (the configured one first). */
  readonly ranks: number[];
  /**
   * Starts from a saved position (warm restart), before the first connect: the
   * sequencer's, and the dp ranks the stream had published (an engine restart clears them).
   */
  restore(position: StreamPosition): void;
}

/**
 * connecting: never connected yet; connected: a publisher is attached;
 * disconnected: it was, and we are reconnecting; stopped: closed for good.
 */
/** Where a stream stood: what a snapshot keeps of it and a restarted source resumes from. */
export interface SourcePosition extends StreamPosition {
  readonly workerId: bigint;
  readonly dpRank: number;
}

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
  const hi =
    ((bytes[at]! << 24) | (bytes[at + 1]! << 16) | (bytes[at + 2]! << 8) | bytes[at + 3]!) >>> 0;
  const lo =
    ((bytes[at + 4]! << 24) | (bytes[at + 5]! << 16) | (bytes[at + 6]! << 8) | bytes[at + 7]!) >>>
    0;
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
  /** The stream's sequencing: here, or (writer-thread mode) its mirror. */
  readonly stream: StreamInput & StreamView;
  private stateNow: SourceState = "connecting";
  private readonly sub: SubSocket;
  private dealer: DealerSocket | null = null;
  /** The replay on `dealer` ended with its end marker: no late reply can follow, so it is reused. */
  private dealerDone = false;
  private readonly log: Logger;
  private readonly problems: OnceLog;

  constructor(
    readonly config: SourceConfig,
    private readonly options: SourceOptions,
  ) {
    this.log = options.log.child({ worker_id: config.workerId, dp_rank: config.dpRank });
    this.problems = new OnceLog(this.log);
    const transport: ReplayTransport = {
      requestReplay:
        config.replayEndpoint === null ? undefined : (start) => this.requestReplay(start),
      cancelReplay: () => this.dropDealer(),
    };
    const changed = (): void => this.options.onChange?.(this);
    this.stream =
      options.input?.(transport, changed) ??
      new EngineStream(config, transport, {
        blockSize: options.blockSize,
        sink: options.sink,
        log: this.log,
        ...(options.tap === undefined ? {} : { tap: options.tap }),
        ...(options.lora === undefined ? {} : { lora: options.lora }),
        ...(options.sequencer === undefined ? {} : { sequencer: options.sequencer }),
        onChange: changed,
      });
    this.sub = new SubSocket({ ...options.zmtp, logger: this.log });
    this.sub.onFrames = (frames) => this.live(frames);
    this.sub.onPeer = (event, peer) => this.peer(event, peer);
    this.sub.onSkipped = () => this.stream.skipped();
  }

  get sequencer(): SequencerView {
    return this.stream.sequencer;
  }

  get normalizer(): StreamView["normalizer"] {
    return this.stream.normalizer;
  }

  get state(): SourceState {
    return this.stateNow;
  }

  /** Whether routing should discount this worker's overlap: lost events, or no publisher. */
  get degraded(): boolean {
    return this.stream.sequencer.isDegraded || this.stateNow !== "connected";
  }

  /** Dp ranks seen from this publisher (the configured one first): an engine restart clears them all. */
  get ranks(): number[] {
    return this.stream.ranks;
  }

  /** Counters of the SUB socket (and of the replay DEALER, when one is open). */
  get socketCounters(): { sub: SubSocket["counters"]; dealer: DealerSocket["counters"] | null } {
    return { sub: this.sub.counters, dealer: this.dealer?.counters ?? null };
  }

  /** Starts from a saved position (warm restart), before `start`. */
  restore(position: SourcePosition): void {
    this.stream.restore(position);
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
    this.stream.close();
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
      this.malformed(
        "bad_seq",
        `a sequence frame of ${frames.size(1)} bytes is not a valid u64 below 2^53`,
      );
      return;
    }
    this.stream.live(seq, frames.frame(2));
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
      this.log.info("publisher connected", {
        endpoint: peer.endpoint,
        remote: peer.remoteAddress,
        connection: peer.id,
      });
      // What the engine holds is unknown until the sequencer's connect probe (or batch 0) says.
      this.stream.connected();
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
   * A replay on a DEALER connection of its own, so replies of an abandoned one cannot be
   * mistaken; one whose last replay ended with its end marker is reused (idle probes ask
   * every `ingest.idle_probe_ms`: no new connection each time).
   */
  private requestReplay(start: number): void {
    if (this.dealer !== null && this.dealerDone) {
      this.dealerDone = false;
      this.dealer.send([EMPTY, seqFrame(start)]);
      return;
    }
    this.dropDealer();
    const dealer = new DealerSocket({ ...this.options.zmtp, logger: this.log });
    this.dealer = dealer;
    dealer.onSkipped = () => this.stream.skipped();
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
      this.problems.report(
        "bad_replay_reply",
        `a replay reply of ${frames.count} frames is malformed`,
      );
      this.stream.replayFailed("malformed reply");
      return;
    }
    if (seq === END_OF_REPLAY) {
      this.dealerDone = true;
      this.stream.replayEnd();
    } else this.stream.replayBatch(seq, frames.frame(seqAt + 1));
  }

  /** Closes the replay connection so late replies of an abandoned replay cannot be mistaken. */
  private dropDealer(): void {
    const dealer = this.dealer;
    this.dealer = null;
    this.dealerDone = false;
    void dealer?.close();
  }
}
