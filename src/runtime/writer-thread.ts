/**
 * The socket thread's end of the index writer thread (./writer.ts): starts it, and
 * gives each EngineSource a stream input that copies what arrives into the event ring
 * instead of sequencing it here. The source keeps its sockets (SUB, the replay
 * DEALER); the writer asks for replays by message. What readers on this thread see of
 * a stream (metrics, /v1/workers) is the mirror the writer's status messages keep: one
 * consistent view per stream, as of the writer's last drain.
 *
 * Control records (add, remove, restore, release) and connects must not be dropped like
 * batches at a full ring: they wait in a backlog, written before anything else, retried
 * every few ms.
 *
 * This thread's worker table (`workers`: the core's) numbers the writer's workers too:
 * a stream's add record carries its configured rank's slot, a rank the writer first
 * sees in a batch is asked here (`answerSlot`), and a slot whose life ended here is
 * retired until the writer answers that its index let go (`release`), then freed.
 */
import { NormalizeCounters } from "../ingest/normalize";
import { SequencerCounters } from "../ingest/sequencer";
import type { SequencerView, SourceConfig, StreamView } from "../ingest/source";
import {
  type ReplayTransport,
  StreamCounters,
  type StreamInput,
  type StreamPosition,
} from "../ingest/stream";
import type { IndexOp } from "../index/ops";
import { createRingBuffers, RecordKind, RING_MAX_STREAMS, RingProducer } from "./ring";
import { type KvedgeThread, startThread } from "./threads";
import type { SharedIndexDescriptor } from "../index/crtc/shared";
import type { IndexStatus } from "../index/threaded-index";
import { WorkerTable } from "../domain/worker-table";
import {
  SlotAnswer,
  type StreamStatus,
  type WriterControl,
  type WriterStart,
  type WriterToMain,
} from "./writer";

const encoder = new TextEncoder();
const BACKLOG_RETRY_MS = 5;
const STOP_WAIT_MS = 5_000;
/** The stream id of control records for the writer as a whole (dump, stop). */
const WRITER_STREAM = RING_MAX_STREAMS - 1;

/** A stream as the socket thread sees it: arrivals go to the ring, reads to the mirror. */
export class RingStream implements StreamInput, StreamView {
  readonly counters = new StreamCounters();
  readonly normalizer = { counters: new NormalizeCounters() };
  readonly sequencer: SequencerView;
  ranks: number[];
  /** The replay the writer asked for last: replies are tagged with it. */
  generation = 0;
  ringLosses = 0;
  private lastSeq = -1;
  private lastFingerprint = -1;
  private degraded = false;
  private degradedReason: string | null = null;

  constructor(
    private readonly owner: WriterThread,
    readonly id: number,
    /** Tells this stream from an earlier one of the same id (the writer's slot asks name it). */
    readonly serial: number,
    readonly workerId: bigint,
    dpRank: number,
    readonly transport: ReplayTransport,
    readonly changed: () => void,
  ) {
    this.ranks = [dpRank];
    const counters = new SequencerCounters();
    const self = this;
    this.sequencer = {
      get lastSeq() {
        return self.lastSeq;
      },
      get lastFingerprint() {
        return self.lastFingerprint;
      },
      get isDegraded() {
        return self.degraded;
      },
      get degradedReason() {
        return self.degradedReason;
      },
      counters,
    };
  }

  live(seq: number, payload: Uint8Array): void {
    this.owner.write(RecordKind.LIVE, this.id, 0, seq, payload);
  }

  restore(position: StreamPosition): void {
    this.owner.control(this.id, {
      op: "restore",
      last: position.lastSeq,
      print: position.fingerprint,
      degraded: position.degraded,
      ranks: [...position.ranks],
    });
  }

  /** Never dropped: a missed reconnect would pass a restarted engine's batches as duplicates. */
  connected(): void {
    this.owner.keep(RecordKind.CONNECTED, this.id, new Uint8Array(0));
  }

  replayBatch(seq: number, payload: Uint8Array): void {
    this.owner.write(RecordKind.REPLAY, this.id, this.generation, seq, payload);
  }

  replayEnd(): void {
    this.owner.write(RecordKind.REPLAY_END, this.id, this.generation, 0);
  }

  replayFailed(): void {
    this.owner.write(RecordKind.REPLAY_FAILED, this.id, this.generation, 0);
  }

  skipped(): void {
    this.owner.write(RecordKind.SKIPPED, this.id, 0, 0);
  }

  close(): void {
    this.owner.control(this.id, { op: "remove" });
    this.owner.forget(this.id);
  }

