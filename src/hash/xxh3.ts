/**
 * XXH3-64 with a 64-bit seed, in plain TypeScript over BigInt.
 *
 * Why it exists: `Bun.hash.xxHash3(data, seed)` uses only the low 32 bits of the
 * seed (Bun 1.4.5: seed 16629034431890740056 hashes like 513168216), so it is wrong
 * for every LoRA or cache-salt seed. This is the pure fallback when the native
 * library is unavailable, and an independent second implementation that tests
 * compare the native one against. It is not a hot path.
 *
 * Follows the XXH3 specification (xxHash 0.8): short inputs (0–16, 17–128,
 * 129–240 bytes) mix the seed into the default secret directly; longer inputs run
 * the stripe accumulator over a secret derived from the seed.
 */

const MASK = (1n << 64n) - 1n;
const PRIME32_1 = 0x9e3779b1n;
const PRIME32_2 = 0x85ebca77n;
const PRIME32_3 = 0xc2b2ae3dn;
const PRIME64_1 = 0x9e3779b185ebca87n;
const PRIME64_2 = 0xc2b2ae3d27d4eb4fn;
const PRIME64_3 = 0x165667b19e3779f9n;
const PRIME64_4 = 0x85ebca77c2b2ae63n;
const PRIME64_5 = 0x27d4eb2f165667c5n;
const PRIME_MX1 = 0x165667919e3779f9n;
const PRIME_MX2 = 0x9fb21c651e98df25n;

const STRIPE_BYTES = 64;
const SECRET_BYTES = 192;
const SECRET_CONSUME_BYTES = 8;
const MIDSIZE_MAX = 240;

// The default 192-byte secret of the XXH3 specification.
const DEFAULT_SECRET = Uint8Array.from(
  Buffer.from(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f" +
      "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c" +
      "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8" +
      "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364" +
      "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e" +
      "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e",
    "hex",
  ),
);

const readLE64 = (bytes: Uint8Array, offset: number): bigint => {
  let value = 0n;
  for (let i = 7; i >= 0; i--) value = (value << 8n) | BigInt(bytes[offset + i]!);
  return value;
};

const readLE32 = (bytes: Uint8Array, offset: number): bigint =>
  BigInt(
    (bytes[offset]! |
      (bytes[offset + 1]! << 8) |
      (bytes[offset + 2]! << 16) |
      (bytes[offset + 3]! << 24)) >>>
      0,
  );

const mul = (a: bigint, b: bigint): bigint => (a * b) & MASK;
const rotl = (value: bigint, bits: bigint): bigint =>
  ((value << bits) | (value >> (64n - bits))) & MASK;
const swap32 = (value: bigint): bigint =>
  ((value & 0xffn) << 24n) | ((value & 0xff00n) << 8n) | ((value >> 8n) & 0xff00n) | (value >> 24n);
const swap64 = (value: bigint): bigint =>
  (swap32(value & 0xffff_ffffn) << 32n) | swap32(value >> 32n);

/** Low 64 bits of the 128-bit product, xored with its high 64 bits. */
const mulFold = (a: bigint, b: bigint): bigint => {
  const product = a * b;
  return (product & MASK) ^ (product >> 64n);
};

const xxh64Avalanche = (h: bigint): bigint => {
  h = mul(h ^ (h >> 33n), PRIME64_2);
  h = mul(h ^ (h >> 29n), PRIME64_3);
  return h ^ (h >> 32n);
};

const avalanche = (h: bigint): bigint => {
  h = mul(h ^ (h >> 37n), PRIME_MX1);
  return h ^ (h >> 32n);
};

const rrmxmx = (h: bigint, length: number): bigint => {
  h ^= rotl(h, 49n) ^ rotl(h, 24n);
  h = mul(h, PRIME_MX2);
  h ^= (h >> 35n) + BigInt(length);
  h = mul(h, PRIME_MX2);
  return h ^ (h >> 28n);
};

const mix16 = (
  input: Uint8Array,
  at: number,
  secret: Uint8Array,
  secretAt: number,
  seed: bigint,
): bigint =>
  mulFold(
    readLE64(input, at) ^ ((readLE64(secret, secretAt) + seed) & MASK),
    readLE64(input, at + 8) ^ ((readLE64(secret, secretAt + 8) - seed) & MASK),
  );

function hashShort(input: Uint8Array, seed: bigint): bigint {
  const length = input.length;
  const secret = DEFAULT_SECRET;
  if (length > 8) {
    const flip1 = ((readLE64(secret, 24) ^ readLE64(secret, 32)) + seed) & MASK;
    const flip2 = ((readLE64(secret, 40) ^ readLE64(secret, 48)) - seed) & MASK;
    const lo = readLE64(input, 0) ^ flip1;
    const hi = readLE64(input, length - 8) ^ flip2;
    return avalanche((BigInt(length) + swap64(lo) + hi + mulFold(lo, hi)) & MASK);
  }
  if (length >= 4) {
    const seedMixed = seed ^ (swap32(seed & 0xffff_ffffn) << 32n);
    const flip = ((readLE64(secret, 8) ^ readLE64(secret, 16)) - seedMixed) & MASK;
    const joined = readLE32(input, length - 4) + (readLE32(input, 0) << 32n);
    return rrmxmx(joined ^ flip, length);
  }
  if (length > 0) {
    const combined =
      (BigInt(input[0]!) << 16n) |
      (BigInt(input[length >> 1]!) << 24n) |
      BigInt(input[length - 1]!) |
      (BigInt(length) << 8n);
    const flip = ((readLE32(secret, 0) ^ readLE32(secret, 4)) + seed) & MASK;
    return xxh64Avalanche(combined ^ flip);
  }
  return xxh64Avalanche(seed ^ readLE64(secret, 56) ^ readLE64(secret, 64));
}

