/*
 * kvedge native fast paths, called from TypeScript through bun:ffi.
 *
 * Only what measures faster than the TypeScript path lives here: hashing a whole
 * token array into per-block XXH3-64 words in one call (one FFI crossing per
 * batch instead of one BigInt per block), reading a JSON array of token ids from
 * bytes, and reading the elements of a msgpack array of token ids. Every function
 * has a pure fallback (src/hash/, src/server/request-json.ts, src/wire/kv-events/
 * decode.ts, src/index/lookup.ts), and tests compare the two.
 *
 * 64-bit results are written as (hi, lo) u32 pairs so JavaScript reads them from
 * a Uint32Array without BigInt.
 */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KV_ABI_VERSION 5u

uint32_t kv_abi_version(void) { return KV_ABI_VERSION; }

static inline void kv_put(uint32_t* out, size_t i, uint64_t h) {
  out[2 * i] = (uint32_t)(h >> 32);
  out[2 * i + 1] = (uint32_t)h;
}

/*
 * Local block hashes: XXH3-64(seed) over each window of `window` tokens, taken
 * every `stride` tokens, tokens as u32 little-endian (the host order on every
 * target we build). window == stride for normal blocks; window == stride + 1 for
 * Eagle. Only complete windows are hashed. The tokens are tokens[token_start..
 * token_start+token_count), the hashes go to out[2 * out_start..] (offsets, so the
 * caller needs no view per event). Returns the number of blocks written.
 */
uint32_t kv_hash_blocks(const uint32_t* tokens, uint32_t token_start, uint32_t token_count,
                        uint32_t stride, uint32_t window, uint32_t seed_hi, uint32_t seed_lo,
                        uint32_t* out, uint32_t out_start) {
  if (stride == 0 || window < stride || token_count < window) return 0;
  const uint64_t seed = ((uint64_t)seed_hi << 32) | seed_lo;
  const uint32_t blocks = (token_count - window) / stride + 1;
  tokens += token_start;
  out += 2 * (size_t)out_start;
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

/*
 * A JSON array of token ids at bytes[start] (on its '['): plain decimal integers in
 * [0, 2^32) (no sign, fraction, exponent or leading zero), JSON whitespace around
 * them. Writes them to `out` (at most `max`) and the position after the ']' to
 * `end[0]`; returns the count, or -1 for anything else (past `length` included) —
 * the caller then uses its general parser. Accepts exactly what scanTokens in
 * src/server/request-json.ts accepts.
 *
 * Two readers of the same grammar. `kv_scan_plain` reads byte by byte and handles
 * everything. `kv_scan_compact` handles the compact form, `[` d+ (`,` d+)* `]` with
 * nothing else before the `]`, without a branch per byte: per 64-byte block it builds
 * bitmaps of digits and separators (SSE2, 16 bytes at a time), then walks the
 * separators; each integer's digits are one 8-byte load, masked to the integer, and
 * a block's integers are converted together (four at a time with AVX2, else a SWAR
 * multiply-add each). A byte-by-byte loop spends most of its time on the mispredicted
 * exit of each integer's digit loop; here nothing depends on the previous integer but
 * the separator bitmap. On anything outside the compact form it gives up and the plain
 * reader decides.
 */
static inline int kv_is_space(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static int32_t kv_scan_plain(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t* out,
                             uint32_t max, uint32_t* end) {
  const uint8_t* p = bytes + start;
  const uint8_t* const stop = bytes + length;
  if (p >= stop || *p != '[') return -1;
  p++;
  while (p < stop && kv_is_space(*p)) p++;
  if (p >= stop) return -1;
  if (*p == ']') {
    end[0] = (uint32_t)(p + 1 - bytes);
    return 0;
  }
  uint32_t count = 0;
  for (;;) {
    if (p >= stop) return -1;
    uint32_t d = (uint32_t)*p - '0';
    if (d > 9) return -1;
    uint64_t value = d;
    p++;
    if (d == 0) {
      if (p < stop && (uint32_t)*p - '0' <= 9) return -1; /* leading zero */
    } else {
      /* At most 10 digits fit below 2^32; an 11th means too large. */
      const uint8_t* limit = stop - p > 9 ? p + 9 : stop;
      while (p < limit && (d = (uint32_t)*p - '0') <= 9) {
        value = value * 10 + d;
        p++;
      }
      if (value > 0xffffffffu || (p < stop && (uint32_t)*p - '0' <= 9)) return -1;
    }
    if (count == max) return -1;
    out[count++] = (uint32_t)value;
    /* The separator: ',' at once, else whitespace then ',' or ']'. */
    if (p >= stop) return -1;
    if (*p != ',') {
      while (p < stop && kv_is_space(*p)) p++;
      if (p >= stop) return -1;
      if (*p == ']') {
        end[0] = (uint32_t)(p + 1 - bytes);
        return (int32_t)count;
      }
      if (*p != ',') return -1;
    }
    p++;
    while (p < stop && kv_is_space(*p)) p++;
  }
}

#define KV_ONES 0x0101010101010101ull

static inline uint64_t kv_load64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8); /* little-endian host: byte 0 is the low byte */
  return v;
}

