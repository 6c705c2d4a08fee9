/**
 * Encodes KV-event batches byte for byte as an engine's msgspec encoder does, in one
 * producer's layout (./variants.ts), for tests, fuzz seeds, the decode benchmark and
 * the mock engines.
 *
 * msgspec's rules, which this follows: ints in the smallest encoding (unsigned forms
 * for values >= 0, so a u64 hash >= 2^63 is a uint64 and one below 2^32 a
 * uint8/16/32), floats always float64, str8 from 32 bytes, arrays/maps in the smallest
 * header; array events at their full length, trailing nils included (`omit_defaults`
 * does not shorten arrays); map events without the default-valued fields that have a
 * default; the tag first. A field the chosen layout does not have is an error, so a
 * test cannot publish a shape no engine sends.
 *
 * msgpackr cannot produce these bytes (it writes integral floats as ints and every
 * bigint as int64), so this uses kvedge's own encoder (src/wire/msgpack.ts). msgpackr
 * stays the independent reference decoder in the tests.
 */

import { MsgpackEncoder } from "../msgpack";
import { WIRE_LAYOUTS, type EventLayout, type WireField, type WireVariant } from "./variants";

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
  /** The fields below may be left undefined: written as nil where the layout has them. */
  readonly loraId?: number | null;
  readonly medium?: string | null;
  readonly loraName?: string | null;
  readonly extraKeys?: readonly (readonly KvValue[] | null)[] | null;
  readonly groupIdx?: number | null;
  readonly kvCacheSpecKind?: string | null;
  readonly kvCacheSpecSlidingWindow?: number | null;
  readonly locality?: string | null;
  readonly ownership?: string | null;
  /** SGLang's salt: a map key (S5) or the appended metadata map (S4, F1). */
  readonly cacheSalt?: string | null;
  /** SGLang S5, vLLM V9. */
  readonly sessionId?: string | null;
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
  /** `data_parallel_rank` (SGLang: `attn_dp_rank`); nil when null, left out of a map batch. */
  readonly dpRank?: number | null;
}

/**
 * The producer layout to write: `variant`, or by `form` the newest of that form:
 * "array" = vLLM V7 (0.22/0.23, the last array era), "map" = vLLM V9 (maps, 0.26+).
 */
export type EncodeOptions =
  | { readonly variant: WireVariant; readonly form?: undefined }
  | { readonly form: "array" | "map"; readonly variant?: undefined };

export function variantOf(options: EncodeOptions): WireVariant {
  return options.variant ?? (options.form === "map" ? "vllm-v9" : "vllm-v7");
}

export function encodeKvBatch(batch: KvBatch, options: EncodeOptions): Uint8Array {
  const variant = variantOf(options);
  const layout = WIRE_LAYOUTS[variant];
  const encoder = new MsgpackEncoder();
  const events = (): void => {
    encoder.arrayHeader(batch.events.length);
    for (const event of batch.events) writeEvent(encoder, event, variant);
  };
  const dpRank = batch.dpRank ?? null;
  if (layout.batch === "array2") {
    if (dpRank !== null) throw new Error(`${variant} batches carry no dp rank`);
    encoder.arrayHeader(2);
    encoder.float64(batch.ts);
    events();
  } else if (layout.batch === "array3") {
    encoder.arrayHeader(3);
    encoder.float64(batch.ts);
    events();
    if (dpRank === null) encoder.nil();
    else encoder.int(dpRank);
  } else {
    encoder.mapHeader(dpRank === null ? 2 : 3);
    encoder.string("ts");
    encoder.float64(batch.ts);
    encoder.string("events");
    events();
    if (dpRank !== null) {
      encoder.string("data_parallel_rank");
      encoder.int(dpRank);
    }
  }
  return encoder.finish();
}

type Write = (encoder: MsgpackEncoder, value: never) => void;

