/**
 * kvedge's own HTTP/1.1 client, for the calls that must be bounded and cancellable:
 * the proxy's requests to engines (from the main thread, or from the route lane a
 * client came to: src/proxy/lane-end.ts). One TCP connection per exchange (`connection: close`): an abort is a closed
 * connection the server sees at once, a request is never on a connection another one
 * used, and nothing is pooled. Not Bun's fetch, whose in-flight cap (256) is per
 * process, across origins and threads, and set only by an environment variable read at
 * start (docs/decisions.md#own-http-client).
 *
 * An exchange connects, writes the request, reads the response head and then its body
 * (Content-Length, chunked, or up to the close), each under its own timer: connect,
 * first byte (from connected to the end of the head), idle (between body bytes, paused
 * while the reader applies backpressure). Body bytes reach `read()` as they arrive,
 * framing removed.
 *
 * Bun's own sockets (Bun.connect) carry it: node:net's cost twice as much per exchange
 * (measured: 1,000 proxied streams in 2.0-2.7 s against 1.2 s). A connection still being
 * made cannot be cancelled, though: given up on (an abort, the connect timeout), it
 * stays with the kernel until the host answers or the kernel gives up (about two minutes
 * on Linux for a host that drops SYNs). At most ABANDONED_MAX such connects per origin
 * and thread: past that, exchanges to it fail at once as refused (nothing sent; the proxy tries the
 * next engine), so a dead host cannot pile up file descriptors.
 */

import type { Socket } from "bun";
import { isIP } from "node:net";

export type UpstreamFailure =
  /** No connection: refused, unreachable, no such host. Nothing was sent. */
  | "refused"
  /** Not connected within the connect timeout. Nothing was sent. */
  | "connect_timeout"
  /** Connected, no complete response head within the first-byte timeout. */
  | "first_byte_timeout"
  /** The body paused longer than the idle timeout. */
  | "idle_timeout"
  /** The server closed the connection before the answer was complete. */
  | "closed"
  /** A socket error after connecting (a reset). */
  | "reset"
  /** Not an HTTP/1.x answer, or broken framing. */
  | "malformed"
  /** This side gave up (`abort()`). */
  | "aborted";

export class UpstreamError extends Error {
  override readonly name = "UpstreamError";
  constructor(
    readonly failure: UpstreamFailure,
    message: string,
    /** Whether the server may have received the request (false: it certainly did not). */
    readonly sent: boolean,
  ) {
    super(message);
  }
}

/** Where exchanges go: parsed once from a base URL (`http://host:port`, `https://...`). */
export interface Origin {
  readonly hostname: string;
  readonly port: number;
  readonly tls: boolean;
  /** The Host header. */
  readonly host: string;
}

export function originOf(base: string): Origin {
  const url = new URL(base);
  const tls = url.protocol === "https:";
  const hostname = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
  return { hostname, port: Number(url.port || (tls ? 443 : 80)), tls, host: url.host };
}

export interface ExchangeRequest {
  readonly origin: Origin;
  readonly method: string;
  /** Path and query. */
  readonly path: string;
  /** Header lines to send (Host, Content-Length and Connection are the client's). */
  readonly headers: readonly (readonly [string, string])[];
  readonly body: Uint8Array | null;
}

/** Milliseconds; 0 = no limit. */
export interface ExchangeTimeouts {
  readonly connectMs: number;
  readonly firstByteMs: number;
  readonly idleMs: number;
}

export interface ResponseHead {
  readonly status: number;
  /** Header names in lower case, in the order received. */
  readonly headers: readonly (readonly [string, string])[];
}

export type ExchangePhase = "connecting" | "waiting" | "body" | "done" | "failed";

/** Connects given up on but still with the kernel, per origin, before it is not tried. */
export const ABANDONED_MAX = 64;
const abandoned = new Map<string, number>();

/** Connects to `origin` given up on whose outcome the kernel has not given yet. */
export function abandonedConnects(origin: Origin): number {
  return abandoned.get(keyOf(origin)) ?? 0;
}

