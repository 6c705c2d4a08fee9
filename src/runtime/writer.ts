/**
 * The index writer thread (role "writer"): owns the index and every engine stream's
 * sequencing (EngineStream: sequencer -> normalizer -> budgeted index), fed by the
 * socket thread through the event ring (./ring.ts). It drains everything there is,
 * then sleeps until the socket thread writes again; its timers (replay timeouts) run
 * meanwhile. What the main thread must see of each stream (position, trust, ranks,
 * counters) it posts after each drain that changed it; replay requests go the same
 * way, tagged with a generation so that replies of an abandoned replay, still in the
 * ring, are recognized and dropped. ./writer-thread.ts is the other end.
 *
 * The writer numbers no worker: its table follows the main thread's. A stream's add
 * record carries its configured rank's slot; a rank first seen in a batch is asked of
 * the main thread (a message), and the writer waits for the answer in shared memory
 * before it writes that rank's first operation (once per rank: the main thread answers
 * within a turn of its event loop). A slot leaves this table only when the main thread
 * says so (a release record), and the main thread gives it to another worker only once
 * the writer answered that it let go. So every slot in the shared index is the main
 * thread's slot for the same worker, and lookups on any thread need no translation.
 */
import { type LoraAdapter, LoraAdapters } from "../hash";
import { BUDGET_REFUSAL, budgetedSink } from "../ingest/budgeted-sink";
import { SLOT_LIMIT, WorkerTable } from "../domain/worker-table";
import { createIndex, type KvIndex } from "../index";
import { IndexBudget } from "../index/budget";
import {
  createSharedIndex,
  type SharedIndex,
  type SharedIndexDescriptor,
} from "../index/crtc/shared";
import type { IndexOp } from "../index/ops";
import type { NormalizeCounters } from "../ingest/normalize";
import type { SequencerCounters, SequencerOptions } from "../ingest/sequencer";
import { EngineStream } from "../ingest/stream";
import type { Config } from "../config";
import { createLogger, type Logger } from "../util/log";
import { RecordKind, type RingBuffers, RingConsumer } from "./ring";
import type { IndexStatus } from "../index/threaded-index";

export interface WriterStart {
  readonly ring: RingBuffers;
  readonly blockSize: number;
  readonly backend: Config["index"]["backend"];
  readonly budgetBytes: number;
  readonly sequencer: Partial<
    Pick<
      SequencerOptions,
      | "replayTimeoutMs"
      | "replayDeadlineMs"
      | "replayBufferBytes"
      | "replayCooldownMs"
      | "idleProbeMs"
    >
  >;
  /** `index.lora_adapters` (how LoRA ids name adapters). */
  readonly loraAdapters?: readonly LoraAdapter[];
  readonly logLevel: Config["server"]["log_level"];
  /**
   * Readers on other threads (route lookups) at most: the index is then the crtc in
   * shared memory (src/index/crtc/shared.ts) and its descriptor is posted at start;
   * 0 = a private index of `backend`.
   */
  readonly sharedReaders: number;
  /** Where the main thread answers a slot asked for (`SlotAnswer`). */
  readonly slotAnswers: SharedArrayBuffer;
}

/**
 * The main thread's answer to the writer's last `slot` message, in shared memory (the
 * writer waits on it): Int32 words [seq answered, slot], then the slot's generation as a
 * float64 at byte 8.
 */
export class SlotAnswer {
  static readonly BYTES = 16;
  readonly words: Int32Array;
  readonly generation: Float64Array;

  constructor(readonly buffer: SharedArrayBuffer) {
    this.words = new Int32Array(buffer, 0, 2);
    this.generation = new Float64Array(buffer, 8, 1);
  }

  /** The main thread's side: the answer to ask `seq`, then a wake. */
  answer(seq: number, slot: number, generation: number): void {
    this.generation[0] = generation;
    this.words[1] = slot;
    Atomics.store(this.words, 0, seq);
    Atomics.notify(this.words, 0);
  }

  /** The writer's side: waits up to `ms` for the answer to `seq`; false on a timeout. */
  wait(seq: number, ms: number): boolean {
    const deadline = performance.now() + ms;
    for (;;) {
      const answered = Atomics.load(this.words, 0);
      if (answered === seq) return true;
      const left = deadline - performance.now();
      if (left <= 0 || Atomics.wait(this.words, 0, answered, left) === "timed-out") return false;
    }
  }
}

