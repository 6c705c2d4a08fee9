/**
 * The KV-event batch walker: reads the msgpack bytes of one vLLM / SGLang
 * `KVEventBatch` once and writes the events straight into a reused DecodedBatch
 * (typed-array columns; hashes as (hi, lo) u32 words; no per-event objects, no
 * BigInt).
 *
 * Accepted shapes (every producer variant in ./README.md; peers.md §2.2,
 * dynamo-kv-router.md §1.4):
 * - batch: `[ts, events, data_parallel_rank?, ...]` (SGLang's `attn_dp_rank` sits in
 *   the same place) or a map with `ts`, `events`, `data_parallel_rank` or `dp_rank`;
 * - event: a tagged array (`["BlockStored", ...]`, fields by position, trailing
 *   fields optional) or a map with `"type"` (fields by name);
 * - hashes: any msgpack int (a negative i64 is read as the same 64 bits) or bytes
 *   (1..64 of them; the low 64 bits read big-endian, as vLLM turns digests into ints);
 * - token ids: u32s, or Eagle bigram pairs `[[a, b], ...]` (normalized to the first of
 *   every pair plus the second of the last: n + 1 tokens, FLAG_EAGLE);
 * - BlockStored position 7: vLLM's `lora_name` (nil or a string), or SGLang's
 *   metadata (`BlockStoredWithMetadata`): a map with `cache_salt` / `session_id`, or
 *   the same struct written as an array `[cache_salt, session_id?]`;
 * - the BlockStored / BlockRemoved tail after the fixed fields: the current layout
 *   `group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership`
 *   (then a metadata map, as a Dynamo-aligned SGLang fork appends) when every item
 *   present in those slots is nil or of that slot's type, otherwise the legacy reading
 *   (first uint = group, second uint = window, first string = spec kind, first list =
 *   per-block MM infos);
 * - `extra_keys` (vLLM): per block, the LoRA name, multimodal ids (bare before vLLM
 *   #36708, `[id, offset]` pairs after), block 0's cache salt, prompt-embedding digests.
 *   The salt is a `dynamo-cache-salt:` prefixed string, else block 0's one bare string;
 *   every other item makes its block (and so the rest of the chain) one kvedge cannot
 *   hash (`mmBlock`).
 *
 * Unknown event tags are skipped and counted (`unknownTags`); unknown map keys and
 * extra positional items are skipped and counted (`unknownFields`). An event that does
 * not fit is skipped alone (EVENT_SKIPPED, with its error code; `skippedEvents`): the
 * rest of its batch is decoded. What leaves no way to find the next event (truncated
 * or invalid msgpack, nesting too deep), a malformed envelope and the batch limits
 * drop the whole batch with an error code (DECODE_ERROR_KINDS).
 *
 * Bounds: the payload size, events per batch, hashes and tokens per batch, string
 * length and nesting depth are limited (DecodeLimits), and every msgpack length or
 * count is checked against the bytes left before anything is read or allocated.
 *
 * Shape (style-anchors "Parser shape"): state in module variables worked by free
 * functions; errors are codes, never exceptions; the common byte ranges are tested
 * before the switch.
 */
import {
  DecodedBatch,
  EVENT_REMOVED,
  EVENT_SKIPPED,
  EVENT_STORED,
  FLAG_EAGLE,
  FLAG_GROUP,
  FLAG_LORA_ID,
  FLAG_PARENT,
  FLAG_WINDOW,
  NO_STRING,
  type DecodeLimits,
} from "./batch";
import { isUtf8 } from "./strings";
import { native } from "../../native/library";

// ---- Status codes (stable: counters and logs use the names) ----
// `truncated` also covers a length or count that claims more bytes than are left: the
// two cannot be told apart, and either way nothing is allocated for it.

export const DECODE_OK = 0;
export const E_TRUNCATED = 1;
export const E_TRAILING_BYTES = 2;
export const E_BAD_MSGPACK = 3;
export const E_BAD_BATCH = 4;
export const E_BAD_EVENT = 5;
export const E_BAD_HASH = 6;
export const E_BAD_TOKENS = 7;
export const E_BAD_FIELD = 8;
export const E_MISSING_FIELD = 9;
export const E_DUPLICATE_KEY = 10;
export const E_BAD_STRING = 11;
export const E_TOO_LARGE = 12;
export const E_TOO_MANY_EVENTS = 13;
export const E_TOO_MANY_BLOCKS = 14;
export const E_TOO_MANY_TOKENS = 15;
export const E_TOO_DEEP = 16;
export const E_STRING_TOO_LONG = 17;

/** Index = status code. */
export const DECODE_ERROR_KINDS = [
  "ok",
  "truncated",
  "trailing_bytes",
  "bad_msgpack",
  "bad_batch",
  "bad_event",
  "bad_hash",
  "bad_tokens",
  "bad_field",
  "missing_field",
  "duplicate_key",
  "bad_string",
  "too_large",
  "too_many_events",
  "too_many_blocks",
  "too_many_tokens",
  "too_deep",
  "string_too_long",
] as const;
export type DecodeErrorKind = Exclude<(typeof DECODE_ERROR_KINDS)[number], "ok">;

/** Errors that concern one event only: it is skipped, the batch goes on (1 = event-scoped). */
const EVENT_SCOPED = new Uint8Array(DECODE_ERROR_KINDS.length);
for (const code of [
  E_BAD_EVENT,
  E_BAD_HASH,
  E_BAD_TOKENS,
  E_BAD_FIELD,
  E_MISSING_FIELD,
  E_DUPLICATE_KEY,
  E_BAD_STRING,
  E_STRING_TOO_LONG,
])
  EVENT_SCOPED[code] = 1;

/** Hash bytes longer than this are not a digest (SHA-512 is 64). */
const HASH_BYTES_MAX = 64;
/** Tail items whose types decide between the current and the legacy layout. */
const TAIL_SLOTS = 5;
/**
 * Token arrays of at least this many ids are read by the native reader (one FFI
 * crossing, then ~1 ns an id; the loop below mispredicts its encoding branch on
 * engines' mixed uint16 / uint32 ids); shorter ones stay here.
 */
const NATIVE_TOKENS_MIN = 8;
const nativeEnd = new Uint32Array(1);

// ---- Walker state ----

const EMPTY = new Uint8Array(0);
let src: Uint8Array = EMPTY;
let pos = 0;
let end = 0;
let err = 0;
let errAt = 0;
let out: DecodedBatch = new DecodedBatch();
let limits: DecodeLimits = out.limits;

