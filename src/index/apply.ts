/**
 * The apply layer: one `kvedge apply` operation (an already parsed JSON value) into
 * index calls. Every field is validated; a malformed operation throws ApplyInputError
 * naming the field and changes nothing. A well-formed event the index must refuse
 * (wrong block size, token count not matching its blocks) is counted as a rejection
 * instead, like any other rejected event. Used by the CLI, the tests and restore.
 */
import { blockSeed, chainHashes, hashBlocks } from "../hash";
import { parseU64, putU64 } from "../util/u64";
import type { MatchOutput, MatchScore, StatsOutput } from "./ops";
import {
  type KvIndex,
  MatchResult,
  StoreStatus,
  TIER_ANY,
  TIER_DEVICE,
  TIER_NAMES,
  TierMatches,
} from "./types";

/** A malformed operation: the message names the field. */
export class ApplyInputError extends Error {
  override readonly name = "ApplyInputError";
}

export type ApplyResult = MatchOutput | StatsOutput | null;

/** Most blocks one operation may carry. */
export const BLOCKS_PER_OP_MAX = 1 << 20;
/** Most tokens one operation may carry. */
export const TOKENS_PER_OP_MAX = 1 << 24;
const DP_RANK_LIMIT = 2 ** 32;
const OPS = new Set(["stored", "removed", "cleared", "remove_worker", "match", "stats"]);

class Scratch {
  external = new Uint32Array(256);
  local = new Uint32Array(256);
  tokens = new Uint32Array(1024);
  readonly match = new MatchResult();
  readonly tierMatch = new TierMatches();

  externalFor(blocks: number): Uint32Array {
    if (this.external.length < 2 * blocks) this.external = new Uint32Array(4 * blocks);
    return this.external;
  }

  localFor(blocks: number): Uint32Array {
    if (this.local.length < 2 * blocks) this.local = new Uint32Array(4 * blocks);
    return this.local;
  }

  tokensFor(count: number): Uint32Array {
    if (this.tokens.length < count) this.tokens = new Uint32Array(count * 2);
    return this.tokens.subarray(0, count);
  }
}

const scratch = new Scratch();

/** Applies one operation; returns the output line's object for match and stats. */
export function applyOp(index: KvIndex, input: unknown): ApplyResult {
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    throw new ApplyInputError("expected a JSON object");
  }
  const op = input as Record<string, unknown>;
  const kind = op.op;
  if (typeof kind !== "string" || !OPS.has(kind)) {
    throw new ApplyInputError(`op must be one of ${[...OPS].join(", ")}`);
  }
  switch (kind) {
    case "stored":
      applyStoredOp(index, op);
      return null;
    case "removed": {
      const workerId = u64Field(op, "worker_id");
      const dpRank = dpRankField(op);
      const tier = tierField(op, true);
      const count = hashArray(
        op,
        "block_hashes",
        scratch.externalFor(arrayLength(op, "block_hashes")),
      );
      if (tier !== TIER_DEVICE)
        index.applyRemovedTier(workerId, dpRank, tier, scratch.external, count);
      if (tier === TIER_DEVICE || tier === TIER_ANY)
        index.applyRemoved(workerId, dpRank, scratch.external, count);
      return null;
    }
    case "cleared":
      index.applyCleared(u64Field(op, "worker_id"), dpRankField(op));
      return null;
    case "remove_worker":
      index.removeWorker(u64Field(op, "worker_id"));
      return null;
    case "match":
      return matchOp(index, op);
    default:
      return statsOutput(index);
  }
}

