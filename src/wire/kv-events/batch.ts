/**
 * The decoder's output: one KV-event batch as columns of typed arrays, reused from
 * batch to batch (the arrays only grow; `reset()` just sets the counts to zero).
 *
 * Layout (event index e in [0, eventCount)):
 * - `kind[e]`: EVENT_STORED | EVENT_REMOVED | EVENT_CLEARED, or EVENT_SKIPPED for an
 *   event that could not be read (then `skipError[e]` is its error code, `skipKind[e]`
 *   the kind its tag named, 0 if not even that was readable, and `skipAt[e]` the byte
 *   offset of the value that failed; it has no hashes or tokens).
 * - `hashStart[e]`, `hashLength[e]`: the event's external block hashes are the u64
 *   pairs `hashes[2i]` (hi), `hashes[2i + 1]` (lo) for i in [start, start + length).
 * - `flags[e]`: FLAG_PARENT (then `parentHi/Lo[e]` hold the parent hash), FLAG_EAGLE
 *   (the tokens were bigram pairs, normalized to n + 1 tokens), FLAG_GROUP
 *   (`groupIdx[e]`), FLAG_WINDOW (`slidingWindow[e]`), FLAG_LORA_ID (`loraId[e]`, the
 *   engine's int id of the LoRA adapter).
 * - `tokenStart[e]`, `tokenLength[e]`: the event's token ids in `tokens`.
 * - `blockSize[e]`.
 * - `mmBlock[e]`: the index of the first block whose engine hash mixes in something
 *   kvedge does not hash (multimodal identifiers, prompt-embedding digests, any other
 *   unrecognized `extra_keys` item; or `block_mm_infos`), or -1.
 * - String columns hold ids into `strings` (valid for this batch) or NO_STRING:
 *   `medium`, `loraName`, `cacheSalt` (a top-level or metadata `cache_salt`, else
 *   recovered from the first block's `extra_keys`), `specKind`, `locality`, `ownership`.
 *
 * Batch fields: `ts`, `hasDpRank` / `dpRank`, the number of events skipped for an
 * unknown tag (`unknownTags`), of fields skipped for an unknown key or position
 * (`unknownFields`) and of events that could not be read (`skippedEvents`).
 */
import { StringTable } from "./strings";

export const EVENT_STORED = 1;
export const EVENT_REMOVED = 2;
export const EVENT_CLEARED = 3;
/** An event that could not be read: skipped alone, the rest of its batch decoded. */
export const EVENT_SKIPPED = 4;

export const FLAG_PARENT = 1;
export const FLAG_EAGLE = 2;
export const FLAG_GROUP = 4;
export const FLAG_WINDOW = 8;
export const FLAG_LORA_ID = 16;

export const NO_STRING = -1;

/** Bounds on one batch; anything past them drops the batch with a counted error. */
export interface DecodeLimits {
  readonly payloadBytesMax: number;
  readonly eventsMax: number;
  /** External hashes in the whole batch. */
  readonly blocksMax: number;
  /** Token ids in the whole batch. */
  readonly tokensMax: number;
  /** msgpack nesting depth (the batch itself is depth 0). */
  readonly depthMax: number;
  /** UTF-8 bytes of any string the decoder reads (medium, names, salt, tags). */
  readonly stringBytesMax: number;
}

export const DEFAULT_DECODE_LIMITS: DecodeLimits = {
  payloadBytesMax: 32 << 20,
  eventsMax: 1 << 16,
  blocksMax: 1 << 20,
  tokensMax: 1 << 23,
  depthMax: 32,
  stringBytesMax: 4096,
};

/** Depth of an extra-key item: batch 0, events 1, event 2, extra_keys 3, block 4, item 5. */
const DEPTH_OF_KNOWN_STRUCTURE = 5;
const EVENTS_INITIAL = 64;
const HASHES_INITIAL = 1024;
const TOKENS_INITIAL = 4096;

export class DecodedBatch {
  readonly limits: DecodeLimits;
  readonly strings = new StringTable();

  ts = 0;
  hasDpRank = false;
  dpRank = 0;
  eventCount = 0;
  /** Hash pairs and tokens in use. */
  hashCount = 0;
  tokenCount = 0;
  unknownTags = 0;
  unknownFields = 0;
  /** Events that could not be read (EVENT_SKIPPED). */
  skippedEvents = 0;
  /** After a failed decode: the byte offset of the value that failed. */
  errorOffset = 0;