/* The value of a window of 8 digit values (0-9, one per byte), most significant first. */
static inline uint32_t kv_window_value(uint64_t x) {
  x = (x * 2561) >> 8;
  x = ((x & 0x00ff00ff00ff00ffull) * 6553601) >> 16;
  return (uint32_t)(((x & 0x0000ffff0000ffffull) * 42949672960001ull) >> 32);
}

#if defined(__SSE2__) && defined(__x86_64__)
#include <immintrin.h>

static void kv_windows_scalar(const uint64_t* windows, uint32_t n, uint32_t* out) {
  for (uint32_t i = 0; i < n; i++) out[i] = kv_window_value(windows[i]);
}

/* Four windows per step: pairs of digits (x10), pairs of pairs (x100), halves (x10000). */
__attribute__((target("avx2"))) static void kv_windows_avx2(const uint64_t* windows, uint32_t n, uint32_t* out) {
  const __m256i tens = _mm256_set1_epi16(0x010a), hundreds = _mm256_set1_epi32(0x00010064);
  const __m256i ten_thousands = _mm256_set1_epi32(0x00012710);
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)(windows + i));
    const __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(x, tens), hundreds);
    const __m256i values = _mm256_madd_epi16(_mm256_packus_epi32(quads, quads), ten_thousands);
    _mm_storeu_si128((__m128i*)(out + i), _mm256_castsi256_si128(_mm256_permute4x64_epi64(values, 0x08)));
  }
  for (; i < n; i++) out[i] = kv_window_value(windows[i]);
}

/* Chosen once: AVX2 where the CPU has it (every CPU Bun's x64 build runs on) unless
   KVEDGE_NATIVE_AVX2=0 (tests read the other path that way), else scalar. */
static void (*kv_windows)(const uint64_t*, uint32_t, uint32_t*) = 0;

static void kv_choose_windows(void) {
  const char* avx2 = getenv("KVEDGE_NATIVE_AVX2");
  __builtin_cpu_init();
  const int off = avx2 != 0 && strcmp(avx2, "0") == 0;
  kv_windows = __builtin_cpu_supports("avx2") && !off ? kv_windows_avx2 : kv_windows_scalar;
}

