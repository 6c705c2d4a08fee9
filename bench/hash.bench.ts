/**
 * Blocks hashed per second: the hot path (`hashBlocks`, one native call per batch,
 * results as (hi, lo) words) next to the in-run baseline (`Bun.hash.xxHash3` once
 * per block, a BigInt each, split into the same words). Seed 1337, where the
 * baseline is correct.
 *
 * Timed region: hashing one batch of 4,096 blocks into a preallocated Uint32Array.
 * Outside it: token generation (seeded PRNG), allocation of input and output.
 *
 *   bun bench/hash.bench.ts [--json]
 */
import { bench, do_not_optimize, group, run } from "mitata";
import { DEFAULT_SEED, hashBlocks, usingNativeHash } from "../src/hash";
import { benchFlags, formatRate, prng, provenance } from "./lib";

const BLOCKS = 4096;
const BLOCK_SIZES = [1, 16, 128];
const json =
  benchFlags("bun bench/hash.bench.ts [--json]", { json: { type: "boolean" } }).json === true;

if (!usingNativeHash)
  throw new Error("native library not loaded: run `bun build.ts --native` first");

const random = prng(42);
const inputs = new Map<number, Uint32Array>();
for (const blockSize of BLOCK_SIZES)
  inputs.set(blockSize, Uint32Array.from({ length: BLOCKS * blockSize }, random));
const out = new Uint32Array(2 * BLOCKS);

function perBlockBaseline(tokens: Uint32Array, blockSize: number): void {
  const bytes = new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  const window = blockSize * 4;
  for (let i = 0; i < BLOCKS; i++) {
    const hash = BigInt(Bun.hash.xxHash3(bytes.subarray(i * window, (i + 1) * window), 1337n));
    out[2 * i] = Number(hash >> 32n);
    out[2 * i + 1] = Number(hash & 0xffff_ffffn);
  }
}

for (const blockSize of BLOCK_SIZES) {
  const tokens = inputs.get(blockSize)!;
  group(`block size ${blockSize} (${BLOCKS} blocks per call)`, () => {
    bench(`hot path bs=${blockSize}`, () =>
      do_not_optimize(hashBlocks(tokens, blockSize, DEFAULT_SEED, out)),
    );
    bench(`Bun.hash.xxHash3 per block bs=${blockSize}`, () => {
      perBlockBaseline(tokens, blockSize);
      do_not_optimize(out);
    }).baseline(true);
  });
}

const result = await run({ format: json ? "quiet" : "mitata" });
const rows = BLOCK_SIZES.map((blockSize) => {
  const find = (prefix: string) =>
    result.benchmarks
      .flatMap((trial) => trial.runs)
      .find((entry) => entry.name === `${prefix} bs=${blockSize}`)!.stats!;
  const hot = BLOCKS / (find("hot path").p50 / 1e9);
  const baseline = BLOCKS / (find("Bun.hash.xxHash3 per block").p50 / 1e9);
  return {
    block_size: blockSize,
    hot_blocks_per_sec: hot,
    baseline_blocks_per_sec: baseline,
    speedup: hot / baseline,
  };
});

if (json) {
  process.stdout.write(`${JSON.stringify({ bench: "hash", provenance: provenance(), rows })}\n`);
} else {
  console.log("\nblock size | hot path      | per-block baseline | speedup");
  for (const row of rows) {
    console.log(
      `${String(row.block_size).padStart(10)} | ${formatRate(row.hot_blocks_per_sec).padEnd(13)} | ` +
        `${formatRate(row.baseline_blocks_per_sec).padEnd(18)} | ${row.speedup.toFixed(1)}x`,
    );
  }
}
