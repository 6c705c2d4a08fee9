/**
 * KV-event normalization (reference §1.4): turns decoded engine batches of one event
 * stream (one worker, usually one dp rank) into index operations with kvedge's own
 * local block hashes.
 *
 * An event the decoder could not read (EVENT_SKIPPED) is counted by its error and
 * logged once per kind; the rest of its batch is applied. It may have been a store, a
 * removal or a clear, so the batch is `incomplete` (the stream calls the worker
 * degraded) unless a clear applied after it made the state known again.
 *
 * Per event, in the reference's order:
 * 1. ownership: an event that names an owner (`"kvcr"` or any other) is filtered;
 *    (Ignored events never get here: the decoder skips and counts unknown tags);
 * 2. locality: absent or `LOCAL` is kept, anything else filtered;
 * 3. medium -> tier, case-insensitive: GPU/DEVICE (or none) = device; CPU,
 *    CPU_PINNED, CPU_TIER1 = host_pinned; CPU_TIER2, DISK, NVME, STORAGE = disk;
 *    EXTERNAL, NETWORK, REMOTE, SHARED = external. A store of another medium is
 *    filtered (`unknown_medium`, logged once); a removal of another medium, or of
 *    none, removes the blocks from every tier (`any`: it must not leave a block indexed
 *    the engine may have dropped). Every tier is indexed (src/index/README.md, "Lower
 *    tiers"); unlike Dynamo, disk and external go through the steps below too;
 * 4. attention group: learn (dp rank, group) -> kind from stores carrying both; keep
 *    only main attention (full, MLA, sink-full); an unlearned group only if 0;
 * 5. cache namespace, per tier: a store without a salt inherits its parent's (its
 *    tier's record, else the device's, else another tier's; ambiguous parent ->
 *    filtered), a store with one records it for its blocks in its tier, an unsalted
 *    store of blocks recorded salted in its tier makes them ambiguous (as Dynamo
 *    does); removes forget in their tier (every tier: `any`), clears in every tier
 *    (NamespaceTable);
 * 6. conversion of a store: a hash repeated within the event (parent included) ->
 *    rejected whole (`self_reference`); block_size != the index block size -> rejected
 *    whole (`block_size_mismatch`; Dynamo stops at the first mismatching block, but
 *    every block of an event has the event's one block_size, so that is the whole
 *    event); blocks from the first one whose engine hash mixes in content kvedge does
 *    not hash (multimodal ids, prompt-embedding digests, unknown extra keys) on ->
 *    rejected (`multimodal_unsupported`: indexing wrong hashes would be worse than a
 *    miss); blocks whose tokens run past `token_ids` -> rejected (`tokens_short`).
 *    The blocks kept are a prefix of the event's chain and get local hashes from
 *    src/hash (the LoRA identity and the salt in the seed, Eagle windows). The LoRA
 *    identity is the event's `lora_name`, else its `lora_id` (named through the
 *    configured adapters, else keyed by the id: src/hash/lora.ts).
 *
 * A batch is normalized whole into scratch arrays before the sink sees any of it.
 *
 * See docs/decisions.md#dual-keys.
 */
import { blockCount, blockSeed, hashBlocksAt, type LoraAdapters, NO_LORA_ADAPTERS } from "../hash";
import { native } from "../native/library";
import { OnceLog, silentLogger, type Logger } from "../util/log";
import {
  DECODE_ERROR_KINDS,
  DECODE_OK,
  DecodedBatch,
  decodeKvBatch,
  EVENT_CLEARED,
  EVENT_REMOVED,
  EVENT_SKIPPED,
  EVENT_STORED,
  FLAG_EAGLE,
  FLAG_GROUP,
  FLAG_LORA_ID,
  FLAG_PARENT,
  NO_STRING,
  type DecodeErrorKind,
} from "../wire/kv-events";
import type { WorkerTable } from "../domain/worker-table";
import { TIER_ANY, TIER_DEVICE, TIER_EXTERNAL } from "../index/types";
import { capacityFor, mix, TABLE_CAPACITY_MIN } from "../util/tables";
import { AMBIGUOUS, NamespaceTable } from "./namespace";
import { RankSlots, type SlotAcquire } from "./rank-slots";