/* The compact form only; -2 = not compact (the plain reader decides), else as above. */
static int32_t kv_scan_compact(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t* out,
                               uint32_t max, uint32_t* end) {
  /* Blocks start at the first integer; the bytes before it are '[' and at least 7 of
     the request's own (or the scan is not worth it), so every 8-byte load ending at a
     separator stays inside the buffer. */
  const uint32_t first = start + 1;
  if (first < 8 || length - first < 64) return -2;
  if (kv_windows == 0) kv_choose_windows();
  uint32_t count = 0;
  uint32_t token = first;  /* where the current integer starts */
  uint64_t digit_before = 0; /* 1 if the byte before this block is a digit */
  uint32_t lengths = 0;    /* OR of (digits - 1) over the integers: > 7 = one empty or over 8 digits */
  uint64_t leading_zeros = 0;
  uint8_t tail[64];
  uint64_t windows[64];
  for (uint32_t block = first; block < length; block += 64) {
    const uint8_t* b = bytes + block;
    if (length - block < 64) {
      /* The last bytes, padded with zeros (neither digit nor separator). */
      memset(tail, 0, sizeof tail);
      memcpy(tail, b, length - block);
      b = tail;
    }
    uint64_t digits = 0, zeros = 0, commas = 0, closes = 0;
    for (unsigned w = 0; w < 4; w++) {
      const __m128i v = _mm_loadu_si128((const __m128i*)(b + 16 * w));
      const __m128i offset = _mm_sub_epi8(v, _mm_set1_epi8('0'));
      const __m128i digit = _mm_cmpeq_epi8(_mm_max_epu8(offset, _mm_set1_epi8(9)), _mm_set1_epi8(9));
      digits |= (uint64_t)(uint16_t)_mm_movemask_epi8(digit) << (16 * w);
      zeros |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('0'))) << (16 * w);
      commas |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(','))) << (16 * w);
      closes |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(']'))) << (16 * w);
    }
    /* Up to the first ']': only digits and commas, or this is not the compact form. */
    const uint64_t before_close = closes == 0 ? ~0ull : (closes & -closes) - 1;
    if (~(digits | commas) & before_close) return -2;
    /* A leading zero: a '0' with no digit before it and a digit after it (for the
       block's last byte, the next block's first byte tells). */
    const uint64_t starts = digits & ~((digits << 1) | digit_before) & zeros & before_close;
    leading_zeros |= starts & (digits >> 1);
    if ((starts >> 63) != 0 && block + 64 < length && (uint32_t)bytes[block + 64] - '0' <= 9) return -2;
    digit_before = digits >> 63;
    uint64_t separators = (commas & before_close) | (closes & -closes);
    const uint32_t found = (uint32_t)__builtin_popcountll(separators);
    if (found > max - count) return -2;
    /* Each separator ends an integer: its last 8 bytes, the ones before it masked to
       zero, are its digits' window (converted together below). Integers of 1-8 digits
       without a leading zero; anything else is left to the plain reader (flagged, not
       branched on). */
    uint32_t k = 0;
    while (separators != 0) {
      const uint32_t at = block + (uint32_t)__builtin_ctzll(separators);
      separators &= separators - 1;
      const uint32_t n = at - token;
      lengths |= n - 1;
      windows[k++] = kv_load64(bytes + at - 8) & (~0ull << ((64 - 8 * n) & 63)) & (KV_ONES * 0x0f);
      token = at + 1;
    }
    if (lengths > 7 || leading_zeros != 0) return -2;
    kv_windows(windows, k, out + count);
    count += k;
    if (closes != 0) {
      end[0] = block + (uint32_t)__builtin_ctzll(closes) + 1;
      return (int32_t)count;
    }
  }
  return -2;
}
#else
/* Without SSE2 (the arm64 build), the plain reader does all the work. */
static int32_t kv_scan_compact(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t* out,
                               uint32_t max, uint32_t* end) {
  (void)bytes, (void)length, (void)start, (void)out, (void)max, (void)end;
  return -2;
}
#endif

int32_t kv_scan_tokens(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t* out,
                       uint32_t max, uint32_t* end) {
  if (start >= length || bytes[start] != '[') return -1;
  const int32_t compact = kv_scan_compact(bytes, length, start, out, max, end);
  return compact != -2 ? compact : kv_scan_plain(bytes, length, start, out, max, end);
}

/*
 * The elements of a msgpack array of token ids (KV-event `token_ids`): up to `count`
 * values from bytes[start..length), each a positive fixint, uint8, uint16 or uint32,
 * into out[at..]. Returns how many were read: fewer than `count` at the first value of any
 * other encoding, or one that runs past `length` (the caller's general reader takes
 * over there). end[0] = the position after the last value read.
 *
 * The loop's only dependency is the cursor: size from the type byte, arithmetically
 * (0xcc, 0xcd, 0xce -> 2, 3, 5), and the value from one 8-byte load, selected without
 * a branch (engines mix uint16 and uint32 ids at random, which a branch mispredicts).
 */
static inline uint32_t kv_mp_size(uint32_t b) {
  if (b < 0x80) return 1;
  return b - 0xccu <= 2 ? (1u << (b - 0xccu)) + 1 : 0;
}

