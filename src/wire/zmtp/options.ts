/**
 * Socket options: every bound on outside input has a name, a default and a range.
 */
import type { Logger } from "../../util/log";
import { silentLogger } from "../../util/log";

export interface ZmtpOptions {
  /**
   * Largest message (sum of its frames) a peer may send; a larger one is read past as it
   * streams in (nothing allocated for it), counted and skipped, and the connection goes
   * on. Default 16 MiB: a vLLM batch for a step of 256k scheduled tokens is about 1.5 MiB
   * of msgpack, so this is ~10x headroom, while reassembly memory stays bounded by
   * (peers mid-message) x 16 MiB.
   */
  readonly maxMessageBytes?: number;
  /** Most frames in one message (empty frames cost 2 wire bytes each). Default 1024. */
  readonly maxFramesPerMessage?: number;
  /** Send a PING this often once connected (0: never). Default 5,000 ms (Dynamo's value). */
  readonly heartbeatIntervalMs?: number;
  /** Drop the connection when nothing arrives this long after a PING. Default 15,000 ms. */
  readonly heartbeatTimeoutMs?: number;
  /**
   * TTL announced in our PINGs: the peer drops us if it hears nothing for this long.
   * Sent in deciseconds, so it is rounded down to 100 ms. Default 15,000 ms.
   */
  readonly heartbeatTtlMs?: number;
  /** Drop a connection that has not finished greeting + READY in this time. Default 30,000 ms. */
  readonly handshakeTimeoutMs?: number;
  /**
   * Drop a connection whose frame (or multi-frame message), once begun, has not ended
   * in this time: a trickling peer holds its partial frame while looking alive.
   * Default 10,000 ms (16 MiB at 1.6 MB/s).
   */
  readonly frameTimeoutMs?: number;
  /** First reconnect delay; doubles per failed attempt (jittered). Default 100 ms. */
  readonly reconnectMinMs?: number;
  /** Largest reconnect delay. Default 5,000 ms. */
  readonly reconnectMaxMs?: number;
  /**
   * Send high-water mark, in messages queued per peer and not yet written to the kernel.
   * Over it a message is dropped for that peer and counted. Default 100,000 (vLLM's).
   */
  readonly hwm?: number;
  /** Identity announced in READY by DEALER and ROUTER sockets (0..255 bytes). Default empty. */
  readonly routingId?: Uint8Array;
  readonly logger?: Logger;
}

export interface ResolvedOptions {
  readonly maxMessageBytes: number;
  readonly maxFramesPerMessage: number;
  readonly heartbeatIntervalMs: number;
  readonly heartbeatTimeoutMs: number;
  readonly heartbeatTtlMs: number;
  readonly handshakeTimeoutMs: number;
  readonly frameTimeoutMs: number;
  readonly reconnectMinMs: number;
  readonly reconnectMaxMs: number;
  readonly hwm: number;
  readonly routingId: Uint8Array;
  readonly logger: Logger;
}

/** Largest command body (READY metadata, a SUBSCRIBE prefix). Commands are control data. */
export const COMMAND_BYTES_MAX = 64 * 1024;
/** Most properties in one READY command. */
export const READY_PROPERTIES_MAX = 256;
/** Most distinct subscription prefixes one peer may hold on our PUB. */
export const SUBSCRIPTIONS_PER_PEER_MAX = 10_000;
/** ZMTP 3.1: a PING context is at most 16 bytes. */
export const PING_CONTEXT_BYTES_MAX = 16;

export const DEFAULTS = {
  maxMessageBytes: 16 * 1024 * 1024,
  maxFramesPerMessage: 1024,
  heartbeatIntervalMs: 5_000,
  heartbeatTimeoutMs: 15_000,
  heartbeatTtlMs: 15_000,
  handshakeTimeoutMs: 30_000,
  frameTimeoutMs: 10_000,
  reconnectMinMs: 100,
  reconnectMaxMs: 5_000,
  hwm: 100_000,
} as const;

const MAX_MESSAGE_BYTES_LIMIT = 2 ** 31 - 1; // one Uint8Array; also keeps sizes in int32 math
const MS_LIMIT = 24 * 3600 * 1000;

function int(
  name: string,
  value: number | undefined,
  fallback: number,
  min: number,
  max: number,
): number {
  const chosen = value ?? fallback;
  if (!Number.isInteger(chosen) || chosen < min || chosen > max) {
    throw new RangeError(
      `zmtp option ${name} must be an integer in [${min}, ${max}], got ${chosen}`,
    );
  }
  return chosen;
}

export function resolveOptions(options: ZmtpOptions = {}): ResolvedOptions {
  const routingId = options.routingId ?? new Uint8Array(0);
  if (routingId.length > 255)
    throw new RangeError(
      `zmtp option routingId must be at most 255 bytes, got ${routingId.length}`,
    );
  const reconnectMinMs = int(
    "reconnectMinMs",
    options.reconnectMinMs,
    DEFAULTS.reconnectMinMs,
    1,
    MS_LIMIT,
  );
  const reconnectMaxMs = int(
    "reconnectMaxMs",
    options.reconnectMaxMs,
    DEFAULTS.reconnectMaxMs,
    1,
    MS_LIMIT,
  );
  if (reconnectMaxMs < reconnectMinMs)
    throw new RangeError("zmtp option reconnectMaxMs must be >= reconnectMinMs");
  return {
    maxMessageBytes: int(
      "maxMessageBytes",
      options.maxMessageBytes,
      DEFAULTS.maxMessageBytes,
      1,
      MAX_MESSAGE_BYTES_LIMIT,
    ),
    maxFramesPerMessage: int(
      "maxFramesPerMessage",
      options.maxFramesPerMessage,
      DEFAULTS.maxFramesPerMessage,
      1,
      1 << 20,
    ),
    heartbeatIntervalMs: int(
      "heartbeatIntervalMs",
      options.heartbeatIntervalMs,
      DEFAULTS.heartbeatIntervalMs,
      0,
      MS_LIMIT,
    ),
    heartbeatTimeoutMs: int(
      "heartbeatTimeoutMs",
      options.heartbeatTimeoutMs,
      DEFAULTS.heartbeatTimeoutMs,
      1,
      MS_LIMIT,
    ),
    // The wire field is u16 deciseconds.
    heartbeatTtlMs: int(
      "heartbeatTtlMs",
      options.heartbeatTtlMs,
      DEFAULTS.heartbeatTtlMs,
      0,
      65_535 * 100,
    ),
    handshakeTimeoutMs: int(
      "handshakeTimeoutMs",
      options.handshakeTimeoutMs,
      DEFAULTS.handshakeTimeoutMs,
      1,
      MS_LIMIT,
    ),
    frameTimeoutMs: int(
      "frameTimeoutMs",
      options.frameTimeoutMs,
      DEFAULTS.frameTimeoutMs,
      1,
      MS_LIMIT,
    ),
    reconnectMinMs,
    reconnectMaxMs,
    hwm: int("hwm", options.hwm, DEFAULTS.hwm, 1, 1 << 30),
    routingId: routingId.slice(),
    logger: options.logger ?? silentLogger,
  };
}
