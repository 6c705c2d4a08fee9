/**
 * Small helpers for index tests: events and queries written with bigint hashes, and
 * scores read back as a plain object { "worker/rank": blocks }.
 */
import { createIndex } from "../../src/index/index";
import {
  BACKEND_NAMES,
  type BackendName,
  type IndexOptions,
  type KvIndex,
  MatchResult,
  type StoreStatus,
} from "../../src/index/types";
import { pairs } from "../harness/streams";

export const BACKENDS: readonly BackendName[] = BACKEND_NAMES;

/** A fresh index with verify() after every mutation. */
export function fresh(backend: BackendName, options: IndexOptions = {}): KvIndex {
  return createIndex(backend, 4, { verify: true, ...options });
}

/** Local hash of block `n` in these tests: n itself; external hash: 1000 * worker + n by default. */
export function store(
  index: KvIndex,
  worker: number,
  parent: bigint | null,
  local: readonly number[],
  external?: readonly bigint[],
  rank = 0,
): StoreStatus {
  const ext = external ?? local.map((n) => BigInt(1000 * worker + n));
  const parentValue = parent ?? 0n;
  return index.applyStored(
    BigInt(worker),
    rank,
    parent !== null,
    Number(parentValue >> 32n),
    Number(parentValue & 0xffff_ffffn),
    pairs(ext.slice()),
    pairs(local.map(BigInt)),
    local.length,
  );
}

/** The default external hash of block n for a worker. */
export function ext(worker: number, n: number): bigint {
  return BigInt(1000 * worker + n);
}

export function remove(
  index: KvIndex,
  worker: number,
  blocks: readonly number[],
  rank = 0,
): number {
  const hashes = blocks.map((n) => ext(worker, n));
  return index.applyRemoved(BigInt(worker), rank, pairs(hashes), hashes.length);
}

export function removeHashes(
  index: KvIndex,
  worker: number,
  hashes: readonly bigint[],
  rank = 0,
): number {
  return index.applyRemoved(BigInt(worker), rank, pairs(hashes.slice()), hashes.length);
}

const out = new MatchResult();

export function scores(index: KvIndex, query: readonly number[]): Record<string, number> {
  index.findMatches(pairs(query.map(BigInt)), query.length, out);
  const result: Record<string, number> = {};
  for (let i = 0; i < out.count; i++) {
    result[`${index.workerIdOf(out.workers[i]!)}/${index.dpRankOf(out.workers[i]!)}`] =
      out.blocks[i]!;
  }
  return result;
}

/** Bytes of a fresh index of the same backend (what an emptied index must return to). */
export function freshBytes(backend: BackendName): number {
  return createIndex(backend, 4).stats().bytes;
}
