/**
 * Block hashing, bit-exact with Dynamo's router (reference §2):
 *
 * - local block hash = XXH3-64 over the block's tokens as u32 little-endian, with a
 *   seed of 1337 plus xxh3(lora_name, 0) plus xxh3(cache_salt, 1) (wrapping u64);
 * - only complete blocks are hashed; Eagle windows are one token longer;
 * - sequence hash: seq[0] = local[0], seq[i] = XXH3-64(LE64(seq[i-1]) ‖ LE64(local[i]), 1337).
 *
 * Hot path: `hashBlocks` hashes a whole token array into a Uint32Array of (hi, lo)
 * words in one native call. The fallback hashes block by block with one BigInt
 * each; tests hold the two equal.
 */
import { u64 } from "../util/u64";
import { native } from "../native/library";
import { xxh3 } from "./xxh3";

export * from "./lora";

export const CHAIN_SEED = 1337n;

/** A block-hash seed, kept both as a bigint and as the (hi, lo) words the hot path takes. */
export interface Seed {
  readonly value: bigint;
  readonly hi: number;
  readonly lo: number;
}

function seedOf(value: bigint): Seed {
  return { value, hi: Number(value >> 32n), lo: Number(value & 0xffff_ffffn) };
}

export const DEFAULT_SEED: Seed = seedOf(CHAIN_SEED);

const encoder = new TextEncoder();
const seedCache = new Map<string, Seed>();
const SEED_CACHE_MAX = 4096;

/**
 * The seed for blocks of a LoRA adapter and/or cache salt (empty or absent = none).
 * Cached: the same few names repeat on every event and request.
 */
export function blockSeed(loraName?: string | null, cacheSalt?: string | null): Seed {
  if (!loraName && !cacheSalt) return DEFAULT_SEED;
  const key = `${loraName ?? ""}\u0000${cacheSalt ?? ""}`;
  let seed = seedCache.get(key);
  if (seed === undefined) {
    let value = CHAIN_SEED;
    if (loraName) value += xxh3(encoder.encode(loraName), 0n);
    if (cacheSalt) value += xxh3(encoder.encode(cacheSalt), 1n);
    seed = seedOf(BigInt.asUintN(64, value));
    if (seedCache.size >= SEED_CACHE_MAX) seedCache.clear();
    seedCache.set(key, seed);
  }
  return seed;
}

/** How many complete blocks `tokenCount` tokens make. */
export function blockCount(tokenCount: number, blockSize: number, eagle = false): number {
  if (blockSize <= 0) return 0;
  const window = eagle ? blockSize + 1 : blockSize;
  return tokenCount < window ? 0 : Math.floor((tokenCount - window) / blockSize) + 1;
}

/**
 * Writes the local hash of every complete block of `tokens` into `out` as (hi, lo)
 * pairs and returns the number of blocks. `out` must hold 2 × blockCount words.
 */
export function hashBlocks(
  tokens: Uint32Array,
  blockSize: number,
  seed: Seed,
  out: Uint32Array,
  eagle = false,
): number {
  return hashBlocksAt(tokens, 0, tokens.length, blockSize, seed, out, 0, eagle);
}

/**
 * hashBlocks over tokens[tokenStart, tokenStart + tokenCount), the hashes from pair
 * `outStart` of `out` on: the event path's form (no view of either array per event).
 */
export function hashBlocksAt(
  tokens: Uint32Array,
  tokenStart: number,
  tokenCount: number,
  blockSize: number,
  seed: Seed,
  out: Uint32Array,
  outStart: number,
  eagle = false,
): number {
  const count = blockCount(tokenCount, blockSize, eagle);
  if (count === 0) return 0;
  if (tokenStart + tokenCount > tokens.length) throw new RangeError("tokens out of range");
  if (out.length < 2 * (outStart + count)) {
    throw new RangeError(`out holds ${out.length} words, needs ${2 * (outStart + count)}`);
  }
  if (native === null) {
    const view = tokens.subarray(tokenStart, tokenStart + tokenCount);
    return fallbackHashBlocks(view, blockSize, seed, out.subarray(2 * outStart), eagle);
  }
  const window = eagle ? blockSize + 1 : blockSize;
  return native.kv_hash_blocks(
    tokens,
    tokenStart,
    tokenCount,
    blockSize,
    window,
    seed.hi,
    seed.lo,
    out,
    outStart,
  );
}

