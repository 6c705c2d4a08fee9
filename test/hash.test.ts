// Goal: block hashing is bit-exact with Dynamo's known-answer vectors (reference §2.3),
// on the native path and on the fallback, and the two agree on random input.
import { describe, expect, test } from "bun:test";
import {
  blockCount,
  blockSeed,
  chainHashes,
  DEFAULT_SEED,
  fallbackChainHashes,
  fallbackHashBlocks,
  hashBlocks,
  hashBlocksAt,
  hashTokens,
  usingNativeHash,
} from "../src/hash";
import { nativeUnavailableReason } from "../src/native/library";
import { xorshift32 } from "../src/util/random";
import { u64 } from "../src/util/u64";

describe("known-answer vectors", () => {
  test("the native library is in use in tests (else the fast path goes untested)", () => {
    expect(nativeUnavailableReason).toBeNull();
    expect(usingNativeHash).toBe(true);
  });

  test("XXH3-64 of raw bytes with seed 1337", () => {
    expect(BigInt(Bun.hash.xxHash3("test data", 1337n))).toBe(13226331709069118873n);
  });

  test("local hashes of [1..4], [5..8], [9..12] and their sequence chain", () => {
    const { local, sequence } = hashTokens([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4);
    expect(local).toEqual([14643705804678351452n, 16777012769546811212n, 483935686894639516n]);
    expect(sequence).toEqual([14643705804678351452n, 4945711292740353085n, 12583592247330656132n]);
  });

  test("LoRA name seed", () => {
    expect(blockSeed("my-lora").value).toBe(12827409268353072861n);
    expect(hashTokens([1, 2, 3, 4], 4, { loraName: "my-lora" }).local).toEqual([
      15671544057904749233n,
    ]);
  });

  test("cache salt (namespace) seed", () => {
    expect(blockSeed(null, "tenant-a").value).toBe(1948188790972764086n);
    expect(hashTokens([1, 2, 3, 4], 4, { cacheSalt: "tenant-a" }).local).toEqual([
      5738685477468498325n,
    ]);
  });

  test("LoRA name and cache salt together", () => {
    expect(blockSeed("my-lora", "tenant-a").value).toBe(14775598059325835610n);
    const { local } = hashTokens([1, 2, 3, 4], 4, { loraName: "my-lora", cacheSalt: "tenant-a" });
    expect(local).toEqual([6157910915076630503n]);
  });

  test("empty LoRA name and salt count as absent", () => {
    expect(blockSeed("", "")).toBe(DEFAULT_SEED);
    expect(blockSeed(undefined, null)).toBe(DEFAULT_SEED);
  });

  test("Eagle: the first window covers one token of the next block", () => {
    const { local } = hashTokens([1, 2, 3, 4, 5], 4, { eagle: true });
    expect(local).toEqual([1914873892905420881n]);
  });
});

describe("block counting", () => {
  test("only complete blocks are hashed", () => {
    expect(blockCount(0, 4)).toBe(0);
    expect(blockCount(3, 4)).toBe(0);
    expect(blockCount(4, 4)).toBe(1);
    expect(blockCount(11, 4)).toBe(2);
    expect(hashTokens([1, 2, 3, 4, 5, 6, 7], 4).local).toHaveLength(1);
  });

  test("Eagle needs one extra token per block count", () => {
    expect(blockCount(4, 4, true)).toBe(0);
    expect(blockCount(5, 4, true)).toBe(1);
    expect(blockCount(8, 4, true)).toBe(1);
    expect(blockCount(9, 4, true)).toBe(2);
  });

  test("block size 0 hashes nothing", () => {
    expect(blockCount(10, 0)).toBe(0);
    expect(hashBlocks(new Uint32Array(10), 0, DEFAULT_SEED, new Uint32Array(0))).toBe(0);
  });

  test("a too-short output array is refused, not overrun", () => {
    expect(() => hashBlocks(new Uint32Array(8), 4, DEFAULT_SEED, new Uint32Array(3))).toThrow(
      RangeError,
    );
  });

  test("hashing a subarray hashes exactly those tokens", () => {
    const tokens = Uint32Array.from({ length: 40 }, (_, i) => i * 7 + 1);
    const whole = new Uint32Array(20);
    hashBlocks(tokens, 4, DEFAULT_SEED, whole);
    const part = new Uint32Array(8);
    expect(hashBlocks(tokens.subarray(8, 24), 4, DEFAULT_SEED, part)).toBe(4);
    expect(Array.from(part)).toEqual(Array.from(whole.subarray(4, 12)));
  });

  test("hashBlocksAt reads and writes at offsets, as the subarray form does", () => {
    const tokens = Uint32Array.from({ length: 40 }, (_, i) => i * 7 + 1);
    const whole = new Uint32Array(20);
    hashBlocks(tokens, 4, DEFAULT_SEED, whole);
    const out = new Uint32Array(12).fill(0xdead);
    expect(hashBlocksAt(tokens, 8, 17, 4, DEFAULT_SEED, out, 2)).toBe(4);
    expect(Array.from(out)).toEqual([0xdead, 0xdead, 0xdead, 0xdead, ...whole.subarray(4, 12)]);
    expect(() => hashBlocksAt(tokens, 30, 16, 4, DEFAULT_SEED, out, 0)).toThrow(RangeError);
    expect(() => hashBlocksAt(tokens, 0, 16, 4, DEFAULT_SEED, out, 3)).toThrow(RangeError);
  });
});

describe("native path equals the fallback", () => {
  // Seeded so failures reproduce.
  const next = xorshift32(0x9e3779b9);

  test("random token arrays, block sizes, seeds and Eagle windows", () => {
    const seeds = [
      DEFAULT_SEED,
      blockSeed("a"),
      blockSeed("lora-x", "salt-y"),
      blockSeed(null, "z"),
    ];
    for (let round = 0; round < 400; round++) {
      const blockSize = [1, 2, 3, 16, 32, 64, 128, 129, 256, 1024][round % 10]!;
      const length = next() % (blockSize * 9 + 3);
      const tokens = Uint32Array.from({ length }, next);
      const seed = seeds[round % seeds.length]!;
      const eagle = round % 3 === 0;
      const count = blockCount(length, blockSize, eagle);
      const native = new Uint32Array(2 * count);
      const fallback = new Uint32Array(2 * count);
      expect(hashBlocks(tokens, blockSize, seed, native, eagle)).toBe(count);
      expect(fallbackHashBlocks(tokens, blockSize, seed, fallback, eagle)).toBe(count);
      expect(native).toEqual(fallback);
      chainHashes(native, count, native);
      fallbackChainHashes(fallback, count, fallback);
      expect(native).toEqual(fallback);
    }
  });

  test("per-block results match Bun.hash.xxHash3 directly", () => {
    const tokens = Uint32Array.from({ length: 64 }, next);
    const out = new Uint32Array(32);
    hashBlocks(tokens, 4, DEFAULT_SEED, out);
    for (let i = 0; i < 16; i++) {
      const bytes = new Uint8Array(tokens.buffer, i * 16, 16);
      expect(u64(out[2 * i]!, out[2 * i + 1]!)).toBe(BigInt(Bun.hash.xxHash3(bytes, 1337n)));
    }
  });
});
