/**
 * Proxied requests whose client is a route lane's: the main thread's end.
 *
 * A lane reads the client's body and posts it here; the main thread runs the request's
 * lifecycle as for its own clients (./proxy.ts: prepare, admission, the route, the slot,
 * which engine to try and when to fail over, every outcome, the load and the observed
 * hits) and orders the lane to send the request to an engine. The lane connects, answers
 * the client with the engine's answer as it comes (./relay.ts) and tells the main thread
 * how it goes: the head, the first bytes, the end (with the usage), a failure, the
 * client leaving. So the per-stream I/O (the client's and the engine's connections, each
 * chunk) stays on the lane, and the main thread does only what must be decided in one
 * place (docs/decisions.md#lane-relays). ./lane-end.ts is the lane's end.
 *
 * Messages go in batches, one per event-loop turn each way.
 */
import {
  type ExchangeRequest,
  type ExchangeTimeouts,
  type ResponseHead,
  type UpstreamFailure,
  UpstreamError,
} from "../http/client";
import { STATUS_OF, type WireError, wireError } from "../http/errors";
import type { OpenAiPath } from "./openai";
import type { OpenAiProxy } from "./proxy";
import type { RelayOwner } from "./relay";
import type { AnswerSpec, EngineLink, ProxyTransport } from "./transport";
import { ownBuffer } from "../util/transfer";

/** A lane's news of its proxied requests, in the order it happened. */
export type ProxyEvent =
  /** A new request: the client's body, read whole within the body limit. */
  | {
      readonly e: "request";
      readonly id: number;
      readonly path: OpenAiPath;
      readonly body: Uint8Array;
    }
  /** The engine's head came; the lane gave it to the client. */
  | { readonly e: "head"; readonly id: number; readonly status: number }
  /** The answer's first body bytes. */
  | { readonly e: "first"; readonly id: number }
  /** The answer ended whole; its usage, if any. */
  | { readonly e: "finished"; readonly id: number; readonly usage: unknown }
  /** The engine failed before its head (`sent`: it may have the request) or after it (`broke`). */
  | {
      readonly e: "failed" | "broke";
      readonly id: number;
      readonly failure: UpstreamFailure;
      readonly message: string;
      readonly sent: boolean;
    }
  /** The client went away (in any phase). */
  | { readonly e: "left"; readonly id: number };

/** The main thread's orders for a lane's proxied requests. */
export type ProxyOrder =
  /** Send the request to this engine; answer the client as `answer` says. */
  | {
      readonly o: "send";
      readonly id: number;
      readonly request: ExchangeRequest;
      readonly timeouts: ExchangeTimeouts;
      readonly answer: AnswerSpec;
    }
  /** The request ended with this error: the client's answer. */
  | { readonly o: "refuse"; readonly id: number; readonly error: WireError }
  /** The request ended here (kvedge stops): close the engine connection, cut the answer. */
  | { readonly o: "cut"; readonly id: number };

/** One lane's proxied requests, on the main thread. */
export class RemoteRequests {
  private readonly requests = new Map<number, RemoteTransport>();
  private outbox: ProxyOrder[] = [];

  constructor(
    private readonly proxy: OpenAiProxy,
    /** Posts a batch of orders to the lane. */
    private readonly post: (orders: ProxyOrder[]) => void,
    /** The client's answer began (the head, or an error), `seconds` after the request came. */
    private readonly answered: (path: OpenAiPath, status: number, seconds: number) => void,
  ) {}

  /** Requests not ended yet. */
  get size(): number {
    return this.requests.size;
  }

  /** What the lane posted, in order. */
  events(events: readonly ProxyEvent[]): void {
    for (const event of events) {
      if (event.e === "request") this.start(event.id, event.path, event.body);
      else this.requests.get(event.id)?.event(event);
    }
  }

  /** The lane is gone: its requests end as if their clients left. */
  laneGone(): void {
    for (const transport of [...this.requests.values()])
      transport.event({ e: "left", id: transport.id });
  }

  order(order: ProxyOrder): void {
    if (this.outbox.length === 0) setImmediate(this.flush);
    this.outbox.push(order);
  }

  forget(id: number): void {
    this.requests.delete(id);
  }

