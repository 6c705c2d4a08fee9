/**
 * Test support for the KV-event walker:
 *
 * - `snapshotBatch`: a DecodedBatch as plain values (bigint hashes, strings), so two
 *   decodes can be compared with toEqual;
 * - `referenceDecode`: the reference path, written from the wire contract and
 *   independent of the walker: msgpackr.unpack, then a straightforward conversion of
 *   the JS values under the same rules and limits;
 * - `expectedSnapshot`: what a batch built in code must decode to (a third path, from
 *   the source objects, that shares nothing with either decoder);
 * - `randomBatch`: a seeded generator of valid batches in one producer's layout.
 *
 * A skipped event (one the walker could not read) snapshots as `kind: "skipped"` with
 * the kind its tag named (`skipped`), every other field at its default.
 */
import { Unpackr } from "msgpackr";
import {
  DEFAULT_DECODE_LIMITS,
  EVENT_CLEARED,
  EVENT_REMOVED,
  EVENT_SKIPPED,
  EVENT_STORED,
  FLAG_EAGLE,
  FLAG_GROUP,
  FLAG_LORA_ID,
  FLAG_PARENT,
  FLAG_WINDOW,
  WIRE_LAYOUTS,
  type DecodedBatch,
  type DecodeLimits,
  type KvBatch,
  type KvEvent,
  type KvHash,
  type KvValue,
  type WireField,
  type WireVariant,
} from "../../src/wire/kv-events";
import { u64 } from "../../src/util/u64";

type Kind = "stored" | "removed" | "cleared";

export interface EventSnapshot {
  kind: Kind | "skipped";
  /** A skipped event: the kind its tag named, null if unreadable (absent otherwise). */
  skipped?: Kind | null;
  hashes: bigint[];
  parent: bigint | null;
  tokens: number[];
  eagle: boolean;
  blockSize: number;
  medium: string | null;
  loraName: string | null;
  loraId: number | null;
  cacheSalt: string | null;
  groupIdx: number | null;
  slidingWindow: number | null;
  specKind: string | null;
  locality: string | null;
  ownership: string | null;
  mmBlock: number;
}

export interface BatchSnapshot {
  ts: number;
  dpRank: number | null;
  unknownTags: number;
  unknownFields: number;
  events: EventSnapshot[];
}

const KINDS = {
  [EVENT_STORED]: "stored",
  [EVENT_REMOVED]: "removed",
  [EVENT_CLEARED]: "cleared",
} as const;

/** An event snapshot with every field at its default. */
function blank(kind: EventSnapshot["kind"]): EventSnapshot {
  return {
    kind,
    hashes: [],
    parent: null,
    tokens: [],
    eagle: false,
    blockSize: 0,
    medium: null,
    loraName: null,
    loraId: null,
    cacheSalt: null,
    groupIdx: null,
    slidingWindow: null,
    specKind: null,
    locality: null,
    ownership: null,
    mmBlock: -1,
  };
}

function skippedSnapshot(kind: Kind | null): EventSnapshot {
  return { ...blank("skipped"), skipped: kind };
}