  /** The writer's view of this stream, as of its last drain. */
  mirror(status: StreamStatus): void {
    this.lastSeq = status.lastSeq;
    this.lastFingerprint = status.lastFingerprint;
    this.degraded = status.degraded;
    this.degradedReason = status.degradedReason;
    this.ranks = status.ranks;
    Object.assign(this.sequencer.counters, status.sequencer);
    Object.assign(this.normalizer.counters, status.normalizer);
    this.counters.applyErrors = status.applyErrors;
    this.ringLosses = status.ringLosses;
  }
}

export interface WriterThreadOptions extends Omit<WriterStart, "ring" | "slotAnswers"> {
  readonly ringBytes: number;
  readonly cpus: readonly number[] | null;
  /** The worker numbering the writer writes in (the core takes it); default: a new one. */
  readonly workers?: WorkerTable;
}

export class WriterThread {
  readonly producer: RingProducer;
  private readonly streams = new Map<number, RingStream>();
  private nextId = 0;
  private streamSerial = 0;
  /**
   * Ids of removed streams, reused (most recent first): safe, as the ring is in order,
   * so the writer sees the old stream's remove before the new one's add.
   */
  private freeIds: number[] = [];
  /** Records that must not be dropped, waiting for room (in order). */
  private backlog: { kind: RecordKind; id: number; payload: Uint8Array }[] = [];
  private retry: ReturnType<typeof setTimeout> | null = null;
  private dumped: ((ops: IndexOp[]) => void)[] = [];
  private stoppedWaiter: (() => void) | null = null;
  private stopping = false;
  /** The shared index's descriptor (readers attach by it), once the writer posted it. */
  descriptor: SharedIndexDescriptor | null = null;
  private described: (() => void) | null = null;

  /** Called once if the writer thread fails (a bug, an allocation: bad input is caught). */
  set onFailure(handler: (error: string) => void) {
    this.thread.onFailure = handler;
  }

  /** The CPUs the writer thread may run on (after pinning itself). */
  get cpus(): readonly number[] {
    return this.thread.ready.cpus;
  }

  /** The writer's index as of its last drain (set by whoever reads it: ThreadedIndex.mirror). */
  onIndex: (status: IndexStatus) => void = () => {};

  private constructor(
    private readonly thread: KvedgeThread,
    producer: RingProducer,
    /** The one worker numbering: the writer's slots are this table's. */
    readonly workers: WorkerTable,
    private readonly slotAnswer: SlotAnswer,
  ) {
    this.producer = producer;
    thread.onMessage = (body) => this.message(body as WriterToMain);
  }

  static async start(options: WriterThreadOptions): Promise<WriterThread> {
    const ring = createRingBuffers(options.ringBytes);
    const slotAnswers = new SharedArrayBuffer(SlotAnswer.BYTES);
    const { ringBytes: _bytes, cpus, workers, ...rest } = options;
    const data: WriterStart = { ...rest, ring, slotAnswers };
    const thread = await startThread({ role: "writer", cpus, data });
    // One wake per socket read: the notify waits for the end of the task that wrote.
    const producer = new RingProducer(ring, true);
    const table = workers ?? new WorkerTable();
    const writer = new WriterThread(thread, producer, table, new SlotAnswer(slotAnswers));
    if (options.sharedReaders > 0) await writer.indexDescribed();
    return writer;
  }

  /** The `input` of an EngineSource: its arrivals go to the writer thread. */
  input(config: SourceConfig): (transport: ReplayTransport, changed: () => void) => RingStream {
    return (transport, changed) => {
      const id = this.freeIds.pop() ?? this.nextId++;
      if (id >= WRITER_STREAM) throw new RangeError(`over ${WRITER_STREAM} engine streams at once`);
      const { workerId, dpRank } = config;
      const serial = ++this.streamSerial;
      const stream = new RingStream(this, id, serial, workerId, dpRank, transport, changed);
      this.streams.set(id, stream);
      // The configured rank's slot goes with the stream (a full table: -1, refused there).
      const slot = this.workers.acquire(workerId, dpRank);
      const generation = slot < 0 ? 0 : this.workers.generation[slot]!;
      const replay = transport.requestReplay !== undefined;
      const add = { workerId: workerId.toString(), dpRank, replay, serial, slot, generation };
      this.control(id, { op: "add", ...add });
      return stream;
    };
  }

  /** A batch or event record; dropped (and announced by a LOSS record) when the ring is full. */
  write(kind: RecordKind, id: number, generation: number, seq: number, payload?: Uint8Array): void {
    if (this.backlog.length > 0) this.flush();
    // Nothing overtakes the backlog: while it waits, batches are dropped (and announced).
    const written =
      this.backlog.length === 0
        ? this.producer.write(kind, id, generation, seq, payload)
        : this.producer.drop(id, payload?.length ?? 0);
    if (!written) this.retryLater();
  }