// Last integer read by readInt: its 64 bits, and whether it came in a signed encoding.
let intHi = 0;
let intLo = 0;
let intSigned = false;
// Last string header read by strHeader.
let strStart = 0;
let strLength = 0;

// Per-event scratch (the event being decoded).
let eventIndex = 0;
/** The kind its tag named (0 until the tag is read): what a skipped event was. */
let eventKind = 0;
let seenFields = 0;
let mmFromExtraKeys = -1;
let mmFromInfos = -1;
let topSalt = NO_STRING;
// Extra keys (see walkExtraKeys).
/** A map event's extra keys met before its lora_name: walked at commit (-1: none). */
let extraKeysAt = -1;
/** The event's LoRA name is final (arrays: position 7 precedes the extra keys). */
let loraSettled = false;
/** vLLM's 9-field array era (before #36708): a bare 64-hex string is a multimodal hash. */
let bareMmIds = false;
/** Block 0's bare strings (not the LoRA name, not prefixed), and the last of them. */
let bareCount = 0;
let lastBare = NO_STRING;
/** The last bare string of block 0 is also in a later block: a multimodal id, not a salt. */
let bareSpans = false;
let prefixedSalt = NO_STRING;
const tailType = new Uint8Array(TAIL_SLOTS);
const tailValue = new Int32Array(TAIL_SLOTS);

const float64 = new Float64Array(1);
const float64Bytes = new Uint8Array(float64.buffer);
const float32 = new Float32Array(1);
const float32Bytes = new Uint8Array(float32.buffer);
if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1)
  throw new Error("kv-events decoder assumes a little-endian host");

/**
 * Decodes one batch payload into `batch` (reset first). Returns DECODE_OK or an
 * error code; on error `batch` holds no events and `batch.errorOffset` is the byte
 * offset of the value that failed. Never throws on any input.
 */
export function decodeKvBatch(payload: Uint8Array, batch: DecodedBatch): number {
  batch.reset();
  batch.strings.trim();
  if (payload.length > batch.limits.payloadBytesMax) {
    batch.errorOffset = 0;
    return E_TOO_LARGE;
  }
  src = payload;
  pos = 0;
  end = payload.length;
  err = 0;
  errAt = 0;
  out = batch;
  limits = batch.limits;
  readBatch();
  if (err === 0 && pos !== end) fail(E_TRAILING_BYTES);
  const status = err;
  src = EMPTY;
  if (status !== DECODE_OK) {
    batch.reset();
    batch.errorOffset = errAt;
  }
  return status;
}

function fail(code: number): void {
  if (err === 0) {
    err = code;
    errAt = pos;
  }
}

// ---- Batch ----

const BATCH_TS = 0;
const BATCH_EVENTS = 1;
/** Ids 2 and 3: `data_parallel_rank` and its alias `dp_rank`. */
const BATCH_DP_RANK = 2;
const BATCH_KEYS = keyTable(["ts", "events", "data_parallel_rank", "dp_rank"]);

function readBatch(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const count = arrayHeader();
  if (count >= 0) {
    if (count < 2) return fail(E_BAD_BATCH);
    readTs();
    if (err === 0) readEvents();
    if (err === 0 && count >= 3) readDpRank();
    for (let i = 3; i < count && err === 0; i++) skipUnknown(1);
    return;
  }
  if (count === FAILED) return;
  const pairs = mapHeader();
  if (pairs === NOT_THIS) return fail(E_BAD_BATCH);
  if (pairs === FAILED) return;
  let seen = 0;
  for (let i = 0; i < pairs && err === 0; i++) {
    const key = readKey(BATCH_KEYS, 1);
    if (key < 0) {
      if (key === KEY_UNKNOWN) skipUnknown(1);
      else out.unknownFields++;
      continue;
    }
    const dpRankSeen = key >= BATCH_DP_RANK && (seen & 0b1100) !== 0;
    if ((seen & (1 << key)) !== 0 || dpRankSeen) return fail(E_DUPLICATE_KEY);
    seen |= 1 << key;
    if (key === BATCH_TS) readTs();
    else if (key === BATCH_EVENTS) readEvents();
    else readDpRank();
  }
  if (err === 0 && (seen & 0b11) !== 0b11) fail(E_MISSING_FIELD);
}

function readTs(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const byte = src[pos]!;
  if (byte === 0xcb) {
    if (pos + 9 > end) return fail(E_TRUNCATED);
    for (let i = 0; i < 8; i++) float64Bytes[i] = src[pos + 8 - i]!;
    out.ts = float64[0]!;
    pos += 9;
  } else if (byte === 0xca) {
    if (pos + 5 > end) return fail(E_TRUNCATED);
    for (let i = 0; i < 4; i++) float32Bytes[i] = src[pos + 4 - i]!;
    out.ts = float32[0]!;
    pos += 5;
  } else if (readInt()) {
    out.ts = intSigned ? (intHi | 0) * 0x1_0000_0000 + intLo : intHi * 0x1_0000_0000 + intLo;
  } else fail(E_BAD_BATCH);
}

function readDpRank(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  if (src[pos] === 0xc0) {
    pos++;
    out.hasDpRank = false;
    return;
  }
  const rank = readU32();
  if (rank < 0) return fail(E_BAD_FIELD);
  out.hasDpRank = true;
  out.dpRank = rank;
}

function readEvents(): void {
  // A repeated "events" key is refused earlier, so this runs once per batch.
  const count = arrayHeader();
  if (count === NOT_THIS) return fail(E_BAD_BATCH);
  if (count === FAILED) return;
  if (count > limits.eventsMax) return fail(E_TOO_MANY_EVENTS);
  for (let i = 0; i < count && err === 0; i++) {
    const start = pos;
    const hashMark = out.hashCount;
    const tokenMark = out.tokenCount;
    const unknownMark = out.unknownFields;
    readEvent();
    if (err !== 0 && EVENT_SCOPED[err] === 1) skipEvent(start, hashMark, tokenMark, unknownMark);
  }
}

/**
 * The event from `start` could not be read: it becomes an EVENT_SKIPPED entry (what
 * it wrote is rolled back) and the walk goes on after it, unless it cannot even be
 * skipped (then the batch fails).
 */