const keyOf = (origin: Origin): string => `${origin.hostname}:${origin.port}`;

/** Response heads past this are refused as malformed. */
const HEAD_BYTES_MAX = 64 * 1024;
/** Body bytes queued for a reader that has not read them: past this the socket pauses. */
const QUEUE_HIGH_BYTES = 256 * 1024;
const encoder = new TextEncoder();
const latin1 = new TextDecoder("latin1");

type Step = { done: true; value?: undefined } | { done: false; value: Uint8Array };

/** One request and its answer on a connection of its own. */
export class Exchange {
  /** The response head; rejects with an UpstreamError. */
  readonly head: Promise<ResponseHead>;
  private resolveHead!: (head: ResponseHead) => void;
  private rejectHead!: (error: UpstreamError) => void;
  private state: ExchangePhase = "connecting";
  private socket: Socket<undefined> | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  /** What the running timer fails the exchange with, after how long, from when. */
  private timerFailure: UpstreamFailure = "connect_timeout";
  private timerMessage = "";
  private timerMs = 0;
  private armedAt = 0;
  private headBytes = new Uint8Array(0);
  private readonly body = new BodyDecoder();
  private readonly queue: Uint8Array[] = [];
  private queued = 0;
  private paused = false;
  private failure: UpstreamError | null = null;
  private reader: ((step: Step) => void) | null = null;
  private readerFailed: ((error: UpstreamError) => void) | null = null;
  private unsent: Uint8Array | null = null;
  /** Called if the exchange ends while its connect is pending. */
  private onAbandon: (() => void) | null = null;

  constructor(
    private readonly request: ExchangeRequest,
    private readonly timeouts: ExchangeTimeouts,
  ) {
    this.head = new Promise<ResponseHead>((resolve, reject) => {
      this.resolveHead = resolve;
      this.rejectHead = reject;
    });
    // Observed by whoever awaits it; a failure nobody awaits is not unhandled.
    this.head.catch(() => {});
    this.arm(timeouts.connectMs, "connect_timeout", "the connection was not made in time");
    this.connect();
  }

  get phase(): ExchangePhase {
    return this.state;
  }

  /** The next body bytes, or done at the end of the body; rejects with an UpstreamError. */
  read(): Promise<Step> {
    const chunk = this.queue.shift();
    if (chunk !== undefined) {
      this.queued -= chunk.length;
      if (this.paused && this.queued < QUEUE_HIGH_BYTES / 2) this.resume();
      return Promise.resolve({ done: false, value: chunk });
    }
    if (this.failure !== null) return Promise.reject(this.failure);
    if (this.state === "done") return Promise.resolve({ done: true });
    if (this.paused) this.resume();
    return new Promise<Step>((resolve, reject) => {
      this.reader = resolve;
      this.readerFailed = reject;
    });
  }

  /** Gives up: the connection is closed at once (the server sees it). Idempotent. */
  abort(): void {
    if (this.state === "done" || this.state === "failed") return;
    this.fail("aborted", "the exchange was aborted");
  }

  private connect(): void {
    const { origin } = this.request;
    const key = keyOf(origin);
    if ((abandoned.get(key) ?? 0) >= ABANDONED_MAX) {
      queueMicrotask(() =>
        this.fail("refused", `${ABANDONED_MAX} earlier connections to it have not completed`),
      );
      return;
    }
    // Once given up on, a connect still pending counts until the kernel settles it.
    let settled = false;
    const settle = (): void => {
      if (settled) return;
      settled = true;
      if (this.state !== "connecting") release(key);
    };
    const handlers = {
      open: (socket: Socket<undefined>) => {
        settle();
        this.opened(socket);
      },
      data: (_socket: Socket<undefined>, data: Uint8Array) => this.received(data),
      drain: () => this.flush(),
      end: () => this.closed(),
      close: () => this.closed(),
      error: (_socket: Socket<undefined>, error: Error) =>
        this.fail("reset", `the connection failed: ${error.message}`),
      connectError: (_socket: Socket<undefined>, error: Error) => {
        settle();
        this.fail("refused", `cannot connect: ${error.message}`);
      },
    };
    this.onAbandon = () => {
      if (!settled) abandoned.set(key, (abandoned.get(key) ?? 0) + 1);
    };
    Bun.connect<undefined>({
      hostname: origin.hostname,
      port: origin.port,
      // SNI names a host, never an address.
      ...(origin.tls
        ? { tls: isIP(origin.hostname) ? true : { serverName: origin.hostname } }
        : {}),
      socket: handlers,
    }).catch((error: Error) => {
      settle();
      this.fail("refused", `cannot connect: ${error.message}`);
    });
  }

