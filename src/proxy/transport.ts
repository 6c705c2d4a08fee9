/**
 * Where a proxied request's client and engine connection live, apart from its lifecycle
 * (./proxy.ts owns that, on the main thread, whichever transport carries it):
 *
 * - `LocalTransport`: the client's connection is the main thread's (no route lanes), and
 *   so are the engine connection and the relay.
 * - `RemoteTransport` (./remote.ts): the client is a route lane's, and the lane connects
 *   to the engine and relays the answer, telling the main thread how it goes.
 */
import {
  Exchange,
  type ExchangeRequest,
  type ExchangeTimeouts,
  type ResponseHead,
} from "../http/client";
import { receiveBytes } from "../http/http";
import { Relay, type RelayOwner } from "./relay";

export interface ProxyTransport {
  /** The client went away. */
  readonly gone: boolean;
  /** `left` is called once if the client goes away, until `unwatch`. */
  watch(left: () => void): void;
  unwatch(): void;
  /** The client's body, read within `limitBytes` (a lane reads it and sends it whole). */
  body(limitBytes: number): Promise<Uint8Array>;
  /** Sends the request to an engine; `answer` says how its answer goes to the client. */
  open(request: ExchangeRequest, timeouts: ExchangeTimeouts, answer: AnswerSpec): EngineLink;
}

/** How an engine's answer goes to the client, fixed before the request is sent. */
export interface AnswerSpec {
  /** Headers kvedge adds to the answer (the worker, the request id). */
  readonly headers: Readonly<Record<string, string>>;
  /** Drop the usage chunk kvedge asked for on the client's behalf. */
  readonly stripUsage: boolean;
}

/** One engine request, from sending it to its answer's end. */
export interface EngineLink {
  /** The answer's head; rejects with an UpstreamError (`sent` says if it may have arrived). */
  readonly head: Promise<ResponseHead>;
  /** Gives up: the engine connection is closed. Idempotent. */
  abort(): void;
  /**
   * From the head on: the answer goes to the client and `owner` is told how it goes.
   * The Response to give the client, or null when another thread gives it.
   */
  answer(head: ResponseHead, owner: RelayOwner): Response | null;
}

export type Reading = "sse" | "json" | "none";

/** The answer's content type, and how it is read for its usage (only a 2xx answer is). */
export function readingOf(head: ResponseHead): { type: string; reading: Reading } {
  const type = head.headers.find(([name]) => name === "content-type")?.[1] ?? "application/json";
  const ok = head.status >= 200 && head.status < 300;
  return { type, reading: !ok ? "none" : type.startsWith("text/event-stream") ? "sse" : "json" };
}

/** The client's answer: the engine's, relayed from its head, with kvedge's headers. */
export function relayedAnswer(
  exchange: Exchange,
  head: ResponseHead,
  spec: AnswerSpec,
  owner: RelayOwner,
): Response {
  const { type, reading } = readingOf(head);
  const relay = new Relay(exchange, reading, spec.stripUsage && reading === "sse", owner);
  return new Response(relay.body, {
    status: head.status,
    headers: { "content-type": type, ...spec.headers },
  });
}

/** The client and the engine connection on this thread. */
export class LocalTransport implements ProxyTransport {
  private left: (() => void) | null = null;
  private readonly onAbort = (): void => this.left?.();

  constructor(private readonly request: Request) {}

  get gone(): boolean {
    return this.request.signal.aborted;
  }

  watch(left: () => void): void {
    this.left = left;
    this.request.signal.addEventListener("abort", this.onAbort, { once: true });
  }

  unwatch(): void {
    this.request.signal.removeEventListener("abort", this.onAbort);
    this.left = null;
  }

  body(limitBytes: number): Promise<Uint8Array> {
    return receiveBytes(this.request, limitBytes);
  }

  open(request: ExchangeRequest, timeouts: ExchangeTimeouts, answer: AnswerSpec): EngineLink {
    const exchange = new Exchange(request, timeouts);
    return {
      head: exchange.head,
      abort: () => exchange.abort(),
      answer: (head, owner) => relayedAnswer(exchange, head, answer, owner),
    };
  }
}
