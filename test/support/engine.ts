/**
 * A scripted engine for end-to-end tests: a real ZMTP PUB socket publishing vLLM KV
 * events (3 frames: topic, seq u64 BE, msgpack batch) and a replay ROUTER speaking
 * vLLM's protocol. Tests decide exactly which batches go out, which are "lost", and
 * when the engine "restarts" (sequence back to 0).
 */
import {
  encodeKvBatch,
  type KvBatch,
  type KvEvent,
  type WireVariant,
} from "../../src/wire/kv-events";
import { PubSocket, RouterSocket } from "../../src/wire/zmtp";
import { until } from "./wait";

const EMPTY = new Uint8Array(0);

function seqFrame(seq: bigint): Uint8Array {
  const frame = new Uint8Array(8);
  new DataView(frame.buffer).setBigUint64(0, seq);
  return frame;
}

export interface TestEngineOptions {
  readonly topic?: string;
  /** Events as arrays (vLLM V7) or maps (vLLM V9); `variant` names any producer's layout instead. */
  readonly form?: "array" | "map";
  readonly variant?: WireVariant;
  readonly replay?: boolean;
  readonly dpRank?: number | null;
}

export class TestEngine {
  pub = new PubSocket({ heartbeatIntervalMs: 1000 });
  router: RouterSocket | null;
  endpoint = "";
  replayEndpoint: string | null = null;
  /** Next sequence number. */
  seq = 0n;
  /** Replay requests answered since start (a subscriber's connect probe is the first). */
  replayRequests = 0;
  /** What a replay can serve: every batch published since the last restart. */
  private readonly ring: { seq: bigint; payload: Uint8Array }[] = [];
  private readonly topic: Uint8Array;

  constructor(private readonly options: TestEngineOptions = {}) {
    this.topic = new TextEncoder().encode(options.topic ?? "");
    this.router = options.replay ? new RouterSocket() : null;
  }

  async start(): Promise<this> {
    this.endpoint = await this.pub.bind("tcp://127.0.0.1:0");
    if (this.router !== null) {
      this.replayEndpoint = await this.router.bind("tcp://127.0.0.1:0");
      this.router.onMessage = (identity, frames) => this.serveReplay(identity, frames);
    }
    return this;
  }

  /**
   * Publishes one batch; `lose` skips the wire (a gap the router must notice); `dpRank`
   * names another rank of the engine than its own (a data-parallel engine's batch).
   */
  publish(
    events: readonly KvEvent[],
    lose = false,
    dpRank: number | null = this.options.dpRank ?? null,
  ): bigint {
    const batch: KvBatch = { ts: Date.now() / 1000, events, dpRank };
    const payload = encodeKvBatch(
      batch,
      this.options.variant === undefined
        ? { form: this.options.form ?? "array" }
        : { variant: this.options.variant },
    );
    const seq = this.seq++;
    this.ring.push({ seq, payload });
    if (!lose) this.pub.send([this.topic, seqFrame(seq), payload]);
    return seq;
  }

  /**
   * The engine process restarted: new sockets on the same addresses (subscribers see a
   * new connection), sequence from 0, nothing to replay.
   */
  async restart(): Promise<void> {
    await Promise.all([this.pub.close(), this.router?.close()]);
    this.seq = 0n;
    this.ring.length = 0;
    this.pub = new PubSocket({ heartbeatIntervalMs: 1000 });
    await this.pub.bind(this.endpoint);
    if (this.router !== null) {
      this.router = new RouterSocket();
      await this.router.bind(this.replayEndpoint!);
      this.router.onMessage = (identity, frames) => this.serveReplay(identity, frames);
    }
  }

  /** Waits until a subscriber's subscription has reached the PUB (else messages are filtered out). */
  async waitForSubscriber(timeoutMs = 10_000): Promise<void> {
    const subscribed = () => this.pub.subscribedPeers > 0;
    await until(subscribed, "a subscriber to reach the test engine", timeoutMs);
  }

  /** Waits until `count` replay requests were answered (e.g. the router's connect probe). */
  async waitForReplayRequests(count: number, timeoutMs = 10_000): Promise<void> {
    const answered = () => this.replayRequests >= count;
    await until(answered, `the test engine to answer ${count} replay requests`, timeoutMs);
  }

  private serveReplay(identity: Uint8Array, frames: readonly Uint8Array[]): void {
    // DEALER request: [empty, start seq (8 bytes BE)].
    if (frames.length !== 2 || frames[1]!.length !== 8) return;
    this.replayRequests++;
    const start = new DataView(frames[1]!.buffer, frames[1]!.byteOffset, 8).getBigUint64(0);
    for (const batch of this.ring) {
      if (batch.seq >= start)
        this.router!.send(identity, [EMPTY, this.topic, seqFrame(batch.seq), batch.payload]);
    }
    this.router!.send(identity, [EMPTY, this.topic, seqFrame(0xffff_ffff_ffff_ffffn), EMPTY]);
  }

  async stop(): Promise<void> {
    await Promise.all([this.pub.close(), this.router?.close()]);
  }
}

/** Stored event helper: blocks of `blockSize` tokens each, engine hashes given. */
export function stored(
  hashes: readonly bigint[],
  tokens: readonly number[],
  blockSize: number,
  parent: bigint | null = null,
  extra: Partial<KvEvent & { type: "BlockStored" }> = {},
): KvEvent {
  return {
    type: "BlockStored",
    blockHashes: hashes,
    parentBlockHash: parent,
    tokenIds: tokens,
    blockSize,
    medium: "GPU",
    ...extra,
  };
}

export function removed(hashes: readonly bigint[]): KvEvent {
  return { type: "BlockRemoved", blockHashes: hashes, medium: "GPU" };
}

export const cleared: KvEvent = { type: "AllBlocksCleared" };
