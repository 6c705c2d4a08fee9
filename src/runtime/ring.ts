/**
 * The event ring: one producer thread (the socket thread) hands raw batches to one
 * consumer thread (the index writer) through a SharedArrayBuffer of fixed size.
 *
 * A record is a 24-byte header (payload length, kind, stream, generation, seq as two
 * u32) and the payload, padded to 8 bytes. Positions are byte counters mod 2^32 (the
 * capacity is a power of two, so they map onto the buffer by masking). A record never
 * straddles the end: where it would not fit, the producer writes a WRAP marker (or,
 * with less than a header left, nothing: both sides skip such a tail) and starts over
 * at offset 0, so the consumer hands out every payload as one view.
 *
 * Waking is eventfd-like: the consumer drains everything there is, declares itself
 * asleep (SLEEPING = 1), checks once more, then waits on that word; the producer
 * notifies only when it finds SLEEPING = 1 and swaps it to 0 itself, so a burst of
 * records costs one wake, not one per record (WAKES counts them).
 *
 * Full ring: the producer never waits. A record that does not fit is dropped and
 * counted, and its stream is marked lost: the next record written for that stream is
 * preceded by a LOSS record carrying how many were dropped. The consumer treats LOSS
 * as the fault model treats a reconnect (docs/operations.md): what the index holds
 * for that stream is unknown until the sequencer establishes it again.
 */

/** What a record says. Kinds < 16; the consumer refuses any other value as corrupt. */
export const RecordKind = {
  /** Never delivered: the producer skipped the rest of the buffer. */
  WRAP: 0,
  /** A live batch: seq, payload. */
  LIVE: 1,
  /** A replay reply: generation of the replay, seq, payload. */
  REPLAY: 2,
  /** A replay's end marker (generation). */
  REPLAY_END: 3,
  /** A malformed replay reply (generation). */
  REPLAY_FAILED: 4,
  /** The publisher connected. */
  CONNECTED: 5,
  /** The publisher disconnected. */
  DISCONNECTED: 6,
  /** Records of this stream were dropped (seq = how many). */
  LOSS: 7,
  /** Producer-defined control records (e.g. add / remove a stream), payload as written. */
  CONTROL: 8,
  /** A message over the size limit was skipped on the wire. */
  SKIPPED: 9,
} as const;
export type RecordKind = (typeof RecordKind)[keyof typeof RecordKind];
const KIND_MAX = RecordKind.SKIPPED;

export const RING_HEADER_BYTES = 24;
/** Smallest and largest data capacities. */
export const RING_MIN_BYTES = 4096;
export const RING_MAX_BYTES = 1 << 30;
/** Streams are numbered 0 .. RING_MAX_STREAMS - 1. */
export const RING_MAX_STREAMS = 1 << 20;
const TWO_32 = 0x1_0000_0000;

/** Words of the control block. */
const HEAD = 0;
const TAIL = 1;
const SLEEPING = 2;
const WAKES = 3;
const CONTROL_WORDS = 8;

/** What both ends need: pass it to the Worker (structured clone shares the buffers). */
export interface RingBuffers {
  readonly control: SharedArrayBuffer;
  readonly data: SharedArrayBuffer;
}

export function createRingBuffers(capacityBytes: number): RingBuffers {
  const valid =
    Number.isInteger(capacityBytes) &&
    capacityBytes >= RING_MIN_BYTES &&
    capacityBytes <= RING_MAX_BYTES &&
    (capacityBytes & (capacityBytes - 1)) === 0;
  if (!valid) {
    throw new RangeError(
      `ring capacity ${capacityBytes} must be a power of two in ` +
        `${RING_MIN_BYTES}..${RING_MAX_BYTES}`,
    );
  }
  return {
    control: new SharedArrayBuffer(CONTROL_WORDS * 4),
    data: new SharedArrayBuffer(capacityBytes),
  };
}

const pad8 = (bytes: number): number => (bytes + 7) & ~7;

class RingView {
  protected readonly control: Int32Array;
  protected readonly bytes: Uint8Array;
  protected readonly words: Int32Array;
  readonly capacity: number;
  protected readonly mask: number;

