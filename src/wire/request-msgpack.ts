/**
 * MessagePack requests read without the generic decoder, for the shape high-rate
 * clients send: binary `/v1/ws` frames (one request map, or an array of them) and
 * `application/msgpack` HTTP bodies (one map), with the request fields as keys and, as
 * values, nil, booleans, integers up to 32 bits, float64, ASCII strings, and
 * `token_ids` as `bin`. Nothing is allocated per request: one body object is refilled
 * for each, and its `token_ids` is a BinRef into the message, which `tokenIds` copies
 * out (no view of the message, no DataView, no object per request: msgpackr made those
 * for every message, and they lengthened the young collections).
 *
 * Anything else (other keys or types, 64-bit integers, float32, non-ASCII strings,
 * nesting, an oversized batch, truncated or trailing bytes) makes `read`
 * return false, and the message goes to msgpackr as before: for every message this
 * reader takes, the bodies are the ones msgpackr would give (a differential test holds
 * them to it), so the answers cannot differ.
 */

/**
 * `token_ids` bytes still inside the message they came in: `tokenIds` copies them out
 * without a view of the message. The reader refills one instance per request.
 */
export class BinRef {
  source: Uint8Array = new Uint8Array(0);
  start = 0;
  end = 0;
}

/** The keys a request body may have here; any other key sends the message to msgpackr. */
const KEYS = [
  "id",
  "op",
  "token_ids",
  "request_id",
  "lora_name",
  "lora_id",
  "cache_salt",
  "expected_output_tokens",
  "overlap_score_credit",
  "prefill_load_scale",
  "temperature",
  "candidates",
] as const;
type Key = (typeof KEYS)[number];
/** Strings read without building them: keys, and the ops as values. */
const KNOWN = [...KEYS, "route", "match", "done", "prefill_done"].map((text) => ({
  text,
  bytes: Buffer.from(text, "ascii"),
}));

/** One request body, refilled by `MsgpackRequestReader.request`. */
export type RequestBody = Record<Key, unknown>;

/** Thrown inside the walk at the first thing this reader does not take; `read` catches it. */
const DECLINE = Object.freeze({ declined: true });

export class MsgpackRequestReader {
  private source: Uint8Array = new Uint8Array(0);
  /** Offset of each request's map header, from the last successful `read`. */
  private starts = new Int32Array(64);
  private requests = 0;
  private batch = false;
  private readonly body = Object.fromEntries(KEYS.map((key) => [key, undefined])) as RequestBody;
  private readonly tokens = new BinRef();
  // Big-endian float64 bytes are reversed into these to be read as a number.
  private readonly floatBytes = new Uint8Array(8);
  private readonly float = new Float64Array(this.floatBytes.buffer);
  private at = 0;

  constructor(private readonly batchMax: number) {}

  /** Requests in the message last read. */
  get count(): number {
    return this.requests;
  }

  /** Whether the message last read was an array of requests (answered with an array). */
  get isBatch(): boolean {
    return this.batch;
  }

  /** Checks the whole message; false: not one this reader takes (decode it with msgpackr). */
  read(message: Uint8Array): boolean {
    this.source = message;
    this.requests = 0;
    this.at = 0;
    if (message.length === 0) return false;
    const head = message[0]!;
    this.batch = (head & 0xf0) === 0x90 || head === 0xdc || head === 0xdd;
    try {
      const count = this.batch ? this.collectionLength(0x90) : 1;
      if (count > this.batchMax) return false;
      if (this.starts.length < count)
        this.starts = new Int32Array(Math.max(count, 2 * this.starts.length));
      for (let i = 0; i < count; i++) {
        this.starts[i] = this.at;
        this.walkMap(null);
      }
      if (this.at !== message.length) return false;
      this.requests = count;
      return true;
    } catch (error) {
      if (error === DECLINE) return false;
      throw error;
    }
  }

  /** Request `i` of the message last read, as a body: the same object each time, refilled. */
  request(i: number): RequestBody {
    if (!(i >= 0 && i < this.requests)) throw new RangeError(`no request ${i} of ${this.requests}`);
    const body = this.body;
    for (const key of KEYS) body[key] = undefined;
    this.at = this.starts[i]!;
    try {
      this.walkMap(body);
    } catch (error) {
      throw error === DECLINE ? new Error("the message changed after it was read") : error;
    }
    return body;
  }