export function snapshotBatch(batch: DecodedBatch): BatchSnapshot {
  const events: EventSnapshot[] = [];
  for (let e = 0; e < batch.eventCount; e++) {
    if (batch.kind[e] === EVENT_SKIPPED) {
      const kind = batch.skipKind[e]!;
      events.push(skippedSnapshot(kind === 0 ? null : KINDS[kind as 1 | 2 | 3]));
      continue;
    }
    const flags = batch.flags[e]!;
    const hashes: bigint[] = [];
    const start = batch.hashStart[e]!;
    for (let i = start; i < start + batch.hashLength[e]!; i++) {
      hashes.push(u64(batch.hashes[2 * i]!, batch.hashes[2 * i + 1]!));
    }
    const tokenStart = batch.tokenStart[e]!;
    events.push({
      kind: KINDS[batch.kind[e] as 1 | 2 | 3],
      hashes,
      parent: flags & FLAG_PARENT ? u64(batch.parentHi[e]!, batch.parentLo[e]!) : null,
      tokens: Array.from(batch.tokens.subarray(tokenStart, tokenStart + batch.tokenLength[e]!)),
      eagle: (flags & FLAG_EAGLE) !== 0,
      blockSize: batch.blockSize[e]!,
      medium: batch.string(batch.medium[e]!),
      loraName: batch.string(batch.loraName[e]!),
      loraId: flags & FLAG_LORA_ID ? batch.loraId[e]! : null,
      cacheSalt: batch.string(batch.cacheSalt[e]!),
      groupIdx: flags & FLAG_GROUP ? batch.groupIdx[e]! : null,
      slidingWindow: flags & FLAG_WINDOW ? batch.slidingWindow[e]! : null,
      specKind: batch.string(batch.specKind[e]!),
      locality: batch.string(batch.locality[e]!),
      ownership: batch.string(batch.ownership[e]!),
      mmBlock: batch.mmBlock[e]!,
    });
  }
  return {
    ts: batch.ts,
    dpRank: batch.hasDpRank ? batch.dpRank : null,
    unknownTags: batch.unknownTags,
    unknownFields: batch.unknownFields,
    events,
  };
}

// ---- Shared rules (the wire contract, restated for the two test-side paths) ----

const SALT_PREFIX = "dynamo-cache-salt:";
const MM_HASH = /^[0-9a-fA-F]{64}$/;

export function isMmHashString(value: unknown): value is string {
  return typeof value === "string" && MM_HASH.test(value);
}

/**
 * vLLM's `extra_keys` as kvedge reads them: the salt (a top-level one wins; else block
 * 0's prefixed string, else its one bare string) and the first block whose items are
 * not just the LoRA name and that salt (-1: none). `bareMmIds`: the 9-field array era,
 * where a bare 64-hex string is a multimodal hash. `checkLength` sees each string read.
 */
export function extraKeysMeaning(
  blocks: readonly (readonly unknown[] | null)[],
  loraName: string | null,
  bareMmIds: boolean,
  topSalt: string | null,
  checkLength: (text: string) => void = () => {},
): { salt: string | null; opaque: number } {
  let opaque = -1;
  const mark = (block: number) => {
    if (opaque < 0 || block < opaque) opaque = block;
  };
  let bareCount = 0;
  let lastBare: string | null = null;
  let prefixed: string | null = null;
  let bareSpans = false;
  blocks.forEach((items, block) => {
    if (items === null) return;
    let lora = loraName;
    for (const item of items) {
      if (typeof item !== "string") {
        mark(block);
        continue;
      }
      if (lora !== null && item === lora) {
        lora = null;
        continue;
      }
      checkLength(item);
      if (block > 0) {
        mark(block);
        if (lastBare !== null && item === lastBare) bareSpans = true;
      } else if ((bareMmIds && isMmHashString(item)) || item === "") mark(0);
      else if (item.startsWith(SALT_PREFIX)) {
        if (prefixed !== null) mark(0);
        else prefixed = item.length > SALT_PREFIX.length ? item.slice(SALT_PREFIX.length) : item;
      } else {
        bareCount++;
        lastBare = item;
      }
    }
  });
  let salt = topSalt ?? prefixed ?? lastBare;
  if (bareCount > 1 || (bareCount === 1 && (salt !== lastBare || bareSpans))) mark(0);
  if (bareSpans && salt === lastBare) salt = null;
  return { salt, opaque };
}

/** Low 64 bits of a digest, big-endian (vLLM's int conversion). */
export function digestToU64(bytes: Uint8Array): bigint {
  let value = 0n;
  for (const byte of bytes.subarray(Math.max(0, bytes.length - 8)))
    value = (value << 8n) | BigInt(byte);
  return value;
}

// ---- Reference path: msgpackr + conversion ----

/** An event the walker must skip alone. */
class Reject extends Error {}
/** What drops the whole batch (the envelope, the batch limits). */
class BatchReject extends Reject {}