  /** A control record: never dropped (held in the backlog while the ring is full). */
  control(id: number, control: WriterControl): void {
    this.keep(RecordKind.CONTROL, id, encoder.encode(JSON.stringify(control)));
  }

  /** A record that must not be dropped: written now, or after the backlog when there is room. */
  keep(kind: RecordKind, id: number, payload: Uint8Array): void {
    this.backlog.push({ kind, id, payload });
    this.flush();
  }

  /**
   * Ends the lives of live `slots` (nothing on this thread names them any more): they
   * are retired now, their blocks leave the writer's index when the record arrives (with
   * `workerId`, every rank of that worker's, after its streams' remove records), and
   * they are freed for other workers once the writer answers.
   */
  release(workerId: bigint | null, slots: readonly number[]): void {
    for (const slot of slots) this.workers.retire(slot);
    const id = workerId === null ? null : workerId.toString();
    this.control(WRITER_STREAM, { op: "release", workerId: id, slots: [...slots] });
  }

  /**
   * The writer asks for the slot of a rank stream `stream` first saw: acquired here (so
   * it is a routing candidate at once) unless that stream is gone, answered in shared
   * memory, then the stream's source is told (the core gives the rank its trust).
   */
  private answerSlot(ask: Extract<WriterToMain, { t: "slot" }>): void {
    const stream = this.streams.get(ask.stream);
    const open = stream !== undefined && stream.serial === ask.serial;
    const slot = open ? this.workers.acquire(stream.workerId, ask.dpRank) : -1;
    this.slotAnswer.answer(ask.seq, slot, slot < 0 ? 0 : this.workers.generation[slot]!);
    if (slot < 0 || stream!.ranks.includes(ask.dpRank)) return;
    stream!.ranks = [...stream!.ranks, ask.dpRank];
    stream!.changed();
  }

  forget(id: number): void {
    if (this.streams.delete(id)) this.freeIds.push(id);
  }

  /** Stream ids handed out so far (live or free): bounded by the most streams at once. */
  get streamIds(): number {
    return this.nextId;
  }

  /** The writer's index as operations (tests, dumps). */
  dump(): Promise<IndexOp[]> {
    return new Promise((resolve) => {
      this.dumped.push(resolve);
      this.control(WRITER_STREAM, { op: "dump" });
    });
  }

  /** Stops the writer's streams and the thread (terminated after STOP_WAIT_MS without answer). */
  async stop(): Promise<void> {
    const stopped = new Promise<void>((resolve) => {
      this.stoppedWaiter = resolve;
      setTimeout(resolve, STOP_WAIT_MS).unref();
    });
    this.control(WRITER_STREAM, { op: "stop" });
    await stopped;
    this.stopping = true;
    if (this.retry !== null) clearTimeout(this.retry);
    await this.thread.stop();
  }

  /** Resolves once the writer posted its shared index's descriptor. */
  private indexDescribed(): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.descriptor !== null) return resolve();
      this.described = resolve;
      this.thread.onFailure = (error) => reject(new Error(error));
    });
  }

  /** Writes the backlog, then the LOSS records owed; retries later what still does not fit. */
  private flush(): void {
    while (this.backlog.length > 0) {
      const { kind, id, payload } = this.backlog[0]!;
      if (!this.producer.offer(kind, id, 0, 0, payload)) break;
      this.backlog.shift();
    }
    const announced = this.producer.announceLosses();
    if (this.backlog.length > 0 || !announced) this.retryLater();
  }

  private retryLater(): void {
    if (this.retry !== null || this.stopping) return;
    this.retry = setTimeout(() => {
      this.retry = null;
      this.flush();
    }, BACKLOG_RETRY_MS);
  }

  private message(message: WriterToMain): void {
    switch (message.t) {
      case "replay": {
        const stream = this.streams.get(message.stream);
        if (stream === undefined) return;
        stream.generation = message.generation;
        stream.transport.requestReplay?.(message.start);
        return;
      }
      case "cancel":
        this.streams.get(message.stream)?.transport.cancelReplay();
        return;
      case "slot":
        return this.answerSlot(message);
      case "released":
        for (const slot of message.slots) this.workers.free(slot);
        return;
      case "status":
        for (const status of message.streams) {
          const stream = this.streams.get(status.stream);
          if (stream === undefined) continue;
          stream.mirror(status);
          stream.changed();
        }
        this.onIndex(message.index);
        return;
      case "dump":
        this.dumped.shift()?.(message.ops);
        return;
      case "stopped":
        this.stoppedWaiter?.();
        return;
      case "index":
        this.descriptor = message.descriptor;
        this.described?.();
    }
  }
}
