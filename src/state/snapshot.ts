/**
 * Warm restart: a snapshot of the index and of each engine source's position, written
 * atomically to `state.dir` and loaded at start. No peer has one (Dynamo, llm-d and
 * SGLang rebuild from events only).
 *
 * File `DIR/kvedge.snapshot`, all integers little-endian:
 *
 *   magic "KVEDGE-SNAPSHOT\n" (16 bytes) · version u32 · header bytes u32 · words u32
 *   header: JSON, padded with spaces to a multiple of 4 bytes
 *   words: the index as operations, then the active requests (u32 each):
 *     1 (stored) · worker ref · dp rank · has parent · parent hi · parent lo · n · n × (ext hi, ext lo) · n × (local hi, local lo)
 *     2 (removed) · worker ref · dp rank · n · n × (ext hi, ext lo)
 *     3 (active) · worker ref · dp rank · id length (UTF-16 units) · prefill tokens · output blocks · idle ms · n
 *       · id (two units per word) · n × (chain hi, chain lo)
 *     4 (stored in a lower tier) · worker ref · dp rank · tier · has parent · parent sequence hi · lo · n
 *       · n × (ext hi, ext lo) · n × (local hi, local lo)
 *   checksum (8 bytes): XXH3-64 of the XXH3-64s (u64 each) of the prefix with the header,
 *     then of each CHECK_CHUNK_BYTES of the words (the last piece shorter)
 *
 * Operations 1, 2 and 4 are the events of the index's `dump()`, packed straight from the
 * backend by src/index/pack.ts, so any backend writes and reads the same file. Operation
 * 3 is one active request of the load tracker (src/route/load.ts `forEachActive`).
 * Worker refs index `header.worker_ids`.
 *
 * Writing: temp file in the same directory, written a piece at a time straight from
 * the words (the checksum in pieces is what lets a 160 MB file be hashed without one
 * long step), fsync, rename over the old one, fsync of the directory: a crash leaves
 * the old snapshot or the new one, never a mix. Reading
 * checks size, magic, version, checksum and block size before anything is applied; a
 * file that fails any check is refused whole (one log line) and kvedge starts empty.
 */
import { existsSync, readFileSync } from "node:fs";
import { mkdir, open, rename } from "node:fs/promises";
import { join } from "node:path";
import { OP_REMOVED, OP_STORED, OP_TIER_STORED } from "../index/pack";
import type { SourcePosition } from "../ingest/source";

export const SNAPSHOT_VERSION = 2;
export const SNAPSHOT_FILE = "kvedge.snapshot";
/** A snapshot being written: `kvedge.snapshot.tmp-<pid>` (src/state/dir.ts removes stale ones). */
export const SNAPSHOT_TEMP_PREFIX = `${SNAPSHOT_FILE}.tmp-`;
const MAGIC = new TextEncoder().encode("KVEDGE-SNAPSHOT\n");
const PREFIX_BYTES = MAGIC.length + 12;
const CHECKSUM_BYTES = 8;
/** The words are checksummed (and written) in pieces of this many bytes. */
const CHECK_CHUNK_BYTES = 1 << 20;
export const OP_ACTIVE = 3;

/** Where one engine source was when the snapshot was taken. */
export interface Snapshot {
  readonly blockSize: number;
  readonly createdAt: string;
  readonly positions: readonly SourcePosition[];
  readonly workerIds: readonly bigint[];
  /** The index and the active requests as operations (see the file comment). */
  readonly words: Uint32Array;
}

/** What a snapshot operation hands to its consumer (arrays valid during the call). */
export interface SnapshotOpSink {
  stored(
    workerId: bigint,
    dpRank: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
  ): void;
  removed(workerId: bigint, dpRank: number, external: Uint32Array, count: number): void;
  /** A lower tier's blocks below a sequence hash (src/index/tiers.ts). */
  tierStored?(
    workerId: bigint,
    dpRank: number,
    tier: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
  ): void;
  active?(
    workerId: bigint,
    dpRank: number,
    requestId: string,
    prefillTokens: number,
    outputBlocks: number,
    idleMs: number,
    chain: Uint32Array,
    count: number,
  ): void;
}

export class SnapshotError extends Error {}