export type ReferenceResult =
  | { readonly ok: true; readonly batch: BatchSnapshot }
  | { readonly ok: false; readonly msgpackrThrew: boolean; readonly reason: string };

const byteLength = (value: string) => Buffer.byteLength(value, "utf8");

export function referenceDecode(
  payload: Uint8Array,
  limits: DecodeLimits = DEFAULT_DECODE_LIMITS,
): ReferenceResult {
  if (payload.length > limits.payloadBytesMax)
    return { ok: false, msgpackrThrew: false, reason: "too large" };
  let value: unknown;
  try {
    // A fresh decoder each time: msgpackr keeps record structures defined inline.
    value = new Unpackr({ mapsAsObjects: false, int64AsType: "bigint", useRecords: false }).unpack(
      payload,
    );
  } catch (error) {
    return { ok: false, msgpackrThrew: true, reason: String(error) };
  }
  // msgpackr turns some extension types, records and the byte 0xc1 into objects of its
  // own (and may read their payload its own way): not plain msgpack, no reference.
  if (!isPlainMsgpack(value))
    return { ok: false, msgpackrThrew: true, reason: "msgpackr extension object" };
  try {
    return { ok: true, batch: new Converter(limits).batch(value) };
  } catch (error) {
    if (error instanceof Reject) return { ok: false, msgpackrThrew: false, reason: error.message };
    throw error;
  }
}

function isPlainMsgpack(value: unknown): boolean {
  if (value === null || typeof value !== "object") return true;
  if (value instanceof Uint8Array) return true;
  if (Array.isArray(value)) return value.every(isPlainMsgpack);
  if (value instanceof Map)
    return [...value].every(([key, item]) => isPlainMsgpack(key) && isPlainMsgpack(item));
  return false;
}

const reject = (reason: string): never => {
  throw new Reject(reason);
};
const rejectBatch = (reason: string): never => {
  throw new BatchReject(reason);
};

function isInt(value: unknown): value is number | bigint {
  return typeof value === "bigint" || (typeof value === "number" && Number.isInteger(value));
}

function u32Of(value: unknown, what: string): number {
  if (isInt(value)) {
    const big = BigInt(value);
    if (big >= 0n && big < 1n << 32n) return Number(big);
  }
  return reject(`${what} is not a u32`);
}

class Converter {
  private blocks = 0;
  private tokenTotal = 0;
  private unknownTags = 0;
  private unknownFields = 0;

  constructor(private readonly limits: DecodeLimits) {}

  private str(value: unknown, what: string): string | null {
    if (value === null) return null;
    if (typeof value !== "string") return reject(`${what} is not a string`);
    return this.checkLength(value);
  }

  private checkLength(value: string): string {
    if (byteLength(value) > this.limits.stringBytesMax) reject("string too long");
    return value;
  }

  batch(value: unknown): BatchSnapshot {
    let ts: unknown;
    let events: unknown;
    let dpRank: unknown = null;
    if (Array.isArray(value)) {
      if (value.length < 2) rejectBatch("batch too short");
      [ts, events] = value;
      if (value.length >= 3) dpRank = value[2];
      this.unknownFields += Math.max(0, value.length - 3);
    } else if (value instanceof Map) {
      for (const [key, item] of value) {
        if (typeof key !== "string") this.unknownFields++;
        else if (key === "ts") ts = item;
        else if (key === "events") events = item;
        else if (key === "data_parallel_rank" || key === "dp_rank") dpRank = item;
        else {
          if (byteLength(key) > this.limits.stringBytesMax) rejectBatch("string too long");
          this.unknownFields++;
        }
      }
      if (value.has("data_parallel_rank") && value.has("dp_rank"))
        rejectBatch("both dp rank aliases");
      if (!value.has("ts") || !value.has("events")) rejectBatch("batch misses ts or events");
    } else rejectBatch("batch is not an array or map");
    if (typeof ts !== "number" && typeof ts !== "bigint") rejectBatch("ts is not a number");
    if (!Array.isArray(events)) rejectBatch("events is not an array");
    const list = events as unknown[];
    if (list.length > this.limits.eventsMax) rejectBatch("too many events");
    const snapshots: EventSnapshot[] = [];
    for (const event of list) {
      const snapshot = this.eventAlone(event);
      if (snapshot !== null) snapshots.push(snapshot);
    }
    let rank: number | null = null;
    if (dpRank !== null) {
      try {
        rank = u32Of(dpRank, "dp rank");
      } catch {
        rejectBatch("dp rank is not a u32");
      }
    }
    return {
      ts: Number(ts),
      dpRank: rank,
      unknownTags: this.unknownTags,
      unknownFields: this.unknownFields,
      events: snapshots,
    };
  }

