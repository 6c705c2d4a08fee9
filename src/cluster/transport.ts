/**
 * The NATS client's connection on Bun's own TCP sockets (`connectNats`).
 *
 * Why: the client's node transport writes through node:net's stream machinery, which
 * under Bun cost a replica about as much per publish as all its facts' encoding; with one
 * publish a millisecond that was 5 points of its decisions per CPU-second at 8 workers
 * (bench/RESULTS.md, "Several replicas"; docs/decisions.md#bus-on-bun-sockets). Bun's
 * socket takes the same frame in one call. The protocol (parsing, pings, reconnects,
 * authentication) stays the client's: this is only its `Transport`.
 *
 * TLS, configured (`tls://`, a CA or certificate) or asked for by the server's INFO, goes
 * through the client's node transport as before: this transport hands the connection to
 * it, and a plain connection the server wants encrypted is dialled again by it.
 */
import type { Socket } from "bun";
import {
  checkOptions,
  type ConnectionOptions,
  type Deferred,
  deferred,
  errors,
  extractProtocolMessage,
  INFO,
  type NatsConnection,
  NatsConnectionImpl,
  type NodeConnectionOptions,
  type Server,
  type ServerInfo,
  setTransportFactory,
  type Transport,
} from "@nats-io/transport-node";
import { NodeTransport, nodeResolveHost } from "@nats-io/transport-node/lib/node_transport";

/** A server's first line (INFO) longer than this is not a NATS server's: refused, not buffered on. */
const INFO_BYTES_MAX = 1024 * 1024;

/** Connects to NATS with `BunTransport` (every connection of this process, reconnects included). */
export function connectNats(options: NodeConnectionOptions): Promise<NatsConnection> {
  setTransportFactory({ factory: () => new BunTransport(), dnsResolveFn: nodeResolveHost });
  return NatsConnectionImpl.connect(options);
}

export class BunTransport implements Transport {
  readonly lang = "nats.js";
  readonly version = "kvedge-bun";
  closeError?: Error;
  /** The node transport carrying a TLS connection (then everything goes to it). */
  private tls: NodeTransport | null = null;
  private socket: Socket | null = null;
  /** Frames received and not yet taken by the client (the INFO first). */
  private yields: Uint8Array[] = [];
  private signal: Deferred<void> = deferred();
  private readonly closedNotification: Deferred<Error | undefined> = deferred();
  /** What the socket did not take yet, in order (written again on drain). */
  private unsent: Uint8Array[] = [];
  private info: Deferred<ServerInfo> = deferred();
  private connected = false;
  private done = false;

  get isClosed(): boolean {
    return this.tls?.isClosed ?? this.done;
  }

  async connect(server: Server, options: ConnectionOptions): Promise<void> {
    if (options.tls != null) return this.handOver(server, options);
    this.info.catch(() => {}); // a dial that fails rejects it unread
    await this.dial(server);
    const info = await this.info;
    try {
      checkOptions(info, options);
    } catch (error) {
      this.discard(); // the client drops a transport whose connect failed: its socket too
      throw error;
    }
    if (info.tls_required === true || (info.tls_available === true && options.tls !== null)) {
      this.discard();
      return this.handOver(server, options);
    }
    if (this.done) throw new errors.ConnectionError("connection closed while connecting");
    this.connected = true;
    this.signal.resolve();
  }

  private async handOver(server: Server, options: ConnectionOptions): Promise<void> {
    const tls = new NodeTransport();
    this.tls = tls;
    void tls.closed().then((error) => {
      this.closeError = tls.closeError;
      this.closedNotification.resolve(error instanceof Error ? error : undefined);
    });
    await tls.connect(server, options as NodeConnectionOptions);
  }

