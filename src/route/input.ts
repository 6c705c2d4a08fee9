/**
 * Adapters from what the server and the index have to what the router takes.
 */
import { blockCount, chainHashes, hashBlocks, type Seed } from "../hash";
import type { WorkerTable } from "../domain/worker-table";
import type { Overlaps } from "./router";

/** One worker's overlap as an index reports it at the API edge. */
export interface WorkerOverlap {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly blocks: number;
}

/**
 * Overlaps keyed by router slot, from per-worker scores. Workers the table does not
 * know are skipped and counted in `unknown` (the index may still hold blocks of a
 * worker that was just removed).
 */
export function overlapsOf(
  table: WorkerTable,
  scores: readonly WorkerOverlap[],
): Overlaps & { unknown: number } {
  const slots = new Int32Array(scores.length);
  const blocks = new Float64Array(scores.length);
  let count = 0;
  let unknown = 0;
  for (const score of scores) {
    const slot = table.find(score.workerId, score.dpRank);
    if (slot < 0) {
      unknown++;
      continue;
    }
    slots[count] = slot;
    blocks[count++] = score.blocks;
  }
  return { count, slots, blocks, unknown };
}

/** A prompt's block hashes: local ones (what the index matches) and the sequence chain (what load tracking keys on). */
export interface PromptHashes {
  readonly blockCount: number;
  /** Local block hashes, (hi, lo) pairs. */
  readonly local: Uint32Array;
  /** Sequence hashes, (hi, lo) pairs. */
  readonly chain: Uint32Array;
}

/**
 * `promptHashes` into buffers reused by every call, for the serving hot path: the
 * result (and its arrays, which may be longer than 2 × blockCount words) is valid
 * until the next call.
 */
export class PromptHasher {
  private local = new Uint32Array(2 * 1024);
  private chain = new Uint32Array(2 * 1024);

  hash(tokens: Uint32Array, blockSize: number, seed: Seed): PromptHashes {
    const words = 2 * blockCount(tokens.length, blockSize);
    if (this.local.length < words) {
      this.local = new Uint32Array(Math.max(words, 2 * this.local.length));
      this.chain = new Uint32Array(this.local.length);
    }
    const count = hashBlocks(tokens, blockSize, seed, this.local);
    chainHashes(this.local, count, this.chain);
    return { blockCount: count, local: this.local, chain: this.chain };
  }
}

export function promptHashes(tokens: Uint32Array, blockSize: number, seed: Seed): PromptHashes {
  const local = new Uint32Array(2 * blockCount(tokens.length, blockSize));
  const count = hashBlocks(tokens, blockSize, seed, local);
  const chain = new Uint32Array(2 * count);
  chainHashes(local, count, chain);
  return { blockCount: count, local, chain };
}
