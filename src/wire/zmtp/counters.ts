/**
 * Per-socket counters, plain numbers the metrics layer reads. All are totals since the
 * socket was created except `connectionsActive` (a gauge).
 */
import { PROTOCOL_ERROR_KINDS, type ProtocolErrorKind } from "./errors";

export interface ZmtpCounters {
  /** Wire bytes read / written (greeting, commands, frame headers and bodies). */
  bytesIn: number;
  bytesOut: number;
  /** Message frames (not commands) read / queued for writing. */
  framesIn: number;
  framesOut: number;
  /** Whole messages delivered to the application / queued to a peer (one per peer copy). */
  messagesIn: number;
  messagesOut: number;
  /** Command frames read / written (READY, PING, PONG, SUBSCRIBE, CANCEL, ERROR). */
  commandsIn: number;
  commandsOut: number;
  /** TCP/ipc connections opened (accepted or connected), handshakes completed, gauge. */
  connectionsOpened: number;
  handshakes: number;
  connectionsActive: number;
  /** Connections closed after a completed handshake. */
  disconnects: number;
  /** Connections closed before their handshake completed (includes handshake timeouts). */
  handshakeFailures: number;
  handshakeTimeouts: number;
  /** Dial attempts, dial attempts that failed (refused, unreachable), and re-dials. */
  connectAttempts: number;
  connectFailures: number;
  reconnects: number;
  /** PINGs sent, and connections dropped because the peer went silent (timeout or its TTL). */
  pingsSent: number;
  heartbeatTimeouts: number;
  /** Messages over maxMessageBytes read past and skipped (the connection went on). */
  oversizeSkipped: number;
  /** Connections dropped because a frame, once begun, did not end within frameTimeoutMs. */
  frameTimeouts: number;
  /** Messages dropped because a peer's send queue was at the high-water mark. */
  hwmDrops: number;
  /** Messages with no destination: PUB with no matching peer, ROUTER to an unknown identity. */
  unroutable: number;
  /** SUB: messages from a peer that match none of our subscriptions. */
  messagesFiltered: number;
  /** Exceptions thrown by the application's onMessage / onPeer callbacks (caught, logged once). */
  callbackErrors: number;
  /** Bugs of ours caught while handling a connection (that connection was dropped). */
  internalErrors: number;
  /** Protocol errors by kind; `protocolErrorsTotal` is their sum. */
  protocolErrorsTotal: number;
  protocolErrors: Record<ProtocolErrorKind, number>;
}

export function newCounters(): ZmtpCounters {
  const protocolErrors = {} as Record<ProtocolErrorKind, number>;
  for (const kind of PROTOCOL_ERROR_KINDS) protocolErrors[kind] = 0;
  return {
    bytesIn: 0,
    bytesOut: 0,
    framesIn: 0,
    framesOut: 0,
    messagesIn: 0,
    messagesOut: 0,
    commandsIn: 0,
    commandsOut: 0,
    connectionsOpened: 0,
    handshakes: 0,
    connectionsActive: 0,
    disconnects: 0,
    handshakeFailures: 0,
    handshakeTimeouts: 0,
    connectAttempts: 0,
    connectFailures: 0,
    reconnects: 0,
    pingsSent: 0,
    heartbeatTimeouts: 0,
    oversizeSkipped: 0,
    frameTimeouts: 0,
    hwmDrops: 0,
    unroutable: 0,
    messagesFiltered: 0,
    callbackErrors: 0,
    internalErrors: 0,
    protocolErrorsTotal: 0,
    protocolErrors,
  };
}
