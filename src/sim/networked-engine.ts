/**
 * A mock engine on the network: a MockEngine whose KV events go out as vLLM's do.
 *
 * - Each engine step's events become one `KVEventBatch` (`encodeKvBatch`: events as
 *   tagged arrays by default, as maps with `form: "map"`), published on a ZMTP PUB
 *   socket as three frames [topic, seq (u64 big-endian, from 0), payload]. Steps
 *   without events publish nothing (vLLM neither).
 * - The last `bufferSteps` batches (vLLM's `buffer_steps`, default 10,000) are kept for
 *   replay: a ROUTER socket answers [identity, empty, start_seq] with one
 *   [empty, topic, seq, payload] per kept batch with seq ≥ start, then
 *   [empty, topic, -1, empty] (vLLM after #45177).
 * - `reset()` is vLLM's reset_prefix_cache: AllBlocksCleared, published at once.
 * - `dropLive` loses chosen live messages on purpose (they stay in the replay ring),
 *   to exercise a consumer's gap recovery.
 *
 * Time is not kept here: a Pacer (./pacer.ts) steps the engine in real time and calls
 * `publish()` after every step and submission.
 */
import { encodeKvBatch, type KvEvent as WireEvent } from "../wire/kv-events";
import { PubSocket, RouterSocket, type ZmtpOptions } from "../wire/zmtp";
import type { Logger } from "../util/log";
import { OnceLog, silentLogger } from "../util/log";
import { EngineCache, type KvEvent } from "./engine-cache";
import { MockEngine, type EngineListener } from "./engine";
import { DEFAULT_TIME_MODEL, type TimeModel } from "./time-model";

export interface NetworkedEngineOptions {
  /** The engine's place in its fleet (logs, MockEngine.index). */
  readonly index: number;
  readonly capacityBlocks: number;
  readonly blockSize?: number;
  readonly hashSeed: bigint;
  /** The CPU offload tier's blocks (0 or absent: none). */
  readonly cpuCapacityBlocks?: number;
  readonly time?: TimeModel;
  /** Where the PUB socket binds, e.g. `tcp://127.0.0.1:0` (port 0: any free port). */
  readonly endpoint: string;
  /** Where the replay ROUTER binds; null: no replay. */
  readonly replayEndpoint?: string | null;
  readonly topic?: string;
  /** Event encoding: "array" (vLLM ≤ 0.23, SGLang) or "map" (vLLM 0.24+). */
  readonly form?: "array" | "map";
  /** Batches kept for replay. */
  readonly bufferSteps?: number;
  /** Receives first tokens and finishes (may be replaced later through `listener`). */
  readonly listener?: EngineListener;
  /** Fault injection: return true to keep live message `seq` off the wire. */
  readonly dropLive?: (seq: number) => boolean;
  /**
   * Publishes no KV events at all (an engine started without --kv-events-config): its
   * events are taken and dropped, nothing is sent or kept for replay.
   */
  readonly silent?: boolean;
  readonly log?: Logger;
  readonly zmtp?: ZmtpOptions;
}

export const DEFAULT_BUFFER_STEPS = 10_000;
/** Bound on the replay ring (memory: batches × their size). */
export const BUFFER_STEPS_MAX = 1_000_000;

export interface NetworkedEngineCounters {
  batches: number;
  events: number;
  bytes: number;
  /** Live messages kept off the wire by `dropLive`. */
  droppedLive: number;
  /** PUB sends that found a subscriber at its high-water mark. */
  hwmDrops: number;
  replayRequests: number;
  replayedBatches: number;
  malformedReplayRequests: number;
}

const EMPTY = new Uint8Array(0);
const END_OF_REPLAY = new Uint8Array(8).fill(0xff);

function seqFrame(seq: number): Uint8Array {
  const frame = new Uint8Array(8);
  new DataView(frame.buffer).setBigUint64(0, BigInt(seq));
  return frame;
}

/** The engine cache's events in the wire encoder's shape (field names as the encoder names them). */
export function toWireEvent(event: KvEvent): WireEvent {
  switch (event.type) {
    case "BlockStored":
      return {
        type: "BlockStored",
        blockHashes: event.block_hashes,
        parentBlockHash: event.parent_block_hash,
        tokenIds: event.token_ids,
        blockSize: event.block_size,
        loraId: null,
        medium: event.medium,
        loraName: event.lora_name,
      };
    case "BlockRemoved":
      return { type: "BlockRemoved", blockHashes: event.block_hashes, medium: event.medium };
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
  }
}

export class NetworkedEngine {
  readonly engine: MockEngine;
  readonly counters: NetworkedEngineCounters = {
    batches: 0,
    events: 0,
    bytes: 0,
    droppedLive: 0,
    hwmDrops: 0,
    replayRequests: 0,
    replayedBatches: 0,
    malformedReplayRequests: 0,
  };
  /** Where the PUB and ROUTER sockets listen (after `start`). */
  endpoint = "";
  replayEndpoint: string | null = null;
  /** Receives the engine's first tokens and finishes; replaceable between runs. */
  listener: EngineListener;