/** How long the writer waits for a slot (the main thread stuck this long is a fault). */
const SLOT_WAIT_MS = 10_000;

/** CONTROL records' payloads (JSON; ids as decimal text). */
export type WriterControl =
  | {
      readonly op: "add";
      readonly workerId: string;
      readonly dpRank: number;
      readonly replay: boolean;
      /** Tells this stream from an earlier one of the same id (the main thread's count). */
      readonly serial: number;
      /** The configured rank's slot and generation in the main thread's table (-1: none). */
      readonly slot: number;
      readonly generation: number;
    }
  | { readonly op: "remove" }
  | {
      readonly op: "restore";
      readonly last: number;
      readonly print: number;
      readonly degraded: boolean;
      readonly ranks: number[];
    }
  | { readonly op: "dump" }
  /**
   * The main thread ended these slots' lives: their blocks go from the index (with
   * `workerId`, every dp rank of that worker's, as a removed worker's), they leave this
   * table, and the answer (`released`) lets the main thread give them out again.
   */
  | { readonly op: "release"; readonly workerId: string | null; readonly slots: number[] }
  | { readonly op: "stop" };

/** One stream as the main thread mirrors it. */
export interface StreamStatus {
  readonly stream: number;
  readonly lastSeq: number;
  readonly lastFingerprint: number;
  /** Lost or unknown events, or stores refused at the memory budget. */
  readonly degraded: boolean;
  /** Why, in words (null when not degraded). */
  readonly degradedReason: string | null;
  readonly ranks: number[];
  readonly sequencer: SequencerCounters;
  readonly normalizer: NormalizeCounters;
  readonly applyErrors: number;
  /** Ring records of this stream dropped at the socket thread (LOSS records). */
  readonly ringLosses: number;
}

export type WriterToMain =
  | {
      readonly t: "replay";
      readonly stream: number;
      readonly start: number;
      readonly generation: number;
    }
  | { readonly t: "cancel"; readonly stream: number }
  /** A rank first seen in stream `stream` (of `serial`) needs a slot: answered in `SlotAnswer`. */
  | {
      readonly t: "slot";
      readonly stream: number;
      readonly serial: number;
      readonly dpRank: number;
      readonly seq: number;
    }
  | { readonly t: "released"; readonly slots: number[] }
  | { readonly t: "status"; readonly streams: StreamStatus[]; readonly index: IndexStatus }
  | { readonly t: "dump"; readonly ops: IndexOp[] }
  | { readonly t: "stopped" }
  | { readonly t: "index"; readonly descriptor: SharedIndexDescriptor };

interface Stream {
  readonly engine: EngineStream;
  /** The replay asked for last; replies of another are stale. */
  generation: number;
  ringLosses: number;
  /** Slots with stores refused at the budget (degraded until cleared). */
  readonly incomplete: Set<number>;
}

const decoder = new TextDecoder();

export class IndexWriter {
  /** The main thread's numbering, as far as this thread's streams use it. */
  readonly table = new WorkerTable(SLOT_LIMIT, "follower");
  readonly index: KvIndex;
  private readonly shared: SharedIndex | null;
  private readonly budget: IndexBudget;
  private readonly streams: (Stream | undefined)[] = [];
  private readonly touched = new Set<number>();
  private readonly consumer: RingConsumer;
  private readonly log: Logger;
  private readonly lora: LoraAdapters;
  private publishing = false;
  /** The index changed without a stream's record (a worker removed). */
  private indexChanged = false;
  private stopped = false;
  /** Records that named no stream, or stale replay replies: skipped. */
  skipped = 0;
  private readonly slotAnswer: SlotAnswer;
  private slotAsks = 0;

  constructor(
    private readonly start: WriterStart,
    private readonly send: (message: WriterToMain) => void,
  ) {
    this.log = createLogger({ level: start.logLevel }).child({ component: "writer" });
    this.lora = new LoraAdapters(start.loraAdapters ?? []);
    this.shared =
      start.sharedReaders > 0
        ? createSharedIndex(start.blockSize, {
            workers: this.table,
            budgetBytes: start.budgetBytes,
            maxReaders: start.sharedReaders,
          })
        : null;
    this.index =
      this.shared?.index ?? createIndex(start.backend, start.blockSize, { workers: this.table });
    this.budget = new IndexBudget(this.index, start.budgetBytes);
    this.consumer = new RingConsumer(start.ring);
    this.slotAnswer = new SlotAnswer(start.slotAnswers);
  }