function applyStoredOp(index: KvIndex, op: Record<string, unknown>): void {
  const workerId = u64Field(op, "worker_id");
  const dpRank = dpRankField(op);
  const tier = tierField(op, false);
  const parent = optionalU64(op, "parent_block_hash");
  const base = optionalU64(op, "parent_sequence_hash");
  if (base !== null && (tier === TIER_DEVICE || parent !== null))
    throw new ApplyInputError(
      "parent_sequence_hash goes only with a lower tier and no parent_block_hash",
    );
  const count = hashArray(op, "block_hashes", scratch.externalFor(arrayLength(op, "block_hashes")));
  const blockSize = op.block_size;
  if (blockSize !== undefined && (!Number.isSafeInteger(blockSize) || (blockSize as number) < 1)) {
    throw new ApplyInputError("block_size must be a positive integer");
  }
  const source = blockSource(op);
  if (blockSize !== undefined && blockSize !== index.blockSize) {
    index.countRejected(StoreStatus.BlockSizeMismatch);
    return;
  }
  if (source.blocks(index.blockSize) !== count) {
    index.countRejected(StoreStatus.Invalid);
    return;
  }
  const local = scratch.localFor(count);
  source.hash(index.blockSize, local);
  const [hasParent, hi, lo] = splitU64(base ?? parent);
  if (tier === TIER_DEVICE)
    index.applyStored(workerId, dpRank, hasParent, hi, lo, scratch.external, local, count);
  else if (op.parent_sequence_hash !== undefined)
    index.applyStoredTierUnder(
      workerId,
      dpRank,
      tier,
      hasParent,
      hi,
      lo,
      scratch.external,
      local,
      count,
    );
  else
    index.applyStoredTier(
      workerId,
      dpRank,
      tier,
      hasParent,
      hi,
      lo,
      scratch.external,
      local,
      count,
    );
}

/** (present, hi, lo) of an optional u64. */
function splitU64(value: bigint | null): [boolean, number, number] {
  if (value === null) return [false, 0, 0];
  return [true, Number(value >> 32n), Number(value & 0xffff_ffffn)];
}

/** A null-or-u64 field (absent = null). */
function optionalU64(op: Record<string, unknown>, name: string): bigint | null {
  const value = op[name];
  if (value === undefined || value === null) return null;
  const parsed = parseU64(value);
  if (parsed === null)
    throw new ApplyInputError(`${name} must be null or an unsigned 64-bit integer`);
  return parsed;
}

/** The `tier` field: a tier name (default device); "any" only where `any` allows it. */
function tierField(op: Record<string, unknown>, any: boolean): number {
  const value = op.tier;
  if (value === undefined) return TIER_DEVICE;
  const tier = (TIER_NAMES as readonly unknown[]).indexOf(value);
  if (tier >= 0) return tier;
  if (any && value === "any") return TIER_ANY;
  throw new ApplyInputError(
    `tier must be one of ${[...TIER_NAMES, ...(any ? ["any"] : [])].join(", ")}`,
  );
}

interface BlockSource {
  /** How many blocks it makes at `blockSize` (-1 when tokens do not fill whole blocks). */
  blocks(blockSize: number): number;
  /** Writes the local hashes as (hi, lo) pairs. */
  hash(blockSize: number, out: Uint32Array): void;
}

/** The blocks of an op: token_ids (hashed here, with lora_name / cache_salt) or local_hashes. */
function blockSource(op: Record<string, unknown>): BlockSource {
  const hasTokens = op.token_ids !== undefined;
  if (hasTokens === (op.local_hashes !== undefined))
    throw new ApplyInputError("give exactly one of token_ids and local_hashes");
  if (!hasTokens) {
    const length = arrayLength(op, "local_hashes");
    const parsed = new Uint32Array(2 * length);
    hashArray(op, "local_hashes", parsed);
    return { blocks: () => length, hash: (_blockSize, out) => out.set(parsed) };
  }
  const tokens = tokenArray(op);
  const seed = blockSeed(optionalString(op, "lora_name"), optionalString(op, "cache_salt"));
  return {
    blocks: (blockSize) => (tokens.length % blockSize === 0 ? tokens.length / blockSize : -1),
    hash: (blockSize, out) => {
      hashBlocks(tokens, blockSize, seed, out);
    },
  };
}

