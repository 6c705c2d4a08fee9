/**
 * Hand-built ZMTP bytes and a raw TCP/Unix client for tests: it lets a test play a
 * misbehaving or old (ZMTP 3.0) peer byte by byte. Written from the spec, independent of
 * src/wire/zmtp/codec.ts, so the two check each other.
 */
import type { Socket } from "bun";
import { parseEndpoint } from "../../src/wire/zmtp";

export const enc = (text: string): Uint8Array => new TextEncoder().encode(text);

export function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

export function greetingBytes(minor = 1, mechanism = "NULL"): Uint8Array {
  const bytes = new Uint8Array(64);
  bytes[0] = 0xff;
  bytes[9] = 0x7f;
  bytes[10] = 3;
  bytes[11] = minor;
  bytes.set(enc(mechanism), 12);
  return bytes;
}

/** One frame: flags (LONG added when needed or forced), size, body. */
export function frameBytes(flags: number, body: Uint8Array, forceLong = false): Uint8Array {
  if (body.length <= 255 && !forceLong) return concat(Uint8Array.of(flags, body.length), body);
  const header = new Uint8Array(9);
  header[0] = flags | 0x02;
  new DataView(header.buffer).setBigUint64(1, BigInt(body.length));
  return concat(header, body);
}

export function commandBytes(name: string, data: Uint8Array = new Uint8Array(0)): Uint8Array {
  return frameBytes(0x04, concat(Uint8Array.of(name.length), enc(name), data));
}

export function readyBytes(properties: Record<string, string | Uint8Array>): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const [name, value] of Object.entries(properties)) {
    const bytes = typeof value === "string" ? enc(value) : value;
    const length = new Uint8Array(4);
    new DataView(length.buffer).setUint32(0, bytes.length);
    parts.push(Uint8Array.of(name.length), enc(name), length, bytes);
  }
  return commandBytes("READY", concat(...parts));
}

/** A whole message: MORE on all frames but the last. */
export function messageBytes(frames: Uint8Array[]): Uint8Array {
  return concat(
    ...frames.map((frame, i) => frameBytes(i < frames.length - 1 ? 0x01 : 0x00, frame)),
  );
}

/** A raw client: records everything it receives, writes what it is told. */
export class RawPeer {
  received: Uint8Array = new Uint8Array(0);
  closed = false;
  /** Resolves the pending write when the kernel buffer has room again. */
  private onDrain: (() => void) | null = null;
  private constructor(private readonly socket: Socket<undefined>) {}

  static async connect(endpoint: string): Promise<RawPeer> {
    const target = parseEndpoint(endpoint, false);
    let peer: RawPeer | null = null;
    const handlers = {
      binaryType: "uint8array" as const,
      data: (_s: Socket<undefined>, chunk: Uint8Array) => {
        if (peer !== null) peer.received = concat(peer.received, chunk);
      },
      close: () => {
        if (peer !== null) peer.closed = true;
        peer?.onDrain?.();
      },
      drain: () => peer?.onDrain?.(),
      error: () => {},
    };
    const socket =
      target.transport === "ipc"
        ? await Bun.connect({ unix: target.path, socket: handlers })
        : await Bun.connect({ hostname: target.host, port: target.port, socket: handlers });
    peer = new RawPeer(socket);
    return peer;
  }

  /** Writes everything (waiting for room on a full kernel buffer); false if the socket closed. */
  async write(bytes: Uint8Array): Promise<boolean> {
    let at = 0;
    while (at < bytes.length) {
      const written = this.socket.write(bytes, at, bytes.length - at);
      if (written < 0 || this.closed) return false;
      at += written;
      if (at < bytes.length)
        await new Promise<void>((resolve) => {
          this.onDrain = resolve;
        });
    }
    this.onDrain = null;
    return true;
  }

  /** Stop reading from the kernel (the sender's buffers fill up). */
  pause(): void {
    (this.socket as unknown as { pause(): void }).pause();
  }

  close(): void {
    this.socket.end();
  }
}