  private async dial(server: Server): Promise<void> {
    try {
      const socket = await Bun.connect({
        hostname: server.hostname,
        port: server.port,
        socket: {
          // Before any data (the server's INFO may come in the same turn as the connect).
          open: (socket) => {
            if (this.done) socket.terminate();
            else this.socket = socket;
          },
          data: (socket, data) => {
            if (socket === this.socket) this.received(data);
          },
          drain: (socket) => {
            if (socket === this.socket) this.flushUnsent();
          },
          error: (socket, error) => {
            if (socket === this.socket) this.closeError = error;
          },
          end: (socket) => {
            if (socket !== this.socket) return;
            this.flushUnsent();
            socket.end();
          },
          close: (socket) => {
            if (socket === this.socket) this.shut(this.closeError, false);
          },
        },
      });
      socket.setNoDelay(true);
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === "ECONNREFUSED")
        throw new errors.ConnectionError("connection refused", { cause: error });
      throw error;
    }
  }

  private received(data: Uint8Array): void {
    this.yields.push(data);
    if (this.connected) {
      this.signal.resolve();
      return;
    }
    // Before the handshake: the INFO line, once it is whole (it stays for the client's parser).
    const received = Buffer.concat(this.yields);
    const line = extractProtocolMessage(received);
    if (line === "" && received.length <= INFO_BYTES_MAX) return;
    const match = INFO.exec(line);
    try {
      if (match === null) throw new Error("unexpected response from server");
      this.info.resolve(JSON.parse(match[1]!) as ServerInfo);
    } catch (error) {
      this.info.reject(error);
    }
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Uint8Array> {
    return this.tls?.[Symbol.asyncIterator]() ?? this.iterate();
  }

  private async *iterate(): AsyncIterableIterator<Uint8Array> {
    while (true) {
      if (this.yields.length === 0) await this.signal;
      const yields = this.yields;
      this.yields = [];
      for (const frame of yields) yield frame;
      if (this.done) break;
      if (this.yields.length === 0) this.signal = deferred();
    }
  }

  isEncrypted(): boolean {
    return this.tls?.isEncrypted() ?? false;
  }

  /** One frame (the client's whole outbound buffer): to the socket, the rest on drain. */
  send(frame: Uint8Array): void {
    if (this.tls !== null) return this.tls.send(frame);
    const socket = this.socket;
    if (this.done || socket === null || frame.length === 0) return;
    if (this.unsent.length > 0) {
      this.unsent.push(frame);
      return;
    }
    const written = socket.write(frame);
    if (written < frame.length) this.unsent.push(frame.subarray(Math.max(0, written)));
  }

  /** Writes what waits, as far as the socket takes it. */
  private flushUnsent(): void {
    const socket = this.socket;
    while (socket !== null && this.unsent.length > 0) {
      const frame = this.unsent[0]!;
      const written = socket.write(frame);
      if (written < frame.length) {
        this.unsent[0] = frame.subarray(Math.max(0, written));
        return;
      }
      this.unsent.shift();
    }
  }

  close(error?: Error): Promise<void> {
    if (this.tls !== null) return this.tls.close(error);
    this.shut(error, false);
    return Promise.resolve();
  }

  /** The client's own disconnect (a stale connection, a forced reconnect). */
  disconnect(): void {
    if (this.tls !== null) return this.tls.disconnect();
    this.shut(undefined, true);
  }

  closed(): Promise<Error | undefined> {
    return this.closedNotification;
  }

  /** Dropped by the client (a new connection replaces it). */
  discard(): void {
    if (this.tls !== null) return this.tls.discard();
    this.done = true;
    const socket = this.socket;
    this.socket = null;
    socket?.terminate();
    this.signal.resolve();
  }

  /**
   * The connection ends (`internal`: the client's own doing, what waits is written
   * first); the client hears of it once, and only of one that came up.
   */
  private shut(error: Error | undefined, internal: boolean): void {
    if (!this.connected) {
      this.info.reject(error ?? new errors.ConnectionError("connection closed"));
      this.discard();
      return;
    }
    if (this.done) return;
    this.closeError = error;
    if (error === undefined && internal) this.flushUnsent();
    const socket = this.socket;
    this.socket = null;
    this.done = true;
    socket?.end();
    this.signal.resolve();
    this.closedNotification.resolve(this.closeError);
  }
}
