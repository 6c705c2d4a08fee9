/**
 * One engine answer on its way to the client: a byte stream, passed on as it arrives,
 * with a reader beside it for the usage (./sse.ts for a stream, the whole JSON of a
 * plain answer up to EVENT_BYTES_MAX). Each pull reads until it has something to pass
 * on or the answer ends: a read that yields nothing for the client (the dropped usage
 * chunk, half an event) never leaves the client's read pending. The end of the engine's
 * answer is the end of the client's; an engine failure breaks the client's stream.
 */
import type { Exchange, UpstreamError } from "../http/client";
import { EVENT_BYTES_MAX, SseScanner } from "./sse";

/** Told how the answer goes (the request's lifecycle owner, ./proxy.ts). */
export interface RelayOwner {
  /** The answer's first body bytes arrived. */
  firstByte(): void;
  /** The answer ended whole; its usage object, if it had one. */
  finished(usage: unknown): void;
  /** The engine's answer broke off (or paused past the idle timeout). */
  broke(error: UpstreamError): void;
  /** The client went away. */
  cancelled(): void;
}

const utf8 = new TextDecoder();

export class Relay {
  readonly body: ReadableStream<Uint8Array>;
  private readonly scanner: SseScanner | null;
  /** A plain answer's bytes, kept (up to EVENT_BYTES_MAX) to read its usage at the end. */
  private readonly whole: Uint8Array[] = [];
  private wholeBytes = 0;
  private started = false;

  constructor(
    private readonly exchange: Exchange,
    /** Read the answer's usage (a 2xx answer): as SSE, or as one JSON document. */
    reading: "sse" | "json" | "none",
    stripUsage: boolean,
    private readonly owner: RelayOwner,
  ) {
    this.scanner = reading === "sse" ? new SseScanner(stripUsage) : null;
    if (reading !== "json") this.wholeBytes = EVENT_BYTES_MAX; // nothing kept
    this.body = new ReadableStream<Uint8Array>({
      pull: (controller) => this.pull(controller),
      cancel: () => this.owner.cancelled(),
    });
  }

  private async pull(controller: ReadableStreamDefaultController<Uint8Array>): Promise<void> {
    const out: Uint8Array[] = [];
    while (out.length === 0) {
      let step: Awaited<ReturnType<Exchange["read"]>>;
      try {
        step = await this.exchange.read();
      } catch (error) {
        this.owner.broke(error as UpstreamError);
        controller.error(error);
        return;
      }
      if (step.done) {
        this.finish(controller);
        return;
      }
      if (!this.started) {
        this.started = true;
        this.owner.firstByte();
      }
      if (this.scanner !== null) this.scanner.push(step.value, out);
      else {
        this.keep(step.value);
        out.push(step.value);
      }
    }
    for (const part of out) controller.enqueue(part);
  }

  private keep(chunk: Uint8Array): void {
    if (this.wholeBytes >= EVENT_BYTES_MAX) return;
    this.whole.push(chunk);
    this.wholeBytes += chunk.length;
  }

  private finish(controller: ReadableStreamDefaultController<Uint8Array>): void {
    let usage: unknown = null;
    if (this.scanner !== null) {
      const rest: Uint8Array[] = [];
      this.scanner.end(rest);
      for (const part of rest) controller.enqueue(part);
      usage = this.scanner.usage;
    } else if (this.wholeBytes < EVENT_BYTES_MAX) {
      usage = usageOfJson(this.whole);
    }
    this.owner.finished(usage);
    controller.close();
  }
}

function usageOfJson(chunks: Uint8Array[]): unknown {
  try {
    return (JSON.parse(utf8.decode(Buffer.concat(chunks))) as { usage?: unknown } | null)?.usage;
  } catch {
    return null;
  }
}
