/**
 * The bus's messages, in a compact binary form of our own (little-endian): one header,
 * then what the kind carries. README.md in this folder has the layout and the rules.
 *
 * Facts name workers by identity (worker id, dp rank) through a dictionary at the end
 * of the message (slots are each process's own numbering) and requests by their id.
 * A reader checks a whole message before anything is applied (`checkFacts`), so a bad
 * message is dropped whole, never half applied.
 */
import type { EndReason } from "../route/load";
import { u64 } from "../util/u64";

export const MAGIC = 0x6b; // "k"
export const VERSION = 1;

export const KIND = { facts: 1, heartbeat: 2, snapshot: 3, sync: 4 } as const;
export type Kind = (typeof KIND)[keyof typeof KIND];
export const FACT = {
  routed: 1,
  prefillDone: 2,
  ended: 3,
  routedFlat: 4,
  decodeTotal: 5,
  predicted: 6,
  corrected: 7,
  predictedOlder: 8,
} as const;
export const END_REASONS: readonly EndReason[] = ["done", "expired", "evicted", "worker_removed"];
const REASON_CODES: Record<EndReason, number> = {
  done: 0,
  expired: 1,
  evicted: 2,
  worker_removed: 3,
};
/** SNAPSHOT flag: the last chunk of a snapshot (it lists the sender's peers). */
export const LAST_CHUNK = 1;
/** HEARTBEAT flag: the sender is shutting down (drop its requests now, not after the lease). */
export const LEAVING = 2;
/** SYNC flag: the asker is joining and takes predictions (the first replica by id sends its own). */
export const WITH_PREDICTIONS = 4;

/** Largest message written or read (NATS's default max_payload). */
export const MESSAGE_BYTES_MAX = 1024 * 1024;
/**
 * A routed fact carries at most this many blocks of its chain (its prefix: 128 KiB), a
 * predicted fact at most this many new blocks (the first of them: 128 KiB).
 */
export const CHAIN_BLOCKS_MAX = 16_384;
/** PREDICTED flag: the blocks follow an anchor (a block the sender held already). */
const ANCHORED = 1;
/** CORRECTED flags: a shortfall (else a surplus); the block its purge is bounded by follows. */
const SHORTFALL = 1;
const NAMED = 2;
/** Replica ids: what a NATS client name and a log line can carry as they are. */
export const REPLICA_ID = /^[A-Za-z0-9._-]{1,64}$/;
const FIXED_HEADER = 25;

/** Where a message's own fields begin, after the header of `replicaId`. */
export function bodyOffset(replicaId: string): number {
  return FIXED_HEADER + replicaId.length;
}

if (new Uint8Array(new Uint32Array([1]).buffer)[0] !== 1)
  throw new Error("the cluster codec copies chains as little-endian words");

export interface Header {
  readonly kind: Kind;
  readonly flags: number;
  readonly epoch: number;
  readonly seq: number;
  readonly sentAtMs: number;
  readonly replicaId: string;
  /** Where the kind's own fields begin. */
  readonly bodyAt: number;
}

/** A message that cannot be read: why (a metrics label). */
export class BadMessage extends Error {
  override readonly name = "BadMessage";
}

/** The header of `bytes`; throws BadMessage. */
export function readHeader(bytes: Uint8Array): Header {
  if (bytes.length > MESSAGE_BYTES_MAX) throw new BadMessage("oversized");
  if (bytes.length < FIXED_HEADER) throw new BadMessage("truncated");
  if (bytes[0] !== MAGIC) throw new BadMessage("not_kvedge");
  if (bytes[1] !== VERSION) throw new BadMessage("version");
  const kind = bytes[2]!;
  if (kind < KIND.facts || kind > KIND.sync) throw new BadMessage("kind");
  const view = viewOf(bytes);
  const epoch = view.getUint32(4, true);
  const seq = view.getFloat64(8, true);
  const sentAtMs = view.getFloat64(16, true);
  if (epoch === 0 || !Number.isSafeInteger(seq) || seq < 0 || !Number.isFinite(sentAtMs))
    throw new BadMessage("header");
  const idLength = bytes[24]!;
  if (FIXED_HEADER + idLength > bytes.length) throw new BadMessage("truncated");
  const replicaId = latin1(bytes, FIXED_HEADER, idLength);
  if (!REPLICA_ID.test(replicaId)) throw new BadMessage("replica_id");
  return {
    kind: kind as Kind,
    flags: bytes[3]!,
    epoch,
    seq,
    sentAtMs,
    replicaId,
    bodyAt: FIXED_HEADER + idLength,
  };
}

