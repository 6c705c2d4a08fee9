/**
 * Warm restart: a snapshot of the index and of each engine source's position, written
 * atomically to `state.dir` and loaded at start. No peer has one (Dynamo, llm-d and
 * SGLang rebuild from events only).
 *
 * File `DIR/kvedge.snapshot`, all integers little-endian:
 *
 *   magic "KVEDGE-SNAPSHOT\n" (16 bytes) · version u32 · header bytes u32 · words u32
 *   header: JSON, padded with spaces to a multiple of 4 bytes
 *   words: the index as operations (u32 each):
 *     1 (stored) · worker ref · dp rank · has parent · parent hi · parent lo · n · n × (ext hi, ext lo) · n × (local hi, local lo)
 *     2 (removed) · worker ref · dp rank · n · n × (ext hi, ext lo)
 *   checksum: XXH3-64 of every byte before it (8 bytes)
 *
 * The operations are the index's `dump()` (the events that rebuild an equal index), so
 * any backend writes and reads the same file. Worker refs index `header.worker_ids`.
 *
 * Writing: temp file in the same directory, fsync, rename over the old one, fsync of
 * the directory: a crash leaves the old snapshot or the new one, never a mix. Reading
 * checks size, magic, version, checksum and block size before anything is applied; a
 * file that fails any check is refused whole (one log line) and kvedge starts empty.
 */
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import type { IndexOp } from "../index/ops";

export const SNAPSHOT_VERSION = 1;
export const SNAPSHOT_FILE = "kvedge.snapshot";
const MAGIC = new TextEncoder().encode("KVEDGE-SNAPSHOT\n");
const PREFIX_BYTES = MAGIC.length + 12;
const CHECKSUM_BYTES = 8;
const OP_STORED = 1;
const OP_REMOVED = 2;

/** Where one engine source was when the snapshot was taken. */
export interface SourcePosition {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly lastSeq: number;
  /** Fingerprint of batch lastSeq (the sequencer's continuity proof), -1 if unknown. */
  readonly fingerprint: number;
  readonly degraded: boolean;
}

export interface Snapshot {
  readonly blockSize: number;
  readonly createdAt: string;
  readonly positions: readonly SourcePosition[];
  readonly workerIds: readonly bigint[];
  /** The index as operations (see the file comment). */
  readonly words: Uint32Array;
}

/** What a snapshot operation hands to its consumer (arrays valid during the call). */
export interface SnapshotOpSink {
  stored(workerId: bigint, dpRank: number, hasParent: boolean, parentHi: number, parentLo: number,
    external: Uint32Array, local: Uint32Array, count: number): void;
  removed(workerId: bigint, dpRank: number, external: Uint32Array, count: number): void;
}

export class SnapshotError extends Error {}

/** Packs the index's dump operations into snapshot words. */
export function encodeOps(ops: readonly IndexOp[]): { words: Uint32Array; workerIds: bigint[] } {
  const refs = new Map<string, number>();
  const workerIds: bigint[] = [];
  let size = 0;
  for (const op of ops) {
    if (op.op === "stored") size += 7 + 4 * op.block_hashes.length;
    else if (op.op === "removed") size += 4 + 2 * op.block_hashes.length;
  }
  const words = new Uint32Array(size);
  let at = 0;
  const put64 = (text: string) => {
    const value = BigInt(text);
    words[at++] = Number(value >> 32n);
    words[at++] = Number(value & 0xffff_ffffn);
  };
  for (const op of ops) {
    if (op.op !== "stored" && op.op !== "removed") continue;
    let ref = refs.get(op.worker_id);
    if (ref === undefined) {
      refs.set(op.worker_id, ref = workerIds.length);
      workerIds.push(BigInt(op.worker_id));
    }
    const n = op.block_hashes.length;
    if (op.op === "stored") {
      words[at++] = OP_STORED;
      words[at++] = ref;
      words[at++] = op.dp_rank ?? 0;
      words[at++] = op.parent_block_hash === null ? 0 : 1;
      if (op.parent_block_hash === null) at += 2;
      else put64(op.parent_block_hash);
      words[at++] = n;
      for (const hash of op.block_hashes) put64(hash);
      for (const hash of op.local_hashes!) put64(hash);
    } else {
      words[at++] = OP_REMOVED;
      words[at++] = ref;
      words[at++] = op.dp_rank ?? 0;
      words[at++] = n;
      for (const hash of op.block_hashes) put64(hash);
    }
  }
  return { words, workerIds };
}

