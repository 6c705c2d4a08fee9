/* The fuzz harnesses' random numbers: xorshift64, seeded by each main (state != 0). */
#include <stdint.h>

static uint64_t state;

/* A number in [0, n). */
static uint32_t below(uint32_t n) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (uint32_t)(state % n);
}
