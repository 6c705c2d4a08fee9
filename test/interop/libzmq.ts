/**
 * Runs test/interop/peer.mjs (a real libzmq socket through the `zeromq` addon) or
 * test/interop/engine.mjs (an engine's KV-event publisher: PUB plus replay ROUTER) under
 * `node`, and reads what it prints. See the scripts for their line protocols.
 */
import { createHash } from "node:crypto";
import { join } from "node:path";
import type { Subprocess } from "bun";

const PEER_SCRIPT = join(import.meta.dir, "peer.mjs");
const ENGINE_SCRIPT = join(import.meta.dir, "engine.mjs");
const READY_TIMEOUT_MS = 15_000;

export interface PeerConfig {
  readonly role: "pub" | "sub" | "router" | "dealer";
  readonly bind?: string;
  readonly connect?: string;
  readonly options?: Record<string, unknown>;
  readonly subscribe?: readonly string[];
  readonly replay?: { readonly topic: string; readonly count: number; readonly withTopic: boolean };
}

export class NodePeer {
  readonly lines: string[] = [];
  endpoint = "";
  private waiters: (() => void)[] = [];
  private stderr = "";

  private constructor(private readonly proc: Subprocess<"pipe", "pipe", "pipe">) {}

  static async start(
    config: PeerConfig | EngineConfig,
    script: string = PEER_SCRIPT,
  ): Promise<NodePeer> {
    const proc = Bun.spawn(["node", script, JSON.stringify(config)], {
      stdin: "pipe",
      stdout: "pipe",
      stderr: "pipe",
    });
    const peer = new NodePeer(proc);
    void peer.pump();
    void new Response(proc.stderr).text().then((text) => (peer.stderr = text));
    try {
      const ready = await peer.waitFor((line) => line.startsWith("ready "), READY_TIMEOUT_MS);
      peer.endpoint = ready.slice("ready ".length);
    } catch (error) {
      peer.kill();
      throw error;
    }
    return peer;
  }

  get pid(): number {
    return this.proc.pid;
  }

  /** Received messages as printed (`msg ...` lines without the prefix). */
  get messages(): string[] {
    return this.lines.filter((line) => line.startsWith("msg ")).map((line) => line.slice(4));
  }

  command(command: Record<string, unknown>): void {
    this.proc.stdin.write(`${JSON.stringify(command)}\n`);
    this.proc.stdin.flush();
  }

  send(frames: readonly Uint8Array[]): void {
    this.command({
      op: "send",
      frames: frames.map((frame) => Buffer.from(frame).toString("base64")),
    });
  }

  /** Resolves with the first line (already seen or future) matching `match`. */
  async waitFor(match: (line: string) => boolean, timeoutMs = 10_000): Promise<string> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.lines.find(match);
      if (found !== undefined) return found;
      const left = deadline - performance.now();
      if (left <= 0 || this.proc.exitCode !== null) {
        throw new Error(
          `libzmq peer: no matching line within ${timeoutMs} ms (exit ${this.proc.exitCode}); lines: ${this.lines.slice(-5).join(" | ")}; stderr: ${this.stderr}`,
        );
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 100));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Waits until at least `count` messages were printed. */
  async waitForMessages(count: number, timeoutMs = 10_000): Promise<string[]> {
    const deadline = performance.now() + timeoutMs;
    while (this.messages.length < count) {
      if (performance.now() > deadline)
        throw new Error(
          `libzmq peer: ${this.messages.length}/${count} messages after ${timeoutMs} ms`,
        );
      await this.waitFor(
        () => this.messages.length >= count,
        Math.max(1, deadline - performance.now()),
      ).catch(() => {});
    }
    return this.messages;
  }

  signal(signal: "SIGSTOP" | "SIGCONT" | "SIGKILL"): void {
    this.proc.kill(signal);
  }

  kill(): void {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill("SIGCONT");
    this.proc.kill("SIGKILL");
  }

  async exited(): Promise<number> {
    return this.proc.exited;
  }

  private async pump(): Promise<void> {
    const decoder = new TextDecoder();
    let partial = "";
    for await (const chunk of this.proc.stdout) {
      partial += decoder.decode(chunk, { stream: true });
      const parts = partial.split("\n");
      partial = parts.pop()!;
      for (const line of parts) this.lines.push(line);
      const waiters = this.waiters;
      this.waiters = [];
      for (const wake of waiters) wake();
    }
  }
}

/** How peer.mjs prints a frame. */
export function describeFrame(frame: Uint8Array): string {
  return frame.length <= 1024
    ? `b64:${Buffer.from(frame).toString("base64")}`
    : `big:${frame.length}:${createHash("sha256").update(frame).digest("hex")}`;
}

export function describeMessage(frames: readonly Uint8Array[]): string {
  return frames.map(describeFrame).join(" ");
}

export function seqBytes(seq: bigint): Uint8Array {
  const bytes = new Uint8Array(8);
  new DataView(bytes.buffer).setBigInt64(0, seq);
  return bytes;
}

export const text = (value: string): Uint8Array => new TextEncoder().encode(value);
export const str = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);

export interface EngineConfig {
  /** Where the PUB binds, e.g. tcp://127.0.0.1:0. */
  readonly pub: string;
  /** Where the replay ROUTER binds; absent or null: no replay. */
  readonly router?: string | null;
  readonly topic?: string;
  /** Replay replies carry the topic frame (vLLM from #45177) or not (earlier vLLM, SGLang). */
  readonly replayTopic?: boolean;
}

/** An engine's KV-event publisher on libzmq (test/interop/engine.mjs) in a node process. */
export class NodeEngine {
  private constructor(
    private readonly peer: NodePeer,
    readonly endpoint: string,
    readonly replayEndpoint: string | null,
  ) {}

  static async start(config: EngineConfig): Promise<NodeEngine> {
    const peer = await NodePeer.start(config, ENGINE_SCRIPT);
    const [pub, router] = peer.endpoint.split(" ") as [string, string];
    return new NodeEngine(peer, pub, router === "-" ? null : router);
  }

  /** Publishes `payload` as batch `seq`; `lose`: into the replay ring only (dropped at the PUB). */
  publish(seq: number, payload: Uint8Array, lose = false): void {
    this.peer.command({
      op: "publish",
      seq,
      payload: Buffer.from(payload).toString("base64"),
      ...(lose ? { lose: true } : {}),
    });
  }

  /** The start seq of every replay request served so far. */
  get replays(): number[] {
    return this.peer.lines
      .filter((line) => line.startsWith("replay "))
      .map((line) => Number(line.slice("replay ".length)));
  }

  /** Waits until `count` commands were carried out (publishes are sent in order). */
  async done(count: number): Promise<void> {
    await this.peer.waitFor(
      () => this.peer.lines.filter((line) => line.startsWith("done ")).length >= count,
    );
  }

  kill(): void {
    this.peer.kill();
  }
}
