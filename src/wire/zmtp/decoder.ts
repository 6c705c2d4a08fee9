/**
 * Streaming ZMTP 3.x decoder: the 64-byte greeting, then frames, from chunks of any size.
 *
 * Usage: `feed(chunk)`, then call `next()` until it returns NEED_MORE. Partial input is
 * normal and never an error; only malformed input throws a `ZmtpError` (stable `code`),
 * after which the decoder is dead (the connection must be dropped).
 *
 * Zero-copy: a frame is reported as a location, bytes [frameStart, frameEnd) of
 * `frameBuffer`: the current chunk when the frame lies wholly inside it, else a
 * per-connection reassembly arena (frames spanning chunks are copied there; the arena is
 * reused from the next message on, and frames over ARENA_RETAIN_BYTES get a buffer of
 * their own). So a frame is valid until the message it belongs to has been handled:
 * copy it to keep it. A declared size is checked against the message bound BEFORE any
 * buffer is allocated for it: a message over the bound is read past as it streams in,
 * never held, and reported as SKIPPED_MESSAGE, so the connection lives on.
 */
import { bufferBudget } from "../../util/buffer-budget";
import { ZmtpError } from "./errors";
import { FLAG_COMMAND, FLAG_LONG, FLAG_MORE, FLAGS_KNOWN, GREETING_BYTES } from "./codec";
import { COMMAND_BYTES_MAX } from "./options";

export const NEED_MORE = -1;
/** The greeting is complete: `minor` holds the peer's minor version (0 = ZMTP 3.0). */
export const GREETING = 0;
/** A message frame: `frame` is its body, `more` tells whether frames follow. */
export const MESSAGE_FRAME = 1;
/** A command frame: `frame` is its body (name length, name, data). */
export const COMMAND_FRAME = 2;
/**
 * A message over maxMessageBytes was read to its end and thrown away (`skippedBytes`
 * says how much of it): its earlier frames, already returned, belong to no message.
 */
export const SKIPPED_MESSAGE = 3;

const S_GREETING = 0;
const S_HEADER = 1;
const S_BODY = 2;
const S_FAILED = 3;
/** Reading past the body of a frame of an oversize message. */
const S_DISCARD = 4;

const EMPTY: Uint8Array = new Uint8Array(0);
/** The reassembly arena grows up to this and is kept; larger frames get their own buffer. */
export const ARENA_RETAIN_BYTES = 256 * 1024;
const ARENA_BYTES_MIN = 4096;
const NULL_MECHANISM = [0x4e, 0x55, 0x4c, 0x4c]; // "NULL"
const MECHANISM_AT = 12;
const MECHANISM_BYTES = 20;

export class FrameDecoder {
  /** Where the frame `next()` just returned lives (see lifetime above). */
  frameBuffer: Uint8Array = EMPTY;
  frameStart = 0;
  frameEnd = 0;
  /** Whether the returned message frame has MORE set. */
  more = false;
  /** Peer's minor version, known once GREETING was returned. */
  minor = -1;
  /** Bytes fed so far (for diagnostics). */
  consumed = 0;
  /** The size of the message SKIPPED_MESSAGE just reported (its frames' bodies). */
  skippedBytes = 0;
  /** Frames (message, command, skipped) read to their end so far. */
  framesEnded = 0;

  private buf: Uint8Array = EMPTY;
  private pos = 0;
  private end = 0;
  private state = S_GREETING;
  /** Bytes gathered in `scratch` (greeting or a header split across chunks). */
  private have = 0;
  private readonly scratch = new Uint8Array(GREETING_BYTES);
  /** A frame body being reassembled across chunks: body[bodyStart, bodyStart + bodySize). */
  private body: Uint8Array = EMPTY;
  private bodyStart = 0;
  private bodySize = 0;
  private bodyFilled = 0;
  private bodyFlags = 0;
  /** Bytes of the process-wide buffer budget taken for `body` (a frame over the arena size). */
  private bodyHeld = 0;
  private arena: Uint8Array = EMPTY;
  private arenaUsed = 0;
  /** Bytes and frames of the message in progress (its frames before the current one). */
  private messageBytes = 0;
  private messageFrames = 0;
  /** The message in progress is over the bound: its frames are read past, not kept. */
  private skipping = false;
  /** Body bytes of the current skipped frame still to read past, and whether frames follow it. */
  private discardLeft = 0;
  private discardMore = false;

