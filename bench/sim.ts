/**
 * Virtual-time simulator study: replays the shipped Mooncake conversation trace (or
 * --trace FILE) over N mock engines under every routing policy and prints one table
 * row per (configuration, policy), then a JSON document with provenance.
 *
 *   bun bench/sim.ts [--requests 2000,12031] [--capacity 16384,65536] [--workers 8]
 *                    [--policies kv_aware_model,round_robin,...] [--time-scale 1]
 *                    [--prefill-tps 15000] [--step-base-ms 5] [--kv-read-ms 39]
 *                    [--max-batched-tokens 8192] [--seed 42] [--speedup 60]
 *                    [--route-policy ttft,dynamo] [--recompute-weight 12] [--calibrate off,on]
 *                    [--router-prefill-tps N] [--router-step-base-ms MS]
 *                    [--overlap-credit 1] [--prefill-scale 1] [--start 0] [--trace FILE] [--json]
 *                    [--admission off,hold,reject] [--admission-bound-ms 2000] [--max-hold-ms 30000]
 *                    [--admission-prefill-weight 4] [--agreement 200]
 *
 * Comma lists sweep: every combination of time scale, requests, capacity, and for
 * kv_aware_model its router's policy and weights (recompute weight for ttft, overlap
 * credit and prefill scale for dynamo, admission mode, bound and order for ttft).
 * --start skips the trace's first N requests. --agreement W checks every ttft decision
 * against the cheapest workers under the engines' true constants on the same state, and
 * prints the share that agree per window of W decisions (calibration's convergence).
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
import { DEFAULT_TTFT_SETTINGS, ROUTE_POLICIES, type RoutePolicy } from "../src/route";
import {
  ADMISSION_MODES,
  type AdmissionMode,
  type AdmissionSettings,
  DEFAULT_ADMISSION,
} from "../src/route/admission";
import {
  DEFAULT_KV_AWARE,
  isPolicyName,
  type KvAwareConfig,
  KvAwareModel,
  POLICY_NAMES,
  type PolicyName,
  type RoutingPolicy,
} from "../src/sim/policies";
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
    "route-policy": { type: "string", default: "ttft,dynamo" },
    "recompute-weight": { type: "string", default: String(DEFAULT_TTFT_SETTINGS.recomputeWeight) },
    start: { type: "string", default: "0" },
    calibrate: { type: "string", default: "off" },
    "router-prefill-tps": { type: "string" },
    "router-step-base-ms": { type: "string" },
    speedup: { type: "string", default: "60" },
    trace: { type: "string" },
    json: { type: "boolean", default: false },
    admission: { type: "string", default: "off" },
    "admission-bound-ms": { type: "string", default: String(DEFAULT_ADMISSION.boundMs) },
    "max-hold-ms": { type: "string", default: String(DEFAULT_ADMISSION.maxHoldMs) },
    "admission-prefill-weight": {
      type: "string",
      default: String(DEFAULT_ADMISSION.prefillWeight),
    },
    agreement: { type: "string", default: "0" },
  },
});

const numbers = (text: string, zeroOk = false): number[] =>
  text.split(",").map((part) => {
    const value = Number(part);
    if (!Number.isFinite(value) || value < 0 || (value === 0 && !zeroOk))
      throw new Error(`bad number '${part}'`);
    return value;
  });
const policies = values.policies.split(",").map((name) => {
  if (!isPolicyName(name))
    throw new Error(`unknown policy '${name}' (known: ${POLICY_NAMES.join(", ")})`);
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
const start = Number(values.start);
const calibrations = values.calibrate.split(",").map((text) => {
  if (text !== "on" && text !== "off")
    throw new Error(`--calibrate takes on, off or on,off; got '${text}'`);
  return text === "on";
});
// What kv_aware_model's router assumes of the engines (default: their true constants).
const routerConstants = {
  ...(values["router-prefill-tps"] === undefined
    ? {}
    : { prefillTokensPerSecond: numbers(values["router-prefill-tps"])[0]! }),
  ...(values["router-step-base-ms"] === undefined
    ? {}
    : { stepBaseMs: numbers(values["router-step-base-ms"])[0]! }),
};
const routePolicies = values["route-policy"].split(",").map((name) => {
  if (!(ROUTE_POLICIES as readonly string[]).includes(name))
    throw new Error(`unknown route policy '${name}'`);
  return name as RoutePolicy;
});
const agreementWindow = numbers(values.agreement, true)[0]!;
const { prefillTokensPerSecond, stepBaseMs } = time;
const trueTimes = { prefillTokensPerSecond, stepBaseMs };
const workers = Number(values.workers);
const seed = Number(values.seed);

/** kv_aware_model's router settings to sweep: every route policy, then its own weights. */
function kvVariants(): { name: string; config: KvAwareConfig }[] {
  return routePolicies.flatMap((policy): { name: string; config: KvAwareConfig }[] =>
    policy === "dynamo"
      ? numbers(values["overlap-credit"]).flatMap((overlapScoreCredit) =>
          numbers(values["prefill-scale"]).map((prefillLoadScale) => ({
            name: `kv dynamo ${overlapScoreCredit}/${prefillLoadScale}`,
            config: { policy, weights: { overlapScoreCredit, prefillLoadScale } },
          })),
        )
      : numbers(values["recompute-weight"], true).flatMap((recomputeWeight) =>
          calibrations.flatMap((calibrate) =>
            admissions().map(({ label, admission }) => ({
              name: `kv ttft ${recomputeWeight}${calibrate ? " cal" : ""}${label}`,
              config: {
                policy,
                calibrate,
                ttft: { recomputeWeight, ...routerConstants },
                admission,
                ...(agreementWindow > 0 ? { reference: trueTimes } : {}),
              },
            })),
          ),
        ),
  );
}

