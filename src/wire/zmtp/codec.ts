/**
 * ZMTP 3.x wire pieces other than the streaming decoder: the greeting we send, frame
 * headers, and command bodies (READY metadata, PING/PONG, SUBSCRIBE/CANCEL, ERROR).
 *
 * Frame: flags (1 byte: bit 0 MORE, bit 1 LONG, bit 2 COMMAND, bits 3-7 zero), then the
 * size in 1 byte (short) or 8 bytes big-endian (LONG), then the body. A command body is
 * name length (1 byte), name, data.
 */
import { ZmtpError } from "./errors";
import { COMMAND_BYTES_MAX, PING_CONTEXT_BYTES_MAX, READY_PROPERTIES_MAX } from "./options";

export const FLAG_MORE = 0x01;
export const FLAG_LONG = 0x02;
export const FLAG_COMMAND = 0x04;
export const FLAGS_KNOWN = FLAG_MORE | FLAG_LONG | FLAG_COMMAND;

export const GREETING_BYTES = 64;
export const SHORT_BODY_BYTES_MAX = 255;

/** Our greeting: signature, version 3.1, mechanism NULL, as-server 0, filler. */
export function greeting(): Uint8Array {
  const bytes = new Uint8Array(GREETING_BYTES);
  bytes[0] = 0xff;
  bytes[9] = 0x7f;
  bytes[10] = 3;
  bytes[11] = 1;
  bytes.set([0x4e, 0x55, 0x4c, 0x4c], 12); // "NULL", zero padded to 20 bytes
  return bytes;
}

/** Writes a frame header at `out[at]`; returns its length (2 or 9). */
export function writeFrameHeader(out: Uint8Array, at: number, flags: number, size: number): number {
  if (size <= SHORT_BODY_BYTES_MAX) {
    out[at] = flags;
    out[at + 1] = size;
    return 2;
  }
  out[at] = flags | FLAG_LONG;
  // Sizes are < 2^31 (maxMessageBytes bound), so the high word is zero.
  out[at + 1] = 0;
  out[at + 2] = 0;
  out[at + 3] = 0;
  out[at + 4] = 0;
  out[at + 5] = size >>> 24;
  out[at + 6] = (size >>> 16) & 0xff;
  out[at + 7] = (size >>> 8) & 0xff;
  out[at + 8] = size & 0xff;
  return 9;
}

export function frameHeaderBytes(size: number): number {
  return size <= SHORT_BODY_BYTES_MAX ? 2 : 9;
}

const ascii = (text: string): Uint8Array => Uint8Array.from(text, (c) => c.charCodeAt(0));

/** A complete command frame (header + name + data). */
export function commandFrame(name: string, data: Uint8Array): Uint8Array {
  const size = 1 + name.length + data.length;
  const out = new Uint8Array(frameHeaderBytes(size) + size);
  let at = writeFrameHeader(out, 0, FLAG_COMMAND, size);
  out[at++] = name.length;
  out.set(ascii(name), at);
  out.set(data, at + name.length);
  return out;
}

/** READY with the given properties (name, value); names are ASCII. */
export function readyFrame(properties: readonly (readonly [string, Uint8Array])[]): Uint8Array {
  let size = 0;
  for (const [name, value] of properties) size += 1 + name.length + 4 + value.length;
  const data = new Uint8Array(size);
  let at = 0;
  for (const [name, value] of properties) {
    data[at++] = name.length;
    data.set(ascii(name), at);
    at += name.length;
    new DataView(data.buffer).setUint32(at, value.length);
    at += 4;
    data.set(value, at);
    at += value.length;
  }
  return commandFrame("READY", data);
}

export function pingFrame(ttlDeciseconds: number, context: Uint8Array): Uint8Array {
  const data = new Uint8Array(2 + context.length);
  data[0] = ttlDeciseconds >>> 8;
  data[1] = ttlDeciseconds & 0xff;
  data.set(context, 2);
  return commandFrame("PING", data);
}

export const pongFrame = (context: Uint8Array): Uint8Array => commandFrame("PONG", context);
export const subscribeFrame = (prefix: Uint8Array): Uint8Array => commandFrame("SUBSCRIBE", prefix);
export const cancelFrame = (prefix: Uint8Array): Uint8Array => commandFrame("CANCEL", prefix);