const writeHash = (encoder: MsgpackEncoder, hash: KvHash): void => {
  if (typeof hash === "bigint") encoder.int(hash);
  else encoder.bytes(hash);
};
const writeHashes = (encoder: MsgpackEncoder, hashes: readonly KvHash[]): void => {
  encoder.arrayHeader(hashes.length);
  for (const hash of hashes) writeHash(encoder, hash);
};
const writeTokens = (encoder: MsgpackEncoder, tokens: KvBlockStored["tokenIds"]): void => {
  encoder.arrayHeader(tokens.length);
  for (const token of tokens) {
    if (typeof token === "number") encoder.int(token);
    else {
      encoder.arrayHeader(2);
      encoder.int(token[0]);
      encoder.int(token[1]);
    }
  }
};
const writeInt = (encoder: MsgpackEncoder, value: number): void => encoder.int(value);
const writeString = (encoder: MsgpackEncoder, value: string): void => encoder.string(value);
const writeAny = (encoder: MsgpackEncoder, value: KvValue): void => encoder.value(value);

/** Per wire field: the event property it comes from and how it is written. */
const FIELDS: Readonly<Record<WireField, readonly [property: string, write: Write]>> = {
  block_hashes: ["blockHashes", writeHashes],
  parent_block_hash: ["parentBlockHash", writeHash],
  token_ids: ["tokenIds", writeTokens],
  block_size: ["blockSize", writeInt],
  lora_id: ["loraId", writeInt],
  medium: ["medium", writeString],
  lora_name: ["loraName", writeString],
  extra_keys: ["extraKeys", writeAny],
  group_idx: ["groupIdx", writeInt],
  kv_cache_spec_kind: ["kvCacheSpecKind", writeString],
  kv_cache_spec_sliding_window: ["kvCacheSpecSlidingWindow", writeInt],
  locality: ["locality", writeString],
  ownership: ["ownership", writeString],
  cache_salt: ["cacheSalt", writeString],
  session_id: ["sessionId", writeString],
};
const PROPERTY_FIELDS: Readonly<Record<string, WireField>> = Object.fromEntries(
  Object.entries(FIELDS).map(([field, [property]]) => [property, field as WireField]),
);

function layoutOf(event: KvEvent, variant: WireVariant): EventLayout {
  const layout = WIRE_LAYOUTS[variant];
  if (event.type === "BlockStored") return layout.stored;
  return event.type === "BlockRemoved" ? layout.removed : layout.cleared;
}

/** What the event gives: its non-nil fields, by wire name. */
function givenFields(event: KvEvent): Partial<Record<WireField, unknown>> {
  const given: Partial<Record<WireField, unknown>> = {};
  for (const [property, value] of Object.entries(event)) {
    if (property === "type" || value === undefined || value === null) continue;
    const field = PROPERTY_FIELDS[property];
    if (field === undefined) throw new Error(`unknown event property ${property}`);
    given[field] = value;
  }
  return given;
}

function writeEvent(encoder: MsgpackEncoder, event: KvEvent, variant: WireVariant): void {
  const layout = layoutOf(event, variant);
  const given = givenFields(event);
  const appended =
    WIRE_LAYOUTS[variant].metadata === "appended" && event.type === "BlockStored"
      ? (event.cacheSalt ?? null)
      : null;
  if (appended !== null) delete given.cache_salt;
  for (const field of Object.keys(given) as WireField[]) {
    if (!layout.fields.includes(field) && !layout.optional.includes(field))
      throw new Error(`${variant} ${event.type} has no ${field}`);
  }
  const value = (field: WireField) => given[field] ?? null;
  if (WIRE_LAYOUTS[variant].events === "array") {
    encoder.arrayHeader(1 + layout.fields.length + (appended === null ? 0 : 1));
    encoder.string(event.type);
    for (const field of layout.fields) writeValue(encoder, field, value(field));
    if (appended !== null) {
      encoder.mapHeader(1);
      encoder.string("cache_salt");
      encoder.string(appended);
    }
    return;
  }
  const written = [
    ...layout.fields,
    ...layout.optional.filter((field) => field in given),
  ] as WireField[];
  encoder.mapHeader(1 + written.length);
  encoder.string("type");
  encoder.string(event.type);
  for (const field of written) {
    encoder.string(field);
    writeValue(encoder, field, value(field));
  }
}

function writeValue(encoder: MsgpackEncoder, field: WireField, value: unknown): void {
  if (value === null) encoder.nil();
  else FIELDS[field][1](encoder, value as never);
}