/** Appends one active request (operation 3) to `out` at `at`; returns the new end (grows `out.words`). */
export function putActive(
  out: { words: Uint32Array },
  at: number,
  ref: number,
  dpRank: number,
  requestId: string,
  prefillTokens: number,
  outputBlocks: number,
  idleMs: number,
  chain: Uint32Array,
  count: number,
): number {
  const idWords = (requestId.length + 1) >>> 1;
  const size = 8 + idWords + 2 * count;
  if (at + size > out.words.length) {
    const grown = new Uint32Array(Math.max(2 * out.words.length, at + size));
    grown.set(out.words.subarray(0, at));
    out.words = grown;
  }
  const words = out.words;
  words.set(
    [
      OP_ACTIVE,
      ref,
      dpRank,
      requestId.length,
      prefillTokens,
      outputBlocks,
      Math.max(0, Math.round(idleMs)),
      count,
    ],
    at,
  );
  at += 8;
  for (let i = 0; i < requestId.length; i += 2) {
    words[at++] =
      requestId.charCodeAt(i) | (i + 1 < requestId.length ? requestId.charCodeAt(i + 1) << 16 : 0);
  }
  words.set(chain.subarray(0, 2 * count), at);
  return at + 2 * count;
}

/**
 * A lower tier's stored operation at word `at` (to `sink`, if any); returns the next
 * word. Any other operation is unknown here: SnapshotError.
 */
function tierStored(
  words: Uint32Array,
  at: number,
  workerId: bigint,
  dpRank: number,
  sink: SnapshotOpSink | null,
): number {
  if (words[at] !== OP_TIER_STORED)
    throw new SnapshotError(`unknown operation ${words[at]} at word ${at}`);
  const [tier, hasBase, baseHi, baseLo, n] = words.subarray(at + 3, at + 8);
  const end = at + 8 + 4 * (n ?? 0);
  if (n === undefined || end > words.length)
    throw new SnapshotError(`operation at word ${at} runs past the end`);
  if (sink?.tierStored !== undefined) {
    const pairs = words.slice(at + 8, end);
    const [external, local] = [pairs.subarray(0, 2 * n), pairs.subarray(2 * n)];
    sink.tierStored(workerId, dpRank, tier!, hasBase === 1, baseHi!, baseLo!, external, local, n);
  }
  return end;
}

/** Walks snapshot words; throws SnapshotError on any malformed operation (check before applying). */
export function forEachOp(snapshot: Snapshot, sink: SnapshotOpSink | null): void {
  const { words, workerIds } = snapshot;
  let external = new Uint32Array(64);
  let local = new Uint32Array(64);
  let at = 0;
  const need = (count: number) => {
    if (at + count > words.length)
      throw new SnapshotError(`operation at word ${at} runs past the end`);
  };
  while (at < words.length) {
    need(4);
    const kind = words[at]!;
    const workerId = workerIds[words[at + 1]!];
    const dpRank = words[at + 2]!;
    if (workerId === undefined) throw new SnapshotError(`bad worker ref at word ${at}`);
    if (kind === OP_STORED) {
      need(7);
      const hasParent = words[at + 3] === 1;
      const parentHi = words[at + 4]!;
      const parentLo = words[at + 5]!;
      const n = words[at + 6]!;
      at += 7;
      need(4 * n);
      if (sink !== null) {
        if (external.length < 2 * n) {
          external = new Uint32Array(2 * n);
          local = new Uint32Array(2 * n);
        }
        external.set(words.subarray(at, at + 2 * n));
        local.set(words.subarray(at + 2 * n, at + 4 * n));
        sink.stored(workerId, dpRank, hasParent, parentHi, parentLo, external, local, n);
      }
      at += 4 * n;
    } else if (kind === OP_REMOVED) {
      const n = words[at + 3]!;
      at += 4;
      need(2 * n);
      if (sink !== null) {
        if (external.length < 2 * n) external = new Uint32Array(2 * n);
        external.set(words.subarray(at, at + 2 * n));
        sink.removed(workerId, dpRank, external, n);
      }
      at += 2 * n;
    } else if (kind === OP_ACTIVE) {
      need(8);
      const units = words[at + 3]!;
      const n = words[at + 7]!;
      const idWords = (units + 1) >>> 1;
      const [prefill, output, idle] = [words[at + 4]!, words[at + 5]!, words[at + 6]!];
      at += 8;
      need(idWords + 2 * n);
      if (sink?.active !== undefined) {
        let id = "";
        for (let i = 0; i < units; i++)
          id += String.fromCharCode((words[at + (i >>> 1)]! >>> (16 * (i & 1))) & 0xffff);
        sink.active(
          workerId,
          dpRank,
          id,
          prefill,
          output,
          idle,
          words.subarray(at + idWords, at + idWords + 2 * n),
          n,
        );
      }
      at += idWords + 2 * n;
    } else {
      at = tierStored(words, at, workerId, dpRank, sink); // or throws: an unknown operation
    }
  }
}

