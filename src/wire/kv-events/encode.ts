/**
 * Encodes KV-event batches byte for byte as vLLM's msgspec encoder does, for tests,
 * fuzz seeds, the decode benchmark and the mock engines.
 *
 * msgspec's rules, which this follows: ints in the smallest encoding (unsigned
 * forms for values >= 0, so a u64 hash >= 2^63 is a uint64 and one below 2^32 a
 * uint8/16/32), floats always float64, str8 from 32 bytes, arrays/maps in the
 * smallest header; `omit_defaults` drops trailing fields at their default in the
 * array form and default-valued fields in the map form; the tag comes first.
 *
 * msgpackr cannot produce these bytes (it writes integral floats as ints and every
 * bigint as int64), so this uses kvedge's own writer (src/wire/msgpack.ts). msgpackr
 * stays the independent reference decoder in the tests.
 */

import { MsgpackWriter } from "../msgpack";

/** A block hash: an int (u64, or a negative i64 as some producers send), or raw digest bytes. */
export type KvHash = bigint | Uint8Array;

/** Any value msgpack can carry, for extra keys and unknown fields. */
export type KvValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | readonly KvValue[]
  | { readonly [key: string]: KvValue };

export interface KvBlockStored {
  readonly type: "BlockStored";
  readonly blockHashes: readonly KvHash[];
  readonly parentBlockHash: KvHash | null;
  /** Token ids, or Eagle bigram pairs. */
  readonly tokenIds: readonly number[] | Uint32Array | readonly (readonly [number, number])[];
  readonly blockSize: number;
  /**
   * The fields below may be left undefined. In the array form the event then ends
   * before the first undefined one of `loraId`, `medium`, `loraName` (SGLang ends
   * after `loraId`); later fields are written only up to the last non-null one.
   */
  readonly loraId?: number | null;
  readonly medium?: string | null;
  readonly loraName?: string | null;
  readonly extraKeys?: readonly (readonly KvValue[] | null)[] | null;
  readonly groupIdx?: number | null;
  readonly kvCacheSpecKind?: string | null;
  readonly kvCacheSpecSlidingWindow?: number | null;
  readonly locality?: string | null;
  readonly ownership?: string | null;
  /** Map form only (TRT-LLM style top-level salt). */
  readonly cacheSalt?: string | null;
  /** Map form only (Dynamo's per-block MM infos). */
  readonly blockMmInfos?: readonly KvValue[] | null;
}

export interface KvBlockRemoved {
  readonly type: "BlockRemoved";
  readonly blockHashes: readonly KvHash[];
  readonly medium?: string | null;
  readonly groupIdx?: number | null;
  readonly kvCacheSpecKind?: string | null;
  readonly kvCacheSpecSlidingWindow?: number | null;
  readonly locality?: string | null;
  readonly ownership?: string | null;
}

export interface KvAllBlocksCleared {
  readonly type: "AllBlocksCleared";
  readonly ownership?: string | null;
}

export type KvEvent = KvBlockStored | KvBlockRemoved | KvAllBlocksCleared;

export interface KvBatch {
  /** Seconds; always written as float64. */
  readonly ts: number;
  readonly events: readonly KvEvent[];
  /** Omitted when null or undefined. */
  readonly dpRank?: number | null;
}

export interface EncodeOptions {
  /** Events as tagged arrays (vLLM up to 0.23, SGLang) or maps with "type" (vLLM 0.24+). */
  readonly form: "array" | "map";
  /** The batch envelope: an array (every vLLM release seen) unless "map" is asked for. */
  readonly batchForm?: "array" | "map";
}

export function encodeKvBatch(batch: KvBatch, options: EncodeOptions): Uint8Array {
  const writer = new MsgpackWriter();
  const events = (): void => {
    writer.arrayHeader(batch.events.length);
    for (const event of batch.events) writeEvent(writer, event, options.form);
  };
  const hasDpRank = batch.dpRank !== undefined && batch.dpRank !== null;
  if ((options.batchForm ?? "array") === "array") {
    writer.arrayHeader(hasDpRank ? 3 : 2);
    writer.float64(batch.ts);
    events();
    if (hasDpRank) writer.int(batch.dpRank!);
  } else {
    writer.mapHeader(hasDpRank ? 3 : 2);
    writer.string("ts");
    writer.float64(batch.ts);
    writer.string("events");
    events();
    if (hasDpRank) {
      writer.string("data_parallel_rank");
      writer.int(batch.dpRank!);
    }
  }
  return writer.finish();
}

type Field = readonly [
  name: string,
  value: unknown,
  write: (writer: MsgpackWriter, value: never) => void,
];

