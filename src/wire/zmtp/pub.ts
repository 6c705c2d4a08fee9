/**
 * PUB: sends each message to every connected peer with a matching subscription.
 * Peers subscribe with SUBSCRIBE/CANCEL commands (ZMTP 3.1) or with 0x01/0x00-prefixed
 * single-frame messages (ZMTP 3.0). A peer whose queue is at the high-water mark misses
 * the message (counted in hwmDrops), like libzmq: a PUB never blocks.
 */
import type { Connection } from "./connection";
import type { FrameList } from "./frames";
import { SUBSCRIPTIONS_PER_PEER_MAX, type ZmtpOptions } from "./options";
import { ZmtpSocket } from "./socket";
import { PrefixSet } from "./subscriptions";

export class PubSocket extends ZmtpSocket {
  constructor(options: ZmtpOptions = {}) {
    super("PUB", options);
  }

  /**
   * Queues `frames` (one message, first frame = topic) for every matching peer. The
   * frames are copied or written before this returns, so the caller may reuse them.
   * Returns false if some matching peer was at its high-water mark and missed it.
   */
  send(frames: readonly Uint8Array[]): boolean {
    if (frames.length === 0) throw new RangeError("a message has at least one frame");
    const topic = frames[0]!;
    const active = this.active;
    let matched = 0;
    let ok = true;
    for (let i = 0; i < active.length; i++) {
      const conn = active[i]!;
      if (!conn.subscriptions!.matches(topic)) continue;
      matched++;
      if (!conn.send(frames)) {
        this.counters.hwmDrops++;
        ok = false;
      }
    }
    if (matched === 0) this.counters.unroutable++;
    return ok;
  }

  /** Peers holding at least one subscription (a publisher may wait for its first subscriber). */
  get subscribedPeers(): number {
    let count = 0;
    for (const conn of this.active) if (conn.subscriptions!.size > 0) count++;
    return count;
  }

  override subscription(conn: Connection, prefix: Uint8Array, subscribe: boolean): void {
    const subscriptions = conn.subscriptions!;
    if (!subscribe) {
      subscriptions.remove(prefix);
      return;
    }
    if (subscriptions.size >= SUBSCRIPTIONS_PER_PEER_MAX && !subscriptions.has(prefix)) {
      this.protocolError(
        conn,
        "too_many_subscriptions",
        `peer holds ${SUBSCRIPTIONS_PER_PEER_MAX} subscriptions already`,
      );
      return;
    }
    subscriptions.add(prefix, false);
  }

  override deliver(conn: Connection, frames: FrameList): void {
    const first = frames.count === 1 ? frames.frame(0) : null;
    if (first !== null && first.length > 0 && first[0]! <= 1) {
      this.subscription(conn, first.subarray(1), first[0] === 1);
      return;
    }
    this.protocolError(
      conn,
      "unexpected_message",
      "a message that is not a subscription was sent to a PUB socket",
    );
  }

  protected override peerAttached(conn: Connection): void {
    conn.subscriptions = new PrefixSet();
  }
}
