/**
 * DEALER: sends round-robin to connected peers (skipping peers at the high-water mark)
 * and receives from all of them. While no peer is connected, messages wait in a queue
 * of up to `hwm` messages and go to the first peer that completes its handshake, as
 * libzmq's connect-side pipe does.
 */
import type { Connection } from "./connection";
import type { ZmtpOptions } from "./options";
import { ZmtpSocket } from "./socket";
import type { MessageListener } from "./sub";

export class DealerSocket extends ZmtpSocket {
  onMessage: MessageListener = () => {};
  private readonly waiting: Uint8Array[][] = [];
  private next = 0;

  constructor(options: ZmtpOptions = {}) {
    super("DEALER", options);
  }

  /**
   * Queues one message for the next peer. Returns false (and counts an hwmDrop) when
   * every peer, or the no-peer queue, is at the high-water mark.
   */
  send(frames: readonly Uint8Array[]): boolean {
    this.assertOpen();
    if (frames.length === 0) throw new RangeError("a message has at least one frame");
    const active = this.active;
    if (active.length === 0) {
      if (this.waiting.length >= this.options.hwm) {
        this.counters.hwmDrops++;
        return false;
      }
      this.waiting.push(frames.map((frame) => frame.slice()));
      return true;
    }
    for (let tried = 0; tried < active.length; tried++) {
      const conn = active[this.next++ % active.length]!;
      if (conn.send(frames)) return true;
    }
    this.counters.hwmDrops++;
    return false;
  }

  /** Messages held while no peer is connected. */
  get waitingMessages(): number {
    return this.waiting.length;
  }

  override deliver(conn: Connection, frames: Uint8Array[]): void {
    this.counters.messagesIn++;
    try {
      this.onMessage(frames, conn.peer);
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  protected override peerAttached(conn: Connection): void {
    const waiting = this.waiting.splice(0);
    for (const frames of waiting) conn.send(frames);
  }
}
