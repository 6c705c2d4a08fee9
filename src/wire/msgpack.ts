/**
 * A MessagePack encoder: the engines' KV-event batches (src/wire/kv-events/encode.ts,
 * byte for byte as vLLM's msgspec writes them) and the server's MessagePack answers.
 *
 * Encodings (msgspec's, and the smallest valid ones): integers in the smallest form,
 * unsigned for values >= 0 (a u64 >= 2^63 is a uint64); non-integral numbers as
 * float64; str8 from 32 bytes; arrays and maps with the smallest header.
 *
 * Why not msgpackr's `pack`: it writes integral floats as ints and every bigint as an
 * int64 (not msgspec's bytes), and on the answer path it was the largest single cost
 * of a WebSocket route. This encoder reuses one buffer, writes ASCII strings without a
 * TextEncoder call, and has the pieces (`mapHeader`, `encoded` keys, `number`, ...)
 * for writing a known shape field by field, as the route answer does
 * (src/server/api.ts `writeRouteAnswer`). msgpackr stays the reader, and the
 * independent reference the tests decode with.
 *
 * See docs/decisions.md#answers-from-decision.
 */

/** Any value the encoder takes. Object members that are `undefined` are left out, as JSON.stringify does. */
export type MsgpackValue =
  | null
  | undefined
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | readonly MsgpackValue[]
  | { readonly [key: string]: MsgpackValue };

const UINT_CODES = [0xcc, 0xcd, 0xce] as const;
const STR_CODES = [0xd9, 0xda, 0xdb] as const;
const BIN_CODES = [0xc4, 0xc5, 0xc6] as const;
const ARRAY_CODES = [0, 0xdc, 0xdd] as const;
const MAP_CODES = [0, 0xde, 0xdf] as const;
/** Strings up to this many characters are tried as ASCII, one byte per character. */
const ASCII_FAST_MAX = 64;
const textEncoder = new TextEncoder();

/** One value's MessagePack (for constants written often, such as map keys). */
export function encodeMsgpack(value: MsgpackValue): Uint8Array {
  const encoder = new MsgpackEncoder(16);
  encoder.value(value);
  return encoder.finish();
}

export class MsgpackEncoder {
  private buffer: Uint8Array;
  private view: DataView;
  private length = 0;

  constructor(capacity = 256) {
    this.buffer = new Uint8Array(capacity);
    this.view = new DataView(this.buffer.buffer);
  }

  /** Starts over, keeping the buffer. */
  reset(): void {
    this.length = 0;
  }

  /** A copy of what was written. */
  finish(): Uint8Array {
    return this.buffer.slice(0, this.length);
  }

  /** What was written, in place: valid until the next write or reset. */
  written(): Uint8Array {
    return this.buffer.subarray(0, this.length);
  }

  nil(): void {
    this.room(1);
    this.buffer[this.length++] = 0xc0;
  }

  bool(value: boolean): void {
    this.room(1);
    this.buffer[this.length++] = value ? 0xc3 : 0xc2;
  }