function skipEvent(start: number, hashMark: number, tokenMark: number, unknownMark: number): void {
  const code = err;
  const at = errAt;
  err = 0;
  pos = start;
  skip(2);
  if (err !== 0) return;
  const e = eventIndex;
  out.hashCount = hashMark;
  out.tokenCount = tokenMark;
  out.unknownFields = unknownMark;
  out.kind[e] = EVENT_SKIPPED;
  out.skipError[e] = code;
  out.skipKind[e] = eventKind;
  out.skipAt[e] = at;
  out.hashStart[e] = hashMark;
  out.hashLength[e] = 0;
  out.tokenStart[e] = tokenMark;
  out.tokenLength[e] = 0;
  out.flags[e] = 0;
  out.mmBlock[e] = -1;
  out.cacheSalt[e] = NO_STRING;
  out.skippedEvents++;
  out.eventCount = e + 1;
}

// ---- Events ----

const F_TYPE = 0;
const F_BLOCK_HASHES = 1;
const F_PARENT = 2;
const F_TOKEN_IDS = 3;
const F_BLOCK_SIZE = 4;
const F_LORA_ID = 5;
const F_MEDIUM = 6;
const F_LORA_NAME = 7;
const F_EXTRA_KEYS = 8;
const F_MM_INFOS = 9;
const F_CACHE_SALT = 10;
const F_GROUP = 11;
const F_SPEC_KIND = 12;
const F_WINDOW = 13;
const F_LOCALITY = 14;
const F_OWNERSHIP = 15;
const F_SESSION_ID = 16;
const F_METADATA = 17;
const EVENT_KEYS = keyTable([
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
]);
const bit = (field: number) => 1 << field;
/** Which map keys each event kind knows; others are skipped and counted. */
const FIELDS_OF = [
  0,
  (1 << 18) - 1,
  bit(F_TYPE) |
    bit(F_BLOCK_HASHES) |
    bit(F_MEDIUM) |
    bit(F_GROUP) |
    bit(F_SPEC_KIND) |
    bit(F_WINDOW) |
    bit(F_LOCALITY) |
    bit(F_OWNERSHIP),
  bit(F_TYPE) | bit(F_OWNERSHIP),
];
const REQUIRED_OF = [
  0,
  bit(F_BLOCK_HASHES) | bit(F_TOKEN_IDS) | bit(F_BLOCK_SIZE),
  bit(F_BLOCK_HASHES),
  0,
];

const TAGS = keyTable(["BlockStored", "BlockRemoved", "AllBlocksCleared"]);
const TAG_UNKNOWN = 0;
const NOT_A_TAG = -1;

function readEvent(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  out.ensureEvent();
  beginEvent(out.eventCount);
  const count = arrayHeader();
  if (count >= 0) return readArrayEvent(count);
  if (count === FAILED) return;
  const pairs = mapHeader();
  if (pairs >= 0) return readMapEvent(pairs);
  if (pairs === NOT_THIS) fail(E_BAD_EVENT);
}

function beginEvent(e: number): void {
  eventIndex = e;
  eventKind = 0;
  seenFields = 0;
  mmFromExtraKeys = -1;
  mmFromInfos = -1;
  topSalt = NO_STRING;
  extraKeysAt = -1;
  loraSettled = false;
  bareMmIds = false;
  bareCount = 0;
  lastBare = NO_STRING;
  bareSpans = false;
  prefixedSalt = NO_STRING;
  out.flags[e] = 0;
  out.hashStart[e] = out.hashCount;
  out.hashLength[e] = 0;
  out.tokenStart[e] = out.tokenCount;
  out.tokenLength[e] = 0;
  out.blockSize[e] = 0;
  out.groupIdx[e] = 0;
  out.slidingWindow[e] = 0;
  out.medium[e] = NO_STRING;
  out.loraName[e] = NO_STRING;
  out.specKind[e] = NO_STRING;
  out.locality[e] = NO_STRING;
  out.ownership[e] = NO_STRING;
}

function commitEvent(kind: number): void {
  const e = eventIndex;
  if (extraKeysAt >= 0) {
    const resume = pos;
    pos = extraKeysAt;
    walkExtraKeys();
    if (err !== 0) return;
    pos = resume;
  }
  const salt = kind === EVENT_STORED ? resolveSalt() : NO_STRING;
  out.kind[e] = kind;
  let mm = mmFromExtraKeys;
  if (mmFromInfos >= 0 && (mm < 0 || mmFromInfos < mm)) mm = mmFromInfos;
  out.mmBlock[e] = mm;
  out.cacheSalt[e] = salt;
  out.eventCount = e + 1;
}

/** Reads the tag string at pos: an EVENT_* kind, TAG_UNKNOWN, or NOT_A_TAG (not consumed). */
function readTag(): number {
  const length = strHeader();
  if (length === NOT_THIS) return NOT_A_TAG;
  if (length === FAILED) return NOT_A_TAG;
  const tag = matchKey(TAGS);
  pos += length;
  if (tag >= 0) return tag + 1;
  if (!checkString()) return NOT_A_TAG;
  return TAG_UNKNOWN;
}

function readArrayEvent(count: number): void {
  if (count === 0) return fail(E_BAD_EVENT);
  const kind = readTag();
  if (kind === NOT_A_TAG) return fail(E_BAD_EVENT);
  if (kind === TAG_UNKNOWN) {
    out.unknownTags++;
    for (let i = 1; i < count && err === 0; i++) skip(3);
    return;
  }
  eventKind = kind;
  if (kind === EVENT_STORED) {
    if (count < 5) return fail(E_MISSING_FIELD);
    readBlockHashes();
    if (err === 0) readParent();
    if (err === 0) readTokenIds();
    if (err === 0) readBlockSize();
    if (err === 0 && count > 5) readLoraId();
    if (err === 0 && count > 6) out.medium[eventIndex] = readStringField();
    if (err === 0 && count > 7) readLoraNameOrMetadata();
    loraSettled = true;
    bareMmIds = count === 9;
    if (err === 0 && count > 8) readExtraKeys();
    if (err === 0 && count > 9) readTail(count - 9);
  } else if (kind === EVENT_REMOVED) {
    if (count < 2) return fail(E_MISSING_FIELD);
    readBlockHashes();
    if (err === 0 && count > 2) out.medium[eventIndex] = readStringField();
    if (err === 0 && count > 3) readTail(count - 3);
  } else {
    if (count > 1) out.ownership[eventIndex] = readStringField();
    for (let i = 2; i < count && err === 0; i++) skipUnknown(3);
  }
  if (err === 0) commitEvent(kind);
}