  private opened(socket: Socket<undefined>): void {
    if (this.state !== "connecting") {
      socket.terminate(); // aborted or timed out meanwhile
      return;
    }
    this.socket = socket;
    this.state = "waiting";
    this.arm(this.timeouts.firstByteMs, "first_byte_timeout", "no answer in time");
    socket.setNoDelay(true);
    const { request } = this;
    let head = `${request.method} ${request.path} HTTP/1.1\r\nhost: ${request.origin.host}\r\n`;
    for (const [name, value] of request.headers) head += `${name}: ${value}\r\n`;
    if (request.body !== null) head += `content-length: ${request.body.length}\r\n`;
    head += "connection: close\r\n\r\n";
    const headBytes = encoder.encode(head);
    if (request.body === null || request.body.length === 0) this.unsent = headBytes;
    else {
      this.unsent = new Uint8Array(headBytes.length + request.body.length);
      this.unsent.set(headBytes);
      this.unsent.set(request.body, headBytes.length);
    }
    this.flush();
  }

  /** Writes what the socket takes of the request; the rest on `drain`. */
  private flush(): void {
    const unsent = this.unsent;
    if (unsent === null || this.socket === null) return;
    const written = this.socket.write(unsent);
    this.unsent = written >= unsent.length ? null : unsent.subarray(Math.max(written, 0));
  }

  private received(data: Uint8Array): void {
    if (this.state === "waiting") this.receivedHead(data);
    else if (this.state === "body") this.receivedBody(data);
  }

  private receivedHead(data: Uint8Array): void {
    const before = this.headBytes.length;
    let bytes = new Uint8Array(before + data.length);
    bytes.set(this.headBytes);
    bytes.set(data, before);
    for (let end = headEnd(bytes, Math.max(0, before - 3)); end >= 0; end = headEnd(bytes, 0)) {
      const head = parseHead(latin1.decode(bytes.subarray(0, end)));
      if (head === null || head.status === 101) {
        this.fail("malformed", "the answer is not an HTTP/1.x response");
        return;
      }
      bytes = bytes.subarray(end);
      // An interim answer (100 Continue, 103 Early Hints): the real one follows.
      if (head.status >= 200) {
        this.startBody(head, bytes);
        return;
      }
    }
    if (bytes.length > HEAD_BYTES_MAX) this.fail("malformed", "the answer's head is too long");
    else this.headBytes = bytes;
  }

  private startBody(head: ResponseHead, rest: Uint8Array): void {
    const framing = framingOf(head, this.request.method);
    if (framing === null) {
      this.fail("malformed", "the answer's Content-Length or Transfer-Encoding is invalid");
      return;
    }
    this.headBytes = new Uint8Array(0);
    this.body.start(framing);
    this.state = "body";
    this.arm(this.timeouts.idleMs, "idle_timeout", "the answer paused too long");
    this.resolveHead(head);
    if (framing.kind === "none") this.finish();
    else if (rest.length > 0) this.receivedBody(rest);
  }

  private receivedBody(data: Uint8Array): void {
    if (!this.paused) this.arm(this.timeouts.idleMs, "idle_timeout", "the answer paused too long");
    const ok = this.body.push(data, (chunk) => this.deliver(chunk));
    if (!ok) this.fail("malformed", "the answer's chunked framing is broken");
    else if (this.body.complete) this.finish();
  }

