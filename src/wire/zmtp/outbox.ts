/**
 * Outgoing bytes of one connection. Bun's `socket.write` is unbuffered: it writes what
 * the kernel takes and returns the count. So:
 *
 * - Small frames are copied into a staging buffer that is written when full or at the
 *   end of the current tick (one `write` per batch, not per message).
 * - A frame body of DIRECT_BYTES_MIN or more is written straight from the caller's
 *   buffer when nothing is queued (zero-copy); whatever the kernel does not take is
 *   copied, so the caller may reuse its buffers as soon as `send` returns.
 * - While the kernel is full, sealed buffers wait in `backlog` and go out on `drain`.
 *
 * `queuedMessages` counts messages whose last byte has not been handed to the kernel;
 * it is what the high-water mark compares against. Each staged/backlog buffer carries
 * the number of messages that end in it, so accounting is O(1) per message.
 */
import { FLAG_MORE, frameHeaderBytes, writeFrameHeader } from "./codec";

/** What a Bun socket offers; returns bytes taken, or -1 when closed. */
export interface WriteTarget {
  write(data: Uint8Array, byteOffset: number, byteLength: number): number;
}

export const STAGE_BYTES = 128 * 1024;
/** Bodies from this size on skip the stage (a syscall costs less than copying them). */
export const DIRECT_BYTES_MIN = 16 * 1024;
/** Stage buffers kept for reuse after the backlog they held was written. */
const SPARE_STAGES_MAX = 4;

export class Outbox {
  queuedMessages = 0;
  /** Waiting for the target's drain event. */
  blocked = false;
  /** Set when the target returned -1 (closed); later writes are discarded. */
  dead = false;

  private stage: Uint8Array = new Uint8Array(STAGE_BYTES);
  private stageLength = 0;
  private stageMessages = 0;
  private readonly backlog: Uint8Array[] = [];
  private readonly backlogMessages: number[] = [];
  /** For backlog entries cut from a stage buffer: that buffer, to recycle once written. */
  private readonly backlogStages: (Uint8Array | null)[] = [];
  private backlogHead = 0;
  private readonly spareStages: Uint8Array[] = [];
  private flushScheduled = false;
  private readonly flushTask = (): void => {
    this.flushScheduled = false;
    if (this.blocked) return;
    this.sealStage();
    if (this.idle) this.becameIdle();
  };

  constructor(
    private readonly target: WriteTarget,
    /** Called with every byte count handed to the kernel. */
    private readonly wrote: (bytes: number) => void,
    /** Called when a flush or drain left nothing queued. */
    private readonly becameIdle: () => void,
  ) {}

  /** Nothing queued anywhere: everything was handed to the kernel. */
  get idle(): boolean {
    return this.stageLength === 0 && this.backlogHead === this.backlog.length;
  }

  /** Queues a whole message (frames with MORE on all but the last). */
  message(frames: readonly Uint8Array[]): void {
    const last = frames.length - 1;
    for (let i = 0; i <= last; i++) this.frame(frames[i]!, i < last ? FLAG_MORE : 0);
    this.queuedMessages++;
    this.stageMessages++;
    this.schedule();
  }

  /** Queues raw bytes that are already complete frames (commands, the greeting). */
  raw(bytes: Uint8Array): void {
    // Commands are bounded by COMMAND_BYTES_MAX, well under the stage size.
    if (bytes.length > STAGE_BYTES)
      throw new Error(`Outbox.raw: ${bytes.length} bytes exceed the stage`);
    this.reserve(bytes.length);
    this.stage.set(bytes, this.stageLength);
    this.stageLength += bytes.length;
    this.schedule();
  }