function readMapEvent(pairs: number): void {
  const start = pos;
  // msgspec writes "type" first; otherwise look for it, then read the fields.
  let kind = NOT_A_TAG;
  for (let i = 0; i < pairs && err === 0; i++) {
    const key = readKey(EVENT_KEYS, 3);
    if (key === F_TYPE) {
      kind = readTag();
      if (kind === NOT_A_TAG && err === 0) fail(E_BAD_EVENT);
      break;
    }
    if (key !== KEY_NOT_STRING) skip(3);
  }
  if (err !== 0) return;
  if (kind === NOT_A_TAG) return fail(E_MISSING_FIELD);
  pos = start;
  if (kind === TAG_UNKNOWN) {
    out.unknownTags++;
    for (let i = 0; i < 2 * pairs && err === 0; i++) skip(3);
    return;
  }
  eventKind = kind;
  const known = FIELDS_OF[kind]!;
  for (let i = 0; i < pairs && err === 0; i++) {
    const key = readKey(EVENT_KEYS, 3);
    if (key < 0 || (known & bit(key)) === 0) {
      if (key !== KEY_NOT_STRING) skipUnknown(3);
      else out.unknownFields++;
      continue;
    }
    if ((seenFields & bit(key)) !== 0) return fail(E_DUPLICATE_KEY);
    seenFields |= bit(key);
    readNamedField(key);
  }
  if (err !== 0) return;
  const required = REQUIRED_OF[kind]!;
  if ((seenFields & required) !== required) return fail(E_MISSING_FIELD);
  commitEvent(kind);
}

function readNamedField(field: number): void {
  const e = eventIndex;
  switch (field) {
    case F_TYPE:
      skip(3);
      break; // already read
    case F_BLOCK_HASHES:
      readBlockHashes();
      break;
    case F_PARENT:
      readParent();
      break;
    case F_TOKEN_IDS:
      readTokenIds();
      break;
    case F_BLOCK_SIZE:
      readBlockSize();
      break;
    case F_LORA_ID:
      readLoraId();
      break;
    case F_MEDIUM:
      out.medium[e] = readStringField();
      break;
    case F_LORA_NAME:
      out.loraName[e] = readStringField();
      loraSettled = true;
      break;
    case F_EXTRA_KEYS:
      readExtraKeys();
      break;
    case F_MM_INFOS:
      readMmInfos();
      break;
    case F_CACHE_SALT:
      topSalt = readStringField();
      break;
    case F_GROUP:
      readOptionalU32(FLAG_GROUP, out.groupIdx);
      break;
    case F_SPEC_KIND:
      out.specKind[e] = readStringField();
      break;
    case F_WINDOW:
      readOptionalU32(FLAG_WINDOW, out.slidingWindow);
      break;
    case F_LOCALITY:
      out.locality[e] = readStringField();
      break;
    case F_SESSION_ID:
      skip(3); // a session key for the engine's scheduling: no part of the cache's content
      break;
    case F_METADATA:
      readMetadata();
      break;
    default:
      out.ownership[e] = readStringField();
      break;
  }
}

// ---- Fields ----

function readBlockHashes(): void {
  const count = arrayHeader();
  if (count === NOT_THIS) return fail(E_BAD_HASH);
  if (count === FAILED) return;
  if (out.hashCount + count > limits.blocksMax) return fail(E_TOO_MANY_BLOCKS);
  out.ensureHashes(count);
  const hashes = out.hashes;
  const bytes = src;
  const first = out.hashCount;
  let at = 2 * first;
  // Hot loop: the common encodings read in place (locals, one bounds check each; the
  // cursor in a local, as for token ids); anything else, or the last few bytes of the
  // payload, takes readHashSlow.
  const stop = end - 41;
  let p = pos;
  for (let i = 0; i < count; i++, at += 2) {
    if (p <= stop) {
      const byte = bytes[p]!;
      if (byte === 0xcf || byte === 0xd3) {
        hashes[at] =
          ((bytes[p + 1]! << 24) | (bytes[p + 2]! << 16) | (bytes[p + 3]! << 8) | bytes[p + 4]!) >>>
          0;
        hashes[at + 1] =
          ((bytes[p + 5]! << 24) | (bytes[p + 6]! << 16) | (bytes[p + 7]! << 8) | bytes[p + 8]!) >>>
          0;
        p += 9;
        continue;
      }
      if (byte < 0x80) {
        hashes[at] = 0;
        hashes[at + 1] = byte;
        p += 1;
        continue;
      }
      if (byte === 0xc4 && bytes[p + 1] === 32) {
        // A SHA-256 digest: its last 8 bytes, big-endian.
        const q = p + 26;
        hashes[at] =
          ((bytes[q]! << 24) | (bytes[q + 1]! << 16) | (bytes[q + 2]! << 8) | bytes[q + 3]!) >>> 0;
        hashes[at + 1] =
          ((bytes[q + 4]! << 24) | (bytes[q + 5]! << 16) | (bytes[q + 6]! << 8) | bytes[q + 7]!) >>>
          0;
        p += 34;
        continue;
      }
    }
    pos = p;
    if (pos >= end) return fail(E_TRUNCATED);
    if (!readHashSlow()) return;
    p = pos;
    hashes[at] = intHi;
    hashes[at + 1] = intLo;
  }
  pos = p;
  out.hashStart[eventIndex] = first;
  out.hashLength[eventIndex] = count;
  out.hashCount = first + count;
}

/** Any other hash encoding: a shorter int, or bytes. Leaves the 64 bits in intHi/intLo. */
function readHashSlow(): boolean {
  if (readInt()) return true;
  if (err !== 0) return false;
  const length = binHeader();
  if (length === FAILED) return false;
  if (length === NOT_THIS || length === 0 || length > HASH_BYTES_MAX) {
    fail(E_BAD_HASH);
    return false;
  }
  // The low 64 bits, big-endian: the last (up to) 8 bytes.
  let hi = 0;
  let lo = 0;
  for (let i = length > 8 ? length - 8 : 0; i < length; i++) {
    hi = ((hi << 8) | (lo >>> 24)) >>> 0;
    lo = ((lo << 8) | src[pos + i]!) >>> 0;
  }
  intHi = hi;
  intLo = lo;
  pos += length;
  return true;
}

function readParent(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const e = eventIndex;
  if (src[pos] === 0xc0) {
    pos++;
    out.flags[e]! &= ~FLAG_PARENT;
    return;
  }
  if (!readHashSlow()) return;
  out.parentHi[e] = intHi;
  out.parentLo[e] = intLo;
  out.flags[e]! |= FLAG_PARENT;
}