  /** One event, or a skipped entry if it cannot be read (its unknown fields not counted). */
  private eventAlone(value: unknown): EventSnapshot | null {
    const unknownMark = this.unknownFields;
    const blocksMark = this.blocks;
    const tokensMark = this.tokenTotal;
    this.kind = null;
    try {
      return this.event(value);
    } catch (error) {
      if (!(error instanceof Reject) || error instanceof BatchReject) throw error;
      this.unknownFields = unknownMark;
      this.blocks = blocksMark;
      this.tokenTotal = tokensMark;
      return skippedSnapshot(this.kind);
    }
  }

  /** The kind of the event being read, once its tag is known. */
  private kind: Kind | null = null;

  private event(value: unknown): EventSnapshot | null {
    const fields = new Map<string, unknown>();
    let tail: unknown[] = [];
    let kind: Kind;
    let arrayLength = 0;
    if (Array.isArray(value)) {
      if (value.length === 0 || typeof value[0] !== "string") return reject("event without a tag");
      const tag = this.tag(value[0]);
      if (tag === null) return null;
      kind = this.kind = tag;
      arrayLength = value.length;
      const names =
        kind === "stored"
          ? [
              "block_hashes",
              "parent_block_hash",
              "token_ids",
              "block_size",
              "lora_id",
              "medium",
              "lora_name",
              "extra_keys",
            ]
          : kind === "removed"
            ? ["block_hashes", "medium"]
            : ["ownership"];
      if (kind === "stored" && value.length < 5) reject("BlockStored too short");
      if (kind === "removed" && value.length < 2) reject("BlockRemoved too short");
      names.forEach((name, i) => {
        if (i + 1 >= value.length) return;
        const item = value[i + 1];
        // Position 7: vLLM's lora_name, or SGLang's metadata (a map, or the struct as an array).
        const metadata = name === "lora_name" && (item instanceof Map || Array.isArray(item));
        fields.set(metadata ? "metadata" : name, item);
      });
      tail = value.slice(1 + names.length);
      if (kind === "cleared") {
        this.unknownFields += tail.length;
        tail = [];
      }
    } else if (value instanceof Map) {
      const keys = [...value.keys()];
      const typeAt = keys.indexOf("type");
      if (typeAt < 0) return reject("event map without type");
      if (typeof value.get("type") !== "string") return reject("type is not a string");
      const tag = this.tag(value.get("type") as string);
      if (tag === null) {
        for (const key of keys.slice(0, typeAt)) if (typeof key === "string") this.checkLength(key);
        return null;
      }
      kind = this.kind = tag;
      const known: readonly string[] = KNOWN_KEYS[kind];
      for (const [key, item] of value) {
        if (typeof key === "string" && known.includes(key)) {
          if (key !== "type") fields.set(key, item);
        } else {
          if (typeof key === "string") this.checkLength(key);
          this.unknownFields++;
        }
      }
      const required =
        kind === "stored"
          ? ["block_hashes", "token_ids", "block_size"]
          : kind === "removed"
            ? ["block_hashes"]
            : [];
      for (const name of required) if (!fields.has(name)) reject(`missing ${name}`);
    } else return reject("event is not an array or map");
    return this.fields(kind, fields, tail, arrayLength === 9);
  }

  private tag(tag: string): Kind | null {
    const kind = (
      { BlockStored: "stored", BlockRemoved: "removed", AllBlocksCleared: "cleared" } as const
    )[tag];
    if (kind !== undefined) return kind;
    this.checkLength(tag);
    this.unknownTags++;
    return null;
  }