uint32_t kv_msgpack_u32s(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t count,
                         uint32_t* out, uint32_t at, uint32_t* end) {
  uint32_t p = start;
  out += at;
  uint32_t i = 0;
  /* At least 9 bytes left: the type byte and an 8-byte load after it stay inside. */
  if (length >= 9) {
    const uint32_t fast_stop = length - 9;
    while (i < count && p <= fast_stop) {
      const uint32_t b = bytes[p];
      const uint32_t size = kv_mp_size(b);
      if (size == 0) break;
      const uint64_t v = __builtin_bswap64(kv_load64(bytes + p + 1));
      const uint32_t n = size - 1 + (size == 1); /* value bytes; a fixint's wide value is unused */
      const uint32_t wide = (uint32_t)(v >> (64 - 8 * n));
      out[i++] = b < 0x80 ? b : wide;
      p += size;
    }
  }
  for (; i < count && p < length; i++) {
    const uint32_t b = bytes[p];
    const uint32_t size = kv_mp_size(b);
    if (size == 0 || length - p < size) break;
    uint32_t value = b < 0x80 ? b : 0;
    for (uint32_t k = 1; k < size && b >= 0x80; k++) value = (value << 8) | bytes[p + k];
    out[i] = value;
    p += size;
  }
  end[0] = p;
  return i;
}

/*
 * The per-worker lookup of the index (src/index/lookup.ts, whose layout and rules
 * these follow exactly): open addressing over (hi, lo, value) u32 triples, value 0 =
 * empty, linear probing, backward-shift deletion; the home slot of a key is the top
 * bits of its mix (small tables, shift > 0) or mix * capacity / 2^32 (large ones,
 * scale = capacity / 2^32, computed as the TypeScript computes it). One call does
 * an event's worth of removals or inserts, in order, loading home slots a few keys
 * ahead so their cache misses overlap, and stops where the caller must resize.
 * limits[0] is the entry count (updated); limits[1] the resize threshold.
 */
/* Up to 2^21 slots, mix * capacity stays below 2^53: the TypeScript's double multiply is
 * exact there and equals this integer one, which is several cycles shorter (the shift
 * runs it for every entry it passes). */
#define KV_LOOKUP_EXACT_CAPACITY (1u << 21)

static inline uint32_t kv_lookup_home(uint32_t hi, uint32_t lo, uint32_t shift, double scale,
                                      uint32_t capacity) {
  const uint32_t mix = (lo ^ (hi * 0x85ebca6bu)) * 0x9e3779b1u;
  if (shift != 0) return mix >> shift;
  if (capacity <= KV_LOOKUP_EXACT_CAPACITY) return (uint32_t)(((uint64_t)mix * capacity) >> 32);
  return (uint32_t)(int32_t)((double)mix * scale);
}

/* Keys ahead of the current one whose home slot is prefetched. */
#define KV_LOOKUP_AHEAD 12
/*
 * 64-byte lines prefetched from a home slot on: the run that a removal's shift or an
 * insert's probe walks is about 13 slots (156 bytes) on average at the 0.8 load limit.
 * One line measured about 1.2x the write path's time of four at page size 1, 1.1x at 16.
 */
#define KV_LOOKUP_PREFETCH_LINES 4

/*
 * Forced inline: GCC's local-pure-const pass takes a void function whose only effect is
 * __builtin_prefetch for a const one and deletes its calls. Out of line, these two
 * compiled to nothing (until 2026-12-04 the lookup's prefetch never ran; with it, a
 * removal from a 16,384-entry table went from about 86 to 62 ns).
 */
#define KV_PREFETCH_HELPER static inline __attribute__((always_inline)) void

KV_PREFETCH_HELPER kv_lookup_prefetch(const uint32_t* table, uint32_t capacity,
                                      const uint32_t* keys, uint32_t i, uint32_t count,
                                      uint32_t shift, double scale) {
  if (i < count) {
    const uint32_t home = kv_lookup_home(keys[2 * i], keys[2 * i + 1], shift, scale, capacity);
    /* Integer addresses: the last lines may lie past the table (a prefetch never faults,
     * but a pointer formed past an array's end would be undefined behaviour in C). */
    const uintptr_t at = (uintptr_t)table + 12 * (uintptr_t)home;
    for (uint32_t line = 0; line < KV_LOOKUP_PREFETCH_LINES; line++) {
      __builtin_prefetch((const void*)(at + 64 * (uintptr_t)line));
    }
  }
}