  int(value: number | bigint): void {
    // Fast path for token ids, counts and other small non-negative numbers: no BigInt.
    if (
      typeof value === "number" &&
      value >= 0 &&
      value < 0x1_0000_0000 &&
      Number.isInteger(value)
    ) {
      this.uint32(value);
      return;
    }
    const big = BigInt(value);
    if (big < -(1n << 63n) || big >= 1n << 64n)
      throw new RangeError(`${big} does not fit in 64 bits`);
    this.room(9);
    if (big >= 0n) {
      if (big < 0x80n) this.buffer[this.length++] = Number(big);
      else if (big < 0x1_0000_0000n) this.sized(Number(big), UINT_CODES);
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
    this.buffer[this.length] = 0xcb;
    this.view.setFloat64(this.length + 1, value); // big-endian; the JIT inlines it
    this.length += 9;
  }

  /** A number: safe integers as ints, anything else (fractions, NaN, huge) as float64. */
  number(value: number): void {
    if (value >= 0 && value < 0x1_0000_0000 && Math.floor(value) === value) this.uint32(value);
    else if (Number.isSafeInteger(value)) this.int(value);
    else this.float64(value);
  }

  /** An integer in [0, 2^32) in its smallest form. */
  private uint32(value: number): void {
    this.room(5);
    const buffer = this.buffer;
    let at = this.length;
    if (value < 0x80) buffer[at++] = value;
    else if (value < 0x100) {
      buffer[at++] = 0xcc;
      buffer[at++] = value;
    } else if (value < 0x1_0000) {
      buffer[at++] = 0xcd;
      buffer[at++] = value >>> 8;
      buffer[at++] = value & 0xff;
    } else {
      buffer[at++] = 0xce;
      buffer[at++] = value >>> 24;
      buffer[at++] = (value >>> 16) & 0xff;
      buffer[at++] = (value >>> 8) & 0xff;
      buffer[at++] = value & 0xff;
    }
    this.length = at;
  }

  string(value: string): void {
    const count = value.length;
    if (count <= ASCII_FAST_MAX) {
      // Header (fixstr or str8) then one byte per character, if they are all ASCII.
      this.room(2 + count);
      const buffer = this.buffer;
      const header = this.length;
      let at = header + (count < 32 ? 1 : 2);
      let i = 0;
      for (; i < count; i++) {
        const c = value.charCodeAt(i);
        if (c >= 0x80) break;
        buffer[at++] = c;
      }
      if (i === count) {
        if (count < 32) buffer[header] = 0xa0 | count;
        else {
          buffer[header] = 0xd9;
          buffer[header + 1] = count;
        }
        this.length = at;
        return;
      }
    }
    const bytes = textEncoder.encode(value);
    this.header(bytes.length, 0xa0, 31, STR_CODES);
    this.raw(bytes);
  }

  /** Bytes that are MessagePack already (e.g. a map key encoded once with `encode`). */
  encoded(bytes: Uint8Array): void {
    this.room(bytes.length);
    const buffer = this.buffer;
    let at = this.length;
    // Keys are a few bytes: a loop beats a native set() call at this size.
    for (let i = 0; i < bytes.length; i++) buffer[at++] = bytes[i]!;
    this.length = at;
  }

  bytes(value: Uint8Array): void {
    this.sized(value.length, BIN_CODES);
    this.raw(value);
  }

  arrayHeader(count: number): void {
    this.header(count, 0x90, 15, ARRAY_CODES);
  }

  mapHeader(count: number): void {
    this.header(count, 0x80, 15, MAP_CODES);
  }

  /** Any value: integral numbers as ints, other numbers as float64, plain objects as maps. */
  value(value: MsgpackValue): void {
    if (value === null || value === undefined) this.nil();
    else if (typeof value === "number") this.number(value);
    else if (typeof value === "string") this.string(value);
    else if (typeof value === "boolean") this.bool(value);
    else if (typeof value === "bigint") this.int(value);
    else if (Array.isArray(value)) {
      const items = value as readonly MsgpackValue[];
      this.arrayHeader(items.length);
      for (let i = 0; i < items.length; i++) this.value(items[i]);
    } else if (value instanceof Uint8Array) this.bytes(value);
    else {
      const object = value as { readonly [key: string]: MsgpackValue };
      let count = 0;
      for (const key in object) if (object[key] !== undefined) count++;
      this.mapHeader(count);
      for (const key in object) {
        const item = object[key];
        if (item === undefined) continue;
        this.string(key);
        this.value(item);
      }
    }
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

  private header(value: number, fix: number, fixMax: number, codes: readonly number[]): void {
    if (value <= fixMax) {
      this.room(1);
      this.buffer[this.length++] = fix | value;
    } else this.sized(value, codes);
  }

  /** `codes`: the 8-, 16- and 32-bit forms (0 where the type has none). */
  private sized(value: number, codes: readonly number[]): void {
    this.room(5);
    const buffer = this.buffer;
    let at = this.length;
    if (value < 0x100 && codes[0] !== 0) {
      buffer[at++] = codes[0]!;
      buffer[at++] = value;
    } else if (value < 0x1_0000) {
      buffer[at++] = codes[1]!;
      buffer[at++] = value >>> 8;
      buffer[at++] = value & 0xff;
    } else {
      buffer[at++] = codes[2]!;
      buffer[at++] = value >>> 24;
      buffer[at++] = (value >>> 16) & 0xff;
      buffer[at++] = (value >>> 8) & 0xff;
      buffer[at++] = value & 0xff;
    }
    this.length = at;
  }

  private raw(bytes: Uint8Array): void {
    this.room(bytes.length);
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
  }
}