  kind = new Uint8Array(EVENTS_INITIAL);
  flags = new Uint8Array(EVENTS_INITIAL);
  hashStart = new Uint32Array(EVENTS_INITIAL);
  hashLength = new Uint32Array(EVENTS_INITIAL);
  parentHi = new Uint32Array(EVENTS_INITIAL);
  parentLo = new Uint32Array(EVENTS_INITIAL);
  tokenStart = new Uint32Array(EVENTS_INITIAL);
  tokenLength = new Uint32Array(EVENTS_INITIAL);
  blockSize = new Uint32Array(EVENTS_INITIAL);
  groupIdx = new Uint32Array(EVENTS_INITIAL);
  slidingWindow = new Uint32Array(EVENTS_INITIAL);
  loraId = new Uint32Array(EVENTS_INITIAL);
  skipError = new Uint8Array(EVENTS_INITIAL);
  skipKind = new Uint8Array(EVENTS_INITIAL);
  skipAt = new Uint32Array(EVENTS_INITIAL);
  mmBlock = new Int32Array(EVENTS_INITIAL);
  medium = new Int32Array(EVENTS_INITIAL);
  loraName = new Int32Array(EVENTS_INITIAL);
  cacheSalt = new Int32Array(EVENTS_INITIAL);
  specKind = new Int32Array(EVENTS_INITIAL);
  locality = new Int32Array(EVENTS_INITIAL);
  ownership = new Int32Array(EVENTS_INITIAL);

  /** (hi, lo) u32 pairs. */
  hashes = new Uint32Array(2 * HASHES_INITIAL);
  tokens = new Uint32Array(TOKENS_INITIAL);

  constructor(limits: Partial<DecodeLimits> = {}) {
    this.limits = { ...DEFAULT_DECODE_LIMITS, ...limits };
    // The walker reads the known structure (batch > events > event > field > block >
    // item) by hand; only values nested below that go through the depth check.
    if (this.limits.depthMax < DEPTH_OF_KNOWN_STRUCTURE) {
      throw new RangeError(`depthMax must be at least ${DEPTH_OF_KNOWN_STRUCTURE}`);
    }
  }

  /** The string behind a string-column id, or null for NO_STRING. */
  string(id: number): string | null {
    return id === NO_STRING ? null : this.strings.get(id);
  }

  reset(): void {
    this.ts = 0;
    this.hasDpRank = false;
    this.dpRank = 0;
    this.eventCount = 0;
    this.hashCount = 0;
    this.tokenCount = 0;
    this.unknownTags = 0;
    this.unknownFields = 0;
    this.skippedEvents = 0;
  }

  /** Makes room for event index `eventCount` (the one allocation site for event columns). */
  ensureEvent(): void {
    if (this.eventCount < this.kind.length) return;
    const capacity = this.kind.length * 2;
    this.kind = grow(this.kind, new Uint8Array(capacity));
    this.flags = grow(this.flags, new Uint8Array(capacity));
    this.hashStart = grow(this.hashStart, new Uint32Array(capacity));
    this.hashLength = grow(this.hashLength, new Uint32Array(capacity));
    this.parentHi = grow(this.parentHi, new Uint32Array(capacity));
    this.parentLo = grow(this.parentLo, new Uint32Array(capacity));
    this.tokenStart = grow(this.tokenStart, new Uint32Array(capacity));
    this.tokenLength = grow(this.tokenLength, new Uint32Array(capacity));
    this.blockSize = grow(this.blockSize, new Uint32Array(capacity));
    this.groupIdx = grow(this.groupIdx, new Uint32Array(capacity));
    this.slidingWindow = grow(this.slidingWindow, new Uint32Array(capacity));
    this.loraId = grow(this.loraId, new Uint32Array(capacity));
    this.skipError = grow(this.skipError, new Uint8Array(capacity));
    this.skipKind = grow(this.skipKind, new Uint8Array(capacity));
    this.skipAt = grow(this.skipAt, new Uint32Array(capacity));
    this.mmBlock = grow(this.mmBlock, new Int32Array(capacity));
    this.medium = grow(this.medium, new Int32Array(capacity));
    this.loraName = grow(this.loraName, new Int32Array(capacity));
    this.cacheSalt = grow(this.cacheSalt, new Int32Array(capacity));
    this.specKind = grow(this.specKind, new Int32Array(capacity));
    this.locality = grow(this.locality, new Int32Array(capacity));
    this.ownership = grow(this.ownership, new Int32Array(capacity));
  }

  /** Makes room for `count` more hash pairs after `hashCount`. */
  ensureHashes(count: number): void {
    const needed = 2 * (this.hashCount + count);
    if (needed <= this.hashes.length) return;
    this.hashes = grow(this.hashes, new Uint32Array(capacityFor(needed, this.hashes.length)));
  }

  /** Makes room for `count` more tokens after `tokenCount`. */
  ensureTokens(count: number): void {
    const needed = this.tokenCount + count;
    if (needed <= this.tokens.length) return;
    this.tokens = grow(this.tokens, new Uint32Array(capacityFor(needed, this.tokens.length)));
  }
}

function capacityFor(needed: number, current: number): number {
  let capacity = current * 2;
  while (capacity < needed) capacity *= 2;
  return capacity;
}

function grow<T extends Uint8Array | Uint32Array | Int32Array>(from: T, to: T): T {
  to.set(from);
  return to;
}