  constructor(
    private readonly maxMessageBytes: number,
    private readonly maxFramesPerMessage: number,
  ) {}

  /** Starts decoding `chunk`; the previous chunk must have been consumed (NEED_MORE seen). */
  feed(chunk: Uint8Array): void {
    if (this.pos < this.end) throw new Error("FrameDecoder.feed: previous chunk not consumed");
    this.buf = chunk;
    this.pos = 0;
    this.end = chunk.length;
    this.consumed += chunk.length;
  }

  /** The frame `next()` just returned, as a view (allocates; hot paths use the location). */
  get frame(): Uint8Array {
    return this.frameBuffer.subarray(this.frameStart, this.frameEnd);
  }

  /**
   * Drops references an idle connection does not need: the consumed chunk (up to 512 KiB
   * from Bun) and, between messages, the reassembly arena. Called from the connection's
   * tick when nothing arrived, so idle peers hold no receive memory.
   */
  trim(): void {
    if (this.pos === this.end) {
      this.buf = EMPTY;
      this.pos = 0;
      this.end = 0;
    }
    this.frameBuffer = EMPTY;
    if (this.state !== S_BODY && this.messageFrames === 0) {
      this.arena = EMPTY;
      this.arenaUsed = 0;
    }
  }

  /** Bytes of receive memory this decoder keeps alive (chunk, arena, a large body). */
  get retainedBytes(): number {
    return this.buf.length + this.arena.length + (this.body === this.arena ? 0 : this.body.length);
  }

  /** Bytes held for an incomplete greeting, header or body. */
  get pending(): number {
    return this.state === S_BODY ? this.bodyFilled : this.have;
  }

  /**
   * Whether a frame or a message has begun and not ended: with `framesEnded`, what
   * tells a peer stalled mid-frame from one that is slow but moving.
   */
  get midFrame(): boolean {
    return (
      this.state === S_BODY || this.state === S_DISCARD || this.have > 0 || this.messageFrames > 0
    );
  }

  next(): number {
    const state = this.state;
    if (state === S_HEADER) {
      const buf = this.buf;
      const pos = this.pos;
      // Fast path: the header is wholly in this chunk.
      if (this.have === 0 && pos + 2 <= this.end) {
        const flags = buf[pos]!;
        if ((flags & FLAG_LONG) === 0) return this.beginBody(flags, buf[pos + 1]!, pos + 2);
        if (pos + 9 <= this.end) {
          if ((buf[pos + 1]! | buf[pos + 2]! | buf[pos + 3]! | buf[pos + 4]!) !== 0)
            return this.fail("oversize", "frame size >= 2^32");
          const size =
            ((buf[pos + 5]! << 24) |
              (buf[pos + 6]! << 16) |
              (buf[pos + 7]! << 8) |
              buf[pos + 8]!) >>>
            0;
          return this.beginBody(flags, size, pos + 9);
        }
      }
      return this.slowHeader();
    }
    if (state === S_BODY) return this.continueBody();
    if (state === S_DISCARD) return this.continueDiscard();
    if (state === S_GREETING) return this.readGreeting();
    throw new ZmtpError("bad_flags", "decoder used after a protocol error");
  }

  /** Gives back the budget a large body holds (it completed, or the connection ended). */
  releaseBody(): void {
    bufferBudget.give(this.bodyHeld);
    this.bodyHeld = 0;
  }

  private fail(kind: ZmtpError["kind"], message: string): never {
    this.releaseBody();
    this.state = S_FAILED;
    this.pos = this.end;
    throw new ZmtpError(kind, message);
  }