/**
 * Where normalized operations go: the index's slot methods, in their argument order
 * (`KvIndex` is one). `slot` is the (worker, dp rank)'s slot in `workerTable`, or -1
 * when every slot is taken. Block i of an operation has its external hash at
 * external[2(first+i)], external[2(first+i)+1] (hi, lo) and its local hash at the same
 * place in `local`. Arrays are valid during the call only.
 */
export interface KvEventSink {
  readonly workerTable: WorkerTable;
  /** How a dp rank new to the table gets its slot (default: `workerTable.acquire`). */
  readonly acquire?: SlotAcquire;
  /** Blocks stored in chain order after the parent (`hasParent` false = the root). */
  storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): void;
  removeAt(slot: number, external: Uint32Array, count: number, first: number): void;
  /** Every block of the slot's worker is gone, in every tier. */
  clearAt(slot: number): void;
  /** The same in a lower tier (TIER_HOST .. TIER_EXTERNAL; removals also TIER_ANY: every lower tier). */
  storeTierAt(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): void;
  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first: number,
  ): void;
}

/**
 * Sees every operation the normalizer hands to the sink, with the decoded event it
 * came from (`kvedge capture` writes them out). `count` is the number of leading blocks
 * of event `event` that were applied; `cacheSalt` the effective salt (the event's own,
 * or inherited from its parent); `lora` the LoRA identity the blocks were hashed under
 * (src/hash/lora.ts). Valid during the call only.
 */
export interface KvEventTap {
  stored(
    batch: DecodedBatch,
    event: number,
    count: number,
    dpRank: number,
    cacheSalt: string | null,
    lora: string | null,
    tier: number,
  ): void;
  /** `tier`: a TIERS index, or TIER_ANY (every tier: a removal of unknown or no medium). */
  removed(batch: DecodedBatch, event: number, count: number, dpRank: number, tier: number): void;
  /** An AllBlocksCleared from the wire (not a clear kvedge decided on itself). */
  cleared(batch: DecodedBatch, event: number, dpRank: number): void;
}

export const TIERS = ["device", "host_pinned", "disk", "external"] as const;
export type Tier = (typeof TIERS)[number];
/** The tiers events are counted by: TIERS, and `any` for removals of unknown or no medium. */
const COUNTED_TIERS = [...TIERS, "any"] as const;
const DEVICE = TIER_DEVICE;

export const REJECT_REASONS = [
  "ownership",
  "locality",
  "unknown_medium",
  "attention_group",
  "namespace_ambiguous",
  "self_reference",
  "block_size_mismatch",
  "multimodal_unsupported",
  "tokens_short",
] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

const zeros = <K extends string>(keys: readonly K[]) =>
  Object.fromEntries(keys.map((key) => [key, 0])) as Record<K, number>;

/** Plain numbers for the metrics layer. */
export class NormalizeCounters {
  batches = 0;
  batchesDropped = 0;
  decodeErrors = zeros<DecodeErrorKind>(DECODE_ERROR_KINDS.slice(1) as DecodeErrorKind[]);
  /** Events the decoder could not read (the rest of their batch applied), by error. */
  skippedEvents = zeros<DecodeErrorKind>(DECODE_ERROR_KINDS.slice(1) as DecodeErrorKind[]);
  events = { stored: 0, removed: 0, cleared: 0 };
  unknownTags = 0;
  unknownFields = 0;
  eventsByTier = zeros(COUNTED_TIERS);
  blocksByTier = zeros(COUNTED_TIERS);
  /** Events with at least one block rejected for the reason (filtered events: all blocks). */
  rejectedEvents = zeros(REJECT_REASONS);
  rejectedBlocks = zeros(REJECT_REASONS);
  appliedStoredBlocks = 0;
  appliedRemovedBlocks = 0;
  appliedClears = 0;
  /**
   * The event lag: batches that carried the engine's timestamp (`ts`), and the sum and
   * last of how long after it each was applied (ms; an engine clock ahead of ours
   * counts as 0). A replayed batch counts as late as it is.
   */
  lagBatches = 0;
  lagSumMs = 0;
  lagLastMs = 0;
}

/** A timestamp further than this from now is not a clock reading (0, garbage): no lag. */
const LAG_PLAUSIBLE_MS = 86_400_000;

