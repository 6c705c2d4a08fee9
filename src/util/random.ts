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

/** Bytes of randomness in each id: 128 bits, as a UUID's. */
const ID_RANDOM_BYTES = 16;
const ID_POOL_BYTES = 4096;

/**
 * Ids no one can guess from the ones they have seen (request ids kvedge makes: knowing
 * another client's id lets a caller end its request): 128 bits from the system's
 * cryptographic generator, drawn a pool at a time, as 22 base64url characters.
 */
export class UnguessableIds {
  private readonly pool = new Uint8Array(ID_POOL_BYTES);
  private at = ID_POOL_BYTES;

  next(prefix: string): string {
    if (this.at + ID_RANDOM_BYTES > this.pool.length) {
      crypto.getRandomValues(this.pool);
      this.at = 0;
    }
    const bytes = Buffer.from(this.pool.buffer, this.at, ID_RANDOM_BYTES);
    this.at += ID_RANDOM_BYTES;
    return prefix + bytes.toString("base64url");
  }
}