/*
 * The slot of key i of `keys` ((hi, lo) pairs), or of the empty slot that ends its
 * probe; first prefetches the home slot of key i + KV_LOOKUP_AHEAD (the keys before
 * it were prefetched by earlier steps or by kv_lookup_prefetch_first).
 */
static inline uint32_t kv_lookup_slot(const uint32_t* table, uint32_t capacity, uint32_t shift,
                                      double scale, const uint32_t* keys, uint32_t i,
                                      uint32_t count) {
  kv_lookup_prefetch(table, capacity, keys, i + KV_LOOKUP_AHEAD, count, shift, scale);
  const uint32_t hi = keys[2 * i], lo = keys[2 * i + 1];
  uint32_t slot = kv_lookup_home(hi, lo, shift, scale, capacity);
  for (;;) {
    const uint32_t* e = table + 3 * (size_t)slot;
    if (e[2] == 0 || (e[1] == lo && e[0] == hi)) return slot;
    if (++slot == capacity) slot = 0;
  }
}

KV_PREFETCH_HELPER kv_lookup_prefetch_first(const uint32_t* table, uint32_t capacity,
                                            const uint32_t* keys, uint32_t count, uint32_t shift,
                                            double scale) {
  for (uint32_t j = 0; j < KV_LOOKUP_AHEAD; j++) {
    kv_lookup_prefetch(table, capacity, keys, j, count, shift, scale);
  }
}

/*
 * Removes keys[first..first+count) ((hi, lo) pairs) in order: out[at + i] = the value
 * removed for key i, or 0 if it was absent. Stops after the removal that takes the
 * count below limits[1] (the shrink threshold). Returns how many keys it processed.
 */
uint32_t kv_lookup_remove(uint32_t* table, uint32_t capacity, uint32_t shift, double scale,
                          const uint32_t* keys, uint32_t first, uint32_t count, uint32_t* out,
                          uint32_t at, uint32_t* limits) {
  const uint32_t* k = keys + 2 * (size_t)first;
  uint32_t n = limits[0];
  const uint32_t shrink = limits[1];
  kv_lookup_prefetch_first(table, capacity, k, count, shift, scale);
  uint32_t i = 0;
  while (i < count) {
    uint32_t slot = kv_lookup_slot(table, capacity, shift, scale, k, i, count);
    const uint32_t value = table[3 * (size_t)slot + 2];
    out[at + i++] = value;
    if (value == 0) continue;
    /* Backward shift: an entry moves into the hole if the hole lies on its probe path. */
    uint32_t hole = slot;
    for (;;) {
      if (++slot == capacity) slot = 0;
      const uint32_t* e = table + 3 * (size_t)slot;
      if (e[2] == 0) break;
      const uint32_t home = kv_lookup_home(e[0], e[1], shift, scale, capacity);
      const uint32_t to_hole = hole >= home ? hole - home : hole + capacity - home;
      const uint32_t to_slot = slot >= home ? slot - home : slot + capacity - home;
      if (to_hole < to_slot) {
        uint32_t* h = table + 3 * (size_t)hole;
        h[0] = e[0];
        h[1] = e[1];
        h[2] = e[2];
        hole = slot;
      }
    }
    uint32_t* h = table + 3 * (size_t)hole;
    h[0] = h[1] = h[2] = 0;
    if (--n < shrink) break;
  }
  limits[0] = n;
  return i;
}

/*
 * Inserts keys[first + i] -> value + i for i = 0, 1, ... (count at most), in order.
 * Stops before the first key already present, or after the insert that takes the
 * count above limits[1] (the grow threshold). Returns how many it inserted.
 */
