/**
 * One ZMTP session over one Bun socket (TCP or Unix): handshake, frame assembly,
 * commands, heartbeats and the outgoing queue. The owning socket (PUB, SUB, ...) is its
 * `ConnectionHost` and decides what messages mean.
 *
 * Lifecycle: HANDSHAKE (greeting + READY both ways) -> ACTIVE -> CLOSED. Whatever ends a
 * connection calls `host.closed` exactly once.
 */
import {
  COMPATIBLE_PEERS,
  errorFrame,
  greeting,
  parseCommand,
  parseMetadata,
  parsePing,
  pingFrame,
  pongFrame,
} from "./codec";
import { COMMAND_FRAME, FrameDecoder, MESSAGE_FRAME, NEED_MORE, SKIPPED_MESSAGE } from "./decoder";
import type { ZmtpCounters } from "./counters";
import { FrameList } from "./frames";
import { type FatalKind, type IgnoredKind, ZmtpError } from "./errors";
import type { ResolvedOptions } from "./options";
import { Outbox, type WriteTarget } from "./outbox";
import type { PrefixSet } from "./subscriptions";

export type PeerEvent = "connected" | "disconnected" | "handshake_failed";
/** Why a connection closed, for counters: a protocol error kind, a deadline, or null (normal). */
export type CloseKind = FatalKind | "heartbeat" | "handshake_timeout" | "frame_timeout" | null;

/** What we know about the other end of one connection. */
export interface PeerInfo {
  /** Unique per connection in this process (never reused); a reconnect gets a new id. */
  readonly id: number;
  /** The endpoint given to connect(), or the bound endpoint that accepted the connection. */
  readonly endpoint: string;
  readonly direction: "connect" | "bind";
  /** "ip:port" of the remote for TCP, the socket path for ipc. */
  readonly remoteAddress: string;
  /**
   * For connect(): the id of the previous connection on the same endpoint that completed
   * its handshake (0 if none), so a "connected" event with previousId != 0 means the
   * publisher behind this endpoint was replaced (restarted, or the network blipped).
   */
  readonly previousId: number;
  /** The peer's ZMTP minor version from its greeting (0 = 3.0, 1 = 3.1); -1 before. */
  readonly zmtpMinor: number;
  /** READY metadata (property names lower-cased). Empty until the handshake completes. */
  readonly socketType: string;
  readonly identity: Uint8Array;
  readonly properties: ReadonlyMap<string, Uint8Array>;
  /** ROUTER only: the identity this peer is addressed by (its Identity, or generated). */
  readonly routingId: Uint8Array;
}

class PeerRecord implements PeerInfo {
  zmtpMinor = -1;
  socketType = "";
  identity: Uint8Array = EMPTY;
  properties: ReadonlyMap<string, Uint8Array> = new Map();
  routingId: Uint8Array = EMPTY;
  constructor(
    readonly id: number,
    readonly endpoint: string,
    readonly direction: "connect" | "bind",
    readonly remoteAddress: string,
    readonly previousId: number,
  ) {}
}

export interface ConnectionHost {
  readonly options: ResolvedOptions;
  readonly counters: ZmtpCounters;
  readonly socketType: string;
  /** Our READY frame (Socket-Type, Identity). */
  readonly readyFrame: Uint8Array;
  /** Counts and logs (once per kind) a protocol error. */
  protocolError(conn: Connection, kind: FatalKind | IgnoredKind, message: string): void;
  /** A bug of ours surfaced while handling this connection (counted, logged). */
  internalError(conn: Connection, error: unknown): void;
  /** Last check before ACTIVE (ROUTER: identity); returns a reason to refuse, or null. */
  admit(conn: Connection): FatalKind | null;
  attached(conn: Connection): void;
  /** A complete message; `frames` (and what it points to) is valid until this returns. */
  deliver(conn: Connection, frames: FrameList): void;
  /** A message over maxMessageBytes was read past and thrown away (the connection lives on). */
  skipped(conn: Connection, bytes: number): void;
  /** SUBSCRIBE (true) / CANCEL (false); `prefix` is a transient view. */
  subscription(conn: Connection, prefix: Uint8Array, subscribe: boolean): void;
  closed(conn: Connection, reason: string, wasActive: boolean, kind: CloseKind): void;
  /** The outgoing queue emptied (for flushed()). */
  idle(conn: Connection): void;
}

const EMPTY: Uint8Array = new Uint8Array(0);
const HANDSHAKE = 0;
const ACTIVE = 1;
const CLOSED = 2;

let nextConnectionId = 1;

export class Connection {
  readonly id = nextConnectionId++;
  readonly peer: PeerRecord;
  readonly outbox: Outbox;
  /** PUB: this peer's subscriptions. */
  subscriptions: PrefixSet | null = null;
  /** Messages delivered to the host, and when the handshake completed (0: not yet). */
  delivered = 0;
  activeSince = 0;