/** Writes the sequence-hash chain of `count` local hashes (pairs) into `out` (may alias). */
export function chainHashes(local: Uint32Array, count: number, out: Uint32Array): void {
  if (count === 0) return;
  if (local.length < 2 * count || out.length < 2 * count)
    throw new RangeError("chain arrays too short");
  if (native === null) fallbackChainHashes(local, count, out);
  else native.kv_chain_hashes(local, count, out);
}

/**
 * A reused buffer of sequence hashes, for indexes given a query without them
 * (KvIndex.findMatches' `chain`): `of` is valid until its next call.
 */
export class ChainBuffer {
  private words = new Uint32Array(64);

  of(local: Uint32Array, count: number): Uint32Array {
    if (this.words.length < 2 * count) this.words = new Uint32Array(2 * count + 64);
    chainHashes(local, count, this.words);
    return this.words;
  }
}

/** Whether the native fast path is in use (false means the fallback below). */
export const usingNativeHash = native !== null;

// ---- Fallback: one BigInt per block. Also the reference in tests. ----

const SEED_32_MAX = 0xffff_ffffn;

/**
 * XXH3-64 of `bytes`. Bun.hash.xxHash3 is correct only for seeds below 2^32 (it
 * drops the high half, see ./xxh3.ts), so larger seeds take our own implementation.
 */
function hashBytes(bytes: Uint8Array, seed: bigint): bigint {
  return seed <= SEED_32_MAX ? BigInt(Bun.hash.xxHash3(bytes, seed)) : xxh3(bytes, seed);
}

export function fallbackHashBlocks(
  tokens: Uint32Array,
  blockSize: number,
  seed: Seed,
  out: Uint32Array,
  eagle = false,
): number {
  const count = blockCount(tokens.length, blockSize, eagle);
  const windowBytes = (eagle ? blockSize + 1 : blockSize) * 4;
  const bytes = new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  for (let i = 0; i < count; i++) {
    const start = i * blockSize * 4;
    const hash = hashBytes(bytes.subarray(start, start + windowBytes), seed.value);
    out[2 * i] = Number(hash >> 32n);
    out[2 * i + 1] = Number(hash & 0xffff_ffffn);
  }
  return count;
}

export function fallbackChainHashes(local: Uint32Array, count: number, out: Uint32Array): void {
  const pair = new DataView(new ArrayBuffer(16));
  let prev = u64(local[0]!, local[1]!);
  out[0] = local[0]!;
  out[1] = local[1]!;
  for (let i = 1; i < count; i++) {
    pair.setBigUint64(0, prev, true);
    pair.setBigUint64(8, u64(local[2 * i]!, local[2 * i + 1]!), true);
    prev = hashBytes(new Uint8Array(pair.buffer), CHAIN_SEED);
    out[2 * i] = Number(prev >> 32n);
    out[2 * i + 1] = Number(prev & 0xffff_ffffn);
  }
}

// ---- API edge: bigint results, for the CLI, HTTP and tests. ----

export interface HashOptions {
  loraName?: string | null;
  cacheSalt?: string | null;
  eagle?: boolean;
}

/** Local and sequence hashes of every complete block, as bigints. */
export function hashTokens(
  tokens: ArrayLike<number>,
  blockSize: number,
  options: HashOptions = {},
): { local: bigint[]; sequence: bigint[] } {
  const words = tokens instanceof Uint32Array ? tokens : Uint32Array.from(tokens);
  const eagle = options.eagle ?? false;
  const out = new Uint32Array(2 * blockCount(words.length, blockSize, eagle));
  const count = hashBlocks(
    words,
    blockSize,
    blockSeed(options.loraName, options.cacheSalt),
    out,
    eagle,
  );
  const local: bigint[] = [];
  for (let i = 0; i < count; i++) local.push(u64(out[2 * i]!, out[2 * i + 1]!));
  chainHashes(out, count, out);
  const sequence: bigint[] = [];
  for (let i = 0; i < count; i++) sequence.push(u64(out[2 * i]!, out[2 * i + 1]!));
  return { local, sequence };
}