function readTokenIds(): void {
  const count = arrayHeader();
  if (count === NOT_THIS) return fail(E_BAD_TOKENS);
  if (count === FAILED) return;
  if (count > 0 && isArrayByte(src[pos]!)) return readBigramTokens(count);
  if (out.tokenCount + count > limits.tokensMax) return fail(E_TOO_MANY_TOKENS);
  out.ensureTokens(count);
  const tokens = out.tokens;
  const bytes = src;
  const first = out.tokenCount;
  // Hot loop, as for hashes: token ids are mostly uint32/uint16/fixint. The cursor
  // lives in a local (a module variable costs a memory round trip per access on JSC);
  // the first value of another encoding, or the last few bytes, go the general way.
  const stop = end;
  let i = 0;
  if (native !== null && count >= NATIVE_TOKENS_MIN) {
    i = native.kv_msgpack_u32s(bytes, stop, pos, count, tokens, first, nativeEnd);
    pos = nativeEnd[0]!;
  }
  while (i < count) {
    let p = pos;
    for (; i < count && p + 5 <= stop; i++) {
      const byte = bytes[p]!;
      if (byte < 0x80) {
        tokens[first + i] = byte;
        p += 1;
      } else if (byte === 0xce) {
        tokens[first + i] =
          ((bytes[p + 1]! << 24) | (bytes[p + 2]! << 16) | (bytes[p + 3]! << 8) | bytes[p + 4]!) >>>
          0;
        p += 5;
      } else if (byte === 0xcd) {
        tokens[first + i] = (bytes[p + 1]! << 8) | bytes[p + 2]!;
        p += 3;
      } else if (byte === 0xcc) {
        tokens[first + i] = bytes[p + 1]!;
        p += 2;
      } else break;
    }
    pos = p;
    if (i === count) break;
    const token = readU32();
    if (token < 0) return fail(E_BAD_TOKENS);
    tokens[first + i++] = token;
  }
  out.tokenStart[eventIndex] = first;
  out.tokenLength[eventIndex] = count;
  out.tokenCount = first + count;
}

/** Eagle: [[a0, b0], [a1, b1], ...] -> a0, a1, ..., b_last (count + 1 tokens). */
function readBigramTokens(count: number): void {
  if (out.tokenCount + count + 1 > limits.tokensMax) return fail(E_TOO_MANY_TOKENS);
  out.ensureTokens(count + 1);
  const tokens = out.tokens;
  const first = out.tokenCount;
  let last = 0;
  for (let i = 0; i < count; i++) {
    if (pos >= end) return fail(E_TRUNCATED);
    const pair = arrayHeader();
    if (pair === FAILED) return;
    if (pair !== 2) return fail(E_BAD_TOKENS);
    const a = readU32();
    if (a < 0) return fail(E_BAD_TOKENS);
    const b = readU32();
    if (b < 0) return fail(E_BAD_TOKENS);
    tokens[first + i] = a;
    last = b;
  }
  tokens[first + count] = last;
  out.tokenStart[eventIndex] = first;
  out.tokenLength[eventIndex] = count + 1;
  out.tokenCount = first + count + 1;
  out.flags[eventIndex]! |= FLAG_EAGLE;
}

function readBlockSize(): void {
  const size = readU32();
  if (size < 0) return fail(E_BAD_FIELD);
  out.blockSize[eventIndex] = size;
}

/** `lora_id`: nil, or the adapter's int id (kept: engines that send no name name it by this). */
function readLoraId(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  if (src[pos] === 0xc0) {
    pos++;
    return;
  }
  const id = readU32();
  if (id < 0) return fail(E_BAD_FIELD);
  out.loraId[eventIndex] = id;
  out.flags[eventIndex]! |= FLAG_LORA_ID;
}

/** BlockStored position 7: vLLM's `lora_name`, or SGLang's metadata (a map, or the struct as an array). */
function readLoraNameOrMetadata(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const byte = src[pos]!;
  if (isArrayByte(byte) || isMapByte(byte)) readMetadata();
  else out.loraName[eventIndex] = readStringField();
}

const META_CACHE_SALT = 0;
const META_SESSION_ID = 1;
const METADATA_KEYS = keyTable(["cache_salt", "session_id"]);

/**
 * SGLang's `BlockStoredMetadata`: `{cache_salt, session_id?}` (unknown keys counted), or
 * the same fields by position; nil is none. The salt is the event's cache salt.
 */
function readMetadata(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  if (src[pos] === 0xc0) {
    pos++;
    return;
  }
  const count = arrayHeader();
  if (count >= 0) {
    if (count > 0) topSalt = readStringField();
    if (count > 1 && err === 0) skip(4);
    for (let i = 2; i < count && err === 0; i++) skipUnknown(4);
    return;
  }
  if (count === FAILED) return;
  const pairs = mapHeader();
  if (pairs === NOT_THIS) return fail(E_BAD_FIELD);
  if (pairs === FAILED) return;
  let seen = 0;
  for (let i = 0; i < pairs && err === 0; i++) {
    const key = readKey(METADATA_KEYS, 4);
    if (key < 0) {
      if (key === KEY_UNKNOWN) skipUnknown(4);
      else out.unknownFields++;
      continue;
    }
    if ((seen & (1 << key)) !== 0) return fail(E_DUPLICATE_KEY);
    seen |= 1 << key;
    if (key === META_CACHE_SALT) topSalt = readStringField();
    else if (key === META_SESSION_ID) skip(4);
  }
}

function readOptionalU32(flag: number, column: Uint32Array): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const e = eventIndex;
  if (src[pos] === 0xc0) {
    pos++;
    out.flags[e]! &= ~flag;
    return;
  }
  const value = readU32();
  if (value < 0) return fail(E_BAD_FIELD);
  column[e] = value;
  out.flags[e]! |= flag;
}

/** A nil-or-string field: its string id, or NO_STRING. */
function readStringField(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return NO_STRING;
  }
  if (src[pos] === 0xc0) {
    pos++;
    return NO_STRING;
  }
  const length = strHeader();
  if (length < 0) {
    if (length === NOT_THIS) fail(E_BAD_FIELD);
    return NO_STRING;
  }
  const id = internString(pos, length);
  pos += length;
  return id;
}

function internString(start: number, length: number): number {
  if (length > limits.stringBytesMax) {
    fail(E_STRING_TOO_LONG);
    return NO_STRING;
  }
  const id = out.strings.intern(src, start, length);
  if (id < 0) fail(E_BAD_STRING);
  return id;
}

/**
 * `extra_keys`: nil, or one entry per block, each nil or a list of items. The LoRA
 * name must be known to read them (an item equal to it is the adapter's): a map event
 * that sends them before its `lora_name` has them walked at commit.
 */