/** The prefix and header bytes of a snapshot (what comes before its words). */
function headOf(snapshot: Snapshot): Uint8Array {
  let header = JSON.stringify({
    version: SNAPSHOT_VERSION,
    created_at: snapshot.createdAt,
    block_size: snapshot.blockSize,
    worker_ids: snapshot.workerIds.map(String),
    positions: snapshot.positions.map((p) => ({
      worker_id: String(p.workerId),
      dp_rank: p.dpRank,
      last_seq: p.lastSeq,
      fingerprint: p.fingerprint,
      degraded: p.degraded,
      ranks: p.ranks,
    })),
  });
  header += " ".repeat((4 - (Buffer.byteLength(header) % 4)) % 4);
  const headerBytes = new TextEncoder().encode(header);
  const head = new Uint8Array(PREFIX_BYTES + headerBytes.length);
  const view = new DataView(head.buffer);
  head.set(MAGIC, 0);
  view.setUint32(MAGIC.length, SNAPSHOT_VERSION, true);
  view.setUint32(MAGIC.length + 4, headerBytes.length, true);
  view.setUint32(MAGIC.length + 8, snapshot.words.length, true);
  head.set(headerBytes, PREFIX_BYTES);
  return head;
}

/** The words' bytes (every supported host is little-endian; checked at decode). */
function bytesOfWords(words: Uint32Array): Uint8Array {
  return new Uint8Array(words.buffer, words.byteOffset, 4 * words.length);
}

/** The checksum over the head and the words' bytes, piece by piece (see the file comment). */
class Checksum {
  private readonly pieces: bigint[] = [];

  add(piece: Uint8Array): void {
    this.pieces.push(Bun.hash.xxHash3(piece));
  }

  /** The bytes cut into the checksum's pieces (views). */
  static piecesOf(bytes: Uint8Array): Uint8Array[] {
    const pieces: Uint8Array[] = [];
    for (let at = 0; at < bytes.length; at += CHECK_CHUNK_BYTES)
      pieces.push(bytes.subarray(at, at + CHECK_CHUNK_BYTES));
    return pieces;
  }

  value(): bigint {
    return Bun.hash.xxHash3(new BigUint64Array(this.pieces));
  }
}

/** Serializes a snapshot into the file's bytes (in memory: tests and small files). */
export function encodeSnapshot(snapshot: Snapshot): Uint8Array {
  const head = headOf(snapshot);
  const words = bytesOfWords(snapshot.words);
  const bytes = new Uint8Array(head.length + words.length + CHECKSUM_BYTES);
  bytes.set(head, 0);
  bytes.set(words, head.length);
  const checksum = new Checksum();
  checksum.add(head);
  for (const piece of Checksum.piecesOf(words)) checksum.add(piece);
  new DataView(bytes.buffer).setBigUint64(bytes.length - CHECKSUM_BYTES, checksum.value(), true);
  return bytes;
}