/** What a facts-carrying message (FACTS, SNAPSHOT) applies, fact by fact. */
export interface FactVisitor {
  /** The workers the facts name, before the first fact. */
  begin(workers: WorkerDictionary): void;
  /**
   * `worker` indexes the message's dictionary. With its chain (`decodeBlocks` null;
   * `chain` valid during the call), or without (`blocks` 0) and the decode blocks its
   * origin counted it adding.
   */
  routed(
    handle: number,
    worker: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    decodeBlocks: number | null,
  ): void;
  prefillDone(handle: number): void;
  /** `freed`: the decode blocks it held that no other request of its origin holds. */
  ended(handle: number, reason: EndReason, freed: number): void;
  /** All the decode blocks the origin's chainless requests add on `worker` now (snapshots). */
  decodeTotal(worker: number, blocks: number): void;
  /**
   * The origin predicted (or refreshed) blocks on the approximate `worker`: `count` blocks
   * by their local hashes after the anchor block (by its sequence hash; `anchored`
   * false: from the root). `local` valid during the call.
   */
  predicted(
    worker: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): void;
  /** The origin corrected its predictions of `worker` (`PredictionShare.corrected`). */
  corrected(worker: number, shortfall: boolean, named: boolean, hi: number, lo: number): void;
  /**
   * Snapshots for a joining replica: a run of the origin's predictions of `worker`, its
   * set walked newest first, as `predicted` names blocks; its first block used `ageMs` ago.
   */
  predictedOlder(
    worker: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
    ageMs: number,
  ): void;
}

/** The workers a message's facts name, by dictionary index. */
export interface WorkerDictionary {
  readonly ids: bigint[];
  readonly ranks: number[];
}