export interface NormalizerOptions {
  readonly workerId: bigint;
  /** The stream's configured rank; a batch's own dp rank overrides it. */
  readonly dpRank: number;
  /** The index block size; stores of another block size are rejected. */
  readonly blockSize: number;
  readonly sink: KvEventSink;
  readonly log?: Logger;
  /** Bound on remembered salted blocks (past it, new ones are not remembered, counted). */
  readonly namespaceEntriesMax?: number;
  /** Decode scratch for `ingest`; one per thread is enough (shared by default). */
  readonly decoded?: DecodedBatch;
  readonly tap?: KvEventTap;
  /** How LoRA ids name adapters (none configured by default). */
  readonly lora?: LoraAdapters;
}

const MAIN_ATTENTION = new Set(["full_attention", "mla_attention", "sink_full_attention"]);
const MEDIUM_TIERS: Record<string, number> = {
  GPU: 0,
  DEVICE: 0,
  CPU: 1,
  CPU_PINNED: 1,
  CPU_TIER1: 1,
  CPU_TIER2: 2,
  DISK: 2,
  NVME: 2,
  STORAGE: 2,
  EXTERNAL: 3,
  NETWORK: 3,
  REMOTE: 3,
  SHARED: 3,
};
const UNKNOWN_MEDIUM = -1;
/** Learned attention groups kept per stream (group ids are few; this bounds a hostile peer). */
const GROUPS_MAX = 1024;
/** Up to this many hashes, the repeat check compares pairs directly. */
const PAIRWISE_MAX = 16;

const OP_STORED = 1;
const OP_REMOVED = 2;
const OP_CLEARED = 3;

let sharedDecoded: DecodedBatch | null = null;

export class KvEventNormalizer {
  readonly counters = new NormalizeCounters();
  /** The stream's dp ranks and their slots. */
  readonly rankSlots: RankSlots;
  private readonly dpRank: number;
  private readonly blockSize: number;
  private readonly sink: KvEventSink;
  private readonly tap: KvEventTap | null;
  private readonly lora: LoraAdapters;
  private readonly onceLog: OnceLog;
  private readonly decoded: DecodedBatch;
  /** Per tier (the lower ones made at their first salted block). */
  private readonly namespaces: (NamespaceTable | null)[];
  private readonly namespaceEntriesMax: number;
  /** (dp rank, group) -> is main attention. */
  private readonly groups = new Map<number, boolean>();
  private readonly tierOfMedium = new Map<string, number>();

  // The normalized batch: ops (kind, event, block count) and the local hashes,
  // indexed like the decoded batch's external hashes.
  private opKind = new Uint8Array(64);
  private opEvent = new Uint32Array(64);
  private opCount = new Uint32Array(64);
  /** The tier of each op: a TIERS index, or TIER_ANY (a removal of unknown medium). */
  private opTier = new Uint8Array(64);
  /** The effective cache salt and LoRA identity of each stored op (for the tap). */
  private readonly opSalt: (string | null)[] = [];
  private readonly opLora: (string | null)[] = [];
  private ops = 0;
  /** The last batch skipped an event that no clear after it made irrelevant. */
  private incompleteNow = false;
  private local = new Uint32Array(2048);
  /** The hashes of one store so far (repeatsHash), emptied per store, sized per batch. */
  private readonly seen = new StampedPairSet();

  constructor(options: NormalizerOptions) {
    if (!(options.blockSize > 0)) throw new RangeError("blockSize must be positive");
    const sink = options.sink;
    this.rankSlots = new RankSlots(
      sink.workerTable,
      options.workerId,
      options.dpRank,
      sink.acquire,
    );
    this.dpRank = options.dpRank;
    this.blockSize = options.blockSize;
    this.sink = options.sink;
    this.tap = options.tap ?? null;
    this.lora = options.lora ?? NO_LORA_ADAPTERS;
    this.onceLog = new OnceLog(
      (options.log ?? silentLogger).child({ component: "kv-normalize", worker: options.workerId }),
    );
    this.decoded = options.decoded ?? (sharedDecoded ??= new DecodedBatch());
    this.namespaceEntriesMax = options.namespaceEntriesMax ?? 1 << 20;
    this.namespaces = [new NamespaceTable(this.namespaceEntriesMax), null, null, null];
  }