/** Parses and checks a snapshot file's bytes; throws SnapshotError saying what is wrong. */
export function decodeSnapshot(bytes: Uint8Array): Snapshot {
  if (bytes.length < PREFIX_BYTES + CHECKSUM_BYTES)
    throw new SnapshotError(`truncated (${bytes.length} bytes)`);
  for (let i = 0; i < MAGIC.length; i++)
    if (bytes[i] !== MAGIC[i]) throw new SnapshotError("not a kvedge snapshot");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint32(MAGIC.length, true);
  if (version !== SNAPSHOT_VERSION)
    throw new SnapshotError(`version ${version}, this kvedge reads version ${SNAPSHOT_VERSION}`);
  const headerLength = view.getUint32(MAGIC.length + 4, true);
  const wordCount = view.getUint32(MAGIC.length + 8, true);
  const expected = PREFIX_BYTES + headerLength + 4 * wordCount + CHECKSUM_BYTES;
  if (headerLength % 4 !== 0 || bytes.length !== expected) {
    throw new SnapshotError(
      `truncated or padded: ${bytes.length} bytes, the prefix says ${expected}`,
    );
  }
  const stored = view.getBigUint64(bytes.length - CHECKSUM_BYTES, true);
  const checksum = new Checksum();
  checksum.add(bytes.subarray(0, PREFIX_BYTES + headerLength));
  for (const piece of Checksum.piecesOf(
    bytes.subarray(PREFIX_BYTES + headerLength, bytes.length - CHECKSUM_BYTES),
  ))
    checksum.add(piece);
  if (checksum.value() !== stored) throw new SnapshotError("checksum mismatch");
  // biome-ignore lint/suspicious/noExplicitAny: the header's fields are checked one by one below
  let header: Record<string, any>;
  try {
    header = JSON.parse(
      new TextDecoder().decode(bytes.subarray(PREFIX_BYTES, PREFIX_BYTES + headerLength)),
    );
  } catch {
    throw new SnapshotError("header is not JSON");
  }
  const wordsAt = bytes.byteOffset + PREFIX_BYTES + headerLength;
  const words = new Uint32Array(wordCount);
  words.set(new Uint32Array(bytes.buffer.slice(wordsAt, wordsAt + 4 * wordCount)));
  const snapshot: Snapshot = {
    blockSize: Number(header.block_size),
    createdAt: String(header.created_at),
    workerIds: (header.worker_ids as string[]).map((id) => BigInt(id)),
    // biome-ignore lint/suspicious/noExplicitAny: each position's fields are converted and checked
    positions: (header.positions as Record<string, any>[]).map((p) => ({
      workerId: BigInt(p.worker_id),
      dpRank: Number(p.dp_rank),
      lastSeq: Number(p.last_seq),
      fingerprint: Number(p.fingerprint),
      degraded: p.degraded === true,
      // Files written before ranks were kept name the configured one only.
      ranks: Array.isArray(p.ranks) ? (p.ranks as unknown[]).map(Number) : [Number(p.dp_rank)],
    })),
    words,
  };
  forEachOp(snapshot, null); // every operation well-formed before any is applied
  return snapshot;
}

/**
 * Writes atomically: temp file, fsync, rename, fsync of the directory (asynchronous I/O,
 * a piece at a time straight from the words: routing goes on meanwhile, no copy of the
 * file is made). Resolves to the bytes written.
 */
export async function writeSnapshotFile(dir: string, snapshot: Snapshot): Promise<number> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, SNAPSHOT_FILE);
  const temp = join(dir, `${SNAPSHOT_TEMP_PREFIX}${process.pid}`);
  const file = await open(temp, "w", 0o600);
  let written = 0;
  try {
    const checksum = new Checksum();
    const head = headOf(snapshot);
    checksum.add(head);
    const writeAll = async (bytes: Uint8Array): Promise<void> => {
      for (let at = 0; at < bytes.length; )
        at += (await file.write(bytes, at, bytes.length - at)).bytesWritten;
      written += bytes.length;
    };
    await writeAll(head);
    for (const piece of Checksum.piecesOf(bytesOfWords(snapshot.words))) {
      checksum.add(piece);
      await writeAll(piece);
    }
    const tail = new Uint8Array(CHECKSUM_BYTES);
    new DataView(tail.buffer).setBigUint64(0, checksum.value(), true);
    await writeAll(tail);
    await file.sync();
  } finally {
    await file.close();
  }
  await rename(temp, path);
  const directory = await open(dir, "r");
  try {
    await directory.sync();
  } finally {
    await directory.close();
  }
  return written;
}

/** The snapshot in `dir`, null if there is none; throws SnapshotError if it cannot be used. */
export function readSnapshotFile(dir: string, blockSize: number): Snapshot | null {
  const path = join(dir, SNAPSHOT_FILE);
  if (!existsSync(path)) return null;
  const snapshot = decodeSnapshot(readFileSync(path));
  if (snapshot.blockSize !== blockSize) {
    throw new SnapshotError(`block size ${snapshot.blockSize}, the index's is ${blockSize}`);
  }
  return snapshot;
}
