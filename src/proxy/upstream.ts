/**
 * The process's bound on connections to engines (proxy.upstream_connections): a request
 * takes a slot before it connects and gives it back when it ends. Past the bound it
 * waits in a FIFO queue, at most `queueMs` and at most `limit` deep; past either it is
 * refused with 503 and Retry-After. Never a silent wait: the queue is a metric.
 */
import { KvedgeError } from "../domain/errors";

interface Waiter {
  readonly resolve: () => void;
  readonly reject: (error: Error) => void;
  readonly timer: ReturnType<typeof setTimeout>;
}

/** A place in the queue, or a slot already held. */
export interface SlotWait {
  readonly ready: Promise<void>;
  /** Leaves the queue (rejecting `ready` with `error`); nothing if the slot was given. */
  cancel(error: Error): void;
}

export class UpstreamSlots {
  /** Slots held now. */
  inUse = 0;
  /** Requests refused: the queue full, or their wait over. */
  refused = 0;
  private readonly queue = new Set<Waiter>();

  constructor(
    readonly limit: number,
    private readonly queueMs: number,
  ) {}

  get queued(): number {
    return this.queue.size;
  }

  acquire(): SlotWait {
    if (this.inUse < this.limit && this.queue.size === 0) {
      this.inUse++;
      return { ready: Promise.resolve(), cancel: () => {} };
    }
    if (this.queue.size >= this.limit) {
      this.refused++;
      return { ready: Promise.reject(this.busy()), cancel: () => {} };
    }
    let waiter!: Waiter;
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.queue.delete(waiter);
        this.refused++;
        reject(this.busy());
      }, this.queueMs);
      waiter = { resolve, reject, timer };
    });
    this.queue.add(waiter);
    return {
      ready,
      cancel: (error) => {
        if (!this.queue.delete(waiter)) return;
        clearTimeout(waiter.timer);
        waiter.reject(error);
      },
    };
  }

  /** A slot given back: to the first in the queue, if any. */
  release(): void {
    for (const waiter of this.queue) {
      this.queue.delete(waiter);
      clearTimeout(waiter.timer);
      waiter.resolve();
      return;
    }
    this.inUse--;
  }

  private busy(): KvedgeError {
    return new KvedgeError(
      "busy",
      `kvedge is at its limit of ${this.limit} engine connections (proxy.upstream_connections) and none freed in time; try again`,
      { retryAfterSecs: 1 },
    );
  }
}