  constructor(buffers: RingBuffers) {
    this.control = new Int32Array(buffers.control);
    this.bytes = new Uint8Array(buffers.data);
    this.words = new Int32Array(buffers.data);
    this.capacity = buffers.data.byteLength;
    this.mask = this.capacity - 1;
  }

  /** Bytes written and not yet consumed. */
  get used(): number {
    return (Atomics.load(this.control, HEAD) - Atomics.load(this.control, TAIL)) >>> 0;
  }

  /** Wakes the producer has sent (one per burst that found the consumer asleep). */
  get wakes(): number {
    return Atomics.load(this.control, WAKES) >>> 0;
  }

  /** Whether the consumer has declared itself asleep and not been woken. */
  get asleep(): boolean {
    return Atomics.load(this.control, SLEEPING) === 1;
  }
}

export class RingCounters {
  /** Records written (LOSS records included). */
  written = 0;
  writtenBytes = 0;
  /** Records dropped because the ring was full, and their payload bytes. */
  droppedFull = 0;
  droppedBytes = 0;
  /** Records refused because they can never fit (larger than the ring allows). */
  oversize = 0;
  /** Fullest the ring has been after a write, in bytes. */
  usedMax = 0;
}

/** The producing end; used from one thread only. */
export class RingProducer extends RingView {
  readonly counters = new RingCounters();
  /** Per stream: records dropped since the last one written (0 = nothing pending). */
  private readonly lost: number[] = [];
  /** The largest payload a record may carry: half the ring, so a wrap never starves it. */
  readonly maxPayload: number;

  private wakeScheduled = false;

  /**
   * `wakeAfterTask`: wake a sleeping consumer once the current task (a socket read's
   * callback) has written all its records, not at the first one, which would wake it to
   * drain one record and sleep again, a futex call per few records (bench/ring.bench.ts).
   * Records are visible at once either way; only the notify waits.
   */
  constructor(
    buffers: RingBuffers,
    private readonly wakeAfterTask = false,
  ) {
    super(buffers);
    this.maxPayload = this.capacity / 2 - RING_HEADER_BYTES;
  }

  /**
   * Appends one record; false if it was dropped (ring full) or refused (payload over
   * `maxPayload`), in which case its stream is marked lost. Never waits.
   */
  write(
    kind: RecordKind,
    stream: number,
    generation: number,
    seq: number,
    payload?: Uint8Array,
  ): boolean {
    checkRecord(kind, stream, generation, seq);
    const length = payload?.length ?? 0;
    if (length > this.maxPayload) {
      this.counters.oversize++;
      this.markLost(stream, length);
      return false;
    }
    const pendingLoss = this.lost[stream] ?? 0;
    if (pendingLoss > 0) {
      const announced = this.append(RecordKind.LOSS, stream, 0, pendingLoss, undefined);
      if (!announced) return this.drop(stream, length);
      this.lost[stream] = 0;
    }
    if (!this.append(kind, stream, generation, seq, payload)) return this.drop(stream, length);
    return true;
  }

  /**
   * Appends one record if it fits now; false (nothing counted, nothing marked lost)
   * if not: for records the caller keeps and offers again (control records).
   */
  offer(
    kind: RecordKind,
    stream: number,
    generation: number,
    seq: number,
    payload?: Uint8Array,
  ): boolean {
    checkRecord(kind, stream, generation, seq);
    if ((payload?.length ?? 0) > this.maxPayload) {
      throw new RangeError(`a ring record of ${payload!.length} bytes is over ${this.maxPayload}`);
    }
    if ((this.lost[stream] ?? 0) > 0) return this.write(kind, stream, generation, seq, payload);
    return this.append(kind, stream, generation, seq, payload);
  }

  /**
   * Writes the LOSS record of every stream with drops not yet announced, as far as
   * the ring has room; true when none is left. A burst that ends in drops is announced
   * by this, not by a next record that may never come.
   */
  announceLosses(): boolean {
    let left = false;
    this.lost.forEach((count, stream) => {
      if (count === 0) return;
      if (this.append(RecordKind.LOSS, stream, 0, count, undefined)) this.lost[stream] = 0;
      else left = true;
    });
    return !left;
  }

  /** Records dropped for `stream` and not yet announced to the consumer. */
  pendingLoss(stream: number): number {
    return this.lost[stream] ?? 0;
  }

