/**
 * What every ZMTP socket role shares: bind/connect over Bun TCP and Unix sockets,
 * reconnect with jittered exponential backoff, one coarse timer for handshake and
 * heartbeat deadlines, peer lifecycle events, counters and bad-input logging.
 */
import { lstatSync, unlinkSync } from "node:fs";
import type { Socket, SocketHandler, SocketListener } from "bun";
import { OnceLog, type Logger } from "../../util/log";
import { readyFrame } from "./codec";
import {
  type CloseKind,
  Connection,
  type ConnectionHost,
  type PeerEvent,
  type PeerInfo,
} from "./connection";
import { newCounters, type ZmtpCounters } from "./counters";
import type { FrameList } from "./frames";
import { parseEndpoint, formatTcp, type Endpoint } from "./endpoint";
import type { FatalKind, IgnoredKind } from "./errors";
import { resolveOptions, type ResolvedOptions, type ZmtpOptions } from "./options";

export type PeerListener = (event: PeerEvent, peer: PeerInfo, reason: string) => void;

/** Tick bounds: deadlines are checked every quarter of the shortest one, within these. */
const TICK_MS_MIN = 5;
const TICK_MS_MAX = 250;

/** What a Bun socket's `data` points to. */
interface Link {
  conn: Connection | null;
  readonly dialer: Dialer | null;
  readonly endpoint: string;
}

type BunSocket = Socket<Link>;

class Dialer {
  attempts = 0;
  /** Consecutive attempts that did not reach a lasting connection (drives the backoff). */
  failures = 0;
  timer: ReturnType<typeof setTimeout> | null = null;
  conn: Connection | null = null;
  /** Id of the last connection on this endpoint that completed its handshake. */
  previousId = 0;
  stopped = false;
  constructor(
    readonly endpoint: string,
    readonly target: Endpoint,
  ) {}
}

interface Bound {
  readonly listener: SocketListener<Link>;
  readonly connections: Set<Connection>;
}

export abstract class ZmtpSocket implements ConnectionHost {
  readonly counters: ZmtpCounters = newCounters();
  readonly options: ResolvedOptions;
  readonly readyFrame: Uint8Array;
  /** Peer lifecycle: connected (handshake done), disconnected, handshake_failed. */
  onPeer: PeerListener = () => {};
  /** A message over maxMessageBytes was read past (its content, seq included, is unknown). */
  onSkipped: (bytes: number) => void = () => {};

  protected readonly log: Logger;
  /** Connections with a completed handshake, in connection order. */
  protected active: Connection[] = [];
  private readonly onceLog: OnceLog;
  private readonly connections = new Set<Connection>();
  private readonly bound = new Map<string, Bound>();
  private readonly dialers = new Map<string, Dialer>();
  private readonly dialerOf = new Map<Connection, Dialer>();
  private readonly boundOf = new Map<Connection, Bound>();
  private ticker: ReturnType<typeof setInterval> | null = null;
  private readonly tickMs: number;
  private closing = false;
  private idleWaiters: (() => void)[] = [];
  private readonly handlers: SocketHandler<Link>;

  constructor(
    readonly socketType: "PUB" | "SUB" | "DEALER" | "ROUTER",
    options: ZmtpOptions,
  ) {
    this.options = resolveOptions(options);
    this.log = this.options.logger.child({ component: "zmtp", socket: socketType });
    this.onceLog = new OnceLog(this.log);
    const properties: [string, Uint8Array][] = [
      ["Socket-Type", new TextEncoder().encode(socketType)],
    ];
    // libzmq announces an Identity from the socket types that can be routed to.
    if (socketType === "DEALER" || socketType === "ROUTER")
      properties.push(["Identity", this.options.routingId]);
    this.readyFrame = readyFrame(properties);
    const o = this.options;
    const shortest = Math.min(
      o.heartbeatIntervalMs > 0 ? o.heartbeatIntervalMs : Infinity,
      o.heartbeatTimeoutMs,
      o.heartbeatTtlMs > 0 ? o.heartbeatTtlMs : Infinity,
      o.handshakeTimeoutMs,
      o.frameTimeoutMs,
    );
    this.tickMs = Math.max(TICK_MS_MIN, Math.min(TICK_MS_MAX, Math.floor(shortest / 4)));
    this.handlers = {
      binaryType: "uint8array",
      data: (socket: BunSocket, chunk: Uint8Array) => socket.data.conn?.onData(chunk),
      drain: (socket: BunSocket) => socket.data.conn?.onDrain(),
      close: (socket: BunSocket, error?: Error) => socket.data.conn?.onClose(error),
      // Bun calls this when a handler threw; ours catch everything, so this is a bug.
      error: (socket: BunSocket, error: Error) => {
        const conn = socket.data.conn;
        if (conn === null) return;
        this.internalError(conn, error);
        conn.close(`internal error: ${String(error)}`, null);
      },
      open: (socket: BunSocket) => this.opened(socket),
      connectError: (socket: BunSocket, error: Error) =>
        this.connectFailed(socket.data.dialer!, error),
    } as SocketHandler<Link>;
  }