  private fields(
    kind: Kind,
    fields: Map<string, unknown>,
    tail: unknown[],
    bareMmIds: boolean,
  ): EventSnapshot {
    const snapshot = blank(kind);
    let mmFromInfos = -1;
    let extraKeys: (readonly unknown[] | null)[] = [];
    let topSalt: string | null = null;
    const readMetadata = (value: unknown) => {
      const salt = this.metadata(value);
      if (salt !== undefined) topSalt = salt;
    };
    for (const [name, value] of fields) {
      switch (name) {
        case "block_hashes":
          snapshot.hashes = this.hashes(value);
          break;
        case "parent_block_hash":
          snapshot.parent = value === null ? null : hashOf(value);
          break;
        case "token_ids":
          [snapshot.tokens, snapshot.eagle] = this.tokens(value);
          break;
        case "block_size":
          snapshot.blockSize = u32Of(value, "block_size");
          break;
        case "lora_id":
          snapshot.loraId = value === null ? null : u32Of(value, "lora_id");
          break;
        case "medium":
          snapshot.medium = this.str(value, name);
          break;
        case "lora_name":
          snapshot.loraName = this.str(value, name);
          break;
        case "extra_keys":
          extraKeys = extraKeysList(value);
          break;
        case "block_mm_infos":
          mmFromInfos = mmInfos(value);
          break;
        case "cache_salt":
          topSalt = this.str(value, name);
          break;
        case "metadata":
          readMetadata(value);
          break;
        case "session_id":
          break;
        case "group_idx":
          snapshot.groupIdx = value === null ? null : u32Of(value, name);
          break;
        case "kv_cache_spec_kind":
          snapshot.specKind = this.str(value, name);
          break;
        case "kv_cache_spec_sliding_window":
          snapshot.slidingWindow = value === null ? null : u32Of(value, name);
          break;
        case "locality":
          snapshot.locality = this.str(value, name);
          break;
        case "ownership":
          snapshot.ownership = this.str(value, name);
          break;
        default:
          throw new Error(`unhandled field ${name}`);
      }
    }
    if (tail.length > 0) mmFromInfos = this.tail(tail, snapshot, mmFromInfos, readMetadata);
    if (kind !== "stored") {
      snapshot.mmBlock = mmFromInfos;
      return snapshot;
    }
    const meaning = extraKeysMeaning(extraKeys, snapshot.loraName, bareMmIds, topSalt, (text) =>
      this.checkLength(text),
    );
    const mmFromExtra = meaning.opaque;
    snapshot.mmBlock =
      mmFromExtra < 0
        ? mmFromInfos
        : mmFromInfos < 0
          ? mmFromExtra
          : Math.min(mmFromExtra, mmFromInfos);
    snapshot.cacheSalt = meaning.salt;
    return snapshot;
  }

  /** SGLang's metadata: its cache salt (undefined: none given). */
  private metadata(value: unknown): string | null | undefined {
    if (value === null) return undefined;
    if (Array.isArray(value)) {
      this.unknownFields += Math.max(0, value.length - 2);
      return value.length > 0 ? this.str(value[0], "metadata cache_salt") : undefined;
    }
    if (!(value instanceof Map)) return reject("metadata is not a map");
    let salt: string | null | undefined;
    for (const [key, item] of value) {
      if (key === "cache_salt") salt = this.str(item, "metadata cache_salt");
      else if (key === "session_id") continue;
      else {
        if (typeof key === "string") this.checkLength(key);
        this.unknownFields++;
      }
    }
    return salt;
  }

  private hashes(value: unknown): bigint[] {
    if (!Array.isArray(value)) return reject("block_hashes is not an array");
    this.blocks += value.length;
    if (this.blocks > this.limits.blocksMax) rejectBatch("too many blocks");
    return value.map(hashOf);
  }

