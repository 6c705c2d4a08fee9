/**
 * SUB: receives messages whose first frame starts with one of its subscriptions.
 * Subscriptions are sent to every peer (SUBSCRIBE/CANCEL commands to ZMTP 3.1 peers,
 * 0x01/0x00-prefixed messages to 3.0 peers) and re-sent after every reconnect. Messages
 * are filtered here too, as libzmq does, for publishers that do not filter.
 */
import { cancelFrame, subscribeFrame, subscriptionMessage } from "./codec";
import type { Connection, PeerInfo } from "./connection";
import type { FrameList } from "./frames";
import type { ZmtpOptions } from "./options";
import { ZmtpSocket } from "./socket";
import { PrefixSet, toBytes } from "./subscriptions";

/**
 * A received message as views. `frames` and every view in it are valid only until the
 * callback returns (views into the receive chunk or a reused arena; the array is reused
 * too): copy what you keep.
 */
export type MessageListener = (frames: readonly Uint8Array[], peer: PeerInfo) => void;
/** A received message as frame locations (no allocation); same lifetime as above. */
export type FramesListener = (frames: FrameList, peer: PeerInfo) => void;

export class SubSocket extends ZmtpSocket {
  /** Called for each message unless `onFrames` is set. */
  onMessage: MessageListener = () => {};
  // See docs/decisions.md#frame-locations.
  /** The allocation-free alternative to `onMessage`; when set, `onMessage` is not called. */
  onFrames: FramesListener | null = null;
  private readonly subscriptions = new PrefixSet();

  constructor(options: ZmtpOptions = {}) {
    super("SUB", options);
  }

  /** Receives messages starting with `prefix` ("" = everything). Counted: N subscribes need N unsubscribes. */
  subscribe(prefix: Uint8Array | string = ""): void {
    this.assertOpen();
    const bytes = toBytes(prefix);
    if (!this.subscriptions.add(bytes, true)) return;
    for (const conn of this.active) sendSubscription(conn, bytes, true);
  }

  unsubscribe(prefix: Uint8Array | string = ""): void {
    this.assertOpen();
    const bytes = toBytes(prefix);
    if (!this.subscriptions.remove(bytes)) return;
    for (const conn of this.active) sendSubscription(conn, bytes, false);
  }

  override deliver(conn: Connection, frames: FrameList): void {
    if (!this.subscriptions.matchesFrame(frames, 0)) {
      this.counters.messagesFiltered++;
      return;
    }
    this.counters.messagesIn++;
    try {
      if (this.onFrames !== null) this.onFrames(frames, conn.peer);
      else this.onMessage(frames.views(), conn.peer);
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  protected override peerAttached(conn: Connection): void {
    for (const prefix of this.subscriptions.list()) sendSubscription(conn, prefix, true);
  }
}

function sendSubscription(conn: Connection, prefix: Uint8Array, subscribe: boolean): void {
  if (conn.peer.zmtpMinor >= 1) {
    conn.sendCommand(subscribe ? subscribeFrame(prefix) : cancelFrame(prefix));
  } else {
    // ZMTP 3.0: subscriptions travel as ordinary messages. They bypass the HWM (control data).
    conn.outbox.message([subscriptionMessage(prefix, subscribe)]);
  }
}
