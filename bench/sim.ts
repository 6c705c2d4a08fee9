/**
 * Virtual-time simulator study: replays the shipped Mooncake conversation trace (or
 * --trace FILE) over N mock engines under every routing policy and prints one table
 * row per (configuration, policy), then a JSON document with provenance.
 *
 *   bun bench/sim.ts [--requests 2000,12031] [--capacity 16384,65536] [--workers 8]
 *                    [--policies kv_aware_model,round_robin,...] [--time-scale 1]
 *                    [--prefill-tps 15000] [--step-base-ms 5] [--kv-read-ms 39]
 *                    [--max-batched-tokens 8192] [--seed 42] [--speedup 60]
 *                    [--overlap-credit 1] [--prefill-scale 1] [--trace FILE] [--json]
 *
 * Comma lists sweep: every combination of time scale, requests, capacity, overlap
 * credit and prefill scale (the last two only change kv_aware_model).
 *
 * Timed region: one `simulate()` call per row (token synthesis, hashing, every
 * engine's cache bookkeeping and the policy); parsing the trace is outside it.
 * `replay_s_at_speedup` is the wall time a real-time replay of the same requests
 * would take at --speedup (model span / speedup), for choosing demo defaults.
 */
import { parseArgs } from "node:util";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { provenance } from "./lib";
import { conversationTracePath } from "../src/sim/embedded-trace";
import { DEFAULT_KV_AWARE, isPolicyName, POLICY_NAMES, type PolicyName } from "../src/sim/policies";
import { simulate, type SimResult } from "../src/sim/simulator";
import { DEFAULT_TIME_MODEL } from "../src/sim/time-model";
import { parseTrace, transformTrace } from "../src/sim/trace";

const { values } = parseArgs({
  options: {
    requests: { type: "string", default: "2000" },
    capacity: { type: "string", default: "16384" },
    workers: { type: "string", default: "8" },
    policies: { type: "string", default: POLICY_NAMES.join(",") },
    "time-scale": { type: "string", default: "1" },
    "prefill-tps": { type: "string", default: String(DEFAULT_TIME_MODEL.prefillTokensPerSecond) },
    "step-base-ms": { type: "string", default: String(DEFAULT_TIME_MODEL.stepBaseMs) },
    "kv-read-ms": { type: "string", default: String(DEFAULT_TIME_MODEL.kvReadMsPerMillionTokens) },
    "max-batched-tokens": { type: "string", default: String(DEFAULT_TIME_MODEL.maxBatchedTokens) },
    seed: { type: "string", default: "42" },
    "overlap-credit": { type: "string", default: "1" },
    "prefill-scale": { type: "string", default: "1" },
    speedup: { type: "string", default: "60" },
    trace: { type: "string" },
    json: { type: "boolean", default: false },
  },
});

const numbers = (text: string): number[] => text.split(",").map((part) => {
  const value = Number(part);
  if (!Number.isFinite(value) || value <= 0) throw new Error(`bad number '${part}'`);
  return value;
});
const policies = values.policies.split(",").map((name) => {
  if (!isPolicyName(name)) throw new Error(`unknown policy '${name}' (known: ${POLICY_NAMES.join(", ")})`);
  return name;
}) as PolicyName[];
const tracePath = values.trace ?? conversationTracePath;
const traceBytes = readFileSync(tracePath);
const fullTrace = parseTrace(traceBytes.toString("utf8"));
const time = {
  ...DEFAULT_TIME_MODEL,
  prefillTokensPerSecond: Number(values["prefill-tps"]),
  stepBaseMs: Number(values["step-base-ms"]),
  kvReadMsPerMillionTokens: Number(values["kv-read-ms"]),
  maxBatchedTokens: Number(values["max-batched-tokens"]),
};
const speedup = Number(values.speedup);
const workers = Number(values.workers);
const seed = Number(values.seed);

interface Row extends SimResult {
  readonly time_scale: number;
  readonly overlap_credit: number;
  readonly prefill_scale: number;
  readonly wall_ms: number;
  readonly replay_s_at_speedup: number;
}

const rows: Row[] = [];
const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;
const line = (cells: (string | number)[]): string =>
  cells.map((cell, i) => String(cell).padStart(i === 0 ? 15 : 11)).join(" ");
if (!values.json) {
  process.stdout.write(`${line(["policy", "requests", "capacity", "time scale", "hit rate", "prefill M", "TTFT p50",
    "TTFT p99", "TPOT p50", "TPOT p99", "spread", "rejected", "wall ms"])}\n`);
}
for (const timeScale of numbers(values["time-scale"])) {
  for (const requests of numbers(values.requests)) {
    const trace = transformTrace(fullTrace, { requests, timeScale });
    for (const capacity of numbers(values.capacity)) {
      for (const policy of policies) {
        const variants = policy === "kv_aware_model"
          ? numbers(values["overlap-credit"]).flatMap((overlapCredit) =>
            numbers(values["prefill-scale"]).map((prefillLoadScale) => ({ overlapCredit, prefillLoadScale })))
          : [DEFAULT_KV_AWARE];
        for (const kvAware of variants) {
          const started = performance.now();
          const result = simulate(trace, { policy, workers, capacityBlocks: capacity, time, seed, kvAware });
          const wall = performance.now() - started;
          const row = { ...result, time_scale: timeScale, overlap_credit: kvAware.overlapCredit,
            prefill_scale: kvAware.prefillLoadScale, wall_ms: Math.round(wall),
            replay_s_at_speedup: result.makespan_ms / speedup / 1000 };
          rows.push(row);
          if (values.json) continue;
          const name = variants.length > 1 ? `kv ${kvAware.overlapCredit}/${kvAware.prefillLoadScale}` : policy;
          process.stdout.write(`${line([name, trace.count, capacity, timeScale, pct(row.hit_rate),
            (row.prefill_tokens / 1e6).toFixed(2), row.ttft_p50_ms.toFixed(0), row.ttft_p99_ms.toFixed(0),
            row.tpot_p50_ms.toFixed(1), row.tpot_p99_ms.toFixed(1), row.load_spread.toFixed(2), row.rejected, row.wall_ms])}\n`);
        }
      }
    }
  }
}
const document = {
  bench: "sim",
  provenance: {
    ...provenance(), trace: tracePath, trace_sha256: createHash("sha256").update(traceBytes).digest("hex"),
  },
  settings: { workers, seed, time, speedup },
  rows,
};
process.stdout.write(`${JSON.stringify(document, null, values.json ? 2 : undefined)}\n`);