uint32_t kv_lookup_insert_run(uint32_t* table, uint32_t capacity, uint32_t shift, double scale,
                              const uint32_t* keys, uint32_t first, uint32_t count, uint32_t value,
                              uint32_t* limits) {
  const uint32_t* k = keys + 2 * (size_t)first;
  uint32_t n = limits[0];
  const uint32_t grow = limits[1];
  kv_lookup_prefetch_first(table, capacity, k, count, shift, scale);
  uint32_t i = 0;
  while (i < count) {
    uint32_t* e = table + 3 * (size_t)kv_lookup_slot(table, capacity, shift, scale, k, i, count);
    if (e[2] != 0) break;
    e[0] = k[2 * i];
    e[1] = k[2 * i + 1];
    e[2] = value + i++;
    if (++n > grow) break;
  }
  limits[0] = n;
  return i;
}

/*
 * A resize: moves every entry of `old` (old_capacity slots) into `table` (capacity
 * slots, all empty; shift and scale are its own), in slot order, as the TypeScript's
 * resize does, so the new table is byte for byte the same. Growing a worker's lookup
 * step by step to 16,384 entries moves about five times its final size; in the
 * TypeScript that was most of an insert's time (12-17 ns per slot).
 */
void kv_lookup_rehash(const uint32_t* old, uint32_t old_capacity, uint32_t* table,
                      uint32_t capacity, uint32_t shift, double scale) {
  for (uint32_t s = 0; s < old_capacity; s++) {
    const uint32_t* e = old + 3 * (size_t)s;
    if (e[2] == 0) continue;
    uint32_t slot = kv_lookup_home(e[0], e[1], shift, scale, capacity);
    while (table[3 * (size_t)slot + 2] != 0) if (++slot == capacity) slot = 0;
    uint32_t* d = table + 3 * (size_t)slot;
    d[0] = e[0];
    d[1] = e[1];
    d[2] = e[2];
  }
}

/*
 * A store's repeat check (src/ingest/normalize.ts): whether a (hi, lo) pair repeats
 * among hashes[start..start+count), the parent included when has_parent. The set is
 * the caller's stamped one: keys as (hi, lo) per slot, a slot taken when its stamp is
 * `stamp` (a fresh value per check, so nothing is cleared), mask + 1 slots (a power of
 * two, room for count + 1 pairs at load 1/2). The mix is src/util/tables.ts's.
 */
static inline uint32_t kv_mix(uint32_t a, uint32_t b) {
  uint32_t h = (b ^ (a * 0x9e3779b1u)) * 0x85ebca6bu;
  h ^= h >> 15;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 13);
}

/* Hashes ahead of the current one whose set slot is prefetched. */
#define KV_PAIRS_AHEAD 8

static inline uint32_t kv_pairs_add(uint32_t* keys, uint32_t* stamps, uint32_t mask,
                                    uint32_t stamp, uint32_t hi, uint32_t lo) {
  for (uint32_t i = kv_mix(hi, lo) & mask;; i = (i + 1) & mask) {
    if (stamps[i] != stamp) {
      stamps[i] = stamp;
      keys[2 * (size_t)i] = hi;
      keys[2 * (size_t)i + 1] = lo;
      return 1;
    }
    if (keys[2 * (size_t)i] == hi && keys[2 * (size_t)i + 1] == lo) return 0;
  }
}

uint32_t kv_pairs_repeat(uint32_t* keys, uint32_t* stamps, uint32_t mask, uint32_t stamp,
                         const uint32_t* hashes, uint32_t start, uint32_t count,
                         uint32_t parent_hi, uint32_t parent_lo, uint32_t has_parent) {
  if (has_parent) kv_pairs_add(keys, stamps, mask, stamp, parent_hi, parent_lo);
  const uint32_t* h = hashes + 2 * (size_t)start;
  for (uint32_t i = 0; i < count; i++) {
    /* A page-1 prompt of 100k blocks makes a set of megabytes: load its slots ahead. */
    if (i + KV_PAIRS_AHEAD < count) {
      const uint32_t* next = h + 2 * (size_t)(i + KV_PAIRS_AHEAD);
      const uint32_t ahead = kv_mix(next[0], next[1]) & mask;
      __builtin_prefetch(stamps + ahead);
      __builtin_prefetch(keys + 2 * (size_t)ahead);
    }
    if (!kv_pairs_add(keys, stamps, mask, stamp, h[2 * i], h[2 * i + 1])) return 1;
  }
  return 0;
}