  /** Listens on `endpoint`; resolves to the bound endpoint (the real port for port 0). */
  async bind(endpoint: string): Promise<string> {
    this.assertOpen();
    const target = parseEndpoint(endpoint, true);
    const link: Link = { conn: null, dialer: null, endpoint: "" };
    let listener: SocketListener<Link>;
    let boundEndpoint: string;
    if (target.transport === "ipc") {
      removeStaleSocket(target.path);
      listener = Bun.listen<Link>({ unix: target.path, socket: this.handlers, data: link });
      boundEndpoint = endpoint;
    } else {
      const tcp = Bun.listen<Link>({
        hostname: target.host,
        port: target.port,
        socket: this.handlers,
        data: link,
      });
      boundEndpoint = formatTcp(target.host, tcp.port);
      listener = tcp;
    }
    if (this.bound.has(boundEndpoint)) {
      listener.stop(true);
      throw new Error(`already bound to ${boundEndpoint}`);
    }
    (link as { endpoint: string }).endpoint = boundEndpoint;
    this.bound.set(boundEndpoint, { listener, connections: new Set() });
    this.startTicker();
    this.log.info("zmtp bound", { endpoint: boundEndpoint });
    return boundEndpoint;
  }

  /** Stops listening on a bound endpoint and closes the connections it accepted. */
  unbind(boundEndpoint: string): void {
    const bound = this.bound.get(boundEndpoint);
    if (bound === undefined) throw new Error(`not bound to ${boundEndpoint}`);
    this.bound.delete(boundEndpoint);
    bound.listener.stop(false);
    for (const conn of [...bound.connections]) conn.close("unbound", null);
  }

  /** Dials `endpoint` now and after every loss, with backoff; returns at once. */
  connect(endpoint: string): void {
    this.assertOpen();
    if (this.dialers.has(endpoint)) throw new Error(`already connected to ${endpoint}`);
    const dialer = new Dialer(endpoint, parseEndpoint(endpoint, false));
    this.dialers.set(endpoint, dialer);
    this.startTicker();
    this.dial(dialer);
  }

  /** Stops dialing `endpoint` and closes its connection. */
  disconnect(endpoint: string): void {
    const dialer = this.dialers.get(endpoint);
    if (dialer === undefined) throw new Error(`not connected to ${endpoint}`);
    this.dialers.delete(endpoint);
    this.stopDialer(dialer);
  }

  /**
   * Consecutive attempts on `endpoint` that did not reach a lasting connection: what
   * its reconnect backoff grows with (0 after a connection that carried a message).
   */
  dialFailures(endpoint: string): number {
    const dialer = this.dialers.get(endpoint);
    if (dialer === undefined) throw new Error(`not connected to ${endpoint}`);
    return dialer.failures;
  }

