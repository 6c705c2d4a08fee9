/**
 * xorshift32: a tiny seeded PRNG for tests and benches, so every process builds the
 * same data for a given seed. Not for anything that must be unpredictable.
 */
export function xorshift32(seed: number): () => number {
  let state = seed >>> 0 || 0x9e3779b9;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return state >>> 0;
  };
}
