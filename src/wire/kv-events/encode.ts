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
 * bigint as int64), so this is a small dedicated writer. msgpackr stays the
 * independent reference decoder in the tests.
 */

/** A block hash: an int (u64, or a negative i64 as some producers send), or raw digest bytes. */
export type KvHash = bigint | Uint8Array;

/** Any value msgpack can carry, for extra keys and unknown fields. */
export type KvValue =
  | null | boolean | number | bigint | string | Uint8Array | readonly KvValue[]
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
  const writer = new Writer();
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

type Field = readonly [name: string, value: unknown, write: (writer: Writer, value: never) => void];

const writeHash = (writer: Writer, hash: KvHash): void => {
  if (typeof hash === "bigint") writer.int(hash);
  else writer.bytes(hash);
};
const writeHashes = (writer: Writer, hashes: readonly KvHash[]): void => {
  writer.arrayHeader(hashes.length);
  for (const hash of hashes) writeHash(writer, hash);
};
const writeOptionalHash = (writer: Writer, hash: KvHash | null): void => {
  if (hash === null) writer.nil();
  else writeHash(writer, hash);
};
const writeTokens = (writer: Writer, tokens: KvBlockStored["tokenIds"]): void => {
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
const writeOptionalInt = (writer: Writer, value: number | null): void => {
  if (value === null) writer.nil();
  else writer.int(value);
};
const writeOptionalString = (writer: Writer, value: string | null): void => {
  if (value === null) writer.nil();
  else writer.string(value);
};
const writeAny = (writer: Writer, value: KvValue): void => writer.value(value);

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
      if (mapOnly && form === "array") throw new Error("cache_salt and block_mm_infos exist only in the map form");
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

function writeEvent(writer: Writer, event: KvEvent, form: "array" | "map"): void {
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

function writeField(writer: Writer, [, value, write]: Field): void {
  if (value === undefined || value === null) writer.nil();
  else write(writer, value as never);
}

const textEncoder = new TextEncoder();
const UINT_CODES = [0xcc, 0xcd, 0xce] as const;

/** A growable msgpack writer with msgspec's choice of encodings. */
class Writer {
  private buffer = new Uint8Array(256);
  private view = new DataView(this.buffer.buffer);
  private length = 0;

  finish(): Uint8Array {
    return this.buffer.slice(0, this.length);
  }

  private room(bytes: number): void {
    if (this.length + bytes <= this.buffer.length) return;
    let capacity = this.buffer.length * 2;
    while (capacity < this.length + bytes) capacity *= 2;
    const grown = new Uint8Array(capacity);
    grown.set(this.buffer.subarray(0, this.length));
    this.buffer = grown;
    this.view = new DataView(grown.buffer);
  }

  private byte(value: number): void {
    this.room(1);
    this.buffer[this.length++] = value;
  }

  private header(value: number, fix: number, fixMax: number, codes: readonly number[]): void {
    if (value <= fixMax) return this.byte(fix | value);
    this.sized(value, codes);
  }

  /** `codes`: the 8-, 16- and 32-bit forms (0 where the type has none). */
  private sized(value: number, codes: readonly number[]): void {
    this.room(5);
    if (value < 0x100 && codes[0] !== 0) {
      this.buffer[this.length++] = codes[0]!;
      this.buffer[this.length++] = value;
    } else if (value < 0x1_0000) {
      this.buffer[this.length++] = codes[1]!;
      this.view.setUint16(this.length, value);
      this.length += 2;
    } else {
      this.buffer[this.length++] = codes[2]!;
      this.view.setUint32(this.length, value);
      this.length += 4;
    }
  }

  nil(): void {
    this.byte(0xc0);
  }

  bool(value: boolean): void {
    this.byte(value ? 0xc3 : 0xc2);
  }

  int(value: number | bigint): void {
    // Fast path for token ids and other small non-negative numbers: same bytes, no BigInt.
    if (typeof value === "number" && value >= 0 && value < 0x1_0000_0000 && Number.isInteger(value)) {
      this.room(5);
      if (value < 0x80) this.buffer[this.length++] = value;
      else this.sized(value, UINT_CODES);
      return;
    }
    const big = BigInt(value);
    if (big < -(1n << 63n) || big >= 1n << 64n) throw new RangeError(`${big} does not fit in 64 bits`);
    this.room(9);
    if (big >= 0n) {
      if (big < 0x80n) this.buffer[this.length++] = Number(big);
      else if (big < 0x1_0000_0000n) this.sized(Number(big), [0xcc, 0xcd, 0xce]);
      else {
        this.buffer[this.length++] = 0xcf;
        this.view.setBigUint64(this.length, big);
        this.length += 8;
      }
    } else if (big >= -32n) this.buffer[this.length++] = Number(big) & 0xff;
    else if (big >= -0x80n) {
      this.buffer[this.length++] = 0xd0;
      this.view.setInt8(this.length++, Number(big));
    } else if (big >= -0x8000n) {
      this.buffer[this.length++] = 0xd1;
      this.view.setInt16(this.length, Number(big));
      this.length += 2;
    } else if (big >= -0x8000_0000n) {
      this.buffer[this.length++] = 0xd2;
      this.view.setInt32(this.length, Number(big));
      this.length += 4;
    } else {
      this.buffer[this.length++] = 0xd3;
      this.view.setBigInt64(this.length, big);
      this.length += 8;
    }
  }

  float64(value: number): void {
    this.room(9);
    this.buffer[this.length++] = 0xcb;
    this.view.setFloat64(this.length, value);
    this.length += 8;
  }

  string(value: string): void {
    const bytes = textEncoder.encode(value);
    this.header(bytes.length, 0xa0, 31, [0xd9, 0xda, 0xdb]);
    this.raw(bytes);
  }

  bytes(value: Uint8Array): void {
    this.sized(value.length, [0xc4, 0xc5, 0xc6]);
    this.raw(value);
  }

  arrayHeader(count: number): void {
    this.header(count, 0x90, 15, [0, 0xdc, 0xdd]);
  }

  mapHeader(count: number): void {
    this.header(count, 0x80, 15, [0, 0xde, 0xdf]);
  }

  private raw(bytes: Uint8Array): void {
    this.room(bytes.length);
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
  }

  /** Any value: integral numbers as ints, other numbers as float64. */
  value(value: KvValue): void {
    if (value === null) this.nil();
    else if (typeof value === "boolean") this.bool(value);
    else if (typeof value === "bigint") this.int(value);
    else if (typeof value === "number") {
      if (Number.isSafeInteger(value)) this.int(value);
      else this.float64(value);
    } else if (typeof value === "string") this.string(value);
    else if (value instanceof Uint8Array) this.bytes(value);
    else if (Array.isArray(value)) {
      this.arrayHeader(value.length);
      for (const item of value as readonly KvValue[]) this.value(item);
    } else {
      const entries = Object.entries(value);
      this.mapHeader(entries.length);
      for (const [key, item] of entries) {
        this.string(key);
        this.value(item);
      }
    }
  }
}
