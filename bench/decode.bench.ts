/**
 * KV-event blocks decoded per second: the walker (`decodeKvBatch`) next to the in-run
 * baseline, msgpackr.unpack plus a straightforward conversion into the same
 * DecodedBatch columns (hashes as (hi, lo) words, tokens, interned strings).
 *
 * Batches are vLLM-shaped (encodeKvBatch): 32 BlockStored events of 1..64 blocks each
 * (seeded), block size 1 or 16, hashes as u64 ints or 32-byte digests, events as
 * arrays (vLLM V4's 8-field layout) or maps (V9).
 *
 * Timed region: decoding one batch payload into a reused DecodedBatch. Outside it:
 * generating and encoding the batches.
 *
 *   bun bench/decode.bench.ts [--json]
 */
import { bench, do_not_optimize, group, run } from "mitata";
import { Unpackr } from "msgpackr";
import {
  DECODE_OK,
  DecodedBatch,
  decodeKvBatch,
  encodeKvBatch,
  EVENT_STORED,
  FLAG_PARENT,
  NO_STRING,
  type KvBatch,
  type WireVariant,
} from "../src/wire/kv-events";
import { benchFlags, formatRate, prng, provenance } from "./lib";

const EVENTS = 32;
const json =
  benchFlags("bun bench/decode.bench.ts [--json]", { json: { type: "boolean" } }).json === true;

interface Scenario {
  readonly name: string;
  readonly blockSize: number;
  readonly hashes: "int" | "bytes";
  readonly variant: WireVariant;
}

const SCENARIOS: Scenario[] = [
  { name: "bs=1 int", blockSize: 1, hashes: "int", variant: "vllm-v4" },
  { name: "bs=16 int", blockSize: 16, hashes: "int", variant: "vllm-v4" },
  { name: "bs=1 bytes", blockSize: 1, hashes: "bytes", variant: "vllm-v4" },
  { name: "bs=16 bytes", blockSize: 16, hashes: "bytes", variant: "vllm-v4" },
  { name: "bs=16 int map", blockSize: 16, hashes: "int", variant: "vllm-v9" },
];

function makeBatch(scenario: Scenario, seed: number): { payload: Uint8Array; blocks: number } {
  const random = prng(seed);
  const hash = () =>
    scenario.hashes === "int"
      ? (BigInt(random()) << 32n) | BigInt(random())
      : Uint8Array.from({ length: 32 }, () => random() & 0xff);
  let blocks = 0;
  const batch: KvBatch = {
    ts: 1_764_547_200.25,
    dpRank: 0,
    events: Array.from({ length: EVENTS }, () => {
      const count = 1 + (random() % 64);
      blocks += count;
      return {
        type: "BlockStored" as const,
        blockHashes: Array.from({ length: count }, hash),
        parentBlockHash: hash(),
        tokenIds: Array.from({ length: count * scenario.blockSize }, () => random() % 150_000),
        blockSize: scenario.blockSize,
        loraId: null,
        medium: "GPU",
        loraName: null,
      };
    }),
  };
  return { payload: encodeKvBatch(batch, { variant: scenario.variant }), blocks };
}

// ---- Baseline: msgpackr, then a plain conversion into the same columns ----

const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });
const stringIds = new Map<string, number>();

function putHash(out: DecodedBatch, index: number, hash: unknown): void {
  let hi: number;
  let lo: number;
  if (typeof hash === "bigint") {
    const value = BigInt.asUintN(64, hash);
    hi = Number(value >> 32n);
    lo = Number(value & 0xffff_ffffn);
  } else if (typeof hash === "number") {
    hi = hash < 0 ? 0xffff_ffff : Math.floor(hash / 0x1_0000_0000);
    lo = hash >>> 0;
  } else {
    const bytes = hash as Uint8Array;
    const at = bytes.length - 8;
    hi =
      ((bytes[at]! << 24) | (bytes[at + 1]! << 16) | (bytes[at + 2]! << 8) | bytes[at + 3]!) >>> 0;
    lo =
      ((bytes[at + 4]! << 24) | (bytes[at + 5]! << 16) | (bytes[at + 6]! << 8) | bytes[at + 7]!) >>>
      0;
  }
  out.hashes[2 * index] = hi;
  out.hashes[2 * index + 1] = lo;
}

function internId(value: string | null): number {
  if (value === null) return NO_STRING;
  let id = stringIds.get(value);
  if (id === undefined) stringIds.set(value, (id = stringIds.size));
  return id;
}