  /**
   * Counts a record as dropped without offering it (the caller holds records ahead of
   * it that must go first); its stream is marked lost like any other drop.
   */
  drop(stream: number, length: number): false {
    this.counters.droppedFull++;
    this.markLost(stream, length);
    return false;
  }

  private markLost(stream: number, length: number): void {
    this.counters.droppedBytes += length;
    this.lost[stream] = (this.lost[stream] ?? 0) + 1;
  }

  private append(
    kind: RecordKind,
    stream: number,
    generation: number,
    seq: number,
    payload: Uint8Array | undefined,
  ): boolean {
    const length = payload?.length ?? 0;
    const size = RING_HEADER_BYTES + pad8(length);
    const head = Atomics.load(this.control, HEAD);
    const tail = Atomics.load(this.control, TAIL);
    const used = (head - tail) >>> 0;
    const at = head & this.mask;
    const toEnd = this.capacity - at;
    // Skip what is left at the end when the record does not fit there.
    const skip = toEnd < size ? toEnd : 0;
    if (used + skip + size > this.capacity) return false;
    if (skip >= RING_HEADER_BYTES) this.header(at, 0, RecordKind.WRAP, 0, 0, 0);
    const start = skip > 0 ? 0 : at;
    this.header(start, length, kind, stream, generation, seq);
    if (payload !== undefined) this.bytes.set(payload, start + RING_HEADER_BYTES);
    Atomics.store(this.control, HEAD, (head + skip + size) | 0);
    const counters = this.counters;
    counters.written++;
    counters.writtenBytes += length;
    if (used + skip + size > counters.usedMax) counters.usedMax = used + skip + size;
    if (!this.wakeAfterTask) this.wake();
    else if (!this.wakeScheduled) {
      this.wakeScheduled = true;
      queueMicrotask(this.wakeLater);
    }
    return true;
  }

  private readonly wakeLater = (): void => {
    this.wakeScheduled = false;
    this.wake();
  };

  private header(
    at: number,
    length: number,
    kind: number,
    stream: number,
    generation: number,
    seq: number,
  ): void {
    const word = at >> 2;
    const words = this.words;
    words[word] = length;
    words[word + 1] = kind;
    words[word + 2] = stream;
    words[word + 3] = generation;
    words[word + 4] = Math.floor(seq / TWO_32);
    words[word + 5] = seq >>> 0;
  }

  /** One notify per sleep: whoever swaps SLEEPING from 1 to 0 wakes the consumer. */
  private wake(): void {
    const control = this.control;
    if (Atomics.load(control, SLEEPING) !== 1) return;
    if (Atomics.compareExchange(control, SLEEPING, 1, 0) !== 1) return;
    Atomics.add(control, WAKES, 1);
    Atomics.notify(control, SLEEPING, 1);
  }
}

function checkRecord(kind: number, stream: number, generation: number, seq: number): void {
  if (!Number.isInteger(kind) || kind <= RecordKind.WRAP || kind > KIND_MAX) {
    throw new RangeError(`bad ring record kind ${kind}`);
  }
  if (!Number.isInteger(stream) || stream < 0 || stream >= RING_MAX_STREAMS) {
    throw new RangeError(`bad ring stream ${stream}`);
  }
  if (!Number.isInteger(generation) || generation < 0 || generation > 0x7fff_ffff) {
    throw new RangeError(`bad ring generation ${generation}`);
  }
  if (!Number.isSafeInteger(seq) || seq < 0) throw new RangeError(`bad ring seq ${seq}`);
}

/** Called per record; `payload` is a view into the ring, valid only during the call. */
export type RecordHandler = (
  kind: RecordKind,
  stream: number,
  generation: number,
  seq: number,
  payload: Uint8Array,
) => void;

export class ConsumerCounters {
  records = 0;
  bytes = 0;
  /** Drains that found something (each followed a wake or a busy poll). */
  drains = 0;
  /** Corrupt headers found; each discarded everything written up to then. */
  corrupt = 0;
  corruptBytes = 0;
  /**
   * Times the consumer declared itself asleep with nothing to read (also a declaration a
   * producer's wake answered before the consumer looked again), so wakes <= sleeps.
   */
  sleeps = 0;
}