function matchOp(index: KvIndex, op: Record<string, unknown>): MatchOutput {
  const source = blockSource(op);
  // A query's trailing partial block is simply not part of the match.
  let count = source.blocks(index.blockSize);
  if (count < 0) count = Math.floor((op.token_ids as unknown[]).length / index.blockSize);
  const local = scratch.localFor(count);
  if (count > 0) source.hash(index.blockSize, local);
  const result = scratch.match;
  index.findMatches(local, count, result);
  const order: { id: bigint; score: MatchScore }[] = [];
  const at: Record<number, number> = {};
  const entry = (handle: number, blocks: number): MatchScore => {
    if (at[handle] === undefined) {
      at[handle] = order.length;
      order.push({ id: index.workerIdOf(handle), score: scoreOf(index, handle, blocks) });
    }
    return order[at[handle]!]!.score;
  };
  for (let i = 0; i < result.count; i++) entry(result.workers[i]!, result.blocks[i]!);
  const tiers = scratch.tierMatch;
  const chain = new Uint32Array(2 * count);
  chainHashes(local, count, chain);
  index.tierMatches(chain, count, result, tiers);
  for (let i = 0; i < tiers.count; i++) {
    const score = entry(tiers.workers[i]!, 0);
    score.host_pinned = tiers.host[i]!;
    score.disk = tiers.disk[i]!;
    score.external = tiers.external[i]!;
  }
  order.sort(
    (x, y) =>
      y.score.blocks - x.score.blocks ||
      (x.id < y.id ? -1 : x.id > y.id ? 1 : 0) ||
      x.score.dp_rank - y.score.dp_rank,
  );
  return { op: "match", scores: order.map((entry) => entry.score) };
}

function scoreOf(index: KvIndex, handle: number, blocks: number): MatchScore {
  return {
    worker_id: index.workerIdOf(handle).toString(),
    dp_rank: index.dpRankOf(handle),
    blocks,
  };
}

function statsOutput(index: KvIndex): StatsOutput {
  const stats = index.stats();
  return {
    op: "stats",
    workers: stats.workers,
    blocks: stats.blocks,
    nodes: stats.nodes,
    lookup_entries: stats.lookupEntries,
    rejected: stats.rejected.total,
    bytes: stats.bytes,
  };
}

function u64Field(op: Record<string, unknown>, name: string): bigint {
  const value = parseU64(op[name]);
  if (value === null) {
    const what =
      op[name] === undefined ? "is missing" : "must be an unsigned 64-bit integer (decimal string)";
    throw new ApplyInputError(`${name} ${what}`);
  }
  return value;
}

function dpRankField(op: Record<string, unknown>): number {
  const value = op.dp_rank;
  if (value === undefined) return 0;
  if (
    typeof value !== "number" ||
    !Number.isInteger(value) ||
    value < 0 ||
    value >= DP_RANK_LIMIT
  ) {
    throw new ApplyInputError("dp_rank must be an integer in [0, 2^32)");
  }
  return value;
}

function optionalString(op: Record<string, unknown>, name: string): string | null {
  const value = op[name];
  if (value === undefined || value === null) return null;
  if (typeof value !== "string") throw new ApplyInputError(`${name} must be a string or null`);
  return value;
}

function arrayLength(op: Record<string, unknown>, name: string): number {
  const value = op[name];
  if (!Array.isArray(value))
    throw new ApplyInputError(`${name} ${value === undefined ? "is missing" : "must be an array"}`);
  if (value.length > BLOCKS_PER_OP_MAX)
    throw new ApplyInputError(`${name} has more than ${BLOCKS_PER_OP_MAX} entries`);
  return value.length;
}

/** Parses an array of u64 into (hi, lo) pairs; returns its length. */
function hashArray(op: Record<string, unknown>, name: string, out: Uint32Array): number {
  const values = op[name] as unknown[];
  for (let i = 0; i < values.length; i++) {
    const value = parseU64(values[i]);
    if (value === null)
      throw new ApplyInputError(
        `${name}[${i}] must be an unsigned 64-bit integer (decimal string)`,
      );
    putU64(out, 2 * i, value);
  }
  return values.length;
}

function tokenArray(op: Record<string, unknown>): Uint32Array {
  const values = op.token_ids;
  if (!Array.isArray(values)) throw new ApplyInputError("token_ids must be an array");
  if (values.length > TOKENS_PER_OP_MAX)
    throw new ApplyInputError(`token_ids has more than ${TOKENS_PER_OP_MAX} entries`);
  const tokens = scratch.tokensFor(values.length);
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value >= 2 ** 32) {
      throw new ApplyInputError(`token_ids[${i}] must be an integer in [0, 2^32)`);
    }
    tokens[i] = value;
  }
  return tokens;
}