  private deliver(chunk: Uint8Array): void {
    // A copy: the socket's buffer is not ours to keep.
    const copy = chunk.slice();
    if (this.reader !== null) {
      const reader = this.reader;
      this.reader = null;
      this.readerFailed = null;
      reader({ done: false, value: copy });
      return;
    }
    this.queue.push(copy);
    this.queued += copy.length;
    if (this.queued > QUEUE_HIGH_BYTES && !this.paused) {
      this.paused = true;
      this.disarm(); // the reader is slow, not the server
      this.socket?.pause();
    }
  }

  private resume(): void {
    this.paused = false;
    this.socket?.resume();
    this.arm(this.timeouts.idleMs, "idle_timeout", "the answer paused too long");
  }

  private closed(): void {
    if (this.state === "body" && this.body.endsAtClose()) {
      this.finish();
      return;
    }
    if (this.state === "connecting") this.fail("refused", "the connection was closed at once");
    else this.fail("closed", "the server closed the connection before the answer was complete");
  }

  private finish(): void {
    if (this.state !== "body") return;
    this.state = "done";
    this.disarm();
    this.socket?.end();
    this.socket = null;
    if (this.reader !== null) {
      const reader = this.reader;
      this.reader = null;
      this.readerFailed = null;
      reader({ done: true });
    }
  }

  private fail(failure: UpstreamFailure, message: string): void {
    if (this.state === "done" || this.state === "failed") return;
    const sent = this.state !== "connecting";
    if (!sent) this.onAbandon?.();
    this.state = "failed";
    this.disarm();
    this.socket?.terminate();
    this.socket = null;
    this.unsent = null;
    const error = new UpstreamError(failure, message, sent);
    this.failure = error;
    this.rejectHead(error);
    if (this.readerFailed !== null) {
      const failed = this.readerFailed;
      this.reader = null;
      this.readerFailed = null;
      failed(error);
    }
  }

  /**
   * Starts the timer for `failure` from now. Re-arming the timer that runs (the idle
   * timer, at every body read) only moves its start: it checks when it fires, and runs
   * on for what is left, instead of a new timer per read.
   */
  private arm(ms: number, failure: UpstreamFailure, message: string): void {
    this.armedAt = performance.now();
    if (this.timer !== null && this.timerFailure === failure) return;
    this.disarm();
    if (ms <= 0) return;
    this.timerFailure = failure;
    this.timerMessage = message;
    this.timerMs = ms;
    this.timer = setTimeout(this.expire, ms);
  }

  private readonly expire = (): void => {
    this.timer = null;
    const left = this.armedAt + this.timerMs - performance.now();
    if (left >= 1) this.timer = setTimeout(this.expire, left);
    else this.fail(this.timerFailure, this.timerMessage);
  };

  private disarm(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }
}

function release(key: string): void {
  const left = (abandoned.get(key) ?? 1) - 1;
  if (left > 0) abandoned.set(key, left);
  else abandoned.delete(key);
}

/** Where the response head ends (after its blank line), or -1. */
function headEnd(bytes: Uint8Array, from: number): number {
  for (let i = from; i < bytes.length; i++) {
    if (bytes[i] !== 0x0a) continue;
    if (bytes[i + 1] === 0x0a) return i + 2;
    if (bytes[i + 1] === 0x0d && bytes[i + 2] === 0x0a) return i + 3;
  }
  return -1;
}

const STATUS_LINE = /^HTTP\/1\.[01] ([1-9][0-9]{2})(?: [^\r\n]*)?$/;

function parseHead(text: string): ResponseHead | null {
  const lines = text.split(/\r?\n/);
  const status = STATUS_LINE.exec(lines[0] ?? "");
  if (status === null) return null;
  const headers: [string, string][] = [];
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    if (line === "") continue;
    const colon = line.indexOf(":");
    // A folded line (obsolete) or a line without a name is refused, as RFC 9112 allows.
    if (colon <= 0 || line[0] === " " || line[0] === "\t") return null;
    headers.push([line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim()]);
  }
  return { status: Number(status[1]), headers };
}

