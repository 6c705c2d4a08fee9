/**
 * What `kvedge capture` records: one engine stream, decoded, sequenced and normalized
 * exactly as `kvedge serve` does (an EngineSource), turned into the JSON operations
 * `kvedge apply` reads. The CLI (src/cli/capture.ts) only parses flags, writes the
 * lines and decides when to stop.
 *
 *   {"op":"stored","worker_id":"7","dp_rank":0,"parent_block_hash":"123",
 *    "block_hashes":[...],"token_ids":[...],"block_size":16,"lora_name":null,"cache_salt":null}
 *   {"op":"removed",...}  {"op":"cleared",...}
 *
 * An operation of a lower tier carries its `tier` (host_pinned, disk, external; a
 * removal of unknown or no medium, `any`), as `kvedge apply` reads it.
 */
import { hashTokens } from "../hash";
import { WorkerTable } from "../domain/worker-table";
import { TIER_ANY, TIER_DEVICE, TIER_NAMES } from "../index/types";
import type { Logger } from "../util/log";
import { u64String } from "../util/u64";
import { type DecodedBatch, FLAG_EAGLE, FLAG_PARENT } from "../wire/kv-events";
import type { KvEventTap, KvEventWriter } from "./normalize";
import { EngineSource } from "./source";

/** One captured operation, as `kvedge apply` reads it. */
export type CapturedOp = Record<string, unknown>;

export interface CaptureOptions {
  readonly workerId: bigint;
  /** Dp rank when batches carry none. */
  readonly dpRank: number;
  readonly endpoint: string;
  readonly replayEndpoint: string | null;
  readonly topic: string;
  /** The router's block size: stores of another size are counted, not captured. */
  readonly blockSize: number;
  readonly log: Logger;
  /** Called with every operation kvedge would index, in order. */
  readonly onOp: (op: CapturedOp) => void;
}

export class Capture {
  /** Operations seen, by kind. */
  readonly kinds = { stored: 0, removed: 0, cleared: 0 };
  readonly source: EngineSource;

  constructor(options: CaptureOptions) {
    const worker = options.workerId.toString();
    const kinds = this.kinds;
    const tap: KvEventTap = {
      stored(batch, event, count, rank, cacheSalt, tier) {
        kinds.stored++;
        options.onOp(withTier(storedOp(batch, event, count, worker, rank, cacheSalt), tier));
      },
      removed(batch, event, count, rank, tier) {
        kinds.removed++;
        const blockHashes = hashList(batch, event, count);
        const op = { op: "removed", worker_id: worker, dp_rank: rank, block_hashes: blockHashes };
        options.onOp(withTier(op, tier));
      },
    };
    // The index is not needed: the tap sees stores and removals; clears (from the wire
    // or an engine restart) come through here.
    const workerTable = new WorkerTable();
    const writer: KvEventWriter = {
      workerTable,
      storeAt: () => {},
      removeAt: () => {},
      storeTierAt: () => {},
      removeTierAt: () => {},
      clearAt: (slot) => {
        kinds.cleared++;
        options.onOp({ op: "cleared", worker_id: worker, dp_rank: workerTable.dpRankOf(slot) });
      },
    };
    this.source = new EngineSource(
      {
        workerId: options.workerId,
        dpRank: options.dpRank,
        endpoint: options.endpoint,
        replayEndpoint: options.replayEndpoint,
        topic: options.topic,
      },
      { blockSize: options.blockSize, writer, tap, log: options.log },
    );
  }

  /** Connects (or binds); resolves with the endpoint in use. */
  start(): Promise<string> {
    return this.source.start();
  }

  stop(): Promise<void> {
    return this.source.stop();
  }

  /** Whether a publisher was ever reached (nothing recorded for lack of one is a failure). */
  get connected(): boolean {
    return this.source.counters.connects > 0;
  }

  /** The two summary lines: batches, events (`written` of them written), gaps, errors. */
  summary(written: number): string {
    const seq = this.source.sequencer.counters;
    const norm = this.source.normalizer.counters;
    const kinds = this.kinds;
    const nonzero = (record: Record<string, number>): string =>
      Object.entries(record)
        .filter(([, value]) => value > 0)
        .map(([key, value]) => `${key}=${value}`)
        .join(" ") || "none";
    const tiers = nonzero({
      host_pinned: norm.blocksByTier.host_pinned,
      disk: norm.blocksByTier.disk,
      external: norm.blocksByTier.external,
    });
    return (
      `kvedge capture: ${norm.batches} batches (${seq.replayed} replayed, ` +
      `${seq.duplicates} duplicate, ${norm.batchesDropped} malformed); ${written} events ` +
      `written (${kinds.stored} stored, ${kinds.removed} removed, ${kinds.cleared} cleared); ` +
      `gaps ${seq.gaps}, replays ${seq.replaysRequested} (${seq.replaysFailed} failed), ` +
      `lost batches ${seq.lost}, engine restarts ${seq.restarts}\n` +
      `kvedge capture: decode errors: ${nonzero(norm.decodeErrors)}; ` +
      `not indexed: ${nonzero(norm.rejectedBlocks)} blocks; other tiers: ${tiers} blocks\n`
    );
  }
}

function hashList(batch: DecodedBatch, event: number, count: number): string[] {
  const hashes: string[] = [];
  const start = batch.hashStart[event]!;
  for (let i = start; i < start + count; i++) {
    hashes.push(u64String(batch.hashes[2 * i]!, batch.hashes[2 * i + 1]!));
  }
  return hashes;
}

/** The op with its tier named when not the device's (`any`: every tier). */
function withTier(op: CapturedOp, tier: number): CapturedOp {
  if (tier === TIER_DEVICE) return op;
  return { ...op, tier: tier === TIER_ANY ? "any" : TIER_NAMES[tier] };
}

function storedOp(
  batch: DecodedBatch,
  event: number,
  count: number,
  worker: string,
  dpRank: number,
  cacheSalt: string | null,
): CapturedOp {
  const flags = batch.flags[event]!;
  const blockSize = batch.blockSize[event]!;
  const eagle = (flags & FLAG_EAGLE) !== 0;
  const tokenStart = batch.tokenStart[event]!;
  const tokenEnd = tokenStart + count * blockSize + (eagle ? 1 : 0);
  const tokens = Array.from(batch.tokens.subarray(tokenStart, tokenEnd));
  const parent =
    (flags & FLAG_PARENT) !== 0 ? u64String(batch.parentHi[event]!, batch.parentLo[event]!) : null;
  const op: CapturedOp = {
    op: "stored",
    worker_id: worker,
    dp_rank: dpRank,
    parent_block_hash: parent,
    block_hashes: hashList(batch, event, count),
  };
  const lora = batch.string(batch.loraName[event]!);
  if (eagle) {
    // `kvedge apply` hashes plain windows; Eagle windows overlap by a token, so the
    // tokens go in an informational field (apply ignores it) and apply is handed the
    // local hashes kvedge computed.
    op.eagle_token_ids = tokens;
    op.local_hashes = hashTokens(tokens, blockSize, {
      loraName: lora,
      cacheSalt,
      eagle: true,
    }).local.map(String);
  } else {
    op.token_ids = tokens;
  }
  op.block_size = blockSize;
  op.lora_name = lora;
  op.cache_salt = cacheSalt;
  return op;
}