  private tokens(value: unknown): [number[], boolean] {
    if (!Array.isArray(value)) return reject("token_ids is not an array");
    const eagle = value.length > 0 && Array.isArray(value[0]);
    let tokens: number[];
    if (eagle) {
      tokens = value.map((pair) => {
        if (!Array.isArray(pair) || pair.length !== 2) reject("bad bigram");
        return u32Of(pair[0], "token");
      });
      tokens.push(u32Of(value[value.length - 1][1], "token"));
      for (const pair of value) u32Of(pair[1], "token");
    } else tokens = value.map((token) => u32Of(token, "token"));
    this.tokenTotal += tokens.length;
    if (this.tokenTotal > this.limits.tokensMax) rejectBatch("too many tokens");
    return [tokens, eagle];
  }

  private tail(
    items: unknown[],
    snapshot: EventSnapshot,
    mmFromInfos: number,
    readMetadata: (value: unknown) => void,
  ): number {
    type Item = { type: "nil" | "uint" | "str" | "list" | "other"; value: unknown };
    const classify = (item: unknown): Item => {
      if (item === null) return { type: "nil", value: null };
      if (typeof item === "number" && !Number.isInteger(item)) return reject("float in the tail");
      if (isInt(item)) {
        const big = BigInt(item);
        return big >= 0n && big < 1n << 32n
          ? { type: "uint", value: Number(big) }
          : { type: "other", value: null };
      }
      if (typeof item === "string") return { type: "str", value: this.checkLength(item) };
      if (Array.isArray(item)) return { type: "list", value: mmInfos(item) };
      return { type: "other", value: null };
    };
    const slots = items.slice(0, 5).map(classify);
    const fixed = ["uint", "str", "uint", "str", "str"];
    if (slots.every((item, i) => item.type === "nil" || item.type === fixed[i])) {
      const [group, kind, window, locality, ownership] = slots;
      if (group?.type === "uint") snapshot.groupIdx = group.value as number;
      if (kind !== undefined) snapshot.specKind = kind.value as string | null;
      if (window?.type === "uint") snapshot.slidingWindow = window.value as number;
      if (locality !== undefined) snapshot.locality = locality.value as string | null;
      if (ownership !== undefined) snapshot.ownership = ownership.value as string | null;
      for (const item of items.slice(5)) {
        if (snapshot.kind === "stored" && item instanceof Map) readMetadata(item);
        else this.unknownFields++;
      }
      return mmFromInfos;
    }
    let uints = 0;
    let strings = 0;
    let lists = 0;
    for (const item of items.map(classify)) {
      if (item.type === "uint" && uints < 2) {
        if (uints++ === 0) snapshot.groupIdx = item.value as number;
        else snapshot.slidingWindow = item.value as number;
      } else if (item.type === "str" && strings++ === 0) snapshot.specKind = item.value as string;
      else if (item.type === "list" && lists++ === 0) mmFromInfos = item.value as number;
      else if (item.type !== "nil") this.unknownFields++;
    }
    return mmFromInfos;
  }
}

function extraKeysList(value: unknown): (readonly unknown[] | null)[] {
  if (value === null) return [];
  if (!Array.isArray(value)) return reject("extra_keys is not an array");
  return value.map((items) => {
    if (items === null) return null;
    if (!Array.isArray(items)) return reject("extra_keys entry is not an array");
    return items;
  });
}

const KNOWN_KEYS = {
  stored: [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "block_mm_infos",
    "cache_salt",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "metadata",
  ],
  removed: [
    "type",
    "block_hashes",
    "medium",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
  ],
  cleared: ["type", "ownership"],
} as const satisfies Record<Kind, readonly string[]>;

function hashOf(value: unknown): bigint {
  if (isInt(value)) return BigInt.asUintN(64, BigInt(value));
  if (value instanceof Uint8Array) {
    if (value.length === 0 || value.length > 64) reject("hash bytes of a bad length");
    return digestToU64(value);
  }
  return reject("hash of a bad type");
}

function mmInfos(value: unknown): number {
  if (value === null) return -1;
  if (!Array.isArray(value)) return reject("block_mm_infos is not an array");
  return value.findIndex((info) => info !== null);
}

