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
 *
 * A capture is the wire: only what the engine sent. kvedge's own continuity decisions
 * (an engine restart proven, a rebuild from the replay ring, lost batches) clear its
 * index in `serve`; here they are log lines on stderr and counts in the summary, not
 * `cleared` operations (one for a dp rank the engine never published would be a lie).
 */
import { hashTokens, LoraAdapters } from "../hash";
import { WorkerTable } from "../domain/worker-table";
import { TIER_ANY, TIER_DEVICE, TIER_NAMES } from "../index/types";
import type { Logger } from "../util/log";
import { u64String } from "../util/u64";
import { type DecodedBatch, FLAG_EAGLE, FLAG_LORA_ID, FLAG_PARENT } from "../wire/kv-events";
import type { KvEventTap, KvEventSink } from "./normalize";
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
  /** How LoRA ids name adapters (`index.lora_adapters`). */
  readonly lora?: LoraAdapters;
  /** `ingest.idle_probe_ms` (0 or absent: never). */
  readonly idleProbeMs?: number;
}

export class Capture {
  /** Operations seen, by kind. */
  readonly kinds = { stored: 0, removed: 0, cleared: 0 };
  readonly source: EngineSource;

  constructor(options: CaptureOptions) {
    const worker = options.workerId.toString();
    const kinds = this.kinds;
    const tap: KvEventTap = {
      stored(batch, event, count, rank, cacheSalt, lora, tier) {
        kinds.stored++;
        const op = storedOp(batch, event, count, worker, rank, cacheSalt, lora);
        options.onOp(withTier(op, tier));
      },
      cleared(_batch, _event, rank) {
        kinds.cleared++;
        options.onOp({ op: "cleared", worker_id: worker, dp_rank: rank });
      },
      removed(batch, event, count, rank, tier) {
        kinds.removed++;
        const blockHashes = hashList(batch, event, count);
        const op = { op: "removed", worker_id: worker, dp_rank: rank, block_hashes: blockHashes };
        options.onOp(withTier(op, tier));
      },
    };
    // The index is not needed: the tap sees what the wire said.
    const sink: KvEventSink = {
      workerTable: new WorkerTable(),
      storeAt: () => {},
      removeAt: () => {},
      storeTierAt: () => {},
      removeTierAt: () => {},
      clearAt: () => {},
    };
    this.source = new EngineSource(
      {
        workerId: options.workerId,
        dpRank: options.dpRank,
        endpoint: options.endpoint,
        replayEndpoint: options.replayEndpoint,
        topic: options.topic,
      },
      {
        blockSize: options.blockSize,
        sink,
        tap,
        log: options.log,
        ...(options.lora === undefined ? {} : { lora: options.lora }),
        sequencer: { idleProbeMs: options.idleProbeMs ?? 0 },
      },
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
      `lost batches ${seq.lost}, engine restarts ${seq.restarts}, ` +
      `rebuilt from the replay ring ${seq.rebuilds}\n` +
      `kvedge capture: decode errors: ${nonzero(norm.decodeErrors)}; ` +
      `events skipped: ${nonzero(norm.skippedEvents)}; ` +
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
  lora: string | null,
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
  // An adapter named only by an id kvedge has no name for: apply cannot hash by it.
  const byId = lora !== null && LoraAdapters.isIdKey(lora);
  if (eagle || byId) {
    // `kvedge apply` hashes plain windows by name; Eagle windows overlap by a token, and
    // an id-keyed adapter has no name: the tokens go in an informational field (apply
    // ignores it) and apply is handed the local hashes kvedge computed.
    op[eagle ? "eagle_token_ids" : "informational_token_ids"] = tokens;
    op.local_hashes = hashTokens(tokens, blockSize, {
      loraName: lora,
      cacheSalt,
      eagle,
    }).local.map(String);
  } else {
    op.token_ids = tokens;
  }
  op.block_size = blockSize;
  op.lora_name = byId ? null : lora;
  if ((flags & FLAG_LORA_ID) !== 0) op.lora_id = batch.loraId[event]!;
  op.cache_salt = cacheSalt;
  return op;
}