/** Walks snapshot words; throws SnapshotError on any malformed operation (check before applying). */
export function forEachOp(snapshot: Snapshot, sink: SnapshotOpSink | null): void {
  const { words, workerIds } = snapshot;
  let external = new Uint32Array(64);
  let local = new Uint32Array(64);
  let at = 0;
  const need = (count: number) => {
    if (at + count > words.length) throw new SnapshotError(`operation at word ${at} runs past the end`);
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
    } else {
      throw new SnapshotError(`unknown operation ${kind} at word ${at}`);
    }
  }
}

/** Serializes a snapshot into the file's bytes. */
export function encodeSnapshot(snapshot: Snapshot): Uint8Array {
  let header = JSON.stringify({
    version: SNAPSHOT_VERSION,
    created_at: snapshot.createdAt,
    block_size: snapshot.blockSize,
    worker_ids: snapshot.workerIds.map(String),
    positions: snapshot.positions.map((p) => ({
      worker_id: String(p.workerId), dp_rank: p.dpRank, last_seq: p.lastSeq, fingerprint: p.fingerprint, degraded: p.degraded,
    })),
  });
  header += " ".repeat((4 - (Buffer.byteLength(header) % 4)) % 4);
  const headerBytes = new TextEncoder().encode(header);
  const total = PREFIX_BYTES + headerBytes.length + 4 * snapshot.words.length + CHECKSUM_BYTES;
  const bytes = new Uint8Array(total);
  const view = new DataView(bytes.buffer);
  bytes.set(MAGIC, 0);
  view.setUint32(MAGIC.length, SNAPSHOT_VERSION, true);
  view.setUint32(MAGIC.length + 4, headerBytes.length, true);
  view.setUint32(MAGIC.length + 8, snapshot.words.length, true);
  bytes.set(headerBytes, PREFIX_BYTES);
  const wordsAt = PREFIX_BYTES + headerBytes.length;
  // Little-endian words (every supported host is little-endian; checked at decode).
  bytes.set(new Uint8Array(snapshot.words.buffer, snapshot.words.byteOffset, 4 * snapshot.words.length), wordsAt);
  view.setBigUint64(total - CHECKSUM_BYTES, Bun.hash.xxHash3(bytes.subarray(0, total - CHECKSUM_BYTES)), true);
  return bytes;
}

/** Parses and checks a snapshot file's bytes; throws SnapshotError saying what is wrong. */
export function decodeSnapshot(bytes: Uint8Array): Snapshot {
  if (bytes.length < PREFIX_BYTES + CHECKSUM_BYTES) throw new SnapshotError(`truncated (${bytes.length} bytes)`);
  for (let i = 0; i < MAGIC.length; i++) if (bytes[i] !== MAGIC[i]) throw new SnapshotError("not a kvedge snapshot");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint32(MAGIC.length, true);
  if (version !== SNAPSHOT_VERSION) throw new SnapshotError(`version ${version}, this kvedge reads version ${SNAPSHOT_VERSION}`);
  const headerLength = view.getUint32(MAGIC.length + 4, true);
  const wordCount = view.getUint32(MAGIC.length + 8, true);
  const expected = PREFIX_BYTES + headerLength + 4 * wordCount + CHECKSUM_BYTES;
  if (headerLength % 4 !== 0 || bytes.length !== expected) {
    throw new SnapshotError(`truncated or padded: ${bytes.length} bytes, the prefix says ${expected}`);
  }
  const stored = view.getBigUint64(bytes.length - CHECKSUM_BYTES, true);
  if (Bun.hash.xxHash3(bytes.subarray(0, bytes.length - CHECKSUM_BYTES)) !== stored) throw new SnapshotError("checksum mismatch");
  let header: Record<string, any>;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(PREFIX_BYTES, PREFIX_BYTES + headerLength)));
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
    positions: (header.positions as Record<string, any>[]).map((p) => ({
      workerId: BigInt(p.worker_id), dpRank: Number(p.dp_rank), lastSeq: Number(p.last_seq),
      fingerprint: Number(p.fingerprint), degraded: p.degraded === true,
    })),
    words,
  };
  forEachOp(snapshot, null); // every operation well-formed before any is applied
  return snapshot;
}

/** Writes atomically: temp file, fsync, rename, fsync of the directory. Returns the bytes written. */
export function writeSnapshotFile(dir: string, snapshot: Snapshot): number {
  mkdirSync(dir, { recursive: true });
  const bytes = encodeSnapshot(snapshot);
  const path = join(dir, SNAPSHOT_FILE);
  const temp = `${path}.tmp-${process.pid}`;
  const fd = openSync(temp, "w", 0o600);
  try {
    for (let at = 0; at < bytes.length;) at += writeSync(fd, bytes, at, bytes.length - at);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(temp, path);
  const dirFd = openSync(dir, "r");
  try {
    fsyncSync(dirFd);
  } finally {
    closeSync(dirFd);
  }
  return bytes.length;
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