  /** Salted blocks remembered now, and bytes held for them. */
  get namespaceEntries(): number {
    return this.namespaces.reduce((sum, table) => sum + (table?.size ?? 0), 0);
  }

  get namespaceBytes(): number {
    return this.namespaces.reduce((sum, table) => sum + (table?.bytes ?? 0), 0);
  }

  /**
   * Whether the batch last normalized skipped an event that could have changed what
   * the worker holds (any event the decoder could not read), with no clear after it:
   * the worker's state is no longer known exactly.
   */
  get incomplete(): boolean {
    return this.incompleteNow;
  }

  /** Decodes one payload and applies it. Returns false if the batch was dropped (counted, logged once per kind). */
  ingest(payload: Uint8Array): boolean {
    const status = decodeKvBatch(payload, this.decoded);
    if (status !== DECODE_OK) {
      const kind = DECODE_ERROR_KINDS[status] as DecodeErrorKind;
      this.counters.batches++;
      this.counters.batchesDropped++;
      this.counters.decodeErrors[kind]++;
      this.onceLog.report(`decode:${kind}`, "dropped a KV-event batch that does not decode", {
        error: kind,
        offset: this.decoded.errorOffset,
        bytes: payload.length,
        head: Buffer.from(payload.subarray(0, 64)).toString("hex"),
      });
      return false;
    }
    this.noteLag(this.decoded.ts);
    this.normalize(this.decoded);
    return true;
  }

  private noteLag(ts: number): void {
    const lag = Date.now() - ts * 1000;
    if (!(Math.abs(lag) < LAG_PLAUSIBLE_MS)) return;
    const counters = this.counters;
    counters.lagBatches++;
    counters.lagLastMs = Math.max(0, lag);
    counters.lagSumMs += counters.lagLastMs;
  }

  /** Normalizes a decoded batch whole, then hands it to the sink. */
  normalize(batch: DecodedBatch): void {
    const counters = this.counters;
    counters.batches++;
    counters.unknownTags += batch.unknownTags;
    counters.unknownFields += batch.unknownFields;
    const dpRank = batch.hasDpRank ? batch.dpRank : this.dpRank;
    this.ops = 0;
    this.incompleteNow = false;
    if (this.local.length < 2 * batch.hashCount)
      this.local = new Uint32Array(grownSize(this.local.length, 2 * batch.hashCount));
    this.seen.size(longestEvent(batch) + 1);
    for (let e = 0; e < batch.eventCount; e++) this.event(batch, e, dpRank);
    this.emit(batch, dpRank);
  }

  /** Forgets what was learned from the stream (call when the engine restarted). */
  reset(): void {
    for (const table of this.namespaces) table?.clear();
    this.groups.clear();
  }

  private event(batch: DecodedBatch, e: number, dpRank: number): void {
    const kind = batch.kind[e]!;
    const blocks = batch.hashLength[e]!;
    if (kind === EVENT_SKIPPED) return this.skipped(batch, e);
    if (kind === EVENT_STORED) this.counters.events.stored++;
    else if (kind === EVENT_REMOVED) this.counters.events.removed++;
    else this.counters.events.cleared++;
    if (batch.ownership[e] !== NO_STRING) return this.reject("ownership", blocks);
    const locality = batch.locality[e]!;
    if (locality !== NO_STRING && batch.strings.get(locality).toUpperCase() !== "LOCAL") {
      return this.reject("locality", blocks);
    }
    const tier = this.tierOfEvent(batch, e, kind);
    if (tier === UNKNOWN_MEDIUM) {
      this.onceLog.report("unknown_medium", "filtered KV stores of an unknown medium", {
        medium: batch.string(batch.medium[e]!),
      });
      return this.reject("unknown_medium", blocks);
    }
    this.counters.eventsByTier[COUNTED_TIERS[tier === TIER_ANY ? 4 : tier]!]++;
    this.counters.blocksByTier[COUNTED_TIERS[tier === TIER_ANY ? 4 : tier]!] += blocks;
    if (kind !== EVENT_CLEARED && !this.mainAttention(batch, e, dpRank))
      return this.reject("attention_group", blocks);
    let namespace: string | null = null;
    if (kind === EVENT_STORED) {
      namespace = this.propagateNamespace(batch, e, dpRank, tier);
      if (namespace === AMBIGUOUS) return this.reject("namespace_ambiguous", blocks);
    } else if (kind === EVENT_REMOVED) this.forgetNamespaces(batch, e, dpRank, tier);
    else for (const table of this.namespaces) table?.forgetRank(dpRank);
    if (kind === EVENT_STORED) this.convertStored(batch, e, namespace, tier);
    else if (kind === EVENT_REMOVED) {
      if (blocks > 0) this.pushOp(OP_REMOVED, e, blocks, tier);
    } else {
      this.pushOp(OP_CLEARED, e, 0, DEVICE);
      this.incompleteNow = false; // what was skipped before it no longer matters
    }
  }