  private state: number = HANDSHAKE;
  private readonly decoder: FrameDecoder;
  private readonly frames = new FrameList();
  private readonly openedAt: number;
  /** Set by every data event; the tick folds it into lastHeardAt (no clock read per chunk). */
  private heard = false;
  private lastHeardAt: number;
  private lastPingAt = 0;
  /** When an unanswered PING times out (0: none outstanding). */
  private pingDeadline = 0;
  /** The peer's announced TTL: silence longer than this drops the connection. */
  private remoteTtlMs = 0;
  /** When a tick first saw the decoder mid-frame at `stalledAtFrame` frames ended (0: not). */
  private stalledSince = 0;
  private stalledAtFrame = -1;

  constructor(
    private readonly host: ConnectionHost,
    private readonly socket: WriteTarget & { end(): void },
    direction: "connect" | "bind",
    endpoint: string,
    remoteAddress: string,
    previousId: number,
    now: number,
  ) {
    this.peer = new PeerRecord(this.id, endpoint, direction, remoteAddress, previousId);
    this.decoder = new FrameDecoder(host.options.maxMessageBytes, host.options.maxFramesPerMessage);
    this.outbox = new Outbox(
      socket,
      (bytes) => {
        host.counters.bytesOut += bytes;
      },
      () => host.idle(this),
    );
    this.openedAt = now;
    this.lastHeardAt = now;
    // Greeting and READY go out at once: with NULL security nothing depends on the
    // peer's greeting, and libzmq only waits for our signature before sending its own.
    this.outbox.raw(greeting());
    this.outbox.raw(host.readyFrame);
    host.counters.commandsOut++;
  }

  get active(): boolean {
    return this.state === ACTIVE;
  }

  /** Receive memory held (see FrameDecoder.retainedBytes). */
  get retainedBytes(): number {
    return this.decoder.retainedBytes;
  }

  get isClosed(): boolean {
    return this.state === CLOSED;
  }

  /** Queues a message unless this peer is at the high-water mark (then returns false). */
  send(frames: readonly Uint8Array[]): boolean {
    const outbox = this.outbox;
    if (outbox.queuedMessages >= this.host.options.hwm || this.state !== ACTIVE) return false;
    outbox.message(frames);
    const counters = this.host.counters;
    counters.messagesOut++;
    counters.framesOut += frames.length;
    return true;
  }

  /** Queues a command frame (complete with header). */
  sendCommand(frame: Uint8Array): void {
    if (this.state === CLOSED) return;
    this.outbox.raw(frame);
    this.host.counters.commandsOut++;
  }

  onData(chunk: Uint8Array): void {
    if (this.state === CLOSED) return;
    this.heard = true;
    this.host.counters.bytesIn += chunk.length;
    const decoder = this.decoder;
    decoder.feed(chunk);
    try {
      for (;;) {
        const kind = decoder.next();
        if (kind === MESSAGE_FRAME) {
          if (this.state !== ACTIVE)
            throw new ZmtpError("unexpected_frame", "message frame before the handshake completed");
          const frames = this.frames;
          frames.add(decoder.frameBuffer, decoder.frameStart, decoder.frameEnd);
          if (decoder.more) continue;
          this.host.counters.framesIn += frames.count;
          this.delivered++;
          this.host.deliver(this, frames);
          frames.clear();
          if (this.isClosed) return;
        } else if (kind === NEED_MORE) {
          return;
        } else if (kind === SKIPPED_MESSAGE) {
          this.frames.clear();
          this.host.skipped(this, decoder.skippedBytes);
        } else if (kind === COMMAND_FRAME) {
          this.command(decoder.frame);
          if (this.state === CLOSED) return;
        } else {
          this.peer.zmtpMinor = decoder.minor;
        }
      }
    } catch (error) {
      this.frames.clear();
      if (ZmtpError.is(error)) {
        this.fail(error.kind, error.message);
      } else {
        // A bug of ours, not the peer's: drop this connection, keep the process.
        this.host.internalError(this, error);
        this.close(`internal error: ${String(error)}`, null);
      }
    }
  }

  onDrain(): void {
    this.outbox.drain();
  }

  /** The transport closed under us (peer closed, reset, ...). */
  onClose(error?: Error): void {
    if (this.state === CLOSED) return;
    this.finish(
      error === undefined ? "peer closed the connection" : `connection error: ${error.message}`,
      null,
    );
  }

  /** Closes on our initiative; `kind` says why (for counters), null for a normal close. */
  close(reason: string, kind: CloseKind): void {
    if (this.state === CLOSED) return;
    // finish() first: Bun runs the close handler synchronously inside end().
    this.finish(reason, kind);
    this.socket.end();
  }

  /** Drops the connection for a protocol error (ERROR command first when it can help). */
  fail(kind: FatalKind, message: string): void {
    if (this.state === CLOSED) return;
    this.host.protocolError(this, kind, message);
    if (this.state === HANDSHAKE && this.peer.zmtpMinor >= 0 && kind !== "peer_error") {
      // The peer parses frames by now; tell it why (best effort, not queued).
      const frame = errorFrame(message);
      this.socket.write(frame, 0, frame.length);
    }
    this.close(`protocol error (${kind}): ${message}`, kind);
  }

