/**
 * Proxied requests whose client is a route lane's: the lane's end (./remote.ts is the
 * main thread's, and says why). The lane posts each request's body to the main thread,
 * sends it where the main thread orders, gives the client the engine's answer as it
 * comes (./relay.ts, as on one thread) and tells the main thread how it goes. It decides
 * nothing: not the engine, not a failover, not an outcome. A client that leaves is told
 * at once, in any phase; whatever the main thread orders for it afterwards is ignored.
 */
import { Exchange, type ResponseHead, type UpstreamError } from "../http/client";
import { errorReply } from "../http/http";
import { clientClosed, fromWire, shuttingDown } from "../http/errors";
import type { OpenAiPath } from "./openai";
import type { RelayOwner } from "./relay";
import type { ProxyEvent, ProxyOrder } from "./remote";
import { relayedAnswer } from "./transport";
import { ownBuffer } from "../util/transfer";

interface Entry {
  readonly request: Request;
  readonly resolve: (response: Response) => void;
  /** The engine request the main thread ordered last. */
  exchange: Exchange | null;
}

type SendOrder = Extract<ProxyOrder, { o: "send" }>;

export class LaneEnd {
  private readonly entries = new Map<number, Entry>();
  private nextId = 0;
  private outbox: ProxyEvent[] = [];
  private transfer: ArrayBuffer[] = [];

  /** `post` sends a batch of events to the main thread, `transfer` moved with them. */
  constructor(private readonly post: (events: ProxyEvent[], transfer: ArrayBuffer[]) => void) {}

  /** Requests not ended yet. */
  get size(): number {
    return this.entries.size;
  }

  /** A client's request, its body read: answered when the main thread and the engine say. */
  handle(request: Request, path: OpenAiPath, body: Uint8Array): Promise<Response> {
    const id = this.nextId++;
    const own = ownBuffer(body); // transferred, not copied
    return new Promise<Response>((resolve) => {
      this.entries.set(id, { request, resolve, exchange: null });
      request.signal.addEventListener("abort", () => this.left(id), { once: true });
      this.send({ e: "request", id, path, body: own }, own.buffer as ArrayBuffer);
      if (request.signal.aborted) this.left(id);
    });
  }

  /** What the main thread orders, in order. */
  orders(orders: readonly ProxyOrder[]): void {
    for (const order of orders) {
      const entry = this.entries.get(order.id);
      if (entry === undefined) continue; // ended here already: its client left, or it ended
      if (order.o === "send") this.start(entry, order);
      else if (order.o === "cut") entry.exchange?.abort();
      else {
        this.entries.delete(order.id);
        entry.exchange?.abort();
        entry.resolve(errorReply(entry.request, fromWire(order.error)));
      }
    }
  }

  /** kvedge stops: every request still here ends (its engine connection closed). */
  stop(): void {
    for (const [id, entry] of this.entries) {
      entry.exchange?.abort();
      this.entries.delete(id);
      entry.resolve(errorReply(entry.request, shuttingDown()));
    }
  }

  private start(entry: Entry, order: SendOrder): void {
    const exchange = new Exchange(order.request, order.timeouts);
    entry.exchange = exchange;
    const current = () => this.entries.get(order.id) === entry && entry.exchange === exchange;
    exchange.head.then(
      (head) => {
        if (current()) this.answer(entry, exchange, head, order);
      },
      (error: UpstreamError) => {
        if (!current()) return;
        entry.exchange = null;
        const { failure, message, sent } = error;
        this.send({ e: "failed", id: order.id, failure, message, sent });
      },
    );
  }

  /** The engine's head: the client's answer from now on, relayed. */
  private answer(entry: Entry, exchange: Exchange, head: ResponseHead, order: SendOrder): void {
    const { id } = order;
    const owner: RelayOwner = {
      firstByte: () => this.send({ e: "first", id }),
      finished: (usage) => {
        if (this.entries.delete(id)) this.send({ e: "finished", id, usage });
      },
      broke: (error) => {
        if (!this.entries.delete(id)) return;
        const { failure, message } = error;
        this.send({ e: "broke", id, failure, message, sent: true });
      },
      cancelled: () => this.left(id),
    };
    this.send({ e: "head", id, status: head.status });
    entry.resolve(relayedAnswer(exchange, head, order.answer, owner));
  }

  /** The client went away: the engine connection closes, the main thread is told. */
  private left(id: number): void {
    const entry = this.entries.get(id);
    if (entry === undefined) return;
    this.entries.delete(id);
    entry.exchange?.abort();
    this.send({ e: "left", id });
    entry.resolve(errorReply(entry.request, clientClosed()));
  }

  private send(event: ProxyEvent, transfer?: ArrayBuffer): void {
    if (this.outbox.length === 0) setImmediate(this.flush);
    this.outbox.push(event);
    if (transfer !== undefined) this.transfer.push(transfer);
  }

  private readonly flush = (): void => {
    const events = this.outbox;
    const transfer = this.transfer;
    this.outbox = [];
    this.transfer = [];
    this.post(events, transfer);
  };
}