  private skipped(batch: DecodedBatch, e: number): void {
    const error = DECODE_ERROR_KINDS[batch.skipError[e]!] as DecodeErrorKind;
    this.counters.skippedEvents[error]++;
    this.incompleteNow = true;
    this.onceLog.report(`skipped:${error}`, "skipped a KV event that does not decode", {
      error,
      event: ["unreadable", "stored", "removed", "cleared"][batch.skipKind[e]!] ?? "unreadable",
      offset: batch.skipAt[e]!,
    });
  }

  /**
   * The tier an event applies to: a clear, the device (and every tier, the index
   * decides); a removal of no medium or one not known, TIER_ANY; a store of an unknown
   * medium, UNKNOWN_MEDIUM (filtered).
   */
  private tierOfEvent(batch: DecodedBatch, e: number, kind: number): number {
    if (kind === EVENT_CLEARED) return DEVICE;
    const medium = batch.string(batch.medium[e]!);
    if (kind !== EVENT_REMOVED) return this.tierOf(medium);
    if (medium === null || medium === "") return TIER_ANY;
    const tier = this.tierOf(medium);
    if (tier !== UNKNOWN_MEDIUM) return tier;
    this.onceLog.report(
      "unknown_medium_removal",
      "removed KV blocks of an unknown medium from every tier",
      {
        medium,
      },
    );
    return TIER_ANY;
  }

  /** A removal's blocks leave its tier's namespace record (every tier's for TIER_ANY). */
  private forgetNamespaces(batch: DecodedBatch, e: number, dpRank: number, tier: number): void {
    const start = batch.hashStart[e]!;
    for (let t = DEVICE; t <= TIER_EXTERNAL; t++) {
      const table = this.namespaces[t];
      if (table == null || (tier !== TIER_ANY && tier !== t)) continue;
      for (let i = start; i < start + batch.hashLength[e]!; i++)
        table.forget(dpRank, batch.hashes[2 * i]!, batch.hashes[2 * i + 1]!);
    }
  }

  private reject(reason: RejectReason, blocks: number): void {
    this.counters.rejectedEvents[reason]++;
    this.counters.rejectedBlocks[reason] += blocks;
  }

  private tierOf(medium: string | null): number {
    if (medium === null || medium === "") return DEVICE;
    let tier = this.tierOfMedium.get(medium);
    if (tier === undefined) {
      tier = MEDIUM_TIERS[medium.toUpperCase()] ?? UNKNOWN_MEDIUM;
      if (this.tierOfMedium.size < GROUPS_MAX) this.tierOfMedium.set(medium, tier);
    }
    return tier;
  }

  private mainAttention(batch: DecodedBatch, e: number, dpRank: number): boolean {
    const flags = batch.flags[e]!;
    const kindId = batch.specKind[e]!;
    const hasGroup = (flags & FLAG_GROUP) !== 0;
    const key = dpRank * 0x1_0000_0000 + batch.groupIdx[e]!;
    if (kindId !== NO_STRING) {
      const main = MAIN_ATTENTION.has(batch.strings.get(kindId));
      if (
        hasGroup &&
        batch.kind[e] === EVENT_STORED &&
        (this.groups.has(key) || this.groups.size < GROUPS_MAX)
      ) {
        this.groups.set(key, main);
      }
      return main;
    }
    if (!hasGroup) return true;
    const learned = this.groups.get(key);
    return learned === undefined ? batch.groupIdx[e] === 0 : learned;
  }

