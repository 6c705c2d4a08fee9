/**
 * What a peer can get wrong. Each kind is a stable counter label and, for the ones that
 * drop the connection, the `code` of the `ZmtpError` the decoder or handshake throws.
 */

/** Kinds that close the connection. */
export const FATAL_KINDS = [
  "bad_signature", // greeting does not start with 0xFF ... 0x7F (not ZMTP at all)
  "unsupported_version", // ZMTP 1.0 / 2.0 (libzmq < 4.0): we speak 3.x only
  "bad_mechanism", // a security mechanism other than NULL
  "bad_flags", // reserved flag bits set, or a command frame with MORE
  "oversize", // a frame or message over maxMessageBytes (or a command over COMMAND_BYTES_MAX)
  "too_many_frames", // a message with more than maxFramesPerMessage frames
  "buffer_budget", // reassembling this frame would take the process past its buffered-bytes budget
  "bad_command", // a command whose body does not parse (name length, PING without TTL, ...)
  "bad_metadata", // READY properties that do not parse, or too many of them
  "unexpected_frame", // a message frame before the handshake finished, or a second READY
  "socket_type_mismatch", // e.g. a SUB talking to a DEALER
  "duplicate_identity", // a ROUTER peer announcing an Identity already connected
  "peer_error", // the peer sent an ERROR command
] as const;

/** Kinds that are counted and logged once, and otherwise ignored (the connection stays). */
export const IGNORED_KINDS = [
  "unknown_command", // a command name we do not know (forward compatibility)
  "unexpected_command", // SUBSCRIBE/CANCEL to a socket that is not a PUB, ERROR after handshake...
  "unexpected_message", // a message to a PUB that is not a 3.0-style subscription
  "too_many_subscriptions", // more than SUBSCRIPTIONS_PER_PEER_MAX prefixes from one peer
] as const;

export type FatalKind = (typeof FATAL_KINDS)[number];
export type IgnoredKind = (typeof IGNORED_KINDS)[number];
export type ProtocolErrorKind = FatalKind | IgnoredKind;

export const PROTOCOL_ERROR_KINDS: readonly ProtocolErrorKind[] = [
  ...FATAL_KINDS,
  ...IGNORED_KINDS,
];

const BRAND = Symbol.for("kvedge.ZmtpError");

/**
 * Malformed input from a peer. `code` is `ZMTP_` + the kind in upper case
 * (e.g. `ZMTP_OVERSIZE`); `kind` is the counter label.
 */
export class ZmtpError extends Error {
  readonly code: string;
  readonly [BRAND] = true;

  constructor(
    readonly kind: FatalKind,
    message: string,
  ) {
    super(message);
    this.name = "ZmtpError";
    this.code = `ZMTP_${kind.toUpperCase()}`;
  }

  static is(value: unknown): value is ZmtpError {
    return (
      typeof value === "object" &&
      value !== null &&
      (value as { [BRAND]?: boolean })[BRAND] === true
    );
  }
}