function hashMid(input: Uint8Array, seed: bigint): bigint {
  const length = input.length;
  const secret = DEFAULT_SECRET;
  let acc = mul(BigInt(length), PRIME64_1);
  if (length <= 128) {
    const pairs = length > 96 ? 4 : length > 64 ? 3 : length > 32 ? 2 : 1;
    for (let i = pairs - 1; i >= 0; i--) {
      acc += mix16(input, 16 * i, secret, 32 * i, seed);
      acc += mix16(input, length - 16 * (i + 1), secret, 32 * i + 16, seed);
    }
    return avalanche(acc & MASK);
  }
  const rounds = Math.floor(length / 16);
  for (let i = 0; i < 8; i++) acc += mix16(input, 16 * i, secret, 16 * i, seed);
  acc = avalanche(acc & MASK);
  for (let i = 8; i < rounds; i++) acc += mix16(input, 16 * i, secret, 16 * (i - 8) + 3, seed);
  acc += mix16(input, length - 16, secret, 136 - 17, seed);
  return avalanche(acc & MASK);
}

function accumulate512(
  acc: bigint[],
  input: Uint8Array,
  at: number,
  secret: Uint8Array,
  secretAt: number,
): void {
  for (let i = 0; i < 8; i++) {
    const data = readLE64(input, at + 8 * i);
    const key = data ^ readLE64(secret, secretAt + 8 * i);
    acc[i ^ 1] = (acc[i ^ 1]! + data) & MASK;
    acc[i] = (acc[i]! + (key & 0xffff_ffffn) * (key >> 32n)) & MASK;
  }
}

function scramble(acc: bigint[], secret: Uint8Array, secretAt: number): void {
  for (let i = 0; i < 8; i++) {
    const value = acc[i]!;
    acc[i] = mul(value ^ (value >> 47n) ^ readLE64(secret, secretAt + 8 * i), PRIME32_1);
  }
}

function hashLong(input: Uint8Array, seed: bigint): bigint {
  let secret = DEFAULT_SECRET;
  if (seed !== 0n) {
    secret = new Uint8Array(SECRET_BYTES);
    const view = new DataView(secret.buffer);
    for (let i = 0; i < SECRET_BYTES; i += 16) {
      view.setBigUint64(i, (readLE64(DEFAULT_SECRET, i) + seed) & MASK, true);
      view.setBigUint64(i + 8, (readLE64(DEFAULT_SECRET, i + 8) - seed) & MASK, true);
    }
  }
  const length = input.length;
  const acc = [
    PRIME32_3,
    PRIME64_1,
    PRIME64_2,
    PRIME64_3,
    PRIME64_4,
    PRIME32_2,
    PRIME64_5,
    PRIME32_1,
  ];
  const stripesPerBlock = (SECRET_BYTES - STRIPE_BYTES) / SECRET_CONSUME_BYTES;
  const blockBytes = STRIPE_BYTES * stripesPerBlock;
  const blocks = Math.floor((length - 1) / blockBytes);
  for (let n = 0; n < blocks; n++) {
    for (let s = 0; s < stripesPerBlock; s++) {
      accumulate512(
        acc,
        input,
        n * blockBytes + s * STRIPE_BYTES,
        secret,
        s * SECRET_CONSUME_BYTES,
      );
    }
    scramble(acc, secret, SECRET_BYTES - STRIPE_BYTES);
  }
  const lastStripes = Math.floor((length - 1 - blockBytes * blocks) / STRIPE_BYTES);
  for (let s = 0; s < lastStripes; s++) {
    accumulate512(
      acc,
      input,
      blocks * blockBytes + s * STRIPE_BYTES,
      secret,
      s * SECRET_CONSUME_BYTES,
    );
  }
  accumulate512(acc, input, length - STRIPE_BYTES, secret, SECRET_BYTES - STRIPE_BYTES - 7);
  let result = mul(BigInt(length), PRIME64_1);
  for (let i = 0; i < 4; i++) {
    result += mulFold(
      acc[2 * i]! ^ readLE64(secret, 11 + 16 * i),
      acc[2 * i + 1]! ^ readLE64(secret, 19 + 16 * i),
    );
  }
  return avalanche(result & MASK);
}

/** XXH3-64 of `input` with a full 64-bit `seed`. */
export function xxh3(input: Uint8Array, seed: bigint): bigint {
  seed &= MASK;
  if (input.length <= 16) return hashShort(input, seed);
  if (input.length <= MIDSIZE_MAX) return hashMid(input, seed);
  return hashLong(input, seed);
}