// ---- Expected output of a batch built in code ----

/** What `batch`, encoded in `variant`'s layout, must decode to. */
export function expectedSnapshot(batch: KvBatch, variant: WireVariant): BatchSnapshot {
  return {
    ts: batch.ts,
    dpRank: batch.dpRank ?? null,
    unknownTags: 0,
    unknownFields: 0,
    events: batch.events.map((event) => expectedEvent(event, variant)),
  };
}

function hashValue(hash: KvHash): bigint {
  return typeof hash === "bigint" ? BigInt.asUintN(64, hash) : digestToU64(hash);
}

function expectedEvent(event: KvEvent, variant: WireVariant): EventSnapshot {
  const base = { ...blank("cleared"), ownership: event.ownership ?? null };
  if (event.type === "AllBlocksCleared") return base;
  const common = {
    ...base,
    hashes: event.blockHashes.map(hashValue),
    medium: event.medium ?? null,
    groupIdx: event.groupIdx ?? null,
    specKind: event.kvCacheSpecKind ?? null,
    slidingWindow: event.kvCacheSpecSlidingWindow ?? null,
    locality: event.locality ?? null,
  };
  if (event.type === "BlockRemoved") return { ...common, kind: "removed" };
  const pairs = event.tokenIds.length > 0 && typeof event.tokenIds[0] !== "number";
  const tokens = pairs
    ? [
        ...(event.tokenIds as readonly (readonly [number, number])[]).map((pair) => pair[0]),
        (event.tokenIds[event.tokenIds.length - 1] as readonly [number, number])[1],
      ]
    : Array.from(event.tokenIds as ArrayLike<number>);
  const loraName = event.loraName ?? null;
  const meaning = extraKeysMeaning(
    event.extraKeys ?? [],
    loraName,
    variant === "vllm-v5",
    event.cacheSalt ?? null,
  );
  return {
    ...common,
    kind: "stored",
    parent: event.parentBlockHash === null ? null : hashValue(event.parentBlockHash),
    tokens,
    eagle: pairs,
    blockSize: event.blockSize,
    loraName,
    loraId: event.loraId ?? null,
    cacheSalt: meaning.salt,
    mmBlock: meaning.opaque,
  };
}

// ---- Seeded generator of valid batches ----

export { xorshift32 as xorshift } from "../../src/util/random";

export interface RandomBatchOptions {
  /** The producer layout: only fields it has are generated. */
  readonly variant: WireVariant;
  readonly maxEvents?: number;
  readonly maxBlocks?: number;
}

const MEDIUMS = ["GPU", "GPU", "GPU", "CPU", "DISK", "", null, undefined];
const KINDS_OF_SPEC = ["full_attention", "sliding_window", "mla_attention", "mamba"];