  /** Closes every connection and listener; the socket cannot be used again. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    if (this.ticker !== null) clearInterval(this.ticker);
    this.ticker = null;
    for (const dialer of this.dialers.values()) this.stopDialer(dialer);
    this.dialers.clear();
    for (const bound of this.bound.values()) bound.listener.stop(true);
    this.bound.clear();
    for (const conn of [...this.connections]) conn.close("socket closed", null);
    this.resolveIdle();
  }

  /** Resolves when every connection's outgoing queue has been handed to the kernel. */
  flushed(): Promise<void> {
    if (this.allIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Connections with a completed handshake. */
  get peers(): readonly PeerInfo[] {
    return this.active.map((conn) => conn.peer);
  }

  /** Sizes of the internal bookkeeping, for tests that check churn gives everything back. */
  get sizes(): {
    connections: number;
    active: number;
    dialers: number;
    bound: number;
    links: number;
    routes: number;
    receiveBytes: number;
  } {
    let receiveBytes = 0;
    for (const conn of this.connections) receiveBytes += conn.retainedBytes;
    return {
      receiveBytes,
      connections: this.connections.size,
      active: this.active.length,
      dialers: this.dialers.size,
      bound: this.bound.size,
      links: this.dialerOf.size + this.boundOf.size,
      routes: this.routeCount(),
    };
  }

  /** Entries a role keeps per peer (ROUTER: identities). */
  protected routeCount(): number {
    return 0;
  }

  // ---- ConnectionHost -------------------------------------------------------------

  protocolError(conn: Connection, kind: FatalKind | IgnoredKind, message: string): void {
    this.counters.protocolErrors[kind]++;
    this.counters.protocolErrorsTotal++;
    this.onceLog.report(kind, `zmtp protocol error: ${message}`, {
      connection: conn.id,
      endpoint: conn.peer.endpoint,
      remote: conn.peer.remoteAddress,
    });
  }

  skipped(conn: Connection, bytes: number): void {
    this.counters.oversizeSkipped++;
    this.onSkipped(bytes);
    this.onceLog.report(
      "oversize_skipped",
      `zmtp message of ${bytes} bytes is over the limit of ${this.options.maxMessageBytes}: skipped`,
      {
        connection: conn.id,
        endpoint: conn.peer.endpoint,
        remote: conn.peer.remoteAddress,
      },
    );
  }

  internalError(conn: Connection, error: unknown): void {
    this.counters.internalErrors++;
    this.log.error("zmtp internal error; connection dropped", {
      connection: conn.id,
      error: String(error),
    });
  }

  admit(_conn: Connection): FatalKind | null {
    return null;
  }

  attached(conn: Connection): void {
    this.active.push(conn);
    this.counters.handshakes++;
    this.counters.connectionsActive++;
    this.log.info("zmtp peer connected", {
      connection: conn.id,
      endpoint: conn.peer.endpoint,
      remote: conn.peer.remoteAddress,
      peer_type: conn.peer.socketType,
      previous: conn.peer.previousId,
    });
    this.peerAttached(conn);
    this.emit("connected", conn, "handshake complete");
  }

  abstract deliver(conn: Connection, frames: FrameList): void;

  subscription(conn: Connection, _prefix: Uint8Array, subscribe: boolean): void {
    this.protocolError(
      conn,
      "unexpected_command",
      `${subscribe ? "SUBSCRIBE" : "CANCEL"} sent to a ${this.socketType} socket`,
    );
  }

  closed(conn: Connection, reason: string, wasActive: boolean, kind: CloseKind): void {
    this.connections.delete(conn);
    const bound = this.boundOf.get(conn);
    bound?.connections.delete(conn);
    this.boundOf.delete(conn);
    if (kind === "heartbeat") this.counters.heartbeatTimeouts++;
    if (kind === "handshake_timeout") this.counters.handshakeTimeouts++;
    if (kind === "frame_timeout") this.counters.frameTimeouts++;
    if (wasActive) {
      const index = this.active.indexOf(conn);
      if (index >= 0) this.active.splice(index, 1);
      this.counters.connectionsActive--;
      this.counters.disconnects++;
      this.peerDetached(conn);
      this.log.info("zmtp peer disconnected", {
        connection: conn.id,
        endpoint: conn.peer.endpoint,
        reason,
      });
      this.emit("disconnected", conn, reason);
    } else {
      this.counters.handshakeFailures++;
      this.log.debug("zmtp handshake failed", {
        connection: conn.id,
        endpoint: conn.peer.endpoint,
        reason,
      });
      this.emit("handshake_failed", conn, reason);
    }
    const dialer = this.dialerOf.get(conn);
    this.dialerOf.delete(conn);
    if (dialer !== undefined) {
      dialer.conn = null;
      if (wasActive) dialer.previousId = conn.id;
      // A peer that completes the handshake and then drops us (an ERROR after READY,
      // a close) must not reset the backoff: only a connection that carried a message
      // or lasted reconnectMaxMs did.
      if (
        wasActive &&
        (conn.delivered > 0 || performance.now() - conn.activeSince >= this.options.reconnectMaxMs)
      )
        dialer.failures = 0;
      else dialer.failures++;
      if (!dialer.stopped && !this.closing) this.scheduleDial(dialer);
    }
    this.resolveIdle();
  }

  idle(_conn: Connection): void {
    if (this.idleWaiters.length > 0) this.resolveIdle();
  }

  // ---- for the roles ----------------------------------------------------------------

  /** A peer finished its handshake (after `active` was updated, before the event). */
  protected peerAttached(_conn: Connection): void {}
  /** A peer that had finished its handshake is gone (after `active` was updated). */
  protected peerDetached(_conn: Connection): void {}

  /** Runs an application callback; an exception is counted and logged once, never rethrown. */
  protected callback(run: () => void): void {
    try {
      run();
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  protected callbackFailed(error: unknown): void {
    this.counters.callbackErrors++;
    this.onceLog.report("callback_error", "zmtp application callback threw", {
      error: String(error),
    });
  }

  protected assertOpen(): void {
    if (this.closing) throw new Error(`${this.socketType} socket is closed`);
  }

  // ---- internals --------------------------------------------------------------------

  private emit(event: PeerEvent, conn: Connection, reason: string): void {
    try {
      this.onPeer(event, conn.peer, reason);
    } catch (error) {
      this.callbackFailed(error);
    }
  }

  private opened(socket: BunSocket): void {
    const link = socket.data;
    if (this.closing || link.dialer?.stopped) {
      socket.end();
      return;
    }
    const dialer = link.dialer;
    const remote = socket.remoteAddress
      ? `${socket.remoteAddress}:${socket.remotePort}`
      : link.endpoint;
    const conn = new Connection(
      this,
      socket,
      dialer === null ? "bind" : "connect",
      dialer === null ? link.endpoint : dialer.endpoint,
      remote,
      dialer === null ? 0 : dialer.previousId,
      performance.now(),
    );
    // Accepted sockets share the listener's link object: give each its own.
    socket.data = { conn, dialer, endpoint: link.endpoint };
    this.connections.add(conn);
    this.counters.connectionsOpened++;
    if (dialer !== null) {
      dialer.conn = conn;
      this.dialerOf.set(conn, dialer);
    } else {
      const bound = this.bound.get(link.endpoint);
      bound?.connections.add(conn);
      if (bound !== undefined) this.boundOf.set(conn, bound);
    }
  }

  private dial(dialer: Dialer): void {
    dialer.timer = null;
    if (dialer.stopped || this.closing) return;
    this.counters.connectAttempts++;
    if (dialer.attempts > 0) this.counters.reconnects++;
    dialer.attempts++;
    const link: Link = { conn: null, dialer, endpoint: dialer.endpoint };
    const target = dialer.target;
    const pending =
      target.transport === "ipc"
        ? Bun.connect<Link>({ unix: target.path, socket: this.handlers, data: link })
        : Bun.connect<Link>({
            hostname: target.host,
            port: target.port,
            socket: this.handlers,
            data: link,
          });
    // Failures arrive through connectError; the rejected promise carries nothing more.
    pending.catch(() => {});
  }

  private connectFailed(dialer: Dialer, error: Error): void {
    this.counters.connectFailures++;
    dialer.failures++;
    this.log.debug("zmtp connect failed", {
      endpoint: dialer.endpoint,
      error: error.message,
      attempt: dialer.attempts,
    });
    if (!dialer.stopped && !this.closing) this.scheduleDial(dialer);
  }

  /** Backoff: min * 2^(failures-1), capped at max, jittered by +-25% (never above max). */
  private scheduleDial(dialer: Dialer): void {
    if (dialer.timer !== null) return;
    const { reconnectMinMs, reconnectMaxMs } = this.options;
    const exponent = Math.min(Math.max(dialer.failures - 1, 0), 30);
    const base = Math.min(reconnectMaxMs, reconnectMinMs * 2 ** exponent);
    const delay = Math.min(reconnectMaxMs, Math.round(base * (0.75 + Math.random() * 0.5)));
    dialer.timer = setTimeout(() => this.dial(dialer), delay);
  }

  private stopDialer(dialer: Dialer): void {
    dialer.stopped = true;
    if (dialer.timer !== null) clearTimeout(dialer.timer);
    dialer.timer = null;
    dialer.conn?.close("disconnected", null);
  }

  private startTicker(): void {
    if (this.ticker !== null) return;
    this.ticker = setInterval(() => {
      const now = performance.now();
      for (const conn of this.connections) conn.tick(now);
    }, this.tickMs);
  }

  private allIdle(): boolean {
    for (const conn of this.connections) if (!conn.outbox.idle && !conn.isClosed) return false;
    return true;
  }

  private resolveIdle(): void {
    if (this.idleWaiters.length === 0 || !this.allIdle()) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

/** libzmq removes a socket file left by a previous run before binding; so do we (sockets only). */
function removeStaleSocket(path: string): void {
  try {
    if (lstatSync(path).isSocket()) unlinkSync(path);
  } catch {
    // Missing: nothing to remove.
  }
}