type Framing =
  | { readonly kind: "none" }
  | { readonly kind: "length"; readonly bytes: number }
  | { readonly kind: "chunked" }
  | { readonly kind: "close" };

/** How the body is delimited (RFC 9112 section 6.3); null if the head contradicts itself. */
function framingOf(head: ResponseHead, method: string): Framing | null {
  const { status } = head;
  if (method === "HEAD" || status === 204 || status === 304) return { kind: "none" };
  const encodings = head.headers.filter(([name]) => name === "transfer-encoding");
  if (encodings.length > 0) {
    const last = encodings.at(-1)![1].split(",").at(-1)!.trim().toLowerCase();
    return last === "chunked" ? { kind: "chunked" } : { kind: "close" };
  }
  const lengths = head.headers
    .filter(([name]) => name === "content-length")
    .flatMap(([, value]) => value.split(",").map((part) => part.trim()));
  if (lengths.length === 0) return { kind: "close" };
  if (!lengths.every((value) => /^[0-9]{1,15}$/.test(value) && value === lengths[0])) return null;
  const bytes = Number(lengths[0]);
  return bytes === 0 ? { kind: "none" } : { kind: "length", bytes };
}

const SIZE_LINE_MAX = 1024;

/** Removes the body's framing: passes its bytes on as they come, says when it is complete. */
export class BodyDecoder {
  complete = false;
  private framing: Framing = { kind: "none" };
  private left = 0;
  /** Chunked: what is being read now. */
  private step: "size" | "data" | "data-end" | "trailer" = "size";
  private line = "";

  start(framing: Framing): void {
    this.framing = framing;
    this.complete = framing.kind === "none";
    if (framing.kind === "length") this.left = framing.bytes;
  }

  endsAtClose(): boolean {
    return this.framing.kind === "close";
  }

  /** False when the framing is broken. */
  push(data: Uint8Array, deliver: (chunk: Uint8Array) => void): boolean {
    const { framing } = this;
    if (this.complete) return true; // bytes after the answer: ignored
    if (framing.kind === "close") {
      deliver(data);
      return true;
    }
    if (framing.kind === "length") {
      const take = Math.min(this.left, data.length);
      if (take > 0) deliver(data.subarray(0, take));
      this.left -= take;
      this.complete = this.left === 0;
      return true;
    }
    return this.chunked(data, deliver);
  }

  private chunked(data: Uint8Array, deliver: (chunk: Uint8Array) => void): boolean {
    let i = 0;
    while (i < data.length && !this.complete) {
      if (this.step === "data") {
        const take = Math.min(this.left, data.length - i);
        deliver(data.subarray(i, i + take));
        i += take;
        this.left -= take;
        if (this.left === 0) this.step = "data-end";
        continue;
      }
      const byte = data[i++]!;
      if (byte !== 0x0a) {
        if (this.line.length >= SIZE_LINE_MAX) return false;
        this.line += String.fromCharCode(byte);
        continue;
      }
      const line = this.line.endsWith("\r") ? this.line.slice(0, -1) : this.line;
      this.line = "";
      if (!this.endOfLine(line)) return false;
    }
    return true;
  }

  /** A line of the chunked framing ended (its LF seen). */
  private endOfLine(line: string): boolean {
    if (this.step === "data-end") {
      if (line !== "") return false;
      this.step = "size";
      return true;
    }
    if (this.step === "trailer") {
      if (line === "") this.complete = true;
      return true;
    }
    const size = /^([0-9a-fA-F]{1,12})[ \t]*(;.*)?$/.exec(line);
    if (size === null) return false;
    this.left = Number.parseInt(size[1]!, 16);
    this.step = this.left === 0 ? "trailer" : "data";
    return true;
  }
}
