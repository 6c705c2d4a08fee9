/**
 * Token synthesis for traces that carry block ids instead of text (Mooncake).
 *
 * Every `hash_id` becomes a fixed pseudo-random block of token ids: token j of id h is
 * fmix32(fmix32(h) ^ POSITION[j]) scaled down to [0, vocab). It is a pure function of (h, j), so equal
 * ids give equal tokens in every process, and tokens are computed on demand (the
 * conversation trace would be 145 M tokens if materialized at once).
 *
 * Why this shape: fmix32 is a bijection on u32, so two different ids differ in every
 * token before the modulo; after it, a 16-token engine block of one id equals the
 * block of another id at the same position with probability about vocab^-16.
 * Token ids are the top bits of the mix scaled to the vocabulary (no modulo bias).
 * Generated output tokens use their own position table, so they never line up with
 * prompt blocks either.
 */

/** Llama-3's vocabulary size: realistic token ids (and msgpack sizes) in events. */
export const DEFAULT_VOCAB_SIZE = 128_256;

/** MurmurHash3's 32-bit finalizer: a bijection with full avalanche. */
export function fmix32(value: number): number {
  let h = value >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85eb_ca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2_ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Per-position mixing constants; `salt` separates prompt blocks from output tokens. */
function makePositionTable(length: number, salt: number): Uint32Array {
  const table = new Uint32Array(length);
  for (let j = 0; j < length; j++) table[j] = fmix32(Math.imul(j + 1, 0x9e37_79b1) ^ salt);
  return table;
}

const PROMPT_SALT = 0x7072_6f6d; // "prom"
const OUTPUT_SALT = 0x6f75_7470; // "outp"
/** Output tokens are generated in chunks of this many positions (one table). */
const OUTPUT_CHUNK_TOKENS = 4096;
const outputTable = makePositionTable(OUTPUT_CHUNK_TOKENS, OUTPUT_SALT);
/** The prompt table of the last block size used (one size per trace in practice). */
let promptTable = makePositionTable(512, PROMPT_SALT);

function promptPositionTable(blockTokens: number): Uint32Array {
  if (promptTable.length !== blockTokens) promptTable = makePositionTable(blockTokens, PROMPT_SALT);
  return promptTable;
}

/**
 * Writes tokens [from, to) of block id `id` (a block of `blockTokens` tokens) into
 * `out` starting at `outIndex`.
 */
export function writeIdTokens(
  id: number,
  blockTokens: number,
  from: number,
  to: number,
  vocabSize: number,
  out: Uint32Array,
  outIndex: number,
): void {
  if (from < 0 || to > blockTokens || from > to)
    throw new RangeError(`token range [${from}, ${to}) of ${blockTokens}`);
  const table = promptPositionTable(blockTokens);
  const base = fmix32(id);
  const scale = vocabSize / 0x1_0000_0000;
  for (let j = from; j < to; j++)
    out[outIndex + j - from] = Math.floor(fmix32(base ^ table[j]!) * scale);
}

/**
 * The prompt of a request whose blocks are `ids` (each `blockTokens` tokens),
 * truncated to `promptLength`, written into `out` from index 0.
 */
export function writePromptTokens(
  ids: Uint32Array,
  blockTokens: number,
  promptLength: number,
  vocabSize: number,
  out: Uint32Array,
): void {
  if (promptLength > ids.length * blockTokens) {
    throw new RangeError(
      `prompt of ${promptLength} tokens from ${ids.length} blocks of ${blockTokens}`,
    );
  }
  if (out.length < promptLength)
    throw new RangeError(`out holds ${out.length} tokens, needs ${promptLength}`);
  for (let b = 0, start = 0; start < promptLength; b++, start += blockTokens) {
    const count = Math.min(blockTokens, promptLength - start);
    writeIdTokens(ids[b]!, blockTokens, 0, count, vocabSize, out, start);
  }
}

/**
 * `length` generated tokens for the request keyed `requestKey`, into `out` from
 * `outIndex`: deterministic, and unrelated to every prompt block.
 */
export function writeOutputTokens(
  requestKey: number,
  length: number,
  vocabSize: number,
  out: Uint32Array,
  outIndex: number,
): void {
  const table = outputTable;
  for (let start = 0, chunk = 0; start < length; start += OUTPUT_CHUNK_TOKENS, chunk++) {
    const base = fmix32(fmix32(requestKey) ^ Math.imul(chunk + 1, 0x27d4_eb2f));
    const count = Math.min(OUTPUT_CHUNK_TOKENS, length - start);
    const scale = vocabSize / 0x1_0000_0000;
    for (let j = 0; j < count; j++)
      out[outIndex + start + j] = Math.floor(fmix32(base ^ table[j]!) * scale);
  }
}