function readExtraKeys(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  if (src[pos] === 0xc0) {
    pos++;
    return;
  }
  if (!loraSettled) {
    extraKeysAt = pos;
    return skip(3);
  }
  walkExtraKeys();
}

/**
 * vLLM's items per block, in order: the LoRA name, multimodal ids (bare strings before
 * #36708, `[id, offset]` pairs after), the cache salt (block 0 only) and prompt-embedding
 * digests (bytes). kvedge hashes the LoRA name and the salt; any other item means the
 * engine's hash of that block mixes in content kvedge does not hash: the first such
 * block is `mmBlock`. Block 0's salt: the first `dynamo-cache-salt:` prefixed string,
 * else its one bare string (resolveSalt decides once the event is read).
 */
function walkExtraKeys(): void {
  const blocks = arrayHeader();
  if (blocks === NOT_THIS) return fail(E_BAD_FIELD);
  if (blocks === FAILED) return;
  for (let block = 0; block < blocks && err === 0; block++) {
    if (pos >= end) return fail(E_TRUNCATED);
    if (src[pos] === 0xc0) {
      pos++;
      continue;
    }
    const items = arrayHeader();
    if (items === NOT_THIS) return fail(E_BAD_FIELD);
    if (items === FAILED) return;
    let lora = out.loraName[eventIndex]!;
    for (let i = 0; i < items && err === 0; i++) {
      const length = strHeader();
      if (length === FAILED) return;
      if (length < 0) {
        markOpaque(block);
        skip(5);
        continue;
      }
      const start = pos;
      pos += length;
      if (lora !== NO_STRING && out.strings.equals(lora, src, start, length)) {
        lora = NO_STRING; // the adapter's name, once per block
        continue;
      }
      if (!checkString()) return;
      if (block === 0) blockZeroString(start, length);
      else {
        markOpaque(block);
        if (lastBare !== NO_STRING && out.strings.equals(lastBare, src, start, length))
          bareSpans = true;
      }
    }
  }
}

const SALT_PREFIX = new TextEncoder().encode("dynamo-cache-salt:");

/** A string item of block 0 that is not the LoRA name: a salt, or a multimodal id. */
function blockZeroString(start: number, length: number): void {
  if (bareMmIds && isMmHash(start, length)) return markOpaque(0);
  if (length === 0) return markOpaque(0);
  if (hasSaltPrefix(start, length)) {
    if (prefixedSalt !== NO_STRING) return markOpaque(0);
    // An empty salt after the prefix stays the raw string: the engine hashed that string.
    const rest = length - SALT_PREFIX.length;
    prefixedSalt =
      rest > 0 ? internString(start + SALT_PREFIX.length, rest) : internString(start, length);
    return;
  }
  bareCount++;
  lastBare = internString(start, length);
}

function hasSaltPrefix(start: number, length: number): boolean {
  if (length < SALT_PREFIX.length) return false;
  for (let i = 0; i < SALT_PREFIX.length; i++) if (src[start + i] !== SALT_PREFIX[i]) return false;
  return true;
}

function markOpaque(block: number): void {
  if (mmFromExtraKeys < 0 || block < mmFromExtraKeys) mmFromExtraKeys = block;
}

function isMmHash(start: number, length: number): boolean {
  if (length !== 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = src[start + i]!;
    const hex = (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46);
    if (!hex) return false;
  }
  return true;
}

/**
 * The event's cache salt: a top-level or metadata `cache_salt`, else block 0's prefixed
 * salt, else its bare string. Block 0 holds one salt at most: any other bare string
 * there, or one that recurs in a later block, is a multimodal id (block 0 then is one
 * kvedge cannot hash, and a recurring string is no salt).
 */
function resolveSalt(): number {
  let salt = topSalt !== NO_STRING ? topSalt : prefixedSalt !== NO_STRING ? prefixedSalt : lastBare;
  if (bareCount > 1 || (bareCount === 1 && (salt !== lastBare || bareSpans))) markOpaque(0);
  if (bareSpans && salt === lastBare) salt = NO_STRING;
  return salt;
}

/** `block_mm_infos`: nil, or per block nil or an MM-info object (content not needed). */
function readMmInfos(): void {
  if (pos >= end) return fail(E_TRUNCATED);
  if (src[pos] === 0xc0) {
    pos++;
    mmFromInfos = -1;
    return;
  }
  const blocks = arrayHeader();
  if (blocks === NOT_THIS) return fail(E_BAD_FIELD);
  if (blocks === FAILED) return;
  mmFromInfos = scanMmInfos(blocks);
}

function scanMmInfos(blocks: number): number {
  let first = -1;
  for (let block = 0; block < blocks && err === 0; block++) {
    if (pos >= end) {
      fail(E_TRUNCATED);
      break;
    }
    if (src[pos] === 0xc0) {
      pos++;
      continue;
    }
    if (first < 0) first = block;
    skip(4);
  }
  return first;
}

// Tail item classes.
const T_NIL = 0;
const T_UINT = 1;
const T_STR = 2;
const T_LIST = 3;
const T_OTHER = 4;
const FIXED_TAIL = [T_UINT, T_STR, T_UINT, T_STR, T_STR];

/** The fields after the fixed ones (see the module comment for the two layouts). */
function readTail(count: number): void {
  const buffered = count < TAIL_SLOTS ? count : TAIL_SLOTS;
  let fixed = true;
  for (let i = 0; i < buffered && err === 0; i++) {
    readTailItem(i);
    if (tailType[i] !== T_NIL && tailType[i] !== FIXED_TAIL[i]) fixed = false;
  }
  if (err !== 0) return;
  const e = eventIndex;
  if (fixed) {
    if (buffered > 0 && tailType[0] === T_UINT) setU32(FLAG_GROUP, out.groupIdx, tailValue[0]!);
    if (buffered > 1) out.specKind[e] = tailValue[1]!;
    if (buffered > 2 && tailType[2] === T_UINT)
      setU32(FLAG_WINDOW, out.slidingWindow, tailValue[2]!);
    if (buffered > 3) out.locality[e] = tailValue[3]!;
    if (buffered > 4) out.ownership[e] = tailValue[4]!;
    for (let i = TAIL_SLOTS; i < count && err === 0; i++) {
      // A Dynamo-aligned SGLang fork appends the metadata map after ownership.
      if (eventKind === EVENT_STORED && isMapByte(src[pos]!)) readMetadata();
      else skipUnknown(3);
    }
    return;
  }
  let uints = 0;
  let strings = 0;
  let lists = 0;
  for (let i = 0; i < count && err === 0; i++) {
    let type: number;
    let value: number;
    if (i < TAIL_SLOTS) {
      type = tailType[i]!;
      value = tailValue[i]!;
    } else {
      readTailItem(0);
      if (err !== 0) return;
      type = tailType[0]!;
      value = tailValue[0]!;
    }
    if (type === T_UINT && uints < 2) {
      if (uints++ === 0) setU32(FLAG_GROUP, out.groupIdx, value);
      else setU32(FLAG_WINDOW, out.slidingWindow, value);
    } else if (type === T_STR && strings === 0) {
      strings++;
      out.specKind[e] = value;
    } else if (type === T_LIST && lists === 0) {
      lists++;
      mmFromInfos = value;
    } else if (type !== T_NIL) out.unknownFields++;
  }
}