function viewOf(bytes: Uint8Array): DataView {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function latin1(bytes: Uint8Array, at: number, length: number): string {
  return String.fromCharCode.apply(null, bytes.subarray(at, at + length) as unknown as number[]);
}

/**
 * Reads the facts section that starts at `at` (u32 dictionary offset, u32 fact count,
 * the facts, the dictionary). With `visitor` null it only checks (throws BadMessage);
 * with one it applies every fact (call it on a checked message only). Returns the
 * dictionary and where the bytes after it begin.
 */
export class FactReader {
  private chain = new Uint32Array(256);
  private local = new Uint32Array(256);

  read(
    bytes: Uint8Array,
    at: number,
    visitor: FactVisitor | null,
  ): { workers: WorkerDictionary; end: number } {
    const view = viewOf(bytes);
    if (at + 8 > bytes.length) throw new BadMessage("truncated");
    const dictAt = view.getUint32(at, true);
    const count = view.getUint32(at + 4, true);
    if (dictAt > bytes.length || dictAt < at + 8) throw new BadMessage("dictionary");
    const workers = readDictionary(bytes, view, dictAt);
    visitor?.begin(workers);
    let p = at + 8;
    for (let i = 0; i < count; i++) p = this.fact(bytes, view, p, dictAt, workers, visitor);
    if (p !== dictAt) throw new BadMessage("facts");
    return { workers, end: dictAt + 2 + 12 * workers.ids.length };
  }

  private fact(
    bytes: Uint8Array,
    view: DataView,
    p: number,
    limit: number,
    workers: WorkerDictionary,
    visitor: FactVisitor | null,
  ): number {
    if (p + 1 > limit) throw new BadMessage("truncated");
    const type = bytes[p]!;
    if (type === FACT.decodeTotal) {
      if (p + 7 > limit) throw new BadMessage("truncated");
      const worker = view.getUint16(p + 1, true);
      if (worker >= workers.ids.length) throw new BadMessage("worker");
      visitor?.decodeTotal(worker, view.getUint32(p + 3, true));
      return p + 7;
    }
    if (type === FACT.predicted || type === FACT.predictedOlder)
      return this.predicted(
        bytes,
        view,
        p + 1,
        limit,
        workers,
        visitor,
        type === FACT.predictedOlder,
      );
    if (type === FACT.corrected) return corrected(bytes, view, p + 1, limit, workers, visitor);
    if (p + 5 > limit) throw new BadMessage("truncated");
    const id = view.getUint32(p + 1, true);
    if (id === 0) throw new BadMessage("handle");
    p += 5;
    if (type === FACT.routed) return this.routed(bytes, view, p, limit, id, workers, visitor);
    if (type === FACT.routedFlat) return routedFlat(view, p, limit, id, workers, visitor);
    if (type === FACT.prefillDone) {
      visitor?.prefillDone(id);
      return p;
    }
    if (type !== FACT.ended) throw new BadMessage("fact_type");
    if (p + 5 > limit) throw new BadMessage("truncated");
    const reason = END_REASONS[bytes[p]!];
    if (reason === undefined) throw new BadMessage("end_reason");
    visitor?.ended(id, reason, view.getUint32(p + 1, true));
    return p + 5;
  }

  private routed(
    bytes: Uint8Array,
    view: DataView,
    p: number,
    limit: number,
    id: number,
    workers: WorkerDictionary,
    visitor: FactVisitor | null,
  ): number {
    if (p + 14 > limit) throw new BadMessage("truncated");
    const worker = view.getUint16(p, true);
    const prefill = view.getUint32(p + 2, true);
    const output = view.getUint32(p + 6, true);
    const blocks = view.getUint32(p + 10, true);
    if (worker >= workers.ids.length) throw new BadMessage("worker");
    if (blocks > CHAIN_BLOCKS_MAX) throw new BadMessage("chain");
    const chainAt = p + 14;
    const end = chainAt + 8 * blocks;
    if (end > limit) throw new BadMessage("truncated");
    if (visitor === null) return end;
    if (this.chain.length < 2 * blocks) this.chain = new Uint32Array(2 * blocks);
    new Uint8Array(this.chain.buffer).set(bytes.subarray(chainAt, end));
    visitor.routed(id, worker, this.chain, blocks, prefill, output, null);
    return end;
  }

  /**
   * A predicted (or, `older`, predicted-older) fact after its type: worker, flags, count,
   * (older: the age in ms), the anchor if any, the local hashes.
   */
  private predicted(
    bytes: Uint8Array,
    view: DataView,
    p: number,
    limit: number,
    workers: WorkerDictionary,
    visitor: FactVisitor | null,
    older: boolean,
  ): number {
    const fixed = older ? 15 : 7;
    if (p + fixed > limit) throw new BadMessage("truncated");
    const worker = view.getUint16(p, true);
    const flags = bytes[p + 2]!;
    const count = view.getUint32(p + 3, true);
    const ageMs = older ? view.getFloat64(p + 7, true) : 0;
    if (worker >= workers.ids.length) throw new BadMessage("worker");
    if (flags > ANCHORED || !(ageMs >= 0 && Number.isFinite(ageMs))) throw new BadMessage("flags");
    if (count > CHAIN_BLOCKS_MAX) throw new BadMessage("chain");
    const anchored = flags === ANCHORED;
    const anchorAt = p + fixed;
    const localAt = anchorAt + (anchored ? 8 : 0);
    const end = localAt + 8 * count;
    if (end > limit) throw new BadMessage("truncated");
    if (count === 0 && (older || !anchored)) throw new BadMessage("empty_prediction");
    if (visitor === null) return end;
    const anchorHi = anchored ? view.getUint32(anchorAt, true) : 0;
    const anchorLo = anchored ? view.getUint32(anchorAt + 4, true) : 0;
    if (this.local.length < 2 * count) this.local = new Uint32Array(2 * count);
    new Uint8Array(this.local.buffer).set(bytes.subarray(localAt, end));
    if (older)
      visitor.predictedOlder(worker, anchored, anchorHi, anchorLo, this.local, count, ageMs);
    else visitor.predicted(worker, anchored, anchorHi, anchorLo, this.local, count);
    return end;
  }
}

const NO_CHAIN = new Uint32Array(0);

/** A corrected fact after its type: worker, flags, the named block's sequence hash (when named). */
function corrected(
  bytes: Uint8Array,
  view: DataView,
  p: number,
  limit: number,
  workers: WorkerDictionary,
  visitor: FactVisitor | null,
): number {
  if (p + 3 > limit) throw new BadMessage("truncated");
  const worker = view.getUint16(p, true);
  const flags = bytes[p + 2]!;
  if (worker >= workers.ids.length) throw new BadMessage("worker");
  // Only a shortfall purges: a surplus names no block.
  if (flags > (SHORTFALL | NAMED) || flags === NAMED) throw new BadMessage("correction");
  const named = (flags & NAMED) !== 0;
  const end = p + 3 + (named ? 8 : 0);
  if (end > limit) throw new BadMessage("truncated");
  const hi = named ? view.getUint32(p + 3, true) : 0;
  const lo = named ? view.getUint32(p + 7, true) : 0;
  visitor?.corrected(worker, (flags & SHORTFALL) !== 0, named, hi, lo);
  return end;
}

/** A routed fact without a chain: worker, prefill tokens, output blocks, decode blocks. */
function routedFlat(
  view: DataView,
  p: number,
  limit: number,
  id: number,
  workers: WorkerDictionary,
  visitor: FactVisitor | null,
): number {
  if (p + 14 > limit) throw new BadMessage("truncated");
  const worker = view.getUint16(p, true);
  if (worker >= workers.ids.length) throw new BadMessage("worker");
  const prefill = view.getUint32(p + 2, true);
  const output = view.getUint32(p + 6, true);
  const decode = view.getUint32(p + 10, true);
  visitor?.routed(id, worker, NO_CHAIN, 0, prefill, output, decode);
  return p + 14;
}

function readDictionary(bytes: Uint8Array, view: DataView, at: number): WorkerDictionary {
  if (at + 2 > bytes.length) throw new BadMessage("truncated");
  const count = view.getUint16(at, true);
  if (at + 2 + 12 * count > bytes.length) throw new BadMessage("truncated");
  const ids: bigint[] = [];
  const ranks: number[] = [];
  for (let i = 0, p = at + 2; i < count; i++, p += 12) {
    ids.push(u64(view.getUint32(p, true), view.getUint32(p + 4, true)));
    ranks.push(view.getUint32(p + 8, true));
  }
  return { ids, ranks };
}

/** Who a slot is, for the dictionary (the core's worker table). */
export interface WorkerIdentity {
  workerIdOf(slot: number): bigint;
  readonly dpRanks: ArrayLike<number>;
  /** Per slot, a stamp that changes when the slot is given to another worker. */
  readonly generation: ArrayLike<number>;
}

/**
 * Writes one message: the header, the kind's fields, then (FACTS, SNAPSHOT) facts as
 * they come and the dictionary of the workers they name. `finish` copies the message
 * out (a published array is the client's until it is sent: never reused) and starts over.
 */
export class MessageEncoder {
  private bytes = new Uint8Array(64 * 1024);
  private view = new DataView(this.bytes.buffer);
  /** Bytes written. */
  length = 0;
  /** Facts written since `begin`. */
  facts = 0;
  private factsAt = -1;
  /** The message's dictionary: its slots in order, their entries already encoded. */
  private readonly dictSlot: number[] = [];
  private readonly dictGeneration: number[] = [];
  private dictBytes = new Uint8Array(12 * 64);
  private dictView = new DataView(this.dictBytes.buffer);
  private dictOf = new Int32Array(0);
  /** Per slot, its worker id's words as last read (for the slot's generation `idGeneration`). */
  private idHi: Uint32Array = new Uint32Array(0);
  private idLo: Uint32Array = new Uint32Array(0);
  private idGeneration = new Float64Array(0);

  constructor(
    private readonly replicaId: string,
    private readonly epoch: number,
    private readonly workers: WorkerIdentity | null,
  ) {
    if (!REPLICA_ID.test(replicaId)) throw new RangeError(`bad replica id '${replicaId}'`);
    if (!(Number.isInteger(epoch) && epoch > 0 && epoch <= 0xffff_ffff))
      throw new RangeError(`bad epoch ${epoch}`);
  }

  /** Starts a message of `kind`; its seq and time are written by `finish`. */
  begin(kind: Kind, flags = 0): void {
    this.clearDictionary();
    this.length = 0;
    this.facts = 0;
    this.factsAt = -1;
    this.ensure(FIXED_HEADER + this.replicaId.length);
    const bytes = this.bytes;
    bytes[0] = MAGIC;
    bytes[1] = VERSION;
    bytes[2] = kind;
    bytes[3] = flags;
    this.view.setUint32(4, this.epoch, true);
    bytes[24] = this.replicaId.length;
    for (let i = 0; i < this.replicaId.length; i++)
      bytes[FIXED_HEADER + i] = this.replicaId.charCodeAt(i);
    this.length = FIXED_HEADER + this.replicaId.length;
  }

  u8(value: number): void {
    this.ensure(1);
    this.bytes[this.length++] = value;
  }

  u32(value: number): void {
    this.ensure(4);
    this.view.setUint32(this.length, value, true);
    this.length += 4;
  }

  /** A short ASCII string (a replica id): u8 length, then its bytes. */
  shortText(text: string): void {
    this.u8(text.length);
    this.ensure(text.length);
    for (let i = 0; i < text.length; i++) this.bytes[this.length++] = text.charCodeAt(i) & 0xff;
  }

  /** Opens the facts section (after the kind's own fields). */
  beginFacts(): void {
    this.factsAt = this.length;
    this.u32(0);
    this.u32(0);
  }

  routed(
    handle: number,
    slot: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
  ): void {
    const kept = Math.min(blocks, CHAIN_BLOCKS_MAX);
    this.head(FACT.routed, handle);
    this.ensure(14 + 8 * kept);
    const view = this.view;
    view.setUint16(this.length, this.workerIndex(slot), true);
    view.setUint32(this.length + 2, clampU32(prefillTokens), true);
    view.setUint32(this.length + 6, clampU32(outputBlocks), true);
    view.setUint32(this.length + 10, kept, true);
    this.length += 14;
    this.bytes.set(new Uint8Array(chain.buffer, chain.byteOffset, 8 * kept), this.length);
    this.length += 8 * kept;
    this.facts++;
  }

  /** A routed fact without its chain: the decode blocks it added as this replica counted them. */
  routedFlat(
    handle: number,
    slot: number,
    prefillTokens: number,
    outputBlocks: number,
    decodeBlocks: number,
  ): void {
    this.head(FACT.routedFlat, handle);
    this.ensure(14);
    const at = this.length;
    const worker = this.workerIndex(slot);
    this.bytes[at] = worker;
    this.bytes[at + 1] = worker >>> 8;
    this.put32(at + 2, clampU32(prefillTokens));
    this.put32(at + 6, clampU32(outputBlocks));
    this.put32(at + 10, clampU32(decodeBlocks));
    this.length = at + 14;
    this.facts++;
  }

  prefillDone(handle: number): void {
    this.head(FACT.prefillDone, handle);
    this.facts++;
  }

  ended(handle: number, reason: EndReason, freed: number): void {
    this.head(FACT.ended, handle);
    this.ensure(5);
    this.bytes[this.length] = REASON_CODES[reason];
    this.put32(this.length + 1, clampU32(freed));
    this.length += 5;
    this.facts++;
  }

  /** All the decode blocks this replica's chainless requests add on `slot` (snapshots). */
  decodeTotal(slot: number, blocks: number): void {
    this.ensure(7);
    this.bytes[this.length] = FACT.decodeTotal;
    this.view.setUint16(this.length + 1, this.workerIndex(slot), true);
    this.view.setUint32(this.length + 3, clampU32(blocks), true);
    this.length += 7;
    this.facts++;
  }

  /**
   * A prediction (or refresh) on `slot`: blocks [held, count) of the chain by their local
   * hashes, after block held − 1 by its sequence hash (the sender held [0, held) already).
   * At most CHAIN_BLOCKS_MAX new blocks are written (a prediction's prefix is one too);
   * returns how many were.
   */
  predicted(
    slot: number,
    local: Uint32Array,
    chain: Uint32Array,
    held: number,
    count: number,
  ): number {
    const kept = Math.min(count - held, CHAIN_BLOCKS_MAX);
    const anchored = held > 0;
    this.ensure(8 + (anchored ? 8 : 0) + 8 * kept);
    const at = this.length;
    const worker = this.workerIndex(slot);
    this.bytes[at] = FACT.predicted;
    this.bytes[at + 1] = worker;
    this.bytes[at + 2] = worker >>> 8;
    this.bytes[at + 3] = anchored ? ANCHORED : 0;
    this.put32(at + 4, kept);
    let p = at + 8;
    if (anchored) {
      this.put32(p, chain[2 * held - 2]!);
      this.put32(p + 4, chain[2 * held - 1]!);
      p += 8;
    }
    this.bytes.set(new Uint8Array(local.buffer, local.byteOffset + 8 * held, 8 * kept), p);
    this.length = p + 8 * kept;
    this.facts++;
    return kept;
  }

  /**
   * A run of this replica's predictions on `slot` for a joining replica's snapshot:
   * `count` blocks by their local hashes (at most CHAIN_BLOCKS_MAX) after the anchor,
   * the first used `ageMs` ago.
   */
  predictedOlder(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
    ageMs: number,
  ): void {
    if (count < 1 || count > CHAIN_BLOCKS_MAX) throw new RangeError(`bad run of ${count} blocks`);
    this.ensure(16 + (anchored ? 8 : 0) + 8 * count);
    const at = this.length;
    const worker = this.workerIndex(slot);
    this.bytes[at] = FACT.predictedOlder;
    this.bytes[at + 1] = worker;
    this.bytes[at + 2] = worker >>> 8;
    this.bytes[at + 3] = anchored ? ANCHORED : 0;
    this.put32(at + 4, count);
    this.view.setFloat64(at + 8, Math.max(0, ageMs), true);
    let p = at + 16;
    if (anchored) {
      this.put32(p, anchorHi);
      this.put32(p + 4, anchorLo);
      p += 8;
    }
    this.bytes.set(new Uint8Array(local.buffer, local.byteOffset, 8 * count), p);
    this.length = p + 8 * count;
    this.facts++;
  }

  /** A correction of the predictions on `slot` (`PredictionShare.corrected`). */
  corrected(slot: number, shortfall: boolean, named: boolean, hi: number, lo: number): void {
    const block = shortfall && named;
    this.ensure(12);
    const at = this.length;
    const worker = this.workerIndex(slot);
    this.bytes[at] = FACT.corrected;
    this.bytes[at + 1] = worker;
    this.bytes[at + 2] = worker >>> 8;
    this.bytes[at + 3] = (shortfall ? SHORTFALL : 0) | (block ? NAMED : 0);
    if (block) {
      this.put32(at + 4, hi);
      this.put32(at + 8, lo);
    }
    this.length = at + 4 + (block ? 8 : 0);
    this.facts++;
  }

  /** Closes the facts section: the dictionary goes after the facts. */
  endFacts(): void {
    if (this.factsAt < 0) return;
    this.view.setUint32(this.factsAt, this.length, true);
    this.view.setUint32(this.factsAt + 4, this.facts, true);
    const count = this.dictSlot.length;
    this.ensure(2 + 12 * count);
    this.view.setUint16(this.length, count, true);
    this.length += 2;
    this.bytes.set(this.dictBytes.subarray(0, 12 * count), this.length);
    this.length += 12 * count;
    this.factsAt = -1;
  }

  /** The message with its seq and send time, as a fresh array; the encoder is empty after. */
  finish(seq: number, sentAtMs: number): Uint8Array {
    this.endFacts();
    this.view.setFloat64(8, seq, true);
    this.view.setFloat64(16, sentAtMs, true);
    const message = this.bytes.slice(0, this.length);
    this.clearDictionary();
    this.length = 0;
    this.facts = 0;
    return message;
  }

  /** Type byte and the request's handle (u32, never 0). */
  private head(type: number, handle: number): void {
    this.ensure(5);
    this.bytes[this.length] = type;
    this.put32(this.length + 1, handle);
    this.length += 5;
  }

  /** A little-endian u32 at `at` (byte stores: cheaper here than a DataView call). */
  private put32(at: number, value: number): void {
    const bytes = this.bytes;
    bytes[at] = value;
    bytes[at + 1] = value >>> 8;
    bytes[at + 2] = value >>> 16;
    bytes[at + 3] = value >>> 24;
  }

  private workerIndex(slot: number): number {
    const workers = this.workers;
    if (workers === null) throw new Error("a message encoder without workers cannot write facts");
    if (this.dictOf.length <= slot) {
      const grown = new Int32Array(Math.max(64, 2 * (slot + 1))).fill(-1);
      grown.set(this.dictOf);
      this.dictOf = grown;
    }
    const known = this.dictOf[slot]!;
    const generation = workers.generation[slot]!;
    if (known >= 0 && this.dictGeneration[known] === generation) return known;
    const index = this.dictSlot.length;
    if (index > 0xffff) throw new RangeError("more than 65,536 workers in one message");
    this.dictSlot.push(slot);
    this.dictGeneration.push(generation);
    this.dictOf[slot] = index;
    this.dictEntry(index, slot, generation, workers);
    return index;
  }

  /** Entry `index` of the dictionary: the worker id's words (read once per slot's generation) and dp rank. */
  private dictEntry(
    index: number,
    slot: number,
    generation: number,
    workers: WorkerIdentity,
  ): void {
    if (this.idGeneration.length <= slot) {
      const size = Math.max(64, 2 * (slot + 1));
      this.idHi = resizedU32(this.idHi, size);
      this.idLo = resizedU32(this.idLo, size);
      const generations = new Float64Array(size);
      generations.set(this.idGeneration);
      this.idGeneration = generations;
    }
    if (this.idGeneration[slot] !== generation) {
      const id = workers.workerIdOf(slot);
      this.idHi[slot] = Number(id >> 32n);
      this.idLo[slot] = Number(id & 0xffff_ffffn);
      this.idGeneration[slot] = generation;
    }
    if (this.dictBytes.length < 12 * (index + 1)) {
      const grown = new Uint8Array(2 * this.dictBytes.length);
      grown.set(this.dictBytes);
      this.dictBytes = grown;
      this.dictView = new DataView(grown.buffer);
    }
    const at = 12 * index;
    this.dictView.setUint32(at, this.idHi[slot]!, true);
    this.dictView.setUint32(at + 4, this.idLo[slot]!, true);
    this.dictView.setUint32(at + 8, workers.dpRanks[slot]!, true);
  }

  private clearDictionary(): void {
    for (const slot of this.dictSlot) this.dictOf[slot] = -1;
    this.dictSlot.length = 0;
    this.dictGeneration.length = 0;
  }

  private ensure(extra: number): void {
    if (this.length + extra <= this.bytes.length) return;
    let size = this.bytes.length;
    while (size < this.length + extra) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.bytes.subarray(0, this.length));
    this.bytes = grown;
    this.view = new DataView(grown.buffer);
  }
}

function resizedU32(old: Uint32Array, size: number): Uint32Array {
  const fresh = new Uint32Array(size);
  fresh.set(old);
  return fresh;
}

function clampU32(value: number): number {
  return value >= 0xffff_ffff ? 0xffff_ffff : value > 0 ? Math.round(value) : 0;
}
