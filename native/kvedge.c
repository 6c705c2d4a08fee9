/*
 * kvedge native fast paths, called from TypeScript through bun:ffi.
 *
 * Only what measures faster than the TypeScript path lives here: hashing a whole
 * token array into per-block XXH3-64 words in one call (one FFI crossing per
 * batch instead of one BigInt per block). Every function has a pure fallback in
 * src/hash/, and tests compare the two.
 *
 * 64-bit results are written as (hi, lo) u32 pairs so JavaScript reads them from
 * a Uint32Array without BigInt.
 */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

#include <stddef.h>
#include <stdint.h>

#define KV_ABI_VERSION 1u

uint32_t kv_abi_version(void) { return KV_ABI_VERSION; }

static inline void kv_put(uint32_t* out, size_t i, uint64_t h) {
  out[2 * i] = (uint32_t)(h >> 32);
  out[2 * i + 1] = (uint32_t)h;
}

/*
 * Local block hashes: XXH3-64(seed) over each window of `window` tokens, taken
 * every `stride` tokens, tokens as u32 little-endian (the host order on every
 * target we build). window == stride for normal blocks; window == stride + 1 for
 * Eagle. Only complete windows are hashed. Returns the number of blocks written.
 */
uint32_t kv_hash_blocks(const uint32_t* tokens, uint32_t token_count, uint32_t stride,
                        uint32_t window, uint32_t seed_hi, uint32_t seed_lo, uint32_t* out) {
  if (stride == 0 || window < stride || token_count < window) return 0;
  const uint64_t seed = ((uint64_t)seed_hi << 32) | seed_lo;
  const uint32_t blocks = (token_count - window) / stride + 1;
  for (uint32_t i = 0; i < blocks; i++) {
    kv_put(out, i, XXH3_64bits_withSeed(tokens + (size_t)i * stride, (size_t)window * 4, seed));
  }
  return blocks;
}

/*
 * Sequence hash chain: seq[0] = local[0];
 * seq[i] = XXH3-64(LE64(seq[i-1]) || LE64(local[i]), seed 1337).
 * `local` and `out` hold (hi, lo) pairs and may be the same array.
 */
void kv_chain_hashes(const uint32_t* local, uint32_t count, uint32_t* out) {
  if (count == 0) return;
  uint64_t prev = ((uint64_t)local[0] << 32) | local[1];
  kv_put(out, 0, prev);
  for (uint32_t i = 1; i < count; i++) {
    uint64_t pair[2];
    pair[0] = prev; /* little-endian host: the in-memory bytes are LE64 */
    pair[1] = ((uint64_t)local[2 * i] << 32) | local[2 * i + 1];
    prev = XXH3_64bits_withSeed(pair, sizeof pair, 1337);
    kv_put(out, i, prev);
  }
}