/** Reads one tail item into tailType/tailValue[slot] (value: u32, string id, or MM block). */
function readTailItem(slot: number): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const byte = src[pos]!;
  // A float is no tail field's type; refusing it keeps int and float apart (msgpack
  // decoders that return plain numbers could not tell them apart).
  if (byte === 0xca || byte === 0xcb) return fail(E_BAD_FIELD);
  if (byte === 0xc0) {
    pos++;
    tailType[slot] = T_NIL;
    tailValue[slot] = NO_STRING;
    return;
  }
  if (readInt()) {
    const fits = intHi === 0;
    tailType[slot] = fits ? T_UINT : T_OTHER;
    tailValue[slot] = fits ? intLo | 0 : 0;
    return;
  }
  if (err !== 0) return;
  const length = strHeader();
  if (length >= 0) {
    tailType[slot] = T_STR;
    tailValue[slot] = internString(pos, length);
    pos += length;
    return;
  }
  if (length === FAILED) return;
  const count = arrayHeader();
  if (count >= 0) {
    tailType[slot] = T_LIST;
    tailValue[slot] = scanMmInfos(count);
    return;
  }
  if (count === FAILED) return;
  tailType[slot] = T_OTHER;
  skip(3);
}

function setU32(flag: number, column: Uint32Array, value: number): void {
  column[eventIndex] = value >>> 0;
  out.flags[eventIndex]! |= flag;
}

// ---- msgpack primitives ----

const NOT_THIS = -1;
const FAILED = -2;

function u16(at: number): number {
  return (src[at]! << 8) | src[at + 1]!;
}

function u32(at: number): number {
  return ((src[at]! << 24) | (src[at + 1]! << 16) | (src[at + 2]! << 8) | src[at + 3]!) >>> 0;
}

function isArrayByte(byte: number): boolean {
  return (byte & 0xf0) === 0x90 || byte === 0xdc || byte === 0xdd;
}

function isMapByte(byte: number): boolean {
  return (byte & 0xf0) === 0x80 || byte === 0xde || byte === 0xdf;
}

/**
 * Consumes an array header and returns its count, NOT_THIS (nothing consumed) if the
 * value is not an array, or FAILED. The count is checked against the bytes left (each
 * element takes at least one) before anyone allocates for it.
 */
function arrayHeader(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  const byte = src[pos]!;
  let count: number;
  let size: number;
  if ((byte & 0xf0) === 0x90) {
    count = byte & 0x0f;
    size = 1;
  } else if (byte === 0xdc) {
    if (pos + 3 > end) return truncated();
    count = u16(pos + 1);
    size = 3;
  } else if (byte === 0xdd) {
    if (pos + 5 > end) return truncated();
    count = u32(pos + 1);
    size = 5;
  } else return NOT_THIS;
  if (count > end - pos - size) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  pos += size;
  return count;
}

/** Like arrayHeader, for maps (a pair takes at least two bytes). */
function mapHeader(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  const byte = src[pos]!;
  let count: number;
  let size: number;
  if ((byte & 0xf0) === 0x80) {
    count = byte & 0x0f;
    size = 1;
  } else if (byte === 0xde) {
    if (pos + 3 > end) return truncated();
    count = u16(pos + 1);
    size = 3;
  } else if (byte === 0xdf) {
    if (pos + 5 > end) return truncated();
    count = u32(pos + 1);
    size = 5;
  } else return NOT_THIS;
  if (2 * count > end - pos - size) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  pos += size;
  return count;
}

/** Consumes a str header: returns the byte length (bytes at strStart = pos), NOT_THIS or FAILED. */
function strHeader(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  const byte = src[pos]!;
  let length: number;
  let size: number;
  if ((byte & 0xe0) === 0xa0) {
    length = byte & 0x1f;
    size = 1;
  } else if (byte === 0xd9) {
    if (pos + 2 > end) return truncated();
    length = src[pos + 1]!;
    size = 2;
  } else if (byte === 0xda) {
    if (pos + 3 > end) return truncated();
    length = u16(pos + 1);
    size = 3;
  } else if (byte === 0xdb) {
    if (pos + 5 > end) return truncated();
    length = u32(pos + 1);
    size = 5;
  } else return NOT_THIS;
  if (length > end - pos - size) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  pos += size;
  strStart = pos;
  strLength = length;
  return length;
}

/** Like strHeader, for bin8/16/32. */
function binHeader(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  const byte = src[pos]!;
  let length: number;
  let size: number;
  if (byte === 0xc4) {
    if (pos + 2 > end) return truncated();
    length = src[pos + 1]!;
    size = 2;
  } else if (byte === 0xc5) {
    if (pos + 3 > end) return truncated();
    length = u16(pos + 1);
    size = 3;
  } else if (byte === 0xc6) {
    if (pos + 5 > end) return truncated();
    length = u32(pos + 1);
    size = 5;
  } else return NOT_THIS;
  if (length > end - pos - size) {
    fail(E_TRUNCATED);
    return FAILED;
  }
  pos += size;
  return length;
}

function truncated(): number {
  fail(E_TRUNCATED);
  return FAILED;
}

/** Checks the string just read by strHeader is valid UTF-8 (a string we compare or keep). */
function checkString(): boolean {
  if (strLength > limits.stringBytesMax) {
    fail(E_STRING_TOO_LONG);
    return false;
  }
  if (isUtf8(src, strStart, strLength)) return true;
  fail(E_BAD_STRING);
  return false;
}

/**
 * Reads any msgpack int into intHi/intLo (its two's-complement 64 bits) and
 * intSigned. Returns false, consuming nothing, if the value is not an int (or is
 * truncated, with err set).
 */