  /** Walks one request map from `at`, filling `body` when given. */
  private walkMap(body: RequestBody | null): void {
    const entries = this.collectionLength(0x80);
    for (let e = 0; e < entries; e++) {
      const key = this.asciiString();
      if (!Object.hasOwn(this.body, key)) throw DECLINE;
      const value = key === "token_ids" ? this.bin(body !== null) : this.scalar();
      if (body !== null) body[key as Key] = value;
    }
  }

  /** A map or array header (`fix` is 0x80 or 0x90): its length; anything else fails. */
  private collectionLength(fix: number): number {
    const source = this.source;
    if (this.at >= source.length) throw DECLINE;
    const head = source[this.at++]!;
    if ((head & 0xf0) === fix) return head & 0x0f;
    const wide16 = fix === 0x80 ? 0xde : 0xdc;
    if (head === wide16) return this.uint(2);
    if (head === wide16 + 1) return this.uint(4);
    throw DECLINE;
  }

  /** A nil, boolean, integer up to 32 bits, float64 or ASCII string. */
  private scalar(): unknown {
    const source = this.source;
    if (this.at >= source.length) throw DECLINE;
    const head = source[this.at]!;
    if (head <= 0x7f) {
      this.at++;
      return head;
    }
    if (head >= 0xe0) {
      this.at++;
      return head - 0x100;
    }
    if ((head & 0xe0) === 0xa0 || head === 0xd9 || head === 0xda || head === 0xdb)
      return this.asciiString();
    this.at++;
    switch (head) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xcc:
        return this.uint(1);
      case 0xcd:
        return this.uint(2);
      case 0xce:
        return this.uint(4);
      case 0xd0:
        return (this.uint(1) << 24) >> 24;
      case 0xd1:
        return (this.uint(2) << 16) >> 16;
      case 0xd2:
        return this.uint(4) | 0;
      case 0xcb: {
        if (this.at + 8 > source.length) throw DECLINE;
        for (let i = 0; i < 8; i++) this.floatBytes[7 - i] = source[this.at + i]!;
        this.at += 8;
        return this.float[0];
      }
      default:
        throw DECLINE;
    }
  }

  /** A string of ASCII bytes only (others decode differently across decoders: fail). */
  private asciiString(): string {
    const source = this.source;
    if (this.at >= source.length) throw DECLINE;
    const head = source[this.at++]!;
    let length: number;
    if ((head & 0xe0) === 0xa0) length = head & 0x1f;
    else if (head === 0xd9) length = this.uint(1);
    else if (head === 0xda) length = this.uint(2);
    else if (head === 0xdb) length = this.uint(4);
    else throw DECLINE;
    const start = this.at;
    const end = start + length;
    if (end > source.length) throw DECLINE;
    this.at = end;
    for (const known of KNOWN) {
      if (known.bytes.length === length && equalBytes(known.bytes, source, start))
        return known.text;
    }
    let text = "";
    for (let i = start; i < end; i++) {
      const byte = source[i]!;
      if (byte >= 0x80) throw DECLINE;
      text += String.fromCharCode(byte);
    }
    return text;
  }

  /** A `bin`: a BinRef into the message when `keep`, else only checked. */
  private bin(keep: boolean): BinRef | null {
    const source = this.source;
    if (this.at >= source.length) throw DECLINE;
    const head = source[this.at++]!;
    let length: number;
    if (head === 0xc4) length = this.uint(1);
    else if (head === 0xc5) length = this.uint(2);
    else if (head === 0xc6) length = this.uint(4);
    else throw DECLINE;
    const start = this.at;
    if (start + length > source.length) throw DECLINE;
    this.at = start + length;
    if (!keep) return null;
    this.tokens.source = source;
    this.tokens.start = start;
    this.tokens.end = start + length;
    return this.tokens;
  }

  /** A big-endian unsigned integer of `bytes` bytes. */
  private uint(bytes: number): number {
    const source = this.source;
    if (this.at + bytes > source.length) throw DECLINE;
    let value = 0;
    for (let i = 0; i < bytes; i++) value = value * 256 + source[this.at++]!;
    return value;
  }
}

function equalBytes(known: Uint8Array, source: Uint8Array, start: number): boolean {
  for (let i = 0; i < known.length; i++) if (known[i] !== source[start + i]) return false;
  return true;
}
