/**
 * dump(): the events that rebuild an equal index (same workers, same held blocks under
 * the same external hashes) when applied in order to a fresh one. Shared by every
 * backend: the index is frozen and packed into operation words (./pack.ts: per worker
 * its held blocks in depth-first order, chained, placeholders through holes), and this
 * file reads those words as events, either as objects (`dump()`) or as NDJSON bytes
 * written straight from the words (`DumpText`, for `GET /v1/dump`: no string per
 * entry, a few bytes of garbage per slice).
 *
 * A stored operation longer than DUMP_CHAIN_BLOCKS_MAX blocks is cut into events of at
 * most that many, each after the previous one's last block. Placeholders count down
 * from 2^64 - 1 and skip every hash the worker holds, so they cannot collide with a
 * real block of that worker (and other workers' hashes do not matter: lookups are per
 * worker). A worker present with no blocks is stored and emptied again.
 */
import type { IndexOp, RemovedOp, StoredOp } from "./ops";
import { type FrozenIndex, OP_STORED, OP_TIER_STORED, packIndex } from "./pack";
import { TIER_NAMES } from "./types";
import { u64String } from "../util/u64";

/** Longest stored event a dump writes; a longer chain continues in the next event. */
export const DUMP_CHAIN_BLOCKS_MAX = 4096;

/** The dump of a frozen index as event objects. */
export function dumpEvents(frozen: FrozenIndex, blockSize: number): IndexOp[] {
  const { words, workerIds } = packIndex(frozen);
  const ids = workerIds.map(String);
  const events: IndexOp[] = [];
  const hash = (at: number): string => u64String(words[at]!, words[at + 1]!);
  forEachEvent(words, (kind, at, piece, pieceBlocks) => {
    const workerId = ids[words[at + 1]!]!;
    const dpRank = words[at + 2]!;
    if (kind === OP_TIER_STORED) {
      events.push(tierEvent(words, at, workerId, blockSize));
      return;
    }
    if (kind === OP_STORED) {
      const n = words[at + 6]!;
      const ext = at + 7 + 2 * piece;
      const event: StoredOp = {
        op: "stored",
        worker_id: workerId,
        dp_rank: dpRank,
        parent_block_hash: piece > 0 ? hash(ext - 2) : words[at + 3] === 1 ? hash(at + 4) : null,
        block_hashes: [],
        local_hashes: [],
        block_size: blockSize,
      };
      for (let i = 0; i < pieceBlocks; i++) {
        event.block_hashes.push(hash(ext + 2 * i));
        event.local_hashes!.push(hash(ext + 2 * n + 2 * i));
      }
      events.push(event);
      return;
    }
    const event: RemovedOp = {
      op: "removed",
      worker_id: workerId,
      dp_rank: dpRank,
      block_hashes: [],
    };
    for (let i = 0; i < pieceBlocks; i++) event.block_hashes.push(hash(at + 4 + 2 * i));
    events.push(event);
  });
  return events;
}

/** A lower tier's stored operation (one block, under its parent's sequence hash) as an event. */
function tierEvent(words: Uint32Array, at: number, workerId: string, blockSize: number): StoredOp {
  const hash = (word: number): string => u64String(words[word]!, words[word + 1]!);
  return {
    op: "stored",
    worker_id: workerId,
    dp_rank: words[at + 2]!,
    tier: TIER_NAMES[words[at + 3]!]!,
    parent_block_hash: null,
    parent_sequence_hash: words[at + 4] === 1 ? hash(at + 5) : null,
    block_hashes: [hash(at + 8)],
    local_hashes: [hash(at + 10)],
    block_size: blockSize,
  };
}

/**
 * Calls `visit` for each event of the packed words: the operation at word `at`, and
 * the piece of it (first block, block count) that one event carries.
 */
function forEachEvent(
  words: Uint32Array,
  visit: (kind: number, at: number, piece: number, blocks: number) => void,
): void {
  for (let at = 0; at < words.length; ) {
    const kind = words[at]!;
    const n = kind === OP_STORED ? words[at + 6]! : kind === OP_TIER_STORED ? 1 : words[at + 3]!;
    for (let piece = 0; piece < n || (piece === 0 && n === 0); piece += DUMP_CHAIN_BLOCKS_MAX) {
      visit(kind, at, piece, Math.min(DUMP_CHAIN_BLOCKS_MAX, n - piece));
    }
    at = nextOp(words, at);
  }
}

function nextOp(words: Uint32Array, at: number): number {
  if (words[at] === OP_TIER_STORED) return at + 8 + 4 * words[at + 7]!;
  return words[at] === OP_STORED ? at + 7 + 4 * words[at + 6]! : at + 4 + 2 * words[at + 3]!;
}

const ascii = (text: string): Uint8Array => new TextEncoder().encode(text);
const STORED_AFTER_RANK = ascii(',"parent_block_hash":');
const TIER_NAME = TIER_NAMES.map((name) => ascii(`,"tier":"${name}"`));
const PARENT_SEQUENCE = ascii(',"parent_sequence_hash":');
const NULL = ascii("null");
const BLOCK_HASHES = ascii(',"block_hashes":[');
const LOCAL_HASHES = ascii('],"local_hashes":[');
const QUOTE = 0x22;
const COMMA = 0x2c;
/** The longest event in bytes: two lists of u64 strings (up to 23 bytes each with quotes and comma), plus the rest. */
const EVENT_BYTES_MAX = 2 * 23 * DUMP_CHAIN_BLOCKS_MAX + 256;

/**
 * The dump of packed words as NDJSON, the same text as `dump()`'s events through
 * JSON.stringify, written a slice at a time into a byte buffer of its own.
 */
