/**
 * 64-bit values at the edges of kvedge.
 *
 * Inside, a u64 travels as a (hi, lo) pair of u32 words in typed arrays; BigInt and
 * decimal strings appear only where values enter or leave (JSON, CLI, logs).
 */

export const U64_MAX = (1n << 64n) - 1n;
const U32 = 0x1_0000_0000;
const DECIMAL_U64 = /^(0|[1-9][0-9]{0,19})$/;

/** Joins a (hi, lo) pair into a bigint. */
export function u64(hi: number, lo: number): bigint {
  return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
}

/** Splits a u64 bigint into `out[index]` (hi) and `out[index + 1]` (lo). */
export function putU64(out: Uint32Array, index: number, value: bigint): void {
  out[index] = Number(value >> 32n);
  out[index + 1] = Number(value & 0xffff_ffffn);
}

/** The unsigned decimal form of a (hi, lo) pair. */
export function u64String(hi: number, lo: number): string {
  if (hi === 0) return String(lo >>> 0);
  const value = (hi >>> 0) * U32 + (lo >>> 0);
  if (value <= Number.MAX_SAFE_INTEGER) return String(value);
  return u64(hi, lo).toString();
}

/**
 * Parses a u64 given as an unsigned decimal string, or as a JSON number that is an
 * exact integer below 2^53. Returns null for anything else (callers name the field).
 */
export function parseU64(value: unknown): bigint | null {
  if (typeof value === "string") {
    if (!DECIMAL_U64.test(value)) return null;
    const big = BigInt(value);
    return big <= U64_MAX ? big : null;
  }
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value) || value < 0) return null;
    return BigInt(value);
  }
  if (typeof value === "bigint") return value >= 0n && value <= U64_MAX ? value : null;
  return null;
}