function readInt(): boolean {
  const byte = src[pos]!;
  if (byte < 0x80) {
    intHi = 0;
    intLo = byte;
    intSigned = false;
    pos++;
    return true;
  }
  if (byte >= 0xe0) {
    intHi = 0xffff_ffff;
    intLo = (byte - 0x100) >>> 0;
    intSigned = true;
    pos++;
    return true;
  }
  if (byte < 0xcc || byte > 0xd3) return false;
  const size = INT_SIZE[byte - 0xcc]!;
  if (pos + 1 + size > end) {
    fail(E_TRUNCATED);
    return false;
  }
  const at = pos + 1;
  let value: number;
  switch (byte) {
    case 0xcc:
      intHi = 0;
      intLo = src[at]!;
      intSigned = false;
      break;
    case 0xcd:
      intHi = 0;
      intLo = u16(at);
      intSigned = false;
      break;
    case 0xce:
      intHi = 0;
      intLo = u32(at);
      intSigned = false;
      break;
    case 0xcf:
      intHi = u32(at);
      intLo = u32(at + 4);
      intSigned = false;
      break;
    case 0xd0:
      value = (src[at]! << 24) >> 24;
      intHi = value < 0 ? 0xffff_ffff : 0;
      intLo = value >>> 0;
      intSigned = true;
      break;
    case 0xd1:
      value = (u16(at) << 16) >> 16;
      intHi = value < 0 ? 0xffff_ffff : 0;
      intLo = value >>> 0;
      intSigned = true;
      break;
    case 0xd2:
      value = u32(at) | 0;
      intHi = value < 0 ? 0xffff_ffff : 0;
      intLo = value >>> 0;
      intSigned = true;
      break;
    default:
      intHi = u32(at);
      intLo = u32(at + 4);
      intSigned = true;
      break;
  }
  pos = at + size;
  return true;
}
const INT_SIZE = [1, 2, 4, 8, 1, 2, 4, 8];

/** An int in [0, 2^32): its value, or -1 (nothing consumed unless it was an int out of range). */
function readU32(): number {
  if (pos >= end) {
    fail(E_TRUNCATED);
    return -1;
  }
  if (!readInt()) return -1;
  return intHi === 0 ? intLo : -1;
}

// ---- Map keys ----

const KEY_UNKNOWN = -1;
const KEY_NOT_STRING = -2;

interface KeyTable {
  /** By byte length: the ids of the keys of that length. */
  readonly byLength: number[][];
  readonly bytes: Uint8Array[];
}

function keyTable(keys: readonly string[]): KeyTable {
  const encoder = new TextEncoder();
  const bytes = keys.map((key) => encoder.encode(key));
  const byLength: number[][] = [];
  for (let length = 0; length <= Math.max(...bytes.map((b) => b.length)); length++)
    byLength.push([]);
  bytes.forEach((b, id) => {
    byLength[b.length]!.push(id);
  });
  return { byLength, bytes };
}

/** The id of the string just read by strHeader in `table`, or -1. */
function matchKey(table: KeyTable): number {
  if (strLength >= table.byLength.length) return -1;
  const candidates = table.byLength[strLength]!;
  for (let c = 0; c < candidates.length; c++) {
    const id = candidates[c]!;
    const key = table.bytes[id]!;
    let i = 0;
    while (i < strLength && key[i] === src[strStart + i]) i++;
    if (i === strLength) return id;
  }
  return -1;
}

/**
 * Reads a map key: a known key's id, KEY_UNKNOWN (a valid string that is not in the
 * table; its value still to be read), or KEY_NOT_STRING (a non-string key, skipped
 * together with its value).
 */
function readKey(table: KeyTable, depth: number): number {
  const length = strHeader();
  if (length >= 0) {
    const id = matchKey(table);
    pos += length;
    if (id >= 0) return id;
    checkString();
    return KEY_UNKNOWN;
  }
  if (length === NOT_THIS) {
    skip(depth);
    skip(depth);
  }
  return KEY_NOT_STRING;
}

// ---- Skipping ----

function skipUnknown(depth: number): void {
  out.unknownFields++;
  skip(depth);
}

/** Skips one value of any type; containers deeper than depthMax are refused. */
function skip(depth: number): void {
  if (pos >= end) return fail(E_TRUNCATED);
  const byte = src[pos]!;
  if (byte < 0x80 || byte >= 0xe0) {
    pos++;
    return;
  }
  if (byte < 0xa0 || byte === 0xdc || byte === 0xdd || byte === 0xde || byte === 0xdf) {
    if (depth > limits.depthMax) return fail(E_TOO_DEEP);
    let count = arrayHeader();
    if (count === FAILED) return;
    if (count === NOT_THIS) {
      count = mapHeader();
      if (count < 0) return;
      count *= 2;
    }
    for (let i = 0; i < count && err === 0; i++) skip(depth + 1);
    return;
  }
  let size: number;
  if (byte < 0xc0) size = 1 + (byte & 0x1f);
  else {
    switch (byte) {
      case 0xc0:
      case 0xc2:
      case 0xc3:
        size = 1;
        break;
      case 0xc4:
      case 0xd9:
        if (pos + 2 > end) return fail(E_TRUNCATED);
        size = 2 + src[pos + 1]!;
        break;
      case 0xc5:
      case 0xda:
        if (pos + 3 > end) return fail(E_TRUNCATED);
        size = 3 + u16(pos + 1);
        break;
      case 0xc6:
      case 0xdb:
        if (pos + 5 > end) return fail(E_TRUNCATED);
        size = 5 + u32(pos + 1);
        break;
      case 0xc7:
        if (pos + 2 > end) return fail(E_TRUNCATED);
        size = 3 + src[pos + 1]!;
        break;
      case 0xc8:
        if (pos + 3 > end) return fail(E_TRUNCATED);
        size = 4 + u16(pos + 1);
        break;
      case 0xc9:
        if (pos + 5 > end) return fail(E_TRUNCATED);
        size = 6 + u32(pos + 1);
        break;
      case 0xca:
      case 0xce:
      case 0xd2:
        size = 5;
        break;
      case 0xcb:
      case 0xcf:
      case 0xd3:
        size = 9;
        break;
      case 0xcc:
      case 0xd0:
        size = 2;
        break;
      case 0xcd:
      case 0xd1:
        size = 3;
        break;
      case 0xd4:
        size = 3;
        break;
      case 0xd5:
        size = 4;
        break;
      case 0xd6:
        size = 6;
        break;
      case 0xd7:
        size = 10;
        break;
      case 0xd8:
        size = 18;
        break;
      default:
        return fail(E_BAD_MSGPACK); // 0xc1, never used
    }
  }
  if (size > end - pos) return fail(E_TRUNCATED);
  pos += size;
}
