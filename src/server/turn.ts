/**
 * Runs the HTTP requests that arrive in one event-loop turn back to back, once that
 * turn's I/O is done (a `setImmediate` per batch), instead of each one as its body
 * arrives.
 *
 * Why: a route touches a few hundred cache lines (the index path, active blocks, load
 * arrays, the parser's buffers) and a lot of code. Run one at a time between Bun's
 * own request handling and the socket I/O, most of them are cold; run together, only
 * the first is. On the serving benchmark this took HTTP from 12.8k to 20.6k routes/s
 * (19 requests per batch with 32 connections). The cost is at most one loop iteration
 * of latency, and a request alone in its turn runs as before.
 *
 * WebSocket frames do not need it: Bun delivers the frames of one read back to back
 * already, and answers sent from inside its message callback are written together
 * (sent later, each would be a write of its own). A frame first `drain`s the batch, so
 * work still runs in arrival order across both transports (a `done` never overtakes
 * the `route` it follows). A batch runs at most BATCH_MAX items, then yields to I/O
 * (engine events included) before the next.
 *
 * See docs/decisions.md#turn-batches.
 */
import type { Logger } from "../util/log";

const BATCH_MAX = 256;

export class TurnBatch {
  private queue: (() => void)[] = [];
  private head = 0;
  private scheduled = false;

  constructor(private readonly log: Logger) {}

  /** Queued items not yet run. */
  get pending(): number {
    return this.queue.length - this.head;
  }

  /** Runs `work` in the current turn's batch. It should not throw (an error is logged). */
  post(work: () => void): void {
    this.queue.push(work);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flush);
    }
  }

  /** Runs everything queued, now. */
  drain(): void {
    if (this.pending > 0) this.runUpTo(this.queue.length);
  }

  private readonly flush = (): void => {
    this.scheduled = false;
    this.runUpTo(this.head + BATCH_MAX);
    if (this.pending > 0 && !this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flush);
    }
  };

  private runUpTo(limit: number): void {
    const end = Math.min(this.queue.length, limit);
    while (this.head < end) {
      const work = this.queue[this.head]!;
      this.queue[this.head++] = noop; // let it be collected
      try {
        work();
      } catch (error) {
        this.log.error("batched request failed", {
          error: error instanceof Error ? (error.stack ?? error.message) : String(error),
        });
      }
    }
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    }
  }
}

const noop = (): void => {};
