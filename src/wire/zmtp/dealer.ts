/**
 * DEALER: sends round-robin to connected peers (skipping peers at the high-water mark)
 * and receives from all of them. While no peer is connected, messages wait in a queue
 * of up to `hwm` messages and go to the first peer that completes its handshake, as
 * libzmq's connect-side pipe does.
 */
import type { Connection } from "./connection";
import type { FrameList } from "./frames";
import type { ZmtpOptions } from "./options";
import { ZmtpSocket } from "./socket";
import type { FramesListener, MessageListener } from "./sub";

export class DealerSocket extends ZmtpSocket {
  /** Called for each message unless `onFrames` is set (lifetimes as for SubSocket). */
  onMessage: MessageListener = () => {};
  onFrames: FramesListener | null = null;
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

  override deliver(conn: Connection, frames: FrameList): void {
    this.counters.messagesIn++;
    try {
      if (this.onFrames !== null) this.onFrames(frames, conn.peer);
      else this.onMessage(frames.views(), conn.peer);
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  protected override peerAttached(conn: Connection): void {
    const waiting = this.waiting.splice(0);
    for (const frames of waiting) conn.send(frames);
  }
}
