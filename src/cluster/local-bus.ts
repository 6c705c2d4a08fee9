/**
 * Replicas in one process, their messages delivered `delayMs` after they were sent, in
 * the caller's time: the virtual-time demo (src/sim) runs N routers on it, and tests run
 * cluster nodes on it (with `lose` to drop messages). Order is kept per sender, as NATS
 * keeps it per connection.
 */
import type { ClusterNode, NodeTransport } from "./node";

interface InFlight {
  readonly dueMs: number;
  readonly to: string;
  readonly bytes: Uint8Array;
  readonly replyTo: string | null;
}

export class LocalBus {
  private readonly nodes = new Map<string, ClusterNode>();
  private queue: InFlight[] = [];
  private head = 0;
  /** The time messages sent now are stamped with (the caller moves it). */
  nowMs = 0;
  /** Messages dropped instead of delivered (tests). */
  lose: ((from: string, to: string, bytes: Uint8Array) => boolean) | null = null;
  readonly counters = { messages: 0, bytes: 0, lost: 0 };

  constructor(private readonly delayMs: number) {
    if (!(delayMs >= 0)) throw new RangeError(`bad delay ${delayMs}`);
  }

  /** The transport of replica `replicaId` (attach its node before delivering). */
  transport(replicaId: string): NodeTransport {
    return {
      broadcast: (message) => {
        for (const to of this.nodes.keys()) if (to !== replicaId) this.send(replicaId, to, message);
        return true;
      },
      ask: (message) => {
        for (const to of this.nodes.keys())
          if (to !== replicaId) this.send(replicaId, to, message, replicaId);
      },
      answer: (replyTo, chunks) => {
        for (const chunk of chunks) this.send(replicaId, replyTo, chunk);
      },
    };
  }

  attach(node: ClusterNode): void {
    this.nodes.set(node.replicaId, node);
  }

  detach(replicaId: string): void {
    this.nodes.delete(replicaId);
  }

  /** When the next message is due (Infinity: none in flight). */
  nextDueMs(): number {
    return this.head < this.queue.length ? this.queue[this.head]!.dueMs : Infinity;
  }

  /** Delivers, in send order, every message due by `nowMs`; returns how many. */
  deliver(nowMs: number): number {
    let delivered = 0;
    while (this.head < this.queue.length && this.queue[this.head]!.dueMs <= nowMs) {
      const message = this.queue[this.head++]!;
      this.nodes.get(message.to)?.receive(message.bytes, message.replyTo);
      delivered++;
    }
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    return delivered;
  }

  private send(from: string, to: string, bytes: Uint8Array, replyTo: string | null = null): void {
    if (this.lose?.(from, to, bytes) === true) {
      this.counters.lost++;
      return;
    }
    this.counters.messages++;
    this.counters.bytes += bytes.length;
    this.queue.push({ dueMs: this.nowMs + this.delayMs, to, bytes, replyTo });
  }
}