  /**
   * The store's namespace (own salt, else the parent's: its tier's record, else the
   * device's, else another tier's, as the index resolves the parent), recorded for its
   * blocks in its tier; AMBIGUOUS filters it. An unsalted store of blocks recorded in its
   * tier under a salt makes them ambiguous (one hash, two namespaces: which one a child
   * continues is unknown).
   */
  private propagateNamespace(
    batch: DecodedBatch,
    e: number,
    dpRank: number,
    tier: number,
  ): string | null {
    const salt = batch.string(batch.cacheSalt[e]!);
    let namespace = salt === "" ? null : salt;
    if (namespace === null && (batch.flags[e]! & FLAG_PARENT) !== 0) {
      namespace = this.parentNamespace(dpRank, tier, batch.parentHi[e]!, batch.parentLo[e]!);
      if (namespace === AMBIGUOUS) return AMBIGUOUS;
    }
    const start = batch.hashStart[e]!;
    const end = start + batch.hashLength[e]!;
    const hashes = batch.hashes;
    if (namespace !== null) {
      const table = (this.namespaces[tier] ??= new NamespaceTable(this.namespaceEntriesMax));
      for (let i = start; i < end; i++)
        table.record(dpRank, hashes[2 * i]!, hashes[2 * i + 1]!, namespace);
    } else if ((this.namespaces[tier]?.size ?? 0) > 0) {
      const table = this.namespaces[tier]!;
      for (let i = start; i < end; i++)
        table.markUnsalted(dpRank, hashes[2 * i]!, hashes[2 * i + 1]!);
    }
    return namespace;
  }

  /** A parent's recorded namespace: in `tier`, then the device, then the other lower tiers. */
  private parentNamespace(dpRank: number, tier: number, hi: number, lo: number): string | null {
    const own = this.namespaces[tier]?.get(dpRank, hi, lo);
    if (own !== undefined) return own;
    for (let t = DEVICE; t <= TIER_EXTERNAL; t++) {
      const found = t === tier ? undefined : this.namespaces[t]?.get(dpRank, hi, lo);
      if (found !== undefined) return found;
    }
    return null;
  }

  /** Local hashes for a store's usable blocks; returns how many (0: none to apply). */
  private convertStored(
    batch: DecodedBatch,
    e: number,
    namespace: string | null,
    tier: number,
  ): void {
    const blocks = batch.hashLength[e]!;
    if (blocks === 0) return;
    if (this.repeatsHash(batch, e)) return this.reject("self_reference", blocks);
    const blockSize = batch.blockSize[e]!;
    if (blockSize !== this.blockSize) {
      this.onceLog.report(
        "block_size_mismatch",
        "rejected KV stores of another block size than the index's",
        {
          event_block_size: blockSize,
          index_block_size: this.blockSize,
        },
      );
      return this.reject("block_size_mismatch", blocks);
    }
    const eagle = (batch.flags[e]! & FLAG_EAGLE) !== 0;
    const usable = this.usableBlocks(batch, e, blocks, eagle);
    if (usable === 0) return;
    const tokenStart = batch.tokenStart[e]!;
    const tokenEnd = tokenStart + usable * blockSize + (eagle ? 1 : 0);
    const lora = this.loraOf(batch, e);
    const start = batch.hashStart[e]!;
    const written = hashBlocksAt(
      batch.tokens,
      tokenStart,
      tokenEnd - tokenStart,
      blockSize,
      blockSeed(lora, namespace),
      this.local,
      start,
      eagle,
    );
    if (written !== usable) throw new Error(`hashed ${written} blocks, expected ${usable}`);
    this.opSalt[this.ops] = namespace;
    this.opLora[this.ops] = lora;
    this.pushOp(OP_STORED, e, usable, tier);
  }

