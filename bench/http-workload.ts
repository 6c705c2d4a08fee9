/**
 * The fleet and the prompts of the serving benchmark (bench/http.ts), derived from a
 * seed so that the publisher process and the load generator agree on every token.
 *
 * - `SYSTEMS` system prompts of 8..48 blocks.
 * - `DOCUMENTS` documents of 32..224 blocks, each under one system prompt, chosen
 *   with a skew (a few are hot, most are cold).
 * - Every worker caches sequences [system][document][unique tail of 8..64 blocks]
 *   until it holds its share of the target (block, worker) pairs. A worker stores only
 *   the blocks it does not hold yet, in one BlockStored event per sequence with the
 *   parent it continues, as an engine does.
 *
 * Tokens of a block are a function of (kind, id, block position), in a 128k vocabulary;
 * engine (external) block hashes are a function of (worker, kind, id, position).
 */
import { prng } from "./lib";

export const BLOCK_SIZE = 16;
export const VOCAB = 128_000;
export const SYSTEMS = 16;
export const DOCUMENTS = 2048;

export const KIND_SYSTEM = 1;
export const KIND_DOCUMENT = 2;
export const KIND_TAIL = 3;
export const KIND_REQUEST = 4;

/** Mixes (a, b, c) into a u32. */
export function mix(a: number, b: number, c: number): number {
  let h =
    Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^
    Math.imul(b + 0x7f4a7c15, 0xc2b2ae35) ^
    Math.imul(c, 0x27d4eb2f);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  h = Math.imul(h, 0x297a2d39);
  return (h ^ (h >>> 15)) >>> 0;
}

/** Writes the 16 tokens of block `position` of (kind, id) at `out[at..]`. */
export function blockTokens(
  kind: number,
  id: number,
  position: number,
  out: number[] | Uint32Array,
  at: number,
): void {
  for (let i = 0; i < BLOCK_SIZE; i++)
    out[at + i] = mix(kind * 0x1000_0000 + id, position, i) % VOCAB;
}

export interface Fleet {
  readonly systemBlocks: Uint16Array;
  readonly documentBlocks: Uint16Array;
  readonly documentSystem: Uint16Array;
  /** Per worker: its sequences, as (document, tail id, tail blocks). */
  readonly sequences: { document: number; tail: number; tailBlocks: number }[][];
  /** Per worker: (block, worker) pairs it holds. */
  readonly pairsPerWorker: Uint32Array;
  readonly pairs: number;
}

/** A document by popularity: the low ids are hot (u^3 skew). */
export function pickDocument(random: () => number): number {
  const u = random() / 2 ** 32;
  return Math.min(DOCUMENTS - 1, Math.floor(DOCUMENTS * u * u * u));
}

export function buildFleet(seed: number, workers: number, targetPairs: number): Fleet {
  const random = prng(seed);
  const between = (low: number, high: number) => low + (random() % (high - low + 1));
  const systemBlocks = new Uint16Array(SYSTEMS);
  for (let s = 0; s < SYSTEMS; s++) systemBlocks[s] = between(8, 48);
  const documentBlocks = new Uint16Array(DOCUMENTS);
  const documentSystem = new Uint16Array(DOCUMENTS);
  for (let d = 0; d < DOCUMENTS; d++) {
    documentBlocks[d] = between(32, 224);
    documentSystem[d] = random() % SYSTEMS;
  }
  const perWorker = Math.ceil(targetPairs / workers);
  const sequences: Fleet["sequences"] = [];
  const pairsPerWorker = new Uint32Array(workers);
  let tailId = 0;
  for (let w = 0; w < workers; w++) {
    const held = new Set<number>();
    const systems = new Set<number>();
    const list: Fleet["sequences"][number] = [];
    let pairs = 0;
    while (pairs < perWorker) {
      const document = pickDocument(random);
      if (held.has(document)) continue;
      held.add(document);
      const system = documentSystem[document]!;
      if (!systems.has(system)) {
        systems.add(system);
        pairs += systemBlocks[system]!;
      }
      const tailBlocks = between(8, 64);
      list.push({ document, tail: tailId++, tailBlocks });
      pairs += documentBlocks[document]! + tailBlocks;
    }
    sequences.push(list);
    pairsPerWorker[w] = pairs;
  }
  let pairs = 0;
  for (const count of pairsPerWorker) pairs += count;
  return { systemBlocks, documentBlocks, documentSystem, sequences, pairsPerWorker, pairs };
}

/** An engine's block hash: unique per (worker, kind, id, position), never 0. */
export function externalHash(worker: number, kind: number, id: number, position: number): bigint {
  const hi = mix(worker + 1, kind * 0x1000_0000 + id, position);
  const lo = mix(position, worker ^ 0x5bd1e995, kind * 0x1000_0000 + id) | 1;
  return (BigInt(hi) << 32n) | BigInt(lo >>> 0);
}

/**
 * A route prompt of `blocks` blocks: with probability 0.9 the system prompt and a
 * document (a popular one more often) cover 50-90 % of it and the rest is unique;
 * otherwise all of it is unique. Unique blocks are (KIND_REQUEST, `unique`, position);
 * the caller varies the last block per request. Returns the tokens and how many
 * leading blocks come from the fleet's cached families.
 */
export function buildPrompt(
  fleet: Fleet,
  random: () => number,
  blocks: number,
  unique: number,
): { tokens: Uint32Array; sharedBlocks: number } {
  const tokens = new Uint32Array(blocks * BLOCK_SIZE);
  let at = 0;
  if (random() % 10 !== 0) {
    const document = pickDocument(random);
    const system = fleet.documentSystem[document]!;
    const fraction = 0.5 + 0.4 * (random() / 2 ** 32);
    const shared = Math.min(
      fleet.systemBlocks[system]! + fleet.documentBlocks[document]!,
      Math.floor(blocks * fraction),
    );
    for (; at < shared; at++) {
      if (at < fleet.systemBlocks[system]!)
        blockTokens(KIND_SYSTEM, system, at, tokens, at * BLOCK_SIZE);
      else
        blockTokens(
          KIND_DOCUMENT,
          document,
          at - fleet.systemBlocks[system]!,
          tokens,
          at * BLOCK_SIZE,
        );
    }
  }
  const sharedBlocks = at;
  for (; at < blocks; at++) blockTokens(KIND_REQUEST, unique, at, tokens, at * BLOCK_SIZE);
  return { tokens, sharedBlocks };
}
