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
 * - `randomBatch`: a seeded generator of valid, vLLM-shaped batches.
 */
import { Unpackr } from "msgpackr";
import {
  DEFAULT_DECODE_LIMITS,
  EVENT_CLEARED,
  EVENT_REMOVED,
  EVENT_STORED,
  FLAG_EAGLE,
  FLAG_GROUP,
  FLAG_PARENT,
  FLAG_WINDOW,
  type DecodedBatch,
  type DecodeLimits,
  type KvBatch,
  type KvEvent,
  type KvHash,
  type KvValue,
} from "../../src/wire/kv-events";
import { u64 } from "../../src/util/u64";

export interface EventSnapshot {
  kind: "stored" | "removed" | "cleared";
  hashes: bigint[];
  parent: bigint | null;
  tokens: number[];
  eagle: boolean;
  blockSize: number;
  medium: string | null;
  loraName: string | null;
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

export function snapshotBatch(batch: DecodedBatch): BatchSnapshot {
  const events: EventSnapshot[] = [];
  for (let e = 0; e < batch.eventCount; e++) {
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

/** The salt rule: drop the first string equal to the LoRA name; prefer a prefixed one; else the first non-empty. */
export function saltFromCandidates(
  candidates: readonly string[],
  loraName: string | null,
): string | null {
  const rest = [...candidates];
  if (loraName !== null) {
    const at = rest.indexOf(loraName);
    if (at >= 0) rest.splice(at, 1);
  }
  for (const candidate of rest) {
    if (candidate.startsWith(SALT_PREFIX) && candidate.length > SALT_PREFIX.length) {
      return candidate.slice(SALT_PREFIX.length);
    }
  }
  return rest.find((candidate) => !candidate.startsWith(SALT_PREFIX) && candidate !== "") ?? null;
}

/** Low 64 bits of a digest, big-endian (vLLM's int conversion). */
export function digestToU64(bytes: Uint8Array): bigint {
  let value = 0n;
  for (const byte of bytes.subarray(Math.max(0, bytes.length - 8)))
    value = (value << 8n) | BigInt(byte);
  return value;
}

// ---- Reference path: msgpackr + conversion ----

class Reject extends Error {}

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
      if (value.length < 2) reject("batch too short");
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
          this.checkLength(key);
          this.unknownFields++;
        }
      }
      if (value.has("data_parallel_rank") && value.has("dp_rank")) reject("both dp rank aliases");
      if (!value.has("ts") || !value.has("events")) reject("batch misses ts or events");
    } else reject("batch is not an array or map");
    if (typeof ts !== "number" && typeof ts !== "bigint") reject("ts is not a number");
    if (!Array.isArray(events)) reject("events is not an array");
    const list = events as unknown[];
    if (list.length > this.limits.eventsMax) reject("too many events");
    const snapshots: EventSnapshot[] = [];
    for (const event of list) {
      const snapshot = this.event(event);
      if (snapshot !== null) snapshots.push(snapshot);
    }
    return {
      ts: Number(ts),
      dpRank: dpRank === null ? null : u32Of(dpRank, "dp rank"),
      unknownTags: this.unknownTags,
      unknownFields: this.unknownFields,
      events: snapshots,
    };
  }

  private event(value: unknown): EventSnapshot | null {
    const fields = new Map<string, unknown>();
    let tail: unknown[] = [];
    let kind: EventSnapshot["kind"];
    if (Array.isArray(value)) {
      if (value.length === 0 || typeof value[0] !== "string") return reject("event without a tag");
      kind = this.tag(value[0]) as EventSnapshot["kind"];
      if (kind === null) return null;
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
        if (i + 1 < value.length) fields.set(name, value[i + 1]);
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
      kind = tag;
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
    return this.fields(kind, fields, tail);
  }

  private tag(tag: string): EventSnapshot["kind"] | null {
    const kind = (
      { BlockStored: "stored", BlockRemoved: "removed", AllBlocksCleared: "cleared" } as const
    )[tag];
    if (kind !== undefined) return kind;
    this.checkLength(tag);
    this.unknownTags++;
    return null;
  }

  private fields(
    kind: EventSnapshot["kind"],
    fields: Map<string, unknown>,
    tail: unknown[],
  ): EventSnapshot {
    const snapshot: EventSnapshot = {
      kind,
      hashes: [],
      parent: null,
      tokens: [],
      eagle: false,
      blockSize: 0,
      medium: null,
      loraName: null,
      cacheSalt: null,
      groupIdx: null,
      slidingWindow: null,
      specKind: null,
      locality: null,
      ownership: null,
      mmBlock: -1,
    };
    let mmFromExtra = -1;
    let mmFromInfos = -1;
    let saltCandidates: string[] = [];
    let topSalt: string | null = null;
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
          if (value !== null && !isInt(value)) reject("lora_id");
          break;
        case "medium":
          snapshot.medium = this.str(value, name);
          break;
        case "lora_name":
          snapshot.loraName = this.str(value, name);
          break;
        case "extra_keys":
          [mmFromExtra, saltCandidates] = this.extraKeys(value);
          break;
        case "block_mm_infos":
          mmFromInfos = mmInfos(value);
          break;
        case "cache_salt":
          topSalt = this.str(value, name);
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
    if (tail.length > 0) mmFromInfos = this.tail(tail, snapshot, mmFromInfos);
    snapshot.mmBlock =
      mmFromExtra < 0
        ? mmFromInfos
        : mmFromInfos < 0
          ? mmFromExtra
          : Math.min(mmFromExtra, mmFromInfos);
    if (kind === "stored")
      snapshot.cacheSalt = topSalt ?? saltFromCandidates(saltCandidates, snapshot.loraName);
    return snapshot;
  }

  private hashes(value: unknown): bigint[] {
    if (!Array.isArray(value)) return reject("block_hashes is not an array");
    this.blocks += value.length;
    if (this.blocks > this.limits.blocksMax) reject("too many blocks");
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
    if (this.tokenTotal > this.limits.tokensMax) reject("too many tokens");
    return [tokens, eagle];
  }

  private extraKeys(value: unknown): [number, string[]] {
    if (value === null) return [-1, []];
    if (!Array.isArray(value)) return reject("extra_keys is not an array");
    let mm = -1;
    const candidates: string[] = [];
    value.forEach((items, block) => {
      if (items === null) return;
      if (!Array.isArray(items)) reject("extra_keys entry is not an array");
      for (const item of items) {
        const text =
          typeof item === "string"
            ? item
            : Array.isArray(item) && typeof item[0] === "string"
              ? item[0]
              : null;
        if (text === null) continue;
        if (isMmHashString(text)) {
          if (mm < 0) mm = block;
        } else {
          this.checkLength(text);
          if (typeof item === "string" && block === 0 && candidates.length < 8)
            candidates.push(text);
        }
      }
    });
    return [mm, candidates];
  }

  private tail(items: unknown[], snapshot: EventSnapshot, mmFromInfos: number): number {
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
    const classified = items.map(classify);
    const fixed = ["uint", "str", "uint", "str", "str"];
    const isFixed = classified
      .slice(0, 5)
      .every((item, i) => item.type === "nil" || item.type === fixed[i]);
    if (isFixed) {
      const [group, kind, window, locality, ownership] = classified;
      if (group?.type === "uint") snapshot.groupIdx = group.value as number;
      if (kind !== undefined) snapshot.specKind = kind.value as string | null;
      if (window?.type === "uint") snapshot.slidingWindow = window.value as number;
      if (locality !== undefined) snapshot.locality = locality.value as string | null;
      if (ownership !== undefined) snapshot.ownership = ownership.value as string | null;
      this.unknownFields += Math.max(0, classified.length - 5);
      return mmFromInfos;
    }
    let uints = 0;
    let strings = 0;
    let lists = 0;
    for (const item of classified) {
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
} as const satisfies Record<EventSnapshot["kind"], readonly string[]>;

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

export function expectedSnapshot(batch: KvBatch): BatchSnapshot {
  return {
    ts: batch.ts,
    dpRank: batch.dpRank ?? null,
    unknownTags: 0,
    unknownFields: 0,
    events: batch.events.map(expectedEvent),
  };
}

function hashValue(hash: KvHash): bigint {
  return typeof hash === "bigint" ? BigInt.asUintN(64, hash) : digestToU64(hash);
}

function expectedEvent(event: KvEvent): EventSnapshot {
  const base: EventSnapshot = {
    kind: "cleared",
    hashes: [],
    parent: null,
    tokens: [],
    eagle: false,
    blockSize: 0,
    medium: null,
    loraName: null,
    cacheSalt: null,
    groupIdx: null,
    slidingWindow: null,
    specKind: null,
    locality: null,
    ownership: event.ownership ?? null,
    mmBlock: -1,
  };
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
  const extra = event.extraKeys ?? [];
  const mmOf = (items: readonly KvValue[] | null) =>
    (items ?? []).some(
      (item) => isMmHashString(item) || (Array.isArray(item) && isMmHashString(item[0])),
    );
  const mmFromExtra = extra.findIndex(mmOf);
  const mmFromInfos = (event.blockMmInfos ?? []).findIndex((info) => info !== null);
  const candidates = (extra[0] ?? []).filter(
    (item): item is string => typeof item === "string" && !isMmHashString(item),
  );
  const loraName = event.loraName ?? null;
  return {
    ...common,
    kind: "stored",
    parent: event.parentBlockHash === null ? null : hashValue(event.parentBlockHash),
    tokens,
    eagle: pairs,
    blockSize: event.blockSize,
    loraName,
    cacheSalt: event.cacheSalt ?? saltFromCandidates(candidates.slice(0, 8), loraName),
    mmBlock:
      mmFromExtra < 0
        ? mmFromInfos
        : mmFromInfos < 0
          ? mmFromExtra
          : Math.min(mmFromExtra, mmFromInfos),
  };
}

// ---- Seeded generator of valid batches ----

export { xorshift32 as xorshift } from "../../src/util/random";

export interface RandomBatchOptions {
  readonly form: "array" | "map";
  readonly maxEvents?: number;
  readonly maxBlocks?: number;
}

const MEDIUMS = ["GPU", "GPU", "GPU", "CPU", "DISK", "", null, undefined];
const KINDS_OF_SPEC = ["full_attention", "sliding_window", "mla_attention", "mamba"];

/** A random valid batch (every field type right), shaped like what vLLM and SGLang send. */
export function randomBatch(next: () => number, options: RandomBatchOptions): KvBatch {
  const pick = <T>(items: readonly T[]): T => items[next() % items.length]!;
  const chance = (percent: number) => next() % 100 < percent;
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
  const events: KvEvent[] = [];
  const count = 1 + (next() % (options.maxEvents ?? 8));
  for (let i = 0; i < count; i++) {
    const roll = next() % 10;
    const tail = () => ({
      groupIdx: chance(30) ? next() % 4 : undefined,
      kvCacheSpecKind: chance(30) ? pick(KINDS_OF_SPEC) : undefined,
      kvCacheSpecSlidingWindow: chance(15) ? next() % 4096 : undefined,
      locality: chance(15) ? pick(["LOCAL", "REMOTE", "local"]) : undefined,
      ownership: chance(10) ? pick(["kvcr", "framework"]) : undefined,
    });
    if (roll < 6) {
      const blocks = next() % ((options.maxBlocks ?? 8) + 1);
      const blockSize = pick([1, 2, 4, 16]);
      const eagle = chance(15) && blocks > 0;
      const tokenCount = blocks * blockSize - (chance(5) ? 1 : 0);
      const tokens = Array.from({ length: Math.max(0, tokenCount) }, () => next() % 200_000);
      const loraName = chance(20) ? pick(["adapter-a", "my-lora", "ünïcode-lora"]) : null;
      const sglang = options.form === "array" && chance(10);
      const extraKeys = chance(30)
        ? Array.from({ length: blocks }, (_, b) => {
            if (chance(40)) return null;
            const items: KvValue[] = [];
            if (loraName !== null) items.push(loraName);
            if (chance(20)) items.push(chance(50) ? mmHex() : [mmHex(), next() % 100]);
            if (b === 0 && chance(50))
              items.push(pick(["tenant-a", "dynamo-cache-salt:tenant-b", "dynamo-cache-salt:"]));
            if (chance(20)) items.push(Uint8Array.of(1, 2, 3));
            if (chance(10)) items.push(next() % 1000);
            return items;
          })
        : undefined;
      events.push({
        type: "BlockStored",
        blockHashes: Array.from({ length: blocks }, hash),
        parentBlockHash: chance(60) ? hash() : null,
        tokenIds: eagle
          ? tokens.map((token, t) => [token, tokens[t + 1] ?? next() % 200_000] as const)
          : tokens,
        blockSize,
        loraId: sglang ? pick([null, 3]) : null,
        ...(sglang ? {} : { medium: pick(MEDIUMS) ?? null, loraName }),
        ...(sglang ? {} : { extraKeys, ...tail() }),
        ...(options.form === "map" && chance(10) ? { cacheSalt: pick(["salt-x", ""]) } : {}),
        ...(options.form === "map" && chance(10)
          ? {
              blockMmInfos: Array.from({ length: blocks }, () =>
                chance(30) ? { mm_objects: [] } : null,
              ),
            }
          : {}),
      });
    } else if (roll < 9) {
      events.push({
        type: "BlockRemoved",
        blockHashes: Array.from({ length: next() % ((options.maxBlocks ?? 8) + 1) }, hash),
        medium: pick(MEDIUMS),
        ...(chance(50) ? tail() : {}),
      });
    } else {
      events.push({ type: "AllBlocksCleared", ...(chance(20) ? { ownership: "kvcr" } : {}) });
    }
  }
  return { ts: 1_700_000_000 + next() / 1000, events, dpRank: chance(50) ? next() % 8 : null };
}
