/**
 * Interned strings for the KV-event walker.
 *
 * The few strings in a batch (medium, LoRA name, spec kind, salt) repeat on almost
 * every event. The table maps their UTF-8 bytes to a small integer id without
 * decoding or allocating on a hit: hash the bytes, probe, compare bytes. A miss
 * validates UTF-8, decodes once and appends.
 *
 * Ids stay valid until `clear()`, which the decoder calls only between batches,
 * when the table has grown past its soft bounds. So an id is valid for the batch
 * that produced it; anything kept longer must be kept as the string.
 */

const SLOTS_MIN = 256;
/** Past these, the table is emptied at the start of the next batch. */
const STRINGS_SOFT_MAX = 4096;
const ARENA_BYTES_SOFT_MAX = 1 << 20;

const utf8 = new TextDecoder("utf-8");

export class StringTable {
  /** Open addressing: slot -> id + 1 (0 = empty). Capacity is a power of two. */
  private slots = new Int32Array(SLOTS_MIN);
  private slotHash = new Uint32Array(SLOTS_MIN);
  /** Per id: where its bytes live in `arena`. */
  private starts = new Uint32Array(64);
  private lengths = new Uint32Array(64);
  private arena = new Uint8Array(4096);
  private arenaLength = 0;
  private readonly values: string[] = [];
  /** Bumped by every clear(), so caches keyed by id can tell ids were reused. */
  generation = 0;

  get size(): number {
    return this.values.length;
  }

  /** The string for an id from this generation. */
  get(id: number): string {
    const value = this.values[id];
    if (value === undefined) throw new RangeError(`no string with id ${id}`);
    return value;
  }

  /** Empties the table if it outgrew its soft bounds (call between batches only). */
  trim(): void {
    if (this.values.length > STRINGS_SOFT_MAX || this.arenaLength > ARENA_BYTES_SOFT_MAX)
      this.clear();
  }

  clear(): void {
    this.slots = new Int32Array(SLOTS_MIN);
    this.slotHash = new Uint32Array(SLOTS_MIN);
    this.arena = new Uint8Array(4096);
    this.arenaLength = 0;
    this.values.length = 0;
    this.generation++;
  }

  /**
   * The id of the string held in `bytes[start, start + length)`, interning it on a
   * miss. Returns -1 if the bytes are not valid UTF-8.
   */
  intern(bytes: Uint8Array, start: number, length: number): number {
    // FNV-1a over the bytes.
    let hash = 0x811c9dc5;
    for (let i = 0; i < length; i++) hash = Math.imul(hash ^ bytes[start + i]!, 0x01000193);
    hash >>>= 0;
    const mask = this.slots.length - 1;
    let slot = hash & mask;
    for (let probe = 0; probe <= mask; probe++) {
      const entry = this.slots[slot]!;
      if (entry === 0) return this.insert(bytes, start, length, hash, slot);
      if (this.slotHash[slot] === hash && this.equals(entry - 1, bytes, start, length))
        return entry - 1;
      slot = (slot + 1) & mask;
    }
    throw new Error("string table full (load factor invariant broken)");
  }

  /** Whether string `id` has exactly the bytes `bytes[start, start + length)` (nothing interned). */
  equals(id: number, bytes: Uint8Array, start: number, length: number): boolean {
    if (this.lengths[id] !== length) return false;
    const arena = this.arena;
    const at = this.starts[id]!;
    for (let i = 0; i < length; i++) if (arena[at + i] !== bytes[start + i]) return false;
    return true;
  }

  private insert(
    bytes: Uint8Array,
    start: number,
    length: number,
    hash: number,
    slot: number,
  ): number {
    if (!isUtf8(bytes, start, length)) return -1;
    const id = this.values.length;
    this.values.push(decodeUtf8(bytes, start, length));
    if (id === this.starts.length) {
      this.starts = grownU32(this.starts, id * 2);
      this.lengths = grownU32(this.lengths, id * 2);
    }
    if (this.arenaLength + length > this.arena.length) {
      const arena = new Uint8Array(Math.max(this.arena.length * 2, this.arenaLength + length));
      arena.set(this.arena.subarray(0, this.arenaLength));
      this.arena = arena;
    }
    this.arena.set(bytes.subarray(start, start + length), this.arenaLength);
    this.starts[id] = this.arenaLength;
    this.lengths[id] = length;
    this.arenaLength += length;
    this.slots[slot] = id + 1;
    this.slotHash[slot] = hash;
    // Keep the load factor at most 1/2 so probes stay short.
    if (2 * this.values.length > this.slots.length) this.rehash(this.slots.length * 2);
    return id;
  }

  private rehash(capacity: number): void {
    const oldSlots = this.slots;
    const oldHash = this.slotHash;
    this.slots = new Int32Array(capacity);
    this.slotHash = new Uint32Array(capacity);
    const mask = capacity - 1;
    for (let i = 0; i < oldSlots.length; i++) {
      const entry = oldSlots[i]!;
      if (entry === 0) continue;
      let slot = oldHash[i]! & mask;
      while (this.slots[slot] !== 0) slot = (slot + 1) & mask;
      this.slots[slot] = entry;
      this.slotHash[slot] = oldHash[i]!;
    }
  }
}

function grownU32(array: Uint32Array, capacity: number): Uint32Array<ArrayBuffer> {
  const grown = new Uint32Array(capacity);
  grown.set(array);
  return grown;
}

function decodeUtf8(bytes: Uint8Array, start: number, length: number): string {
  let ascii = "";
  for (let i = 0; i < length; i++) {
    const byte = bytes[start + i]!;
    if (byte >= 0x80) return utf8.decode(bytes.subarray(start, start + length));
    ascii += String.fromCharCode(byte);
  }
  return ascii;
}

/** Whether `bytes[start, start + length)` is well-formed UTF-8 (no overlongs, surrogates, > U+10FFFF). */
export function isUtf8(bytes: Uint8Array, start: number, length: number): boolean {
  const end = start + length;
  let i = start;
  while (i < end) {
    const byte = bytes[i]!;
    if (byte < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let low = 0x80;
    let high = 0xbf;
    if (byte >= 0xc2 && byte <= 0xdf) need = 1;
    else if (byte >= 0xe0 && byte <= 0xef) {
      need = 2;
      if (byte === 0xe0) low = 0xa0;
      else if (byte === 0xed) high = 0x9f;
    } else if (byte >= 0xf0 && byte <= 0xf4) {
      need = 3;
      if (byte === 0xf0) low = 0x90;
      else if (byte === 0xf4) high = 0x8f;
    } else return false;
    if (i + need >= end) return false;
    const second = bytes[i + 1]!;
    if (second < low || second > high) return false;
    for (let k = 2; k <= need; k++) {
      const next = bytes[i + k]!;
      if (next < 0x80 || next > 0xbf) return false;
    }
    i += need + 1;
  }
  return true;
}