export class DumpText {
  private at = 0;
  private piece = 0;
  private readonly storedHead: Uint8Array[];
  private readonly removedHead: Uint8Array[];
  private readonly tail: Uint8Array;
  private out: Uint8Array;
  private length = 0;

  constructor(
    private readonly words: Uint32Array,
    workerIds: readonly bigint[],
    blockSize: number,
    sliceBytes: number,
  ) {
    // Per worker ref, the bytes up to the dp rank: written once, copied per event.
    this.storedHead = workerIds.map((id) => ascii(`{"op":"stored","worker_id":"${id}","dp_rank":`));
    this.removedHead = workerIds.map((id) =>
      ascii(`{"op":"removed","worker_id":"${id}","dp_rank":`),
    );
    this.tail = ascii(`],"block_size":${blockSize}}\n`);
    this.out = new Uint8Array(sliceBytes + EVENT_BYTES_MAX);
  }

  get done(): boolean {
    return this.at >= this.words.length;
  }

  /**
   * Writes whole events until at least `bytes` are written or `until()` says stop (it
   * is asked every few events); returns a fresh copy of them (empty once done).
   */
  next(bytes: number, until: () => boolean): Uint8Array {
    this.length = 0;
    for (let events = 1; !this.done && this.length < bytes; events++) {
      this.event();
      if (events % 16 === 0 && until()) break;
    }
    return this.out.slice(0, this.length);
  }

  private event(): void {
    const words = this.words;
    const at = this.at;
    if (words[at] === OP_TIER_STORED) {
      this.tierEvent(at);
      return;
    }
    const stored = words[at] === OP_STORED;
    const n = stored ? words[at + 6]! : words[at + 3]!;
    const piece = this.piece;
    const blocks = Math.min(DUMP_CHAIN_BLOCKS_MAX, n - piece);
    const ref = words[at + 1]!;
    this.put((stored ? this.storedHead : this.removedHead)[ref]!);
    this.number(words[at + 2]!);
    if (stored) {
      const ext = at + 7 + 2 * piece;
      this.put(STORED_AFTER_RANK);
      if (piece > 0) this.hash(ext - 2);
      else if (words[at + 3] === 1) this.hash(at + 4);
      else this.put(NULL);
      this.put(BLOCK_HASHES);
      this.hashes(ext, blocks);
      this.put(LOCAL_HASHES);
      this.hashes(ext + 2 * n, blocks);
      this.put(this.tail);
    } else {
      this.put(BLOCK_HASHES);
      this.hashes(at + 4 + 2 * piece, blocks);
      this.put(REMOVED_TAIL);
    }
    this.piece += DUMP_CHAIN_BLOCKS_MAX;
    if (this.piece >= n) {
      this.piece = 0;
      this.at = nextOp(words, at);
    }
  }

  /** A lower tier's one-block store, as tierEvent() writes it. */
  private tierEvent(at: number): void {
    const words = this.words;
    this.put(this.storedHead[words[at + 1]!]!);
    this.number(words[at + 2]!);
    this.put(TIER_NAME[words[at + 3]!]!);
    this.put(STORED_AFTER_RANK);
    this.put(NULL);
    this.put(PARENT_SEQUENCE);
    if (words[at + 4] === 1) this.hash(at + 5);
    else this.put(NULL);
    this.put(BLOCK_HASHES);
    this.hash(at + 8);
    this.put(LOCAL_HASHES);
    this.hash(at + 10);
    this.put(this.tail);
    this.at = nextOp(words, at);
  }

  private hashes(from: number, count: number): void {
    for (let i = 0; i < count; i++) {
      if (i > 0) this.out[this.length++] = COMMA;
      this.hash(from + 2 * i);
    }
  }

  private hash(at: number): void {
    this.out[this.length++] = QUOTE;
    this.length = writeU64(this.out, this.length, this.words[at]!, this.words[at + 1]!);
    this.out[this.length++] = QUOTE;
  }

  private number(value: number): void {
    this.length = writeDigits(this.out, this.length, value);
  }

  private put(bytes: Uint8Array): void {
    this.out.set(bytes, this.length);
    this.length += bytes.length;
  }
}

const REMOVED_TAIL = ascii("]}\n");
const U32 = 0x1_0000_0000;
/** Below 2^21 in the high word, a u64 is exact as a double. */
const HI_EXACT = 0x20_0000;
const MILLION = 1_000_000;

/** Writes the decimal form of the u64 (hi, lo) at `at`; returns the end. */
export function writeU64(out: Uint8Array, at: number, hi: number, lo: number): number {
  if (hi < HI_EXACT) return writeDigits(out, at, hi * U32 + lo);
  // value = upper * 10^6 + low6, each part exact: (hi % 10^6) * 2^32 + lo < 2^53.
  const r = hi % MILLION;
  const t = r * U32 + lo;
  const tq = Math.floor(t / MILLION);
  const low6 = t - tq * MILLION;
  at = writeDigits(out, at, ((hi - r) / MILLION) * U32 + tq);
  for (let p = MILLION / 10; p >= 1; p /= 10) out[at++] = 0x30 + (Math.floor(low6 / p) % 10);
  return at;
}

/** Writes the decimal digits of a non-negative integer below 2^53 at `at`; returns the end. */
function writeDigits(out: Uint8Array, at: number, value: number): number {
  let digits = 1;
  for (let p = 10; p <= value; p *= 10) digits++;
  let rest = value;
  for (let i = digits - 1; i >= 0; i--) {
    const digit = rest % 10;
    out[at + i] = 0x30 + digit;
    rest = (rest - digit) / 10;
  }
  return at + digits;
}