/** The consuming end; used from one thread only. */
export class RingConsumer extends RingView {
  readonly counters = new ConsumerCounters();

  /**
   * Hands every record written so far to `handler`, in order, giving each one's space
   * back as soon as the handler returns. A corrupt header (a length or kind no
   * producer writes) discards everything up to the head and calls `onCorrupt`: the
   * records in it are lost, and which streams they were for is unknown.
   * Returns the records delivered.
   */
  drain(handler: RecordHandler, onCorrupt?: (bytes: number) => void): number {
    const control = this.control;
    let tail = Atomics.load(control, TAIL);
    let head = Atomics.load(control, HEAD);
    let delivered = 0;
    while (tail !== head) {
      const at = tail & this.mask;
      const toEnd = this.capacity - at;
      if (toEnd < RING_HEADER_BYTES) {
        tail = (tail + toEnd) | 0;
        Atomics.store(control, TAIL, tail);
        continue;
      }
      const word = at >> 2;
      const words = this.words;
      const length = words[word]!;
      const kind = words[word + 1]!;
      const size = RING_HEADER_BYTES + pad8(length);
      const available = (head - tail) >>> 0;
      if (kind === RecordKind.WRAP && length === 0) {
        tail = (tail + toEnd) | 0;
        Atomics.store(control, TAIL, tail);
        continue;
      }
      const bad = length < 0 || length > toEnd || kind <= RecordKind.WRAP || kind > KIND_MAX;
      if (bad || size > toEnd || size > available) {
        this.discard(head, available, onCorrupt);
        break;
      }
      const seq = (words[word + 4]! >>> 0) * TWO_32 + (words[word + 5]! >>> 0);
      const start = at + RING_HEADER_BYTES;
      handler(
        kind as RecordKind,
        words[word + 2]!,
        words[word + 3]!,
        seq,
        this.bytes.subarray(start, start + length),
      );
      delivered++;
      this.counters.bytes += length;
      tail = (tail + size) | 0;
      Atomics.store(control, TAIL, tail);
      if (tail === head) head = Atomics.load(control, HEAD);
    }
    this.counters.records += delivered;
    if (delivered > 0) this.counters.drains++;
    return delivered;
  }

  private discard(head: number, bytes: number, onCorrupt?: (bytes: number) => void): void {
    this.counters.corrupt++;
    this.counters.corruptBytes += bytes;
    Atomics.store(this.control, TAIL, head);
    onCorrupt?.(bytes);
  }

  /**
   * Declares the consumer asleep and resolves when the producer writes (at once if it
   * already has). Asynchronous (Atomics.waitAsync), so the consumer thread's timers
   * and messages keep running while it sleeps; `timeoutMs` bounds the sleep.
   */
  sleep(timeoutMs = Infinity): Promise<unknown> | null {
    const control = this.control;
    Atomics.store(control, SLEEPING, 1);
    // A record written after the drain and before SLEEPING = 1 found no sleeper: look again.
    if (Atomics.load(control, HEAD) !== Atomics.load(control, TAIL)) {
      // A producer that took SLEEPING back to 0 first has sent this declaration its wake.
      if (Atomics.compareExchange(control, SLEEPING, 1, 0) !== 1) this.counters.sleeps++;
      return null;
    }
    this.counters.sleeps++;
    const waiting = Atomics.waitAsync(control, SLEEPING, 1, timeoutMs);
    return waiting.async ? waiting.value : null;
  }

  /**
   * Drains, sleeps until written to, drains again, ...; after each drain calls
   * `drained`, and stops when it returns true. Between sleeps the thread's event loop
   * runs (timers, messages).
   */
  async run(
    handler: RecordHandler,
    drained: () => boolean,
    onCorrupt?: (bytes: number) => void,
  ): Promise<void> {
    for (;;) {
      this.drain(handler, onCorrupt);
      if (drained()) return;
      const sleeping = this.sleep();
      if (sleeping !== null) await sleeping;
      this.awake();
    }
  }

  /** Leaves the sleeping state (after a timeout, or on stop), so no wake is sent for nothing. */
  awake(): void {
    Atomics.store(this.control, SLEEPING, 0);
  }
}