  private readonly pub: PubSocket;
  private readonly router: RouterSocket | null;
  private readonly topic: Uint8Array;
  private readonly form: "array" | "map";
  /** Batch `seq` lives at `seq % ring.length` while seq > nextSeq − ring.length. */
  private readonly ring: (Uint8Array | null)[];
  private nextSeq = 0;
  private readonly problems: OnceLog;

  constructor(private readonly options: NetworkedEngineOptions) {
    const bufferSteps = options.bufferSteps ?? DEFAULT_BUFFER_STEPS;
    if (!Number.isSafeInteger(bufferSteps) || bufferSteps < 1 || bufferSteps > BUFFER_STEPS_MAX) {
      throw new RangeError(
        `bufferSteps must be an integer in [1, ${BUFFER_STEPS_MAX}], got ${bufferSteps}`,
      );
    }
    this.listener = options.listener ?? { prefillDone() {}, finished() {} };
    const cache = new EngineCache({
      capacityBlocks: options.capacityBlocks,
      blockSize: options.blockSize,
      hashSeed: options.hashSeed,
      cpuCapacityBlocks: options.cpuCapacityBlocks ?? 0,
    });
    // The engine reports to whatever `listener` is at the time.
    this.engine = new MockEngine(options.index, cache, options.time ?? DEFAULT_TIME_MODEL, {
      prefillDone: (request, nowMs, cachedTokens) =>
        this.listener.prefillDone(request, nowMs, cachedTokens),
      finished: (request, nowMs) => this.listener.finished(request, nowMs),
    });
    const log = options.log ?? silentLogger;
    this.problems = new OnceLog(log);
    this.pub = new PubSocket({ ...options.zmtp, logger: log });
    this.router =
      options.replayEndpoint === undefined || options.replayEndpoint === null
        ? null
        : new RouterSocket({ ...options.zmtp, logger: log });
    this.topic = new TextEncoder().encode(options.topic ?? "");
    this.form = options.form ?? "array";
    this.ring = new Array<Uint8Array | null>(bufferSteps).fill(null);
  }

  /** Binds the sockets; resolves once both listen. */
  async start(): Promise<this> {
    this.endpoint = await this.pub.bind(this.options.endpoint);
    if (this.router !== null) {
      this.router.onMessage = (identity, frames) => this.serveReplay(identity, frames);
      this.replayEndpoint = await this.router.bind(this.options.replayEndpoint!);
    }
    return this;
  }

  /** Sequence number of the last batch published (-1 before the first). */
  get lastSeq(): number {
    return this.nextSeq - 1;
  }

  /** Peers subscribed to the PUB socket. */
  get subscribers(): number {
    return this.pub.subscribedPeers;
  }

  /** Waits until a subscriber's subscription has reached the PUB (earlier messages would be lost). */
  async waitForSubscriber(timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (this.pub.subscribedPeers === 0) {
      if (performance.now() > deadline) {
        throw new Error(
          `no subscriber reached engine ${this.options.index} (${this.endpoint}) within ${timeoutMs} ms`,
        );
      }
      await Bun.sleep(5);
    }
  }

  /** Publishes the engine's pending events as one batch; returns its seq, or -1 if there were none. */
  publish(): number {
    const events = this.engine.cache.takeEvents();
    if (events.length === 0 || this.options.silent === true) return -1;
    const payload = encodeKvBatch(
      { ts: Date.now() / 1000, events: events.map(toWireEvent) },
      { form: this.form },
    );
    const seq = this.nextSeq++;
    this.ring[seq % this.ring.length] = payload;
    this.counters.batches++;
    this.counters.events += events.length;
    this.counters.bytes += payload.length;
    if (this.options.dropLive?.(seq) === true) {
      this.counters.droppedLive++;
      return seq;
    }
    if (!this.pub.send([this.topic, seqFrame(seq), payload])) this.counters.hwmDrops++;
    return seq;
  }

  /** vLLM's reset_prefix_cache: drops every cached block and announces it. False while requests run. */
  reset(): boolean {
    if (!this.engine.idle || !this.engine.cache.reset()) return false;
    this.publish();
    return true;
  }

  async close(): Promise<void> {
    await Promise.all([this.pub.close(), this.router?.close()]);
  }

  private serveReplay(identity: Uint8Array, frames: readonly Uint8Array[]): void {
    // A DEALER's request arrives as [empty, start_seq (8 bytes big-endian)].
    if (frames.length !== 2 || frames[0]!.length !== 0 || frames[1]!.length !== 8) {
      this.counters.malformedReplayRequests++;
      this.problems.report(
        "bad_replay_request",
        `a replay request of ${frames.length} frames is malformed`,
      );
      return;
    }
    this.counters.replayRequests++;
    const view = frames[1]!;
    const start = new DataView(view.buffer, view.byteOffset, 8).getBigUint64(0);
    const router = this.router!;
    const size = this.ring.length;
    const oldest = Math.max(0, this.nextSeq - size);
    const from = start > BigInt(this.nextSeq) ? this.nextSeq : Math.max(oldest, Number(start));
    for (let seq = from; seq < this.nextSeq; seq++) {
      router.send(identity, [EMPTY, this.topic, seqFrame(seq), this.ring[seq % size]!]);
      this.counters.replayedBatches++;
    }
    router.send(identity, [EMPTY, this.topic, END_OF_REPLAY, EMPTY]);
  }
}