/** ERROR carries a reason of at most 255 bytes (ASCII here). */
export function errorFrame(reason: string): Uint8Array {
  const bytes = ascii(reason.slice(0, 255));
  const data = new Uint8Array(1 + bytes.length);
  data[0] = bytes.length;
  data.set(bytes, 1);
  return commandFrame("ERROR", data);
}

/** ZMTP 3.0 subscription as a message: 0x01 (subscribe) or 0x00 (cancel), then the prefix. */
export function subscriptionMessage(prefix: Uint8Array, subscribe: boolean): Uint8Array {
  const out = new Uint8Array(1 + prefix.length);
  out[0] = subscribe ? 1 : 0;
  out.set(prefix, 1);
  return out;
}

export interface Command {
  /** Upper-cased by the sender by convention; compared exactly (libzmq does too). */
  readonly name: string;
  /** The command data after the name: a view into the frame. */
  readonly data: Uint8Array;
}

/** Splits a command body into name and data. Throws ZmtpError(bad_command). */
export function parseCommand(body: Uint8Array): Command {
  if (body.length > COMMAND_BYTES_MAX)
    throw new ZmtpError("oversize", `command of ${body.length} bytes`);
  if (body.length === 0) throw new ZmtpError("bad_command", "empty command frame");
  const nameLength = body[0]!;
  if (nameLength === 0 || 1 + nameLength > body.length) {
    throw new ZmtpError(
      "bad_command",
      `command name length ${nameLength} in a ${body.length}-byte frame`,
    );
  }
  let name = "";
  for (let i = 1; i <= nameLength; i++) name += String.fromCharCode(body[i]!);
  return { name, data: body.subarray(1 + nameLength) };
}

/**
 * READY metadata: (name length 1 byte, name, value length 4 bytes BE, value)*. Names are
 * case-insensitive (returned lower-cased); values are copied (the frame is transient).
 */
export function parseMetadata(data: Uint8Array): Map<string, Uint8Array> {
  const properties = new Map<string, Uint8Array>();
  let at = 0;
  let count = 0;
  while (at < data.length) {
    if (++count > READY_PROPERTIES_MAX)
      throw new ZmtpError("bad_metadata", `more than ${READY_PROPERTIES_MAX} properties`);
    const nameLength = data[at]!;
    if (nameLength === 0) throw new ZmtpError("bad_metadata", "empty property name");
    if (at + 1 + nameLength + 4 > data.length)
      throw new ZmtpError("bad_metadata", "truncated property name");
    let name = "";
    for (let i = at + 1; i <= at + nameLength; i++) name += String.fromCharCode(data[i]!);
    at += 1 + nameLength;
    const valueLength =
      ((data[at]! << 24) | (data[at + 1]! << 16) | (data[at + 2]! << 8) | data[at + 3]!) >>> 0;
    at += 4;
    if (valueLength > data.length - at)
      throw new ZmtpError("bad_metadata", `property ${name} value overruns the command`);
    properties.set(name.toLowerCase(), data.slice(at, at + valueLength));
    at += valueLength;
  }
  return properties;
}

export interface Ping {
  /** The peer's TTL in milliseconds (0: none). */
  readonly ttlMs: number;
  /** Context to echo in the PONG (truncated to 16 bytes, as libzmq does). */
  readonly context: Uint8Array;
}

export function parsePing(data: Uint8Array): Ping {
  if (data.length < 2) throw new ZmtpError("bad_command", "PING without a TTL");
  const ttlMs = ((data[0]! << 8) | data[1]!) * 100;
  return { ttlMs, context: data.subarray(2, 2 + PING_CONTEXT_BYTES_MAX) };
}

/** Peer socket types each of ours may talk to (ZMTP 3.x "socket compatibility"). */
export const COMPATIBLE_PEERS: Readonly<Record<string, readonly string[]>> = {
  PUB: ["SUB", "XSUB"],
  SUB: ["PUB", "XPUB"],
  DEALER: ["REP", "DEALER", "ROUTER"],
  ROUTER: ["REQ", "DEALER", "ROUTER"],
};