/** A random valid batch (every field type right) in the variant's layout. */
export function randomBatch(next: () => number, options: RandomBatchOptions): KvBatch {
  const layout = WIRE_LAYOUTS[options.variant];
  const has = (kind: "stored" | "removed" | "cleared", field: WireField) =>
    layout[kind].fields.includes(field) ||
    layout[kind].optional.includes(field) ||
    (field === "cache_salt" && kind === "stored" && layout.metadata === "appended");
  const pick = <T>(items: readonly T[]): T => items[next() % items.length]!;
  const chance = (percent: number) => next() % 100 < percent;
  const maybe = <T>(kind: "stored" | "removed" | "cleared", field: WireField, value: () => T) =>
    has(kind, field) ? value() : undefined;
  const u64 = () => (BigInt(next()) << 32n) | BigInt(next());
  const hash = (): KvHash => {
    const roll = next() % 10;
    if (roll < 5) return u64();
    if (roll < 6) return BigInt(next() % 300);
    if (roll < 7) return -BigInt(next() % 0x7fff_ffff) - 1n;
    if (roll < 8) return BigInt.asIntN(64, u64());
    return Uint8Array.from({ length: pick([32, 32, 8, 3, 64]) }, () => next() & 0xff);
  };
  const mmHex = () =>
    Array.from({ length: 8 }, () => next().toString(16).padStart(8, "0")).join("");
  const tail = (kind: "stored" | "removed") => ({
    groupIdx: maybe(kind, "group_idx", () => (chance(30) ? next() % 4 : null)),
    kvCacheSpecKind: maybe(kind, "kv_cache_spec_kind", () =>
      chance(30) ? pick(KINDS_OF_SPEC) : null,
    ),
    kvCacheSpecSlidingWindow: maybe(kind, "kv_cache_spec_sliding_window", () =>
      chance(15) ? next() % 4096 : null,
    ),
    locality: maybe(kind, "locality", () =>
      chance(15) ? pick(["LOCAL", "REMOTE", "local"]) : null,
    ),
    ownership: maybe(kind, "ownership", () => (chance(10) ? pick(["kvcr", "framework"]) : null)),
  });
  const extraKeys = (blocks: number, loraName: string | null) =>
    Array.from({ length: blocks }, (_, b) => {
      if (chance(40)) return null;
      const items: KvValue[] = [];
      if (loraName !== null) items.push(loraName);
      if (chance(15)) items.push(chance(50) ? mmHex() : [mmHex(), next() % 100]);
      if (b === 0 && chance(50))
        items.push(pick(["tenant-a", "dynamo-cache-salt:tenant-b", "dynamo-cache-salt:", "x"]));
      if (chance(10)) items.push(Uint8Array.of(1, 2, 3));
      if (chance(5)) items.push(next() % 1000);
      if (chance(5)) items.push("uuid-image");
      return items;
    });
  const events: KvEvent[] = [];
  const count = 1 + (next() % (options.maxEvents ?? 8));
  for (let i = 0; i < count; i++) {
    const roll = next() % 10;
    if (roll < 6) {
      const blocks = next() % ((options.maxBlocks ?? 8) + 1);
      const blockSize = pick([1, 2, 4, 16]);
      const eagle = chance(15) && blocks > 0;
      const tokenCount = blocks * blockSize - (chance(5) ? 1 : 0);
      const tokens = Array.from({ length: Math.max(0, tokenCount) }, () => next() % 200_000);
      const loraName =
        has("stored", "lora_name") && chance(20)
          ? pick(["adapter-a", "my-lora", "ünïcode-lora"])
          : null;
      events.push({
        type: "BlockStored",
        blockHashes: Array.from({ length: blocks }, hash),
        parentBlockHash: chance(60) ? hash() : null,
        tokenIds: eagle
          ? tokens.map((token, t) => [token, tokens[t + 1] ?? next() % 200_000] as const)
          : tokens,
        blockSize,
        loraId: chance(20) ? next() % 64 : null,
        medium: maybe("stored", "medium", () => pick(MEDIUMS) ?? null),
        loraName: maybe("stored", "lora_name", () => loraName),
        extraKeys: maybe("stored", "extra_keys", () =>
          chance(30) ? extraKeys(blocks, loraName) : null,
        ),
        cacheSalt: maybe("stored", "cache_salt", () =>
          chance(30) ? pick(["salt-x", "", "tenant-a"]) : null,
        ),
        sessionId: maybe("stored", "session_id", () => (chance(20) ? "sess-1" : null)),
        ...tail("stored"),
      });
    } else if (roll < 9) {
      events.push({
        type: "BlockRemoved",
        blockHashes: Array.from({ length: next() % ((options.maxBlocks ?? 8) + 1) }, hash),
        medium: maybe("removed", "medium", () => pick(MEDIUMS) ?? null),
        ...(chance(50) ? tail("removed") : {}),
      });
    } else {
      events.push({
        type: "AllBlocksCleared",
        ownership: maybe("cleared", "ownership", () => (chance(20) ? "kvcr" : null)),
      });
    }
  }
  const dpRank = layout.batch === "array2" ? null : chance(50) ? next() % 8 : null;
  return { ts: 1_700_000_000 + next() / 1000, events, dpRank };
}