  /** Heartbeat and handshake deadlines; `now` is performance.now(). */
  tick(now: number): void {
    if (this.state === CLOSED) return;
    if (this.heard) {
      this.heard = false;
      this.lastHeardAt = now;
      this.pingDeadline = 0;
    } else {
      this.decoder.trim(); // quiet for a tick: let go of receive buffers
    }
    const options = this.host.options;
    if (this.state === HANDSHAKE) {
      if (now - this.openedAt >= options.handshakeTimeoutMs)
        this.close("handshake timed out", "handshake_timeout");
      return;
    }
    if (this.frameStalled(now)) {
      this.close(`a frame was not completed within ${options.frameTimeoutMs} ms`, "frame_timeout");
      return;
    }
    if (this.pingDeadline !== 0 && now >= this.pingDeadline) {
      this.close(`no traffic within ${options.heartbeatTimeoutMs} ms of a PING`, "heartbeat");
      return;
    }
    if (this.remoteTtlMs > 0 && now - this.lastHeardAt >= this.remoteTtlMs) {
      this.close(`no traffic within the peer's TTL of ${this.remoteTtlMs} ms`, "heartbeat");
      return;
    }
    if (options.heartbeatIntervalMs > 0 && now - this.lastPingAt >= options.heartbeatIntervalMs) {
      this.sendCommand(pingFrame(Math.floor(options.heartbeatTtlMs / 100), EMPTY));
      this.host.counters.pingsSent++;
      this.lastPingAt = now;
      if (this.pingDeadline === 0) this.pingDeadline = now + options.heartbeatTimeoutMs;
    }
  }

  /**
   * A frame (or message) begun and not ended for frameTimeoutMs: a peer trickling bytes
   * shows life to the heartbeat but never delivers, and holds its partial frame.
   */
  private frameStalled(now: number): boolean {
    const decoder = this.decoder;
    if (!decoder.midFrame) {
      this.stalledSince = 0;
      return false;
    }
    if (this.stalledSince === 0 || decoder.framesEnded !== this.stalledAtFrame) {
      this.stalledSince = now;
      this.stalledAtFrame = decoder.framesEnded;
      return false;
    }
    return now - this.stalledSince >= this.host.options.frameTimeoutMs;
  }

  private finish(reason: string, kind: CloseKind): void {
    const wasActive = this.state === ACTIVE;
    this.state = CLOSED;
    this.decoder.releaseBody();
    this.outbox.discard();
    this.host.closed(this, reason, wasActive, kind);
  }

  private command(body: Uint8Array): void {
    this.host.counters.commandsIn++;
    const { name, data } = parseCommand(body);
    if (this.state === HANDSHAKE) {
      if (name === "READY") return this.ready(data);
      if (name === "ERROR")
        throw new ZmtpError("peer_error", `peer refused the handshake: ${errorReason(data)}`);
      throw new ZmtpError("unexpected_frame", `${name} before READY`);
    }
    switch (name) {
      case "PING": {
        const ping = parsePing(data);
        this.remoteTtlMs = ping.ttlMs;
        this.sendCommand(pongFrame(ping.context));
        return;
      }
      case "PONG":
        return; // any traffic already counts as a sign of life
      case "SUBSCRIBE":
      case "CANCEL":
        return this.host.subscription(this, data, name === "SUBSCRIBE");
      case "READY":
        throw new ZmtpError("unexpected_frame", "second READY");
      case "ERROR":
        throw new ZmtpError("peer_error", `peer sent ERROR: ${errorReason(data)}`);
      default:
        this.host.protocolError(
          this,
          "unknown_command",
          `unknown command ${JSON.stringify(name)} ignored`,
        );
    }
  }

  private ready(data: Uint8Array): void {
    const properties = parseMetadata(data);
    const typeBytes = properties.get("socket-type");
    if (typeBytes === undefined) throw new ZmtpError("bad_metadata", "READY without Socket-Type");
    const socketType = String.fromCharCode(...typeBytes.subarray(0, 32));
    const peer = this.peer;
    peer.socketType = socketType;
    peer.identity = properties.get("identity") ?? EMPTY;
    peer.properties = properties;
    if (!(COMPATIBLE_PEERS[this.host.socketType] ?? []).includes(socketType)) {
      throw new ZmtpError(
        "socket_type_mismatch",
        `a ${this.host.socketType} socket cannot talk to a ${socketType} peer`,
      );
    }
    const refused = this.host.admit(this);
    if (refused !== null) throw new ZmtpError(refused, `peer refused (${refused})`);
    this.state = ACTIVE;
    this.activeSince = performance.now();
    this.lastPingAt = this.lastHeardAt;
    this.host.attached(this);
  }
}

function errorReason(data: Uint8Array): string {
  const length = data[0] ?? 0;
  return String.fromCharCode(...data.subarray(1, 1 + length));
}