function baselineDecode(payload: Uint8Array, out: DecodedBatch): void {
  out.reset();
  const batch = unpackr.unpack(payload) as [number, unknown[], number?];
  out.ts = batch[0];
  out.hasDpRank = batch[2] !== undefined;
  out.dpRank = batch[2] ?? 0;
  for (const raw of batch[1]) {
    const event = Array.isArray(raw)
      ? {
          block_hashes: raw[1],
          parent_block_hash: raw[2],
          token_ids: raw[3],
          block_size: raw[4],
          medium: raw[6],
          lora_name: raw[7],
        }
      : (raw as Record<string, unknown>);
    const e = out.eventCount;
    out.ensureEvent();
    const hashes = event.block_hashes as unknown[];
    out.ensureHashes(hashes.length);
    out.kind[e] = EVENT_STORED;
    out.hashStart[e] = out.hashCount;
    out.hashLength[e] = hashes.length;
    for (let i = 0; i < hashes.length; i++) putHash(out, out.hashCount + i, hashes[i]);
    out.hashCount += hashes.length;
    if (event.parent_block_hash !== null) {
      out.flags[e] = FLAG_PARENT;
      out.ensureHashes(1);
      putHash(out, out.hashCount, event.parent_block_hash);
      out.parentHi[e] = out.hashes[2 * out.hashCount]!;
      out.parentLo[e] = out.hashes[2 * out.hashCount + 1]!;
    }
    const tokens = event.token_ids as number[];
    out.ensureTokens(tokens.length);
    out.tokenStart[e] = out.tokenCount;
    out.tokenLength[e] = tokens.length;
    out.tokens.set(tokens, out.tokenCount);
    out.tokenCount += tokens.length;
    out.blockSize[e] = event.block_size as number;
    out.medium[e] = internId(event.medium as string | null);
    out.loraName[e] = internId(event.lora_name as string | null);
    out.eventCount++;
  }
}

// ---- Run ----

const walkerOut = new DecodedBatch();
const baselineOut = new DecodedBatch();
const inputs = SCENARIOS.map((scenario, i) => ({ scenario, ...makeBatch(scenario, 1000 + i) }));

for (const { scenario, payload } of inputs) {
  // Same output both ways before timing anything.
  if (decodeKvBatch(payload, walkerOut) !== DECODE_OK)
    throw new Error(`walker refused ${scenario.name}`);
  baselineDecode(payload, baselineOut);
  const words = 2 * walkerOut.hashCount;
  if (
    walkerOut.hashCount !== baselineOut.hashCount ||
    walkerOut.hashes.subarray(0, words).some((w, i) => w !== baselineOut.hashes[i])
  ) {
    throw new Error(`walker and baseline disagree on ${scenario.name}`);
  }
  group(`${scenario.name} (${payload.length} bytes)`, () => {
    bench(`walker ${scenario.name}`, () => do_not_optimize(decodeKvBatch(payload, walkerOut)));
    bench(`msgpackr+convert ${scenario.name}`, () => {
      baselineDecode(payload, baselineOut);
      do_not_optimize(baselineOut.hashCount);
    }).baseline(true);
  });
}

const result = await run({ format: json ? "quiet" : "mitata" });
const p50 = (name: string) =>
  result.benchmarks.flatMap((trial) => trial.runs).find((entry) => entry.name === name)!.stats!.p50;
const rows = inputs.map(({ scenario, blocks, payload }) => {
  const walker = blocks / (p50(`walker ${scenario.name}`) / 1e9);
  const baseline = blocks / (p50(`msgpackr+convert ${scenario.name}`) / 1e9);
  return {
    scenario: scenario.name,
    blocks_per_batch: blocks,
    payload_bytes: payload.length,
    walker_blocks_per_sec: walker,
    baseline_blocks_per_sec: baseline,
    speedup: walker / baseline,
  };
});

if (json) {
  process.stdout.write(`${JSON.stringify({ bench: "decode", provenance: provenance(), rows })}\n`);
} else {
  console.log("\nscenario       | walker        | msgpackr+convert | speedup");
  for (const row of rows) {
    console.log(
      `${row.scenario.padEnd(14)} | ${formatRate(row.walker_blocks_per_sec).padEnd(13)} | ` +
        `${formatRate(row.baseline_blocks_per_sec).padEnd(16)} | ${row.speedup.toFixed(1)}x`,
    );
  }
}