  /** Posts the shared index's descriptor (if shared), then drains and sleeps until stopped. */
  run(): Promise<void> {
    if (this.shared !== null) this.send({ t: "index", descriptor: this.shared.descriptor });
    return this.consumer.run(
      (kind, stream, generation, seq, payload) => {
        this.record(kind, stream, generation, seq, payload);
      },
      () => {
        // Between events: what waited for readers that have left goes back.
        this.shared?.settle();
        this.publish();
        return this.stopped;
      },
      (bytes) => this.corrupt(bytes),
    );
  }

  private record(
    kind: RecordKind,
    id: number,
    generation: number,
    seq: number,
    payload: Uint8Array,
  ): void {
    if (kind === RecordKind.CONTROL) {
      return this.control(id, JSON.parse(decoder.decode(payload)) as WriterControl);
    }
    const stream = this.streams[id];
    if (stream === undefined) {
      this.skipped++;
      return;
    }
    this.touched.add(id);
    const engine = stream.engine;
    switch (kind) {
      case RecordKind.LIVE:
        return engine.live(seq, payload);
      case RecordKind.CONNECTED:
        return engine.connected();
      case RecordKind.SKIPPED:
        return engine.skipped();
      case RecordKind.LOSS:
        // Batches or replay replies dropped at a full ring (never a connect: those wait).
        // A replay that lost replies has failed; otherwise what the engine holds is
        // unknown, as after a reconnect: the connect probe (or, without replay, the
        // degraded state) establishes it again. A failed replay asks nothing again, so
        // a replay too large for the ring cannot loop.
        stream.ringLosses += seq;
        if (engine.sequencer.isReplaying) return engine.replayFailed("the event ring was full");
        return engine.connected();
      default:
        if (generation !== stream.generation) {
          this.skipped++;
          return;
        }
        if (kind === RecordKind.REPLAY) return engine.replayBatch(seq, payload);
        if (kind === RecordKind.REPLAY_END) return engine.replayEnd();
        if (kind === RecordKind.REPLAY_FAILED) return engine.replayFailed("malformed reply");
        this.skipped++;
    }
  }

  private control(id: number, control: WriterControl): void {
    switch (control.op) {
      case "add":
        return this.add(id, control);
      case "remove":
        return this.remove(id);
      case "restore":
        this.streams[id]?.engine.restore({
          lastSeq: control.last,
          fingerprint: control.print,
          degraded: control.degraded,
          ranks: control.ranks,
        });
        this.touched.add(id);
        return;
      case "dump":
        return this.send({ t: "dump", ops: this.index.dump() });
      case "release":
        return this.release(control.workerId, control.slots);
      case "stop":
        for (const stream of this.streams) stream?.engine.close();
        this.stopped = true;
        this.publish();
        this.send({ t: "stopped" });
    }
  }

  /** The main thread ended these slots' lives (see the `release` record). */
  private release(workerId: string | null, slots: number[]): void {
    if (workerId !== null) this.index.removeWorker(BigInt(workerId));
    for (const slot of slots) {
      if (!this.table.isLive(slot)) continue;
      this.index.dropSlot(slot);
      this.table.release(slot);
    }
    this.indexChanged = true;
    this.send({ t: "released", slots });
  }

  /**
   * The main thread's slot for a rank of stream `id` this table does not know: asked,
   * then waited for (the rank's first operation is written in it). -1 when the main
   * thread refuses (the stream was removed there) or does not answer in time.
   */
  private slotOf(id: number, serial: number, workerId: bigint, dpRank: number): number {
    const known = this.table.find(workerId, dpRank);
    if (known >= 0) return known;
    const seq = ++this.slotAsks;
    this.send({ t: "slot", stream: id, serial, dpRank, seq });
    if (!this.slotAnswer.wait(seq, SLOT_WAIT_MS)) {
      this.log.error("no slot from the main thread in time: the rank's operations are refused", {
        worker_id: workerId,
        dp_rank: dpRank,
      });
      return -1;
    }
    const slot = this.slotAnswer.words[1]!;
    if (slot >= 0) this.table.adopt(slot, workerId, dpRank, this.slotAnswer.generation[0]!);
    return slot;
  }