  /** The client's answer began: the engine's head, or an error. */
  began(transport: RemoteTransport, status: number): void {
    this.answered(transport.path, status, (performance.now() - transport.started) / 1000);
  }

  private start(id: number, path: OpenAiPath, body: Uint8Array): void {
    const transport = new RemoteTransport(id, path, body, this);
    this.requests.set(id, transport);
    this.proxy.carry(transport, path).then(undefined, (error: unknown) => {
      const wire = wireError(error, this.proxy.options.log);
      this.began(transport, STATUS_OF[wire.code]);
      this.order({ o: "refuse", id, error: wire });
    });
  }

  private readonly flush = (): void => {
    const orders = this.outbox;
    this.outbox = [];
    this.post(orders);
  };
}

/** A lane's client and engine connection, as the request's lifecycle sees them. */
class RemoteTransport implements ProxyTransport {
  gone = false;
  readonly started = performance.now();
  private left: (() => void) | null = null;
  private link: LaneLink | null = null;

  constructor(
    readonly id: number,
    readonly path: OpenAiPath,
    private readonly bytes: Uint8Array,
    private readonly requests: RemoteRequests,
  ) {}

  watch(left: () => void): void {
    this.left = left;
  }

  /** The request ended: nothing more of it is looked at. */
  unwatch(): void {
    this.left = null;
    this.requests.forget(this.id);
  }

  body(): Promise<Uint8Array> {
    return Promise.resolve(this.bytes);
  }

  open(request: ExchangeRequest, timeouts: ExchangeTimeouts, answer: AnswerSpec): EngineLink {
    this.link = new LaneLink(this, (order) => this.requests.order(order));
    // A message copies a view's whole buffer: a part of a larger one goes as its own.
    const { body } = request;
    const sent = body === null ? request : { ...request, body: ownBuffer(body) };
    this.requests.order({ o: "send", id: this.id, request: sent, timeouts, answer });
    return this.link;
  }

  event(event: Exclude<ProxyEvent, { e: "request" }>): void {
    if (event.e === "left") {
      this.gone = true;
      this.left?.();
      return;
    }
    if (event.e === "head") this.requests.began(this, event.status);
    this.link?.event(event);
  }
}

/**
 * One engine request a lane makes. The lane's news of the answer waits until the
 * lifecycle has taken the head (`answer`), so it is seen in the order it happened.
 */
class LaneLink implements EngineLink {
  readonly head: Promise<ResponseHead>;
  private resolveHead!: (head: ResponseHead) => void;
  private rejectHead!: (error: UpstreamError) => void;
  private owner: RelayOwner | null = null;
  private early: Exclude<ProxyEvent, { e: "request" | "head" | "left" }>[] = [];
  /** The lane is done with it (ended, failed, or its client left). */
  private over = false;

  constructor(
    private readonly transport: RemoteTransport,
    private readonly order: (order: ProxyOrder) => void,
  ) {
    this.head = new Promise<ResponseHead>((resolve, reject) => {
      this.resolveHead = resolve;
      this.rejectHead = reject;
    });
    this.head.catch(() => {});
  }

  abort(): void {
    if (this.over) return;
    this.over = true;
    if (!this.transport.gone) this.order({ o: "cut", id: this.transport.id });
    if (this.owner === null)
      this.rejectHead(new UpstreamError("aborted", "the exchange was aborted", true));
  }

  answer(_head: ResponseHead, owner: RelayOwner): null {
    this.owner = owner;
    for (const event of this.early) this.tell(owner, event);
    this.early = [];
    return null;
  }

  event(event: Exclude<ProxyEvent, { e: "request" | "left" }>): void {
    if (event.e === "head") this.resolveHead({ status: event.status, headers: [] });
    else if (event.e === "failed") {
      this.over = true;
      this.rejectHead(new UpstreamError(event.failure, event.message, event.sent));
    } else if (this.owner === null) this.early.push(event);
    else this.tell(this.owner, event);
  }

  private tell(owner: RelayOwner, event: Exclude<ProxyEvent, { e: "request" | "head" | "left" }>) {
    if (event.e === "first") owner.firstByte();
    else if (event.e === "finished") {
      this.over = true;
      owner.finished(event.usage);
    } else if (event.e === "broke") {
      this.over = true;
      owner.broke(new UpstreamError(event.failure, event.message, true));
    }
  }
}