const writeHash = (writer: MsgpackWriter, hash: KvHash): void => {
  if (typeof hash === "bigint") writer.int(hash);
  else writer.bytes(hash);
};
const writeHashes = (writer: MsgpackWriter, hashes: readonly KvHash[]): void => {
  writer.arrayHeader(hashes.length);
  for (const hash of hashes) writeHash(writer, hash);
};
const writeOptionalHash = (writer: MsgpackWriter, hash: KvHash | null): void => {
  if (hash === null) writer.nil();
  else writeHash(writer, hash);
};
const writeTokens = (writer: MsgpackWriter, tokens: KvBlockStored["tokenIds"]): void => {
  writer.arrayHeader(tokens.length);
  for (const token of tokens) {
    if (typeof token === "number") writer.int(token);
    else {
      writer.arrayHeader(2);
      writer.int(token[0]);
      writer.int(token[1]);
    }
  }
};
const writeOptionalInt = (writer: MsgpackWriter, value: number | null): void => {
  if (value === null) writer.nil();
  else writer.int(value);
};
const writeOptionalString = (writer: MsgpackWriter, value: string | null): void => {
  if (value === null) writer.nil();
  else writer.string(value);
};
const writeAny = (writer: MsgpackWriter, value: KvValue): void => writer.value(value);

/** The fields of an event in declaration order, and how many of them are required. */
function fieldsOf(event: KvEvent, form: "array" | "map"): { fields: Field[]; required: number } {
  switch (event.type) {
    case "BlockStored": {
      const fields: Field[] = [
        ["block_hashes", event.blockHashes, writeHashes],
        ["parent_block_hash", event.parentBlockHash, writeOptionalHash],
        ["token_ids", event.tokenIds, writeTokens],
        ["block_size", event.blockSize, writeOptionalInt],
        ["lora_id", event.loraId, writeOptionalInt],
        ["medium", event.medium, writeOptionalString],
        ["lora_name", event.loraName, writeOptionalString],
        ["extra_keys", event.extraKeys, writeAny],
        ["group_idx", event.groupIdx, writeOptionalInt],
        ["kv_cache_spec_kind", event.kvCacheSpecKind, writeOptionalString],
        ["kv_cache_spec_sliding_window", event.kvCacheSpecSlidingWindow, writeOptionalInt],
        ["locality", event.locality, writeOptionalString],
        ["ownership", event.ownership, writeOptionalString],
      ];
      const mapOnly = event.cacheSalt !== undefined || event.blockMmInfos !== undefined;
      if (mapOnly && form === "array")
        throw new Error("cache_salt and block_mm_infos exist only in the map form");
      fields.push(["cache_salt", event.cacheSalt, writeOptionalString]);
      fields.push(["block_mm_infos", event.blockMmInfos, writeAny]);
      // lora_id, medium and lora_name have no default in vLLM: written when given.
      let required = 4;
      while (required < 7 && fields[required]![1] !== undefined) required++;
      return { fields, required };
    }
    case "BlockRemoved":
      return {
        fields: [
          ["block_hashes", event.blockHashes, writeHashes],
          ["medium", event.medium, writeOptionalString],
          ["group_idx", event.groupIdx, writeOptionalInt],
          ["kv_cache_spec_kind", event.kvCacheSpecKind, writeOptionalString],
          ["kv_cache_spec_sliding_window", event.kvCacheSpecSlidingWindow, writeOptionalInt],
          ["locality", event.locality, writeOptionalString],
          ["ownership", event.ownership, writeOptionalString],
        ],
        required: event.medium === undefined ? 1 : 2,
      };
    case "AllBlocksCleared":
      return { fields: [["ownership", event.ownership, writeOptionalString]], required: 0 };
  }
}

function writeEvent(writer: MsgpackWriter, event: KvEvent, form: "array" | "map"): void {
  const { fields, required } = fieldsOf(event, form);
  const present = (value: unknown) => value !== undefined && value !== null;
  if (form === "array") {
    let length = required;
    for (let i = required; i < fields.length; i++) if (present(fields[i]![1])) length = i + 1;
    writer.arrayHeader(1 + length);
    writer.string(event.type);
    for (let i = 0; i < length; i++) writeField(writer, fields[i]!);
    return;
  }
  const written = fields.filter((field, i) => i < required || present(field[1]));
  writer.mapHeader(1 + written.length);
  writer.string("type");
  writer.string(event.type);
  for (const field of written) {
    writer.string(field[0]);
    writeField(writer, field);
  }
}

function writeField(writer: MsgpackWriter, [, value, write]: Field): void {
  if (value === undefined || value === null) writer.nil();
  else write(writer, value as never);
}