  private add(id: number, control: Extract<WriterControl, { op: "add" }>): void {
    const identity = { workerId: BigInt(control.workerId), dpRank: control.dpRank };
    if (control.slot >= 0 && this.table.find(identity.workerId, identity.dpRank) < 0)
      this.table.adopt(control.slot, identity.workerId, identity.dpRank, control.generation);
    const incomplete = new Set<number>();
    const budgeted = budgetedSink(this.index, this.budget, this.table, {
      refused: (slot, blocks) => {
        this.budget.refuse(blocks);
        if (!incomplete.has(slot))
          this.log.warn("index memory budget reached: stores refused", {
            slot,
          });
        incomplete.add(slot);
        this.touched.add(id);
      },
      cleared: (slot) => {
        if (incomplete.delete(slot)) this.touched.add(id);
      },
    });
    const acquire = (workerId: bigint, dpRank: number) =>
      this.slotOf(id, control.serial, workerId, dpRank);
    const sink = { ...budgeted, acquire };
    let stream: Stream | null = null;
    const engine = new EngineStream(
      identity,
      {
        requestReplay: control.replay
          ? (start) => {
              stream!.generation++;
              this.send({ t: "replay", stream: id, start, generation: stream!.generation });
            }
          : undefined,
        cancelReplay: () => this.send({ t: "cancel", stream: id }),
      },
      {
        blockSize: this.start.blockSize,
        sink,
        lora: this.lora,
        log: this.log.child({ worker_id: identity.workerId, dp_rank: identity.dpRank }),
        sequencer: this.start.sequencer,
        onChange: () => this.changed(id),
      },
    );
    stream = { engine, generation: 0, ringLosses: 0, incomplete };
    this.streams[id] = stream;
    this.touched.add(id);
  }

  private remove(id: number): void {
    const stream = this.streams[id];
    if (stream === undefined) return;
    stream.engine.close();
    this.streams[id] = undefined;
    this.touched.delete(id);
  }

  /** Every stream lost what was in a corrupt stretch of the ring: unknown, as after a reconnect. */
  private corrupt(bytes: number): void {
    this.log.error("corrupt event ring record: every stream treated as reconnected", { bytes });
    this.streams.forEach((stream, id) => {
      if (stream === undefined) return;
      stream.engine.connected();
      this.touched.add(id);
    });
  }

  /** A change outside a drain (a replay timer): published on the next turn. */
  private changed(id: number): void {
    this.touched.add(id);
    if (this.publishing) return;
    this.publishing = true;
    setImmediate(() => this.publish());
  }

  private publish(): void {
    this.publishing = false;
    if (this.touched.size === 0 && !this.indexChanged) return;
    const streams: StreamStatus[] = [];
    for (const id of this.touched) {
      const stream = this.streams[id];
      if (stream !== undefined) streams.push(statusOf(id, stream));
    }
    this.touched.clear();
    this.indexChanged = false;
    const index: IndexStatus = {
      counters: this.index.counters,
      stats: this.index.stats(),
      workers: this.index.workers(),
      refusedEvents: this.budget.refusedEvents,
      refusedBlocks: this.budget.refusedBlocks,
      slots: this.table.liveCount,
    };
    this.send({ t: "status", streams, index });
  }
}

function statusOf(id: number, stream: Stream): StreamStatus {
  const { sequencer, normalizer } = stream.engine;
  return {
    stream: id,
    lastSeq: sequencer.lastSeq,
    lastFingerprint: sequencer.lastFingerprint,
    degraded: sequencer.isDegraded || stream.incomplete.size > 0,
    degradedReason:
      sequencer.degradedReason ?? (stream.incomplete.size > 0 ? BUDGET_REFUSAL : null),
    ranks: stream.engine.ranks,
    sequencer: sequencer.counters,
    normalizer: normalizer.counters,
    applyErrors: stream.engine.counters.applyErrors,
    ringLosses: stream.ringLosses,
  };
}