  /** Validates a frame's flags and size, then hands out or starts reassembling its body. */
  private beginBody(flags: number, size: number, start: number): number {
    if ((flags & ~FLAGS_KNOWN) !== 0)
      this.fail("bad_flags", `reserved flag bits in 0x${flags.toString(16)}`);
    if ((flags & FLAG_COMMAND) !== 0) {
      if ((flags & FLAG_MORE) !== 0) this.fail("bad_flags", "command frame with MORE");
      if (size > COMMAND_BYTES_MAX)
        this.fail("oversize", `command of ${size} bytes (max ${COMMAND_BYTES_MAX})`);
    } else {
      if (this.messageFrames >= this.maxFramesPerMessage)
        this.fail("too_many_frames", `more than ${this.maxFramesPerMessage} frames`);
      if (this.skipping || size > this.maxMessageBytes - this.messageBytes)
        return this.beginDiscard(flags, size, start);
    }
    // The previous message was handled before next() was called again: reuse its arena.
    if ((flags & FLAG_COMMAND) === 0 && this.messageFrames === 0) this.arenaUsed = 0;
    const stop = start + size;
    if (stop <= this.end) {
      this.frameBuffer = this.buf;
      this.frameStart = start;
      this.frameEnd = stop;
      this.pos = stop;
      return this.emit(flags);
    }
    // Spans chunks: the size passed the bound above, so this allocation is bounded.
    this.reserveBody(size);
    const available = this.end - start;
    this.body.set(this.buf.subarray(start, this.end), this.bodyStart);
    this.bodyFilled = available;
    this.bodyFlags = flags;
    this.pos = this.end;
    this.state = S_BODY;
    return NEED_MORE;
  }

  /** Reads past a frame of an oversize message (this one, or an earlier one, made it so). */
  private beginDiscard(flags: number, size: number, start: number): number {
    this.skipping = true;
    this.messageBytes += size;
    this.messageFrames++;
    this.discardMore = (flags & FLAG_MORE) !== 0;
    this.discardLeft = size;
    this.pos = start;
    this.state = S_DISCARD;
    return this.continueDiscard();
  }

  private continueDiscard(): number {
    const taken = Math.min(this.discardLeft, this.end - this.pos);
    this.pos += taken;
    this.discardLeft -= taken;
    if (this.discardLeft > 0) return NEED_MORE;
    this.framesEnded++;
    this.state = S_HEADER;
    if (this.discardMore) return this.next();
    this.skippedBytes = this.messageBytes;
    this.skipping = false;
    this.messageBytes = 0;
    this.messageFrames = 0;
    return SKIPPED_MESSAGE;
  }

  /** Room for a spanning body: in the arena, or its own buffer when over the retain size. */
  private reserveBody(size: number): void {
    this.bodySize = size;
    if (size > ARENA_RETAIN_BYTES) {
      // Many peers each mid-way through a large frame add up: held in the process budget.
      if (!bufferBudget.take(size))
        this.fail(
          "buffer_budget",
          `no room for a frame of ${size} bytes in the process's buffer budget`,
        );
      this.bodyHeld = size;
      this.body = new Uint8Array(size);
      this.bodyStart = 0;
      return;
    }
    if (this.arenaUsed + size > this.arena.length) {
      // Earlier frames of this message stay in the old arena (still referenced); start anew.
      const length = Math.min(
        ARENA_RETAIN_BYTES,
        Math.max(ARENA_BYTES_MIN, 2 * this.arena.length, size),
      );
      this.arena = new Uint8Array(length);
      this.arenaUsed = 0;
    }
    this.body = this.arena;
    this.bodyStart = this.arenaUsed;
    this.arenaUsed += size;
  }