  /** Of a store's blocks, those it can hash: cut at multimodal content and where tokens run short (counted). */
  private usableBlocks(batch: DecodedBatch, e: number, blocks: number, eagle: boolean): number {
    let usable = blocks;
    const blockSize = this.blockSize;
    const mmBlock = batch.mmBlock[e]!;
    if (mmBlock >= 0 && mmBlock < usable) {
      this.onceLog.report(
        "multimodal_unsupported",
        "rejected KV blocks with multimodal content (hashing does not include MM hashes yet)",
        {
          blocks: usable - mmBlock,
        },
      );
      this.reject("multimodal_unsupported", usable - mmBlock);
      usable = mmBlock;
    }
    const available = blockCount(batch.tokenLength[e]!, blockSize, eagle);
    if (available < usable) {
      this.onceLog.report("tokens_short", "rejected KV blocks whose token ids run short", {
        blocks: usable,
        tokens: batch.tokenLength[e]!,
        block_size: blockSize,
      });
      this.reject("tokens_short", usable - available);
      usable = available;
    }
    return usable;
  }

  /** The LoRA identity of a store: its name, else its id (src/hash/lora.ts). */
  private loraOf(batch: DecodedBatch, e: number): string | null {
    const id = (batch.flags[e]! & FLAG_LORA_ID) !== 0 ? batch.loraId[e]! : null;
    return this.lora.identity(batch.string(batch.loraName[e]!), id);
  }

  /** Whether a hash repeats within the store, the parent included (Dynamo turns these into no-ops). */
  private repeatsHash(batch: DecodedBatch, e: number): boolean {
    const start = batch.hashStart[e]!;
    const count = batch.hashLength[e]!;
    const hashes = batch.hashes;
    const hasParent = (batch.flags[e]! & FLAG_PARENT) !== 0;
    const parentHi = batch.parentHi[e]!;
    const parentLo = batch.parentLo[e]!;
    if (count <= PAIRWISE_MAX) {
      for (let i = start; i < start + count; i++) {
        const hi = hashes[2 * i]!;
        const lo = hashes[2 * i + 1]!;
        if (hasParent && hi === parentHi && lo === parentLo) return true;
        for (let j = i + 1; j < start + count; j++)
          if (hashes[2 * j + 1] === lo && hashes[2 * j] === hi) return true;
      }
      return false;
    }
    return this.seen.repeats(hashes, start, count, hasParent, parentHi, parentLo);
  }

  private pushOp(kind: number, event: number, count: number, tier: number): void {
    if (this.ops === this.opKind.length) {
      const capacity = this.ops * 2;
      this.opKind = copyInto(this.opKind, new Uint8Array(capacity));
      this.opEvent = copyInto(this.opEvent, new Uint32Array(capacity));
      this.opCount = copyInto(this.opCount, new Uint32Array(capacity));
      this.opTier = copyInto(this.opTier, new Uint8Array(capacity));
    }
    this.opKind[this.ops] = kind;
    this.opEvent[this.ops] = event;
    this.opCount[this.ops] = count;
    this.opTier[this.ops] = tier;
    this.ops++;
  }

  private storeTier(
    batch: DecodedBatch,
    e: number,
    tier: number,
    slot: number,
    count: number,
  ): void {
    this.sink.storeTierAt(
      tier,
      slot,
      (batch.flags[e]! & FLAG_PARENT) !== 0,
      batch.parentHi[e]!,
      batch.parentLo[e]!,
      batch.hashes,
      this.local,
      count,
      batch.hashStart[e]!,
    );
  }

  private emit(batch: DecodedBatch, dpRank: number): void {
    if (this.ops === 0) return;
    const { sink, counters } = this;
    const slot = this.rankSlots.slotOf(dpRank);
    for (let op = 0; op < this.ops; op++) {
      const e = this.opEvent[op]!;
      const count = this.opCount[op]!;
      const tier = this.opTier[op]!;
      switch (this.opKind[op]) {
        case OP_STORED:
          if (tier === DEVICE)
            sink.storeAt(
              slot,
              (batch.flags[e]! & FLAG_PARENT) !== 0,
              batch.parentHi[e]!,
              batch.parentLo[e]!,
              batch.hashes,
              this.local,
              count,
              batch.hashStart[e]!,
            );
          else this.storeTier(batch, e, tier, slot, count);
          this.tap?.stored(batch, e, count, dpRank, this.opSalt[op]!, this.opLora[op]!, tier);
          counters.appliedStoredBlocks += count;
          break;
        case OP_REMOVED:
          if (tier !== DEVICE)
            sink.removeTierAt(tier, slot, batch.hashes, count, batch.hashStart[e]!);
          if (tier === DEVICE || tier === TIER_ANY)
            sink.removeAt(slot, batch.hashes, count, batch.hashStart[e]!);
          this.tap?.removed(batch, e, count, dpRank, tier);
          counters.appliedRemovedBlocks += count;
          break;
        default:
          sink.clearAt(slot);
          this.tap?.cleared(batch, e, dpRank);
          counters.appliedClears++;
      }
    }
  }
}