  /** Handles the target's drain event: writes the backlog, then the stage. */
  drain(): void {
    if (this.dead) return;
    const backlog = this.backlog;
    while (this.backlogHead < backlog.length) {
      const head = backlog[this.backlogHead]!;
      const written = this.write(head);
      if (written < head.length) {
        if (written > 0) backlog[this.backlogHead] = head.subarray(written);
        return;
      }
      this.queuedMessages -= this.backlogMessages[this.backlogHead]!;
      const stage = this.backlogStages[this.backlogHead]!;
      if (stage !== null && this.spareStages.length < SPARE_STAGES_MAX)
        this.spareStages.push(stage);
      backlog[this.backlogHead] = EMPTY;
      this.backlogStages[this.backlogHead] = null;
      this.backlogHead++;
    }
    backlog.length = 0;
    this.backlogMessages.length = 0;
    this.backlogStages.length = 0;
    this.backlogHead = 0;
    this.blocked = false;
    this.sealStage();
    if (this.idle) this.becameIdle();
  }

  /** Forgets everything queued (the connection is gone). */
  discard(): void {
    this.dead = true;
    this.backlog.length = 0;
    this.backlogMessages.length = 0;
    this.backlogStages.length = 0;
    this.spareStages.length = 0;
    this.backlogHead = 0;
    this.stageLength = 0;
    this.stageMessages = 0;
    this.queuedMessages = 0;
  }

  private frame(body: Uint8Array, flags: number): void {
    const size = body.length;
    const header = frameHeaderBytes(size);
    if (size < DIRECT_BYTES_MIN) {
      this.reserve(header + size);
      const at = this.stageLength;
      writeFrameHeader(this.stage, at, flags, size);
      this.stage.set(body, at + header);
      this.stageLength = at + header + size;
      this.schedule();
      return;
    }
    // Large body: header into the stage, stage out, then the body without a copy if we can.
    this.reserve(header);
    this.stageLength += writeFrameHeader(this.stage, this.stageLength, flags, size);
    this.sealStage();
    if (this.dead) return;
    if (this.blocked) {
      this.pushCopy(body, 0);
      return;
    }
    const written = this.write(body);
    if (written >= 0 && written < size) this.pushCopy(body, written);
  }

  /** Makes room for `bytes` contiguous bytes in the stage (sealing it if needed). */
  private reserve(bytes: number): void {
    if (bytes <= this.stage.length - this.stageLength) return;
    this.sealStage();
  }

  /**
   * Hands the stage to the kernel (or to the backlog when blocked). Messages ending in it
   * are done once it is fully written.
   */
  private sealStage(): void {
    const length = this.stageLength;
    const messages = this.stageMessages;
    if (length === 0 && messages === 0) return;
    this.stageMessages = 0;
    if (this.dead) {
      this.stageLength = 0;
      return;
    }
    if (!this.blocked) {
      const written = this.write(this.stage.subarray(0, length));
      if (written === length) {
        this.stageLength = 0;
        this.queuedMessages -= messages;
        return;
      }
      this.blocked = true;
      this.backlog.push(this.stage.subarray(Math.max(written, 0), length));
    } else if (length === 0) {
      // Only message ends (their last bytes went out with a large body): keep the stage.
      this.backlog.push(EMPTY);
      this.backlogMessages.push(messages);
      this.backlogStages.push(null);
      return;
    } else {
      this.backlog.push(this.stage.subarray(0, length));
    }
    this.backlogMessages.push(messages);
    this.backlogStages.push(this.stage);
    this.stage = this.spareStages.pop() ?? new Uint8Array(STAGE_BYTES);
    this.stageLength = 0;
  }

  /** Copies `body[from..]` into the backlog; the message counts move with later seals. */
  private pushCopy(body: Uint8Array, from: number): void {
    this.blocked = true;
    this.backlog.push(body.slice(from));
    this.backlogMessages.push(0);
    this.backlogStages.push(null);
  }

  private write(bytes: Uint8Array): number {
    if (bytes.length === 0) return 0;
    const written = this.target.write(bytes, 0, bytes.length);
    if (written < 0) {
      this.dead = true;
      return -1;
    }
    if (written > 0) this.wrote(written);
    return written;
  }

  private schedule(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    queueMicrotask(this.flushTask);
  }
}

const EMPTY: Uint8Array = new Uint8Array(0);