  private continueBody(): number {
    const body = this.body;
    const wanted = this.bodySize - this.bodyFilled;
    const available = this.end - this.pos;
    if (available < wanted) {
      body.set(this.buf.subarray(this.pos, this.end), this.bodyStart + this.bodyFilled);
      this.bodyFilled += available;
      this.pos = this.end;
      return NEED_MORE;
    }
    body.set(this.buf.subarray(this.pos, this.pos + wanted), this.bodyStart + this.bodyFilled);
    this.pos += wanted;
    this.frameBuffer = body;
    this.frameStart = this.bodyStart;
    this.frameEnd = this.bodyStart + this.bodySize;
    this.releaseBody();
    this.body = EMPTY;
    this.bodyFilled = 0;
    this.state = S_HEADER;
    return this.emit(this.bodyFlags);
  }

  private emit(flags: number): number {
    this.framesEnded++;
    if ((flags & FLAG_COMMAND) !== 0) {
      this.more = false;
      return COMMAND_FRAME;
    }
    if ((flags & FLAG_MORE) !== 0) {
      this.more = true;
      this.messageBytes += this.frameEnd - this.frameStart;
      this.messageFrames++;
    } else {
      this.more = false;
      this.messageBytes = 0;
      this.messageFrames = 0;
    }
    return MESSAGE_FRAME;
  }

  /** A header split across chunks: gather its 2 or 9 bytes in `scratch` (bounded: 9 steps). */
  private slowHeader(): number {
    const scratch = this.scratch;
    while (this.pos < this.end) {
      scratch[this.have++] = this.buf[this.pos++]!;
      const length = (scratch[0]! & FLAG_LONG) === 0 ? 2 : 9;
      if (this.have < length) continue;
      this.have = 0;
      if (length === 2) return this.beginBody(scratch[0]!, scratch[1]!, this.pos);
      if ((scratch[1]! | scratch[2]! | scratch[3]! | scratch[4]!) !== 0)
        return this.fail("oversize", "frame size >= 2^32");
      const size =
        ((scratch[5]! << 24) | (scratch[6]! << 16) | (scratch[7]! << 8) | scratch[8]!) >>> 0;
      return this.beginBody(scratch[0]!, size, this.pos);
    }
    return NEED_MORE;
  }

  /**
   * The greeting, checked as its bytes arrive so a non-ZMTP client (an HTTP request, a
   * ZMTP 2.0 peer) is rejected at its first wrong byte rather than after 64.
   */
  private readGreeting(): number {
    const scratch = this.scratch;
    const before = this.have;
    const take = Math.min(GREETING_BYTES - before, this.end - this.pos);
    scratch.set(this.buf.subarray(this.pos, this.pos + take), before);
    this.pos += take;
    const have = (this.have = before + take);
    if (have >= 1 && scratch[0] !== 0xff)
      this.fail("bad_signature", `greeting starts with 0x${scratch[0]!.toString(16)}`);
    // libzmq checks only bit 0 of byte 9 (0 there means a ZMTP 1.0 identity frame).
    if (have >= 10 && (scratch[9]! & 0x01) === 0)
      this.fail("bad_signature", "greeting byte 9 lacks bit 0");
    if (have >= 11 && scratch[10]! < 3)
      this.fail("unsupported_version", `ZMTP major version ${scratch[10]}`);
    if (have >= MECHANISM_AT + MECHANISM_BYTES && before < MECHANISM_AT + MECHANISM_BYTES) {
      for (let i = 0; i < MECHANISM_BYTES; i++) {
        if (scratch[MECHANISM_AT + i] !== (NULL_MECHANISM[i] ?? 0)) {
          const name = String.fromCharCode(
            ...scratch.subarray(MECHANISM_AT, MECHANISM_AT + MECHANISM_BYTES),
          ).replace(/\0+$/, "");
          this.fail("bad_mechanism", `mechanism ${JSON.stringify(name)} (only NULL is supported)`);
        }
      }
    }
    if (have < GREETING_BYTES) return NEED_MORE;
    this.minor = scratch[11]!;
    this.have = 0;
    this.state = S_HEADER;
    return GREETING;
  }
}