/** The most blocks of one event in the batch. */
function longestEvent(batch: DecodedBatch): number {
  let longest = 0;
  for (let e = 0; e < batch.eventCount; e++) longest = Math.max(longest, batch.hashLength[e]!);
  return longest;
}

/** Batches in a row that want a smaller seen-set before it shrinks. */
const SEEN_SHRINK_AFTER = 64;

/**
 * A set of (hi, lo) pairs that empties in O(1): a slot is taken when its stamp is the
 * current one, so a long store's check costs its own blocks, not a table fill. Sized
 * per batch by the tables' one rule (capacityFor), so memory follows the batches; it
 * shrinks only after a run of batches that want it smaller, since a vLLM stream
 * alternates prefill chunks (128 blocks at page size 16) with one-block decode steps,
 * and shrinking at once reallocated it about twice per request.
 * Not a PairTable: it never deletes, and PairTable.clear fills its whole array.
 */
class StampedPairSet {
  private keys = new Uint32Array(2 * TABLE_CAPACITY_MIN);
  private stamps = new Uint32Array(TABLE_CAPACITY_MIN);
  private mask = TABLE_CAPACITY_MIN - 1;
  private stamp = 1;
  private smallerRun = 0;

  /** Room for `count` pairs at load at most 1/2 (empties the set when it resizes). */
  size(count: number): void {
    const current = this.mask + 1;
    const capacity = capacityFor(count, current, TABLE_CAPACITY_MIN);
    if (capacity >= current) this.smallerRun = 0;
    if (capacity === current) return;
    if (capacity < current && ++this.smallerRun < SEEN_SHRINK_AFTER) return;
    this.smallerRun = 0;
    this.keys = new Uint32Array(2 * capacity);
    this.stamps = new Uint32Array(capacity);
    this.mask = capacity - 1;
    this.stamp = 1;
  }

  private clear(): void {
    if (this.stamp === U32_MAX) {
      this.stamps.fill(0);
      this.stamp = 0;
    }
    this.stamp++;
  }

  /**
   * Empties the set, then adds the parent (if any) and hashes start..start+count;
   * returns whether a pair was there already. One native call when the library is loaded.
   */
  repeats(
    hashes: Uint32Array,
    start: number,
    count: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
  ): boolean {
    // Room for every pair at load 1/2, so a probe always ends (normalize() sizes per batch).
    if (2 * (count + 1) > this.mask + 1) this.size(count + 1);
    this.clear();
    if (native !== null) {
      const { keys, stamps, mask, stamp } = this;
      const parent = hasParent ? 1 : 0;
      return (
        native.kv_pairs_repeat(
          keys,
          stamps,
          mask,
          stamp,
          hashes,
          start,
          count,
          parentHi >>> 0,
          parentLo >>> 0,
          parent,
        ) === 1
      );
    }
    if (hasParent) this.add(parentHi, parentLo);
    for (let i = start; i < start + count; i++)
      if (!this.add(hashes[2 * i]!, hashes[2 * i + 1]!)) return true;
    return false;
  }

  /** Adds (hi, lo); returns false if it was there already. */
  private add(hi: number, lo: number): boolean {
    const { keys, stamps, mask, stamp } = this;
    const h = hi >>> 0;
    const l = lo >>> 0;
    for (let i = mix(h, l) & mask; ; i = (i + 1) & mask) {
      if (stamps[i] !== stamp) {
        stamps[i] = stamp;
        keys[2 * i] = h;
        keys[2 * i + 1] = l;
        return true;
      }
      if (keys[2 * i] === h && keys[2 * i + 1] === l) return false;
    }
  }
}

const U32_MAX = 0xffff_ffff;

function grownSize(current: number, needed: number): number {
  let size = Math.max(current, 1);
  while (size < needed) size *= 2;
  return size;
}

function copyInto<T extends Uint8Array | Uint32Array>(from: T, to: T): T {
  to.set(from);
  return to;
}