/** Admission settings to sweep: every mode, and for hold and reject every bound, longest hold and prefill weight. */
function admissions(): { label: string; admission: Partial<AdmissionSettings> }[] {
  return values.admission
    .split(",")
    .flatMap((text): { label: string; admission: Partial<AdmissionSettings> }[] => {
      if (!(ADMISSION_MODES as readonly string[]).includes(text))
        throw new Error(`--admission takes ${ADMISSION_MODES.join(", ")}; got '${text}'`);
      const mode = text as AdmissionMode;
      if (mode === "off") return [{ label: "", admission: { mode } }];
      return numbers(values["admission-bound-ms"], true).flatMap((boundMs) =>
        numbers(values["max-hold-ms"], true).flatMap((maxHoldMs) =>
          numbers(values["admission-prefill-weight"], true).map((prefillWeight) => ({
            label: ` ${mode} ${boundMs}/${maxHoldMs}/${prefillWeight}`,
            admission: { mode, boundMs, maxHoldMs, prefillWeight },
          })),
        ),
      );
    });
}

interface Row extends SimResult {
  readonly time_scale: number;
  readonly start: number;
  readonly kv_aware: KvAwareConfig;
  readonly wall_ms: number;
  readonly replay_s_at_speedup: number;
  /** Per window of --agreement decisions: the share equal to a true-constant router's. */
  readonly agreement?: number[];
}

/** Shares of 1s per window of `size` (the last window may be shorter). */
function windowShares(flags: readonly number[], size: number): number[] {
  const shares: number[] = [];
  for (let at = 0; at < flags.length; at += size) {
    const window = flags.slice(at, at + size);
    shares.push(window.reduce((sum, flag) => sum + flag, 0) / window.length);
  }
  return shares;
}

const rows: Row[] = [];
const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;
const line = (cells: (string | number)[]): string =>
  cells.map((cell, i) => String(cell).padStart(i === 0 ? 28 : 11)).join(" ");
if (!values.json) {
  process.stdout.write(
    `${line([
      "policy",
      "requests",
      "capacity",
      "time scale",
      "hit rate",
      "prefill M",
      "TTFT p50",
      "TTFT p99",
      "TPOT p50",
      "TPOT p99",
      "spread",
      "rejected",
      "wall ms",
    ])}\n`,
  );
}
for (const timeScale of numbers(values["time-scale"])) {
  for (const requests of numbers(values.requests)) {
    const trace = transformTrace(fullTrace, { start, requests, timeScale });
    for (const capacity of numbers(values.capacity)) {
      for (const policy of policies) {
        const variants =
          policy === "kv_aware_model" ? kvVariants() : [{ name: policy, config: DEFAULT_KV_AWARE }];
        for (const { name, config: kvAware } of variants) {
          const started = performance.now();
          let agreed: readonly number[] = [];
          const onFinish = (finished: RoutingPolicy) => {
            if (finished instanceof KvAwareModel) agreed = finished.agreed;
          };
          const result = simulate(trace, {
            policy,
            workers,
            capacityBlocks: capacity,
            time,
            seed,
            kvAware,
            onFinish,
          });
          const wall = performance.now() - started;
          const agreement = agreed.length > 0 ? windowShares(agreed, agreementWindow) : undefined;
          const row = {
            ...result,
            policy: name,
            time_scale: timeScale,
            start,
            kv_aware: kvAware,
            wall_ms: Math.round(wall),
            replay_s_at_speedup: result.makespan_ms / speedup / 1000,
            ...(agreement === undefined ? {} : { agreement }),
          };
          rows.push(row);
          if (values.json) continue;
          process.stdout.write(
            `${line([
              name,
              trace.count,
              capacity,
              timeScale,
              pct(row.hit_rate),
              (row.prefill_tokens / 1e6).toFixed(2),
              row.ttft_p50_ms.toFixed(0),
              row.ttft_p99_ms.toFixed(0),
              row.tpot_p50_ms.toFixed(1),
              row.tpot_p99_ms.toFixed(1),
              row.load_spread.toFixed(2),
              row.rejected,
              row.wall_ms,
            ])}\n`,
          );
          if (agreement !== undefined) {
            const total = agreed.reduce((sum, flag) => sum + flag, 0) / agreed.length;
            const shares = agreement.map(pct).join(" ");
            const all = pct(total);
            process.stdout.write(
              `${" ".repeat(29)}agreement per ${agreementWindow}: ${shares} (all ${all})\n`,
            );
          }
        }
      }
    }
  }
}
const document = {
  bench: "sim",
  provenance: {
    ...provenance(),
    trace: tracePath,
    trace_sha256: createHash("sha256").update(traceBytes).digest("hex"),
  },
  settings: { workers, seed, time, speedup },
  rows,
};
process.stdout.write(`${JSON.stringify(document, null, values.json ? 2 : undefined)}\n`);
