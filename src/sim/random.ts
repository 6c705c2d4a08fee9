/**
 * Seeded randomness for the simulator: every run with the same seed makes the same
 * choices (mulberry32: small, fast, and good enough for tie-breaks and sampling).
 */

export type Rng = () => number;

/** Uniform numbers in [0, 1), determined by `seed`. */
export function createRng(seed: number): Rng {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b_79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 0x1_0000_0000;
  };
}

/** A uniform integer in [0, n). */
export function randomInt(rng: Rng, n: number): number {
  return Math.floor(rng() * n);
}

/** A random 64-bit value (an engine's hash seed). */
export function randomU64(rng: Rng): bigint {
  const hi = BigInt(Math.floor(rng() * 0x1_0000_0000));
  const lo = BigInt(Math.floor(rng() * 0x1_0000_0000));
  return (hi << 32n) | lo;
}
