/**
 * ROUTER: addresses each peer by its routing id: the Identity the peer announced in
 * READY, or a generated 5-byte id (0x00 + a 32-bit counter, as libzmq makes them). A
 * second peer announcing an identity already connected is refused (libzmq's default
 * without ROUTER_HANDOVER). Messages to an unknown identity are dropped and counted.
 */
import type { Connection, PeerInfo } from "./connection";
import type { FrameList } from "./frames";
import type { FatalKind } from "./errors";
import type { ZmtpOptions } from "./options";
import { ZmtpSocket } from "./socket";

/** `identity`, `frames` and the views in it are valid only until the callback returns. */
export type RoutedMessageListener = (
  identity: Uint8Array,
  frames: readonly Uint8Array[],
  peer: PeerInfo,
) => void;

export class RouterSocket extends ZmtpSocket {
  onMessage: RoutedMessageListener = () => {};
  private readonly byIdentity = new Map<string, Connection>();
  private nextGenerated = (Math.random() * 0x1_0000_0000) >>> 0;

  constructor(options: ZmtpOptions = {}) {
    super("ROUTER", options);
  }

  /** Queues a message for the peer with `identity`; false if unknown (unroutable) or at the HWM. */
  send(identity: Uint8Array, frames: readonly Uint8Array[]): boolean {
    this.assertOpen();
    if (frames.length === 0) throw new RangeError("a message has at least one frame");
    const conn = this.byIdentity.get(identityKey(identity));
    if (conn === undefined) {
      this.counters.unroutable++;
      return false;
    }
    if (conn.send(frames)) return true;
    this.counters.hwmDrops++;
    return false;
  }

  override admit(conn: Connection): FatalKind | null {
    let routingId = conn.peer.identity;
    if (routingId.length === 0) {
      routingId = new Uint8Array(5);
      new DataView(routingId.buffer).setUint32(1, this.nextGenerated);
      this.nextGenerated = (this.nextGenerated + 1) >>> 0;
    }
    if (this.byIdentity.has(identityKey(routingId))) return "duplicate_identity";
    (conn.peer as { routingId: Uint8Array }).routingId = routingId;
    return null;
  }

  override deliver(conn: Connection, frames: FrameList): void {
    this.counters.messagesIn++;
    try {
      this.onMessage(conn.peer.routingId, frames.views(), conn.peer);
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  protected override routeCount(): number {
    return this.byIdentity.size;
  }

  protected override peerAttached(conn: Connection): void {
    this.byIdentity.set(identityKey(conn.peer.routingId), conn);
  }

  protected override peerDetached(conn: Connection): void {
    const key = identityKey(conn.peer.routingId);
    if (this.byIdentity.get(key) === conn) this.byIdentity.delete(key);
  }
}

function identityKey(identity: Uint8Array): string {
  return Buffer.from(identity.buffer, identity.byteOffset, identity.byteLength).toString("latin1");
}
