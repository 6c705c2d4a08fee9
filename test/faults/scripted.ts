/**
 * A scripted engine for the fault suite: a real ZMTP PUB publishing vLLM KV events and
 * a replay ROUTER that can misbehave (silent, garbage, endless). It keeps the truth:
 * the set of blocks its events leave cached.
 */
import { encodeKvBatch, type KvEvent } from "../../src/wire/kv-events";
import { PubSocket, RouterSocket } from "../../src/wire/zmtp";
import { until } from "../support/wait";

export type ReplayMode = "good" | "silent" | "garbage" | "endless";

const EMPTY = new Uint8Array(0);
const END = new Uint8Array(8).fill(0xff);

function seqFrame(seq: bigint): Uint8Array {
  const frame = new Uint8Array(8);
  new DataView(frame.buffer).setBigUint64(0, seq);
  return frame;
}

export class ScriptedEngine {
  readonly pub = new PubSocket({ heartbeatIntervalMs: 1000 });
  readonly router = new RouterSocket();
  endpoint = "";
  replayEndpoint = "";
  mode: ReplayMode = "good";
  /** The blocks the engine caches, by external hash (decimal). */
  readonly truth = new Set<string>();
  private readonly ring: { seq: bigint; payload: Uint8Array }[] = [];
  private readonly timers = new Set<ReturnType<typeof setInterval>>();

  async start(): Promise<this> {
    this.endpoint = await this.pub.bind("tcp://127.0.0.1:0");
    this.replayEndpoint = await this.router.bind("tcp://127.0.0.1:0");
    this.router.onMessage = (identity) => this.serve(identity);
    return this;
  }

  /** Publishes one batch under `seq`; `lose` keeps it off the wire; `bogus` keeps it out of the truth and the ring. */
  publish(
    seq: bigint,
    events: readonly KvEvent[],
    options: { lose?: boolean; bogus?: boolean } = {},
  ): void {
    const payload = encodeKvBatch({ ts: Date.now() / 1000, events }, { form: "array" });
    if (options.bogus !== true) {
      this.ring.push({ seq, payload });
      for (const event of events) {
        if (event.type === "BlockStored")
          for (const hash of event.blockHashes) this.truth.add(String(hash));
        else if (event.type === "BlockRemoved")
          for (const hash of event.blockHashes) this.truth.delete(String(hash));
        else this.truth.clear();
      }
    }
    if (options.lose !== true) this.pub.send([EMPTY, seqFrame(seq), payload]);
  }

  async waitForSubscriber(timeoutMs = 10_000): Promise<void> {
    const subscribed = () => this.pub.subscribedPeers > 0;
    await until(subscribed, "a subscriber to reach the scripted engine", timeoutMs);
  }

  private serve(identity: Uint8Array): void {
    if (this.mode === "silent") return;
    if (this.mode === "garbage") {
      this.router.send(identity, [EMPTY, new Uint8Array([1, 2, 3]), new Uint8Array([9])]);
      return;
    }
    if (this.mode === "endless") {
      // Keeps resending its first batch and never sends the end marker.
      const first = this.ring[0] ?? {
        seq: 0n,
        payload: encodeKvBatch({ ts: 0, events: [] }, { form: "array" }),
      };
      const timer = setInterval(
        () => this.router.send(identity, [EMPTY, EMPTY, seqFrame(first.seq), first.payload]),
        5,
      );
      this.timers.add(timer);
      return;
    }
    for (const batch of this.ring)
      this.router.send(identity, [EMPTY, EMPTY, seqFrame(batch.seq), batch.payload]);
    this.router.send(identity, [EMPTY, EMPTY, END, EMPTY]);
  }

  async stop(): Promise<void> {
    for (const timer of this.timers) clearInterval(timer);
    await Promise.all([this.pub.close(), this.router.close()]);
  }
}
