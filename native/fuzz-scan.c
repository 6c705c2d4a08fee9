/*
 * Randomized check of the token readers, built with AddressSanitizer and UBSan by
 * test/native-scan-fuzz.test.ts:
 * - kv_scan_tokens: on random arrays of integers (1-11 digits, leading zeros, stray
 *   bytes, early ']', tight output bounds), the reader with its block path must return
 *   exactly what the byte-by-byte reader returns (count, values, end);
 * - kv_msgpack_u32s: on random msgpack values (mostly fixint / uint8 / uint16 / uint32,
 *   some other types, cut anywhere), it must return what a one-value-at-a-time reader
 *   written here returns (count, values, end).
 * Neither may touch a byte outside the input or the output bound: each input is its own
 * heap allocation of its exact size, so a read past it is caught.
 *
 *   cc -O1 -g -fsanitize=address,undefined native/fuzz-scan.c -o fuzz && ./fuzz [inputs] [seed]
 *
 * Prints two "ok: ..." lines and exits 0, or prints the first input that differs and exits 1.
 */
#include "kvedge.c"

#include <stdio.h>
#include <stdlib.h>

#include "fuzz-random.h"

/* The reference: one msgpack value at a time, each byte read once. */
static uint32_t msgpack_plain(const uint8_t* bytes, uint32_t length, uint32_t start, uint32_t count,
                              uint32_t* out, uint32_t* end) {
  uint32_t p = start, i = 0;
  for (; i < count && p < length; i++) {
    const uint8_t b = bytes[p];
    uint32_t size;
    if (b < 0x80) size = 1;
    else if (b == 0xcc) size = 2;
    else if (b == 0xcd) size = 3;
    else if (b == 0xce) size = 5;
    else break;
    if (p + size > length) break;
    uint32_t value = b < 0x80 ? b : 0;
    for (uint32_t k = 1; k < size; k++) value = value * 256 + bytes[p + k];
    out[i] = value;
    p += size;
  }
  end[0] = p;
  return i;
}

static int fuzz_msgpack(long inputs) {
  long values = 0;
  for (long n = 0; n < inputs; n++) {
    const uint32_t length = 1 + below(400);
    uint8_t* bytes = malloc(length);
    for (uint32_t i = 0; i < length;) {
      const uint32_t pick = below(100);
      static const uint8_t types[] = {0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd2, 0xc0, 0xe5, 0x92};
      uint8_t type = pick < 45 ? 0xce : pick < 85 ? 0xcd : pick < 92 ? (uint8_t)below(0x80) : types[below(sizeof types)];
      bytes[i++] = type;
      const uint32_t size = type == 0xcc ? 1 : type == 0xcd ? 2 : type == 0xce ? 4 : type == 0xcf ? 8 : 0;
      for (uint32_t k = 0; k < size && i < length; k++) bytes[i++] = (uint8_t)below(256);
    }
    const uint32_t start = below(length < 16 ? length : 16);
    const uint32_t count = below(4) != 0 ? length : below(length + 1);
    const uint32_t at = below(3);
    uint32_t* ours = malloc(4 * ((size_t)count + at) + 4);
    uint32_t* plain = malloc(4 * (size_t)count + 4);
    uint32_t ours_end = 0, plain_end = 0;
    const uint32_t got = kv_msgpack_u32s(bytes, length, start, count, ours, at, &ours_end);
    const uint32_t expected = msgpack_plain(bytes, length, start, count, plain, &plain_end);
    if (got != expected || ours_end != plain_end || memcmp(ours + at, plain, 4 * (size_t)got) != 0) {
      printf("msgpack differs on input %ld: %u values (end %u), plain reader %u (end %u), start %u, count %u\n",
             n, got, ours_end, expected, plain_end, start, count);
      return 1;
    }
    values += got;
    free(ours);
    free(plain);
    free(bytes);
  }
  printf("ok: %ld msgpack inputs, %ld values read\n", inputs, values);
  return 0;
}

int main(int argc, char** argv) {
  const long inputs = argc > 1 ? atol(argv[1]) : 100000;
  state = argc > 2 ? strtoull(argv[2], 0, 10) : 88172645463325252ull;
  if (state == 0) state = 1;
  long accepted = 0, by_blocks = 0;
  for (long n = 0; n < inputs; n++) {
    const uint32_t length = 8 + below(600);
    uint8_t* bytes = malloc(length);
    const uint32_t wanted = 7 + below(8);
    const uint32_t start = wanted < length ? wanted : 0;
    memset(bytes, 'x', start);
    bytes[start] = '[';
    const int clean = below(4) == 0; /* only integers and commas until the end */
    for (uint32_t i = start + 1; i < length;) {
      if (clean || below(100) < 70) {
        const uint32_t digits = 1 + (below(10) < 8 ? below(7) : below(11));
        for (uint32_t d = 0; d < digits && i < length; d++) {
          bytes[i++] = (uint8_t)('0' + (d == 0 && below(20) != 0 ? 1 + below(9) : below(10)));
        }
        if (i < length) bytes[i++] = below(60) != 0 ? ',' : (below(2) != 0 ? ']' : ' ');
      } else {
        static const char stray[] = ",] \n0-.e\"x[";
        bytes[i++] = (uint8_t)stray[below(sizeof stray - 1)];
      }
    }
    if (below(3) == 0 && length - start > 1) bytes[start + 1 + below(length - start - 1)] = ']';
    const uint32_t max = below(4) != 0 ? length : below(length + 1);
    uint32_t* ours = malloc(4 * (size_t)max + 4);
    uint32_t* plain = malloc(4 * (size_t)max + 4);
    uint32_t* blocks = malloc(4 * (size_t)max + 4);
    uint32_t ours_end = 0, plain_end = 0, blocks_end = 0;
    const int32_t count = kv_scan_tokens(bytes, length, start, ours, max, &ours_end);
    const int32_t expected = kv_scan_plain(bytes, length, start, plain, max, &plain_end);
    if (kv_scan_compact(bytes, length, start, blocks, max, &blocks_end) >= 0) by_blocks++;
    if (count != expected || (count >= 0 && (ours_end != plain_end || memcmp(ours, plain, 4 * (size_t)count) != 0))) {
      printf("differs on input %ld: %d tokens (end %u), byte reader %d (end %u), start %u, max %u\n",
             n, count, ours_end, expected, plain_end, start, max);
      fwrite(bytes, 1, length, stdout);
      printf("\n");
      return 1;
    }
    if (count >= 0) accepted++;
    free(ours);
    free(plain);
    free(blocks);
    free(bytes);
  }
  printf("ok: %ld inputs, %ld read, %ld by the block path\n", inputs, accepted, by_blocks);
  return fuzz_msgpack(inputs);
}
