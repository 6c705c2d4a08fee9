import { availableParallelism } from "node:os";
import { ADMISSION_MODES, type AdmissionMode, DEFAULT_ADMISSION } from "../route/admission";
import { DEFAULT_PACING, PACING_MODES, type PacingMode } from "../route/pacing";
import { DEGRADED_FALLBACKS } from "../route/router";
import { DEFAULT_TTFT_SETTINGS, ROUTE_POLICIES, type RoutePolicy } from "../route/ttft";
import type { DegradedFallbackMode } from "../sim/degraded-fleet";
import { getAffinity, pinProcess } from "../runtime/affinity";
import {
  type AdmissionReport,
  type DemoResult,
  type RouterReport,
  runDemo,
  type TierComparison,
} from "../sim/demo";
import type { IndexCheck } from "../sim/index-check";
import type { ProxyReport } from "../sim/proxy-replay";
import {
  defaultDemoPolicies,
  approximateEngines,
  DEMO_EVENTS,
  type DemoEvents,
  type DemoPolicy,
  isDemoPolicy,
} from "../sim/demo-options";
import { loadConversationTrace } from "../sim/embedded-trace";
import { CAPACITY_BLOCKS_MAX } from "../sim/engine-cache";
import { WORKERS_MAX } from "../sim/simulator";
import { DEFAULT_TIME_MODEL, type TimeModel } from "../sim/time-model";
import { DEFAULT_VOCAB_SIZE } from "../sim/tokens";
import { parseTrace, type Trace, TraceError, traceStats, transformTrace } from "../sim/trace";
import { isWorkload, WORKLOADS, workloadTrace } from "../sim/workloads";
import {
  flagBool,
  flagInt,
  flagNumber,
  flagString,
  type Parsed,
  parseFlags,
  UsageError,
} from "./args";
import { type Command, HELP_FLAG } from "./command";

/** Flags of the engine time model, shared by demo, replay and mock-engine. */
export const TIME_MODEL_FLAGS = {
  "prefill-tps": { kind: "string" },
  "step-base-ms": { kind: "string" },
  "kv-read-ms": { kind: "string" },
  "max-batched-tokens": { kind: "string" },
  "max-running": { kind: "string" },
  "long-prefill-tokens": { kind: "string" },
} as const;

export const TIME_MODEL_HELP = `Engine model (every constant; defaults: an ~8B model on one H100):
  --prefill-tps N        prompt tokens prefilled per second (${DEFAULT_TIME_MODEL.prefillTokensPerSecond})
  --step-base-ms MS      fixed cost of a scheduler step, the weights read (${DEFAULT_TIME_MODEL.stepBaseMs})
  --kv-read-ms MS        step time to read the KV of 1M context tokens (${DEFAULT_TIME_MODEL.kvReadMsPerMillionTokens})
  --max-batched-tokens N tokens per step (${DEFAULT_TIME_MODEL.maxBatchedTokens})
  --max-running N        requests running at once (${DEFAULT_TIME_MODEL.maxRunning})
  --long-prefill-tokens N
                         most prompt tokens one request prefills per step (vLLM's
                         --long-prefill-token-threshold; 0, the default: no cap)
`;

export function timeModelOf(parsed: Parsed): TimeModel {
  const d = DEFAULT_TIME_MODEL;
  const model: TimeModel = {
    prefillTokensPerSecond: flagNumber(parsed, "prefill-tps", d.prefillTokensPerSecond, 1, 1e9),
    stepBaseMs: flagNumber(parsed, "step-base-ms", d.stepBaseMs, 0, 60_000),
    kvReadMsPerMillionTokens: flagNumber(parsed, "kv-read-ms", d.kvReadMsPerMillionTokens, 0, 1e6),
    maxBatchedTokens: flagInt(parsed, "max-batched-tokens", d.maxBatchedTokens, 1, 1 << 24),
    maxRunning: flagInt(parsed, "max-running", d.maxRunning, 1, 1 << 20),
  };
  if (model.stepBaseMs === 0 && model.kvReadMsPerMillionTokens === 0) {
    throw new UsageError(
      "--step-base-ms and --kv-read-ms cannot both be 0 (a decode step would take no time)",
    );
  }
  const longPrefill = flagInt(parsed, "long-prefill-tokens", 0, 0, 1 << 24);
  return longPrefill > 0 ? { ...model, longPrefillTokens: longPrefill } : model;
}

/** The trace in FILE (Mooncake JSONL), a generated workload, or the embedded conversation trace. */
export async function loadTrace(
  path: string | undefined,
  workload?: string,
  seed?: number,
): Promise<{ trace: Trace; name: string }> {
  if (workload !== undefined) {
    if (path !== undefined) throw new UsageError("give --trace or --workload, not both");
    if (!isWorkload(workload))
      throw new UsageError(
        `--workload: unknown workload '${workload}' (known: ${WORKLOADS.join(", ")})`,
      );
    return {
      trace: parseTrace(workloadTrace(workload, seed)),
      name: `the generated ${workload} workload (seed ${seed ?? "default"})`,
    };
  }
  if (path === undefined)
    return { trace: await loadConversationTrace(), name: "the Mooncake conversation trace" };
  const file = Bun.file(path);
  if (!(await file.exists())) throw new UsageError(`--trace ${path}: no such file`);
  try {
    return { trace: parseTrace(await file.text()), name: path };
  } catch (error) {
    if (error instanceof TraceError) throw new UsageError(`--trace ${path}: ${error.message}`);
    throw error;
  }
}

const flags = {
  ...HELP_FLAG,
  ...TIME_MODEL_FLAGS,
  requests: { kind: "string" },
  workers: { kind: "string" },
  "capacity-blocks": { kind: "string" },
  "cpu-capacity-blocks": { kind: "string" },
  "block-size": { kind: "string" },
  trace: { kind: "string" },
  workload: { kind: "string" },
  "workload-seed": { kind: "string" },
  speedup: { kind: "string" },
  "time-scale": { kind: "string" },
  twins: { kind: "string" },
  policies: { kind: "string" },
  seed: { kind: "string" },
  json: { kind: "boolean" },
  "map-form": { kind: "boolean" },
  "realtime-baselines": { kind: "boolean" },
  virtual: { kind: "boolean" },
  start: { kind: "string" },
  "route-policy": { kind: "string" },
  "recompute-weight": { kind: "string" },
  admission: { kind: "string" },
  pacing: { kind: "string" },
  "no-pin": { kind: "boolean" },
  proxy: { kind: "boolean" },
  events: { kind: "string" },
  "predicted-capacity-blocks": { kind: "string" },
  "no-correct": { kind: "boolean" },
  replicas: { kind: "string" },
  "no-sync": { kind: "boolean" },
  "sync-delay-ms": { kind: "string" },
  "stagger-ms": { kind: "string" },
  "cut-streams": { kind: "string" },
  "cut-at": { kind: "string" },
  "cut-ms": { kind: "string" },
  "degraded-fallback": { kind: "string" },
} as const;

export const DEMO_DEFAULTS = {
  requests: 2000,
  workers: 8,
  capacityBlocks: 32_768,
  blockSize: 16,
  speedup: 10,
  timeScale: 0.5,
  seed: 42,
} as const;

const RECOMPUTE_WEIGHT = DEFAULT_TTFT_SETTINGS.recomputeWeight;

export const demoCommand: Command = {
  name: "demo",
  summary:
    "show what KV-aware routing buys: mock engines + kvedge serve vs. the usual routers, on a real trace",
  flags,
  help: `Usage: kvedge demo [options]

Starts ${DEMO_DEFAULTS.workers} mock engines in this process (vLLM-like KV caches that publish real
vLLM KV events over ZeroMQ) and one kvedge serve, replays a Mooncake trace through
kvedge's routing API in scaled real time, then replays the same trace with the
routers people use instead (round robin, random, least loaded, and SGLang-style
approximate prefix routing). Prints, per policy, the prefix-cache hit rate, prefill
tokens computed, modeled TTFT and TPOT, and per-worker load spread, and what
kv-aware routing gained. A progress bar shows on a terminal (stderr).

Options:
  --virtual              run every policy in virtual time, kv_aware as kvedge's router in-process
                         (told each engine's true cache): deterministic, no kvedge serve, no waiting
  --start N              skip the trace's first N requests (0)
  --requests N           requests to replay (${DEMO_DEFAULTS.requests})
  --workers N            mock engines (${DEMO_DEFAULTS.workers})
  --capacity-blocks N    KV capacity of each engine, in blocks (${DEMO_DEFAULTS.capacityBlocks}: ~80 GB for an 8B model)
  --cpu-capacity-blocks N  a CPU offload tier per engine, in blocks (0: none): evicted blocks spill
                         there (vLLM's CPU events) and load back faster than a prefill; kv_aware
                         then also runs routing on the device tier only, for a table of the gain
  --block-size N         tokens per KV block (${DEMO_DEFAULTS.blockSize})
  --trace FILE           a Mooncake-format JSONL trace (default: the embedded conversation trace)
  --workload NAME        a generated Mooncake-format trace instead (src/sim/workloads.ts): agentic
                         (tool-using agent sessions with fan-outs) or burst (64 requests sharing a
                         4,096-token prefix within 50 ms, a fresh prefix every 2.5 s)
  --workload-seed S      the generator's seed (its default: 7)
  --time-scale F         multiply arrival times by F (${DEMO_DEFAULTS.timeScale}: twice the trace's request rate)
  --twins F              a fraction F of the requests arrive twice at once (parallel sampling,
                         retries) (0): an engine given both reuses the first's blocks as they are
                         scheduled (vLLM V1); with --long-prefill-tokens they prefill side by side,
                         the first computes again the chunks the second computed, and the engine
                         keeps both copies, each announced and evicted on its own, as vLLM does
  --speedup X            model seconds per wall second in the kvedge replay (${DEMO_DEFAULTS.speedup})
  --policies LIST        comma list of ${["kv_aware", "round_robin", "random", "least_loaded", "approx_prefix", "kv_aware_model"].join(", ")}
                         (default: all but kv_aware_model, kvedge's cost model in-process with exact knowledge)
  --seed S               seed of engine hash seeds and randomized policies (${DEMO_DEFAULTS.seed})
  --map-form             engines encode events as maps (vLLM 0.24+) instead of arrays
  --realtime-baselines   replay the baselines in real time too (same results, more wall time)
  --route-policy P       kv_aware's route policy: ttft (default) or dynamo
  --recompute-weight W   kv_aware's recompute weight under ttft (${DEFAULT_TTFT_SETTINGS.recomputeWeight})
  --pacing MODE          kv_aware's pacing (route.pacing): off (default) or on: each engine is sent
                         at most two requests still prefilling, the rest wait in kvedge
  --admission MODE       kv_aware's admission at saturation (route.admission): off (default), hold
                         or reject; the summary counts the calls held, released and refused
  --no-pin               do not pin kvedge serve and this process to separate CPUs
  --proxy                run kv_aware through kvedge serve --proxy: OpenAI /v1/completions
                         requests to kvedge, which routes, forwards to the engines' OpenAI API
                         and drives each request's lifecycle from the answer
  --events MODE          which engines publish KV events: all (default), mixed (even engines; the
                         odd ones are approximate workers) or none (every engine approximate: kvedge
                         predicts their caches from its own decisions)
  --predicted-capacity-blocks N
                         the KV capacity kvedge is told for approximate workers (default: the
                         engines' real one, --capacity-blocks)
  --no-correct           kvedge is not told the cached tokens engines served (prefill_done's
                         cached_tokens; with --proxy kvedge serve runs without correction)
  --replicas N           kvedge as N replicas (1): request i to replica i mod N, its lifecycle
                         calls too, as behind a plain load balancer. kv_aware shares their load
                         over a local nats-server (bound to 127.0.0.1); kv_aware_unsynced, the
                         same replicas without it, runs beside it
  --no-sync              with --replicas: only the replicas without the bus (kv_aware_unsynced)
  --sync-delay-ms D      with --virtual --replicas: each replica applies its peers' facts D ms late (1)
  --stagger-ms S         with --replicas: the replicas' cluster.stagger_ms, replica k answering a
                         contested route k × S ms late (default: D with --virtual, else 1; 0 = off)
  --cut-streams N        with --virtual: the first N engines' KV-event streams are cut (no replay):
                         kvedge's index of them loses what they publish during the cut, and they
                         are degraded from then on (0)
  --cut-at F             the cut starts F of the way through the replay (0.25)
  --cut-ms MS            the cut's length, model ms (10000)
  --degraded-fallback M  kv_aware's route.degraded_fallback: predictions (default) or discount
  --json                 print one JSON object on stdout instead of the table
${TIME_MODEL_HELP}  -h, --help             show this help
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (parsed.positionals.length > 0)
      throw new UsageError(`unexpected argument '${parsed.positionals[0]}'`);
    const virtual = flagBool(parsed, "virtual");
    const workers = flagInt(parsed, "workers", DEMO_DEFAULTS.workers, 1, WORKERS_MAX);
    const capacityBlocks = flagInt(
      parsed,
      "capacity-blocks",
      DEMO_DEFAULTS.capacityBlocks,
      1,
      CAPACITY_BLOCKS_MAX,
    );
    const cpuCapacityBlocks = flagInt(parsed, "cpu-capacity-blocks", 0, 0, CAPACITY_BLOCKS_MAX);
    const blockSize = flagInt(parsed, "block-size", DEMO_DEFAULTS.blockSize, 1, 4096);
    const speedup = flagNumber(parsed, "speedup", DEMO_DEFAULTS.speedup, 0.01, 1e6);
    const seed = flagInt(parsed, "seed", DEMO_DEFAULTS.seed, 0, 0xffff_ffff);
    const time = timeModelOf(parsed);
    const routing = routingFlags(parsed, time, speedup);
    const json = flagBool(parsed, "json");
    const replicated = replicaFlags(parsed, virtual);
    const policies = policiesOf(flagString(parsed, "policies"), replicated);
    const { trace, name, start, timeScale } = await demoTrace(parsed);
    const degraded = degradedFlags(parsed, virtual, trace, workers);
    const serveArgs = [
      ...routing.serveArgs,
      ...localServeArgs(parsed, virtual, policies),
      ...degraded.serveArgs,
    ];
    const predictions = predictionOptions(parsed, capacityBlocks);
    const events = predictions.events;
    const result = await runDemo({
      trace,
      workers,
      capacityBlocks,
      cpuCapacityBlocks,
      blockSize,
      speedup,
      policies,
      seed,
      time,
      vocabSize: DEFAULT_VOCAB_SIZE,
      form: flagBool(parsed, "map-form") ? "map" : "array",
      realtimeBaselines: flagBool(parsed, "realtime-baselines"),
      serveArgs,
      progress: progressLine(json),
      virtual,
      proxy: flagBool(parsed, "proxy"),
      ...predictions,
      kvAware: { ...routing.kvAware, ...degraded.kvAware },
      ...replicated.options,
      ...degraded.options,
    });
    const config = {
      trace: name,
      events,
      approximate_workers: approximateEngines(events, workers),
      start,
      requests: trace.count,
      virtual,
      ...routing.config,
      workers,
      capacity_blocks: capacityBlocks,
      cpu_capacity_blocks: cpuCapacityBlocks,
      block_size: blockSize,
      time_scale: timeScale,
      speedup,
      seed,
      time_model: time,
      trace_span_s: traceStats(trace).spanMs / 1000,
      ...replicated.config,
      ...degraded.config,
    };
    if (json) process.stdout.write(`${JSON.stringify({ ...result, config })}\n`);
    else process.stdout.write(renderDemo(result, config));
    return 0;
  },
};

/** The trace the demo replays (./traceOf), sliced, scaled and twinned as the flags say. */
async function demoTrace(parsed: Parsed) {
  const requests = flagInt(parsed, "requests", DEMO_DEFAULTS.requests, 1, 50_000_000);
  const start = flagInt(parsed, "start", 0, 0, 50_000_000);
  const timeScale = flagNumber(parsed, "time-scale", DEMO_DEFAULTS.timeScale, 1e-6, 1e6);
  const twins = flagNumber(parsed, "twins", 0, 0, 1);
  const loaded = await traceOf(parsed);
  if (start >= loaded.trace.count)
    throw new UsageError(`--start ${start}: the trace has ${loaded.trace.count} requests`);
  const trace = transformTrace(loaded.trace, { start, requests, timeScale, twins });
  return { trace, name: loaded.name, start, timeScale };
}

/** The trace the demo replays: --trace FILE, --workload NAME, or the conversation trace. */
function traceOf(parsed: Parsed): Promise<{ trace: Trace; name: string }> {
  const workloadSeed = parsed.flags.has("workload-seed")
    ? flagInt(parsed, "workload-seed", 7, 0, 0xffff_ffff)
    : undefined;
  return loadTrace(flagString(parsed, "trace"), flagString(parsed, "workload"), workloadSeed);
}

/** Which engines publish events, and what kvedge is told about the others. */
function predictionOptions(parsed: Parsed, capacityBlocks: number) {
  const events = eventsOf(flagString(parsed, "events"));
  const flag = "predicted-capacity-blocks";
  return {
    events,
    ...(parsed.flags.has(flag)
      ? { predictedCapacityBlocks: flagInt(parsed, flag, capacityBlocks, 1, CAPACITY_BLOCKS_MAX) }
      : {}),
    correct: !flagBool(parsed, "no-correct"),
  };
}

/** Progress on stderr: a bar on a terminal, phase announcements otherwise; none for --json off a terminal. */
function progressLine(json: boolean): ((line: string) => void) | null {
  const tty = process.stderr.isTTY === true;
  if (json && !tty) return null;
  let shown = 0;
  return (line: string): void => {
    if (tty) {
      process.stderr.write(
        line === ""
          ? "\r\x1b[2K"
          : `\r\x1b[2K${line.slice(0, (process.stderr.columns ?? 100) - 1)}`,
      );
    } else if (line !== "" && !line.includes("[")) {
      // Without a terminal: phase announcements only, no bar.
      if (shown++ < 1000) process.stderr.write(`${line}\n`);
    }
  };
}

/**
 * Not with --proxy: the proxied replay takes each TTFT from the engine's answer, which
 * cannot see the time a request was held.
 */
function admissionOf(text: string | undefined, proxy: boolean): AdmissionMode {
  if (text === undefined) return "off";
  if (!(ADMISSION_MODES as readonly string[]).includes(text)) {
    throw new UsageError(
      `--admission: unknown mode '${text}' (known: ${ADMISSION_MODES.join(", ")})`,
    );
  }
  if (text !== "off" && proxy) throw new UsageError("--admission does not go with --proxy yet");
  return text as AdmissionMode;
}

/** kv_aware's routing flags: its router's settings in-process, kvedge serve's flags, the summary's fields. */
function routingFlags(parsed: Parsed, time: TimeModel, speedup: number) {
  const routePolicy = routePolicyOf(flagString(parsed, "route-policy"));
  const recomputeWeight = flagNumber(parsed, "recompute-weight", RECOMPUTE_WEIGHT, 0, 1e6);
  const admission = admissionOf(flagString(parsed, "admission"), flagBool(parsed, "proxy"));
  const pacing = pacingOf(flagString(parsed, "pacing"), flagBool(parsed, "proxy"));
  const held = [...admissionArgs(admission, speedup), ...pacingArgs(pacing, speedup)];
  return {
    serveArgs: serveArgsOf(routePolicy, recomputeWeight, time, held),
    kvAware: {
      policy: routePolicy,
      ttft: { recomputeWeight },
      admission: { mode: admission },
      pacing: { mode: pacing },
    },
    config: { route_policy: routePolicy, recompute_weight: recomputeWeight, admission, pacing },
  };
}

/** As admission's: the proxy's replay cannot see the time a request waited in kvedge. */
function pacingOf(text: string | undefined, proxy: boolean): PacingMode {
  if (text === undefined) return DEFAULT_PACING.mode;
  if (!(PACING_MODES as readonly string[]).includes(text))
    throw new UsageError(`--pacing: unknown mode '${text}' (known: ${PACING_MODES.join(", ")})`);
  if (text !== "off" && proxy) throw new UsageError("--pacing does not go with --proxy yet");
  return text as PacingMode;
}

/** kvedge serve's pacing flags: the longest hold scaled to mean in model time what its default says. */
function pacingArgs(mode: PacingMode, speedup: number): string[] {
  if (mode === "off") return [];
  return ["--pacing", mode, "--pacing-max-hold-ms", String(DEFAULT_PACING.maxHoldMs / speedup)];
}

/**
 * kvedge serve's admission flags. Its clock is the wall clock, its predictions are in
 * model ms (it is told the engines' model constants): the longest hold and the order's
 * aging are scaled by the speed-up so they mean in model time what their defaults say.
 */
function admissionArgs(mode: AdmissionMode, speedup: number): string[] {
  if (mode === "off") return [];
  return [
    "--admission",
    mode,
    "--admission-max-hold-ms",
    String(DEFAULT_ADMISSION.maxHoldMs / speedup),
    "--admission-prefill-weight",
    String(DEFAULT_ADMISSION.prefillWeight / speedup),
  ];
}

/** Pinning, and without correction kvedge serve ignores the cached tokens it hears (the proxy reads them anyway). */
function localServeArgs(parsed: Parsed, virtual: boolean, policies: readonly DemoPolicy[]) {
  const args: string[] = [];
  const kvedge = policies.includes("kv_aware") || policies.includes("kv_aware_unsynced");
  if (!virtual && !flagBool(parsed, "no-pin") && kvedge) args.push(...pinning());
  if (flagBool(parsed, "no-correct")) args.push("--no-predicted-correction");
  return args;
}

/** --degraded-fallback and the stream cut (--cut-streams, --cut-at, --cut-ms), checked together. */
function degradedFlags(parsed: Parsed, virtual: boolean, trace: Trace, workers: number) {
  const text = flagString(parsed, "degraded-fallback");
  const degradedFallback = degradedFallbackOf(text);
  const cut = streamCutOf(parsed, virtual, trace, workers);
  return {
    kvAware: { degradedFallback },
    options: cut.streamCut === null ? {} : { streamCut: cut.streamCut },
    config: { degraded_fallback: degradedFallback, ...cut.config },
    serveArgs: text === undefined ? [] : ["--degraded-fallback", degradedFallback],
  };
}

function degradedFallbackOf(text: string | undefined): DegradedFallbackMode {
  if (text === undefined) return "predictions";
  if (!(DEGRADED_FALLBACKS as readonly string[]).includes(text)) {
    throw new UsageError(
      `--degraded-fallback: unknown mode '${text}' (known: ${DEGRADED_FALLBACKS.join(", ")})`,
    );
  }
  return text as DegradedFallbackMode;
}

/** --cut-streams, --cut-at, --cut-ms: the first N engines' streams cut, F of the way through the replay. */
function streamCutOf(parsed: Parsed, virtual: boolean, trace: Trace, workers: number) {
  const count = flagInt(parsed, "cut-streams", 0, 0, workers);
  const at = flagNumber(parsed, "cut-at", 0.25, 0, 1);
  const ms = flagNumber(parsed, "cut-ms", 10_000, 0, 1e9);
  const used = ["cut-streams", "cut-at", "cut-ms"].filter((flag) => parsed.flags.has(flag));
  if (used.length > 0 && !virtual) throw new UsageError(`--${used[0]} needs --virtual`);
  if (count === 0) {
    if (used.length > 0 && used[0] !== "cut-streams")
      throw new UsageError(`--${used[0]} needs --cut-streams 1 or more`);
    return { streamCut: null, config: {} };
  }
  const first = trace.count > 0 ? trace.arrivalMs[0]! : 0;
  const fromMs = first + at * traceStats(trace).spanMs;
  const streamCut = {
    workers: Array.from({ length: count }, (_, w) => w),
    fromMs,
    toMs: fromMs + ms,
  };
  return { streamCut, config: { cut_streams: count, cut_from_s: fromMs / 1000, cut_ms: ms } };
}

function eventsOf(text: string | undefined): DemoEvents {
  if (text === undefined) return "all";
  if (!(DEMO_EVENTS as readonly string[]).includes(text))
    throw new UsageError(`--events: unknown mode '${text}' (known: ${DEMO_EVENTS.join(", ")})`);
  return text as DemoEvents;
}

function routePolicyOf(text: string | undefined): RoutePolicy {
  if (text === undefined) return "ttft";
  if (!(ROUTE_POLICIES as readonly string[]).includes(text)) {
    throw new UsageError(
      `--route-policy: unknown policy '${text}' (known: ${ROUTE_POLICIES.join(", ")})`,
    );
  }
  return text as RoutePolicy;
}

/** kvedge serve is told the engines' constants, as an operator would configure it. */
function serveArgsOf(
  routePolicy: RoutePolicy,
  recomputeWeight: number,
  time: TimeModel,
  admission: string[],
): string[] {
  return [
    ...["--route-policy", routePolicy, "--recompute-weight", String(recomputeWeight)],
    ...["--prefill-tokens-per-sec", String(time.prefillTokensPerSecond)],
    ...["--step-base-ms", String(time.stepBaseMs)],
    ...["--kv-read-ms-per-million-tokens", String(time.kvReadMsPerMillionTokens)],
    ...["--max-batched-tokens", String(time.maxBatchedTokens)],
    ...admission,
  ];
}

/** ", 3 replicas over NATS" when kvedge ran as replicas. */
function replicasNote(replicas: number): string {
  return replicas > 1 ? `, ${replicas} replicas over NATS` : "";
}

/** A row's name: kvedge's rows say how many replicas ran them. */
function rowLabel(name: string, replicas: number): string {
  const kvedge = name.startsWith("kv_aware") && name !== "kv_aware_model";
  return replicas > 1 && kvedge ? `${name} ×${replicas}` : name;
}

/** Most kvedge replicas a demo starts. */
const MAX_REPLICAS = 16;

/** --replicas, --no-sync, --sync-delay-ms, --stagger-ms, checked together. */
function replicaFlags(parsed: Parsed, virtual: boolean) {
  const replicas = flagInt(parsed, "replicas", 1, 1, MAX_REPLICAS);
  const noSync = flagBool(parsed, "no-sync");
  if (noSync && replicas === 1) throw new UsageError("--no-sync needs --replicas 2 or more");
  if (replicas > 1 && flagBool(parsed, "proxy"))
    throw new UsageError("--replicas does not go with --proxy yet");
  const syncDelayMs = flagNumber(parsed, "sync-delay-ms", 1, 0, 60_000);
  if (parsed.flags.has("sync-delay-ms") && !(virtual && replicas > 1))
    throw new UsageError("--sync-delay-ms needs --virtual and --replicas 2 or more");
  // The bus's delay in virtual time; in real time a millisecond of wall clock.
  const staggerMs = flagNumber(parsed, "stagger-ms", virtual ? syncDelayMs : 1, 0, 1000);
  const config = {
    replicas,
    sync_delay_ms: virtual && replicas > 1 ? syncDelayMs : null,
    stagger_ms: replicas > 1 ? staggerMs : null,
  };
  return { replicas, noSync, options: { replicas, syncDelayMs, staggerMs }, config };
}

function policiesOf(
  text: string | undefined,
  { replicas, noSync }: { replicas: number; noSync: boolean },
): DemoPolicy[] {
  if (text === undefined) {
    const defaults = defaultDemoPolicies(replicas);
    return noSync ? defaults.filter((policy) => policy !== "kv_aware") : defaults;
  }
  const names = text
    .split(",")
    .map((name) => name.trim())
    .filter((name) => name !== "");
  if (names.length === 0) throw new UsageError("--policies needs at least one policy");
  for (const name of names) {
    if (!isDemoPolicy(name)) {
      throw new UsageError(
        `--policies: unknown policy '${name}' (known: kv_aware, kv_aware_unsynced, round_robin, random, least_loaded, approx_prefix, kv_aware_model)`,
      );
    }
    if (name === "kv_aware_unsynced" && replicas === 1)
      throw new UsageError("--policies kv_aware_unsynced needs --replicas 2 or more");
  }
  return [...new Set(names)] as DemoPolicy[];
}

/**
 * kvedge serve on the last CPU this process may use, the demo on the others, when
 * there are at least two: the router and the engines then do not compete for a core.
 */
function pinning(): string[] {
  let cpus: number[];
  try {
    cpus = getAffinity();
  } catch {
    return [];
  }
  if (cpus.length < 2 || availableParallelism() < 2) return [];
  const serveCpu = cpus[cpus.length - 1]!;
  try {
    pinProcess(cpus.slice(0, -1));
  } catch {
    return [];
  }
  return ["--cpus", String(serveCpu)];
}

function admissionLine(a: AdmissionReport): string {
  const calls = int(a.immediate + a.held);
  return (
    `Admission (${a.mode}): ${int(a.held)} of ${calls} route calls held at saturation` +
    ` (${int(a.released)} released when a worker freed, ${int(a.overdue)} routed at the longest hold),` +
    ` ${int(a.rejected)} refused (429), ${int(a.dropped)} dropped; TTFT counts the time held.`
  );
}

interface DemoConfig {
  readonly replicas?: number;
  readonly trace: string;
  readonly events: DemoEvents;
  readonly approximate_workers: readonly number[];
  readonly start: number;
  readonly requests: number;
  readonly workers: number;
  readonly capacity_blocks: number;
  readonly block_size: number;
  readonly time_scale: number;
  readonly speedup: number;
  readonly trace_span_s: number;
  readonly degraded_fallback?: DegradedFallbackMode;
  readonly cut_streams?: number;
  readonly cut_from_s?: number;
  readonly cut_ms?: number;
}

const int = (value: number): string => Math.round(value).toLocaleString("en-US");
const percent = (value: number): string => `${(100 * value).toFixed(1)}%`;
const ms = (value: number): string =>
  value >= 10_000 ? `${(value / 1000).toFixed(1)} s` : `${int(value)} ms`;
const signed = (value: number, digits = 0): string =>
  `${value > 0 ? "+" : value < 0 ? "−" : "±"}${Math.abs(value).toFixed(digits)}`;

/** The end-of-run check of an index against the engines' caches (both tiers, every copy). */
function indexLine(check: IndexCheck): string {
  const host =
    check.engine_host_blocks + check.index_host_blocks === 0
      ? ""
      : `; CPU tier ${int(check.index_host_blocks)} indexed, ${int(check.engine_host_blocks)} held`;
  const copies =
    check.engine_duplicates_computed === 0
      ? ""
      : `; duplicate copies: ${int(check.engine_duplicates_computed)} computed in the run,` +
        ` ${int(check.index_extra_copies)} indexed and ${int(check.engine_extra_copies)} held at the end`;
  return (
    `index vs engines at the end: ${check.index_matches_engines ? "identical" : "DIFFERENT"}` +
    ` (${int(check.index_blocks)} blocks indexed, ${int(check.engine_cached_blocks)} cached${copies}${host}).`
  );
}

/** Tier-aware routing against device-only routing, with a CPU tier on every engine. */
function tierTable(tiers: TierComparison): string[] {
  const rows = [
    ["kv_aware routing on", "hit rate", "of it CPU tier", "prefill tokens", "TTFT p50", "TTFT p99"],
    ...(
      [
        ["device and CPU tiers", tiers.tier_aware],
        ["device tier only", tiers.device_only],
      ] as const
    ).map(([name, row]) => [
      name,
      percent(row.hit_rate),
      percent(row.host_hit_rate),
      `${(row.prefill_tokens / 1e6).toFixed(2)} M`,
      ms(row.ttft_p50_ms),
      ms(row.ttft_p99_ms),
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
  const line = (row: string[]) =>
    row
      .map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!)))
      .join("  ");
  return [
    `With a CPU tier of ${int(tiers.cpu_capacity_blocks)} blocks per engine (evicted blocks spill there, load back instead of a prefill):`,
    ...rows.map(line),
  ];
}

export function renderDemo(result: DemoResult, config: DemoConfig): string {
  const out: string[] = [];
  const rate =
    config.time_scale === 1
      ? "at its own request rate"
      : `at ${(1 / config.time_scale).toFixed(2).replace(/\.?0+$/, "")}× its request rate`;
  out.push(
    `kvedge demo: ${config.workers} mock engines × ${int(config.capacity_blocks)} KV blocks of ${config.block_size} tokens;` +
      ` ${int(config.requests)} requests of ${config.trace}${config.start > 0 ? ` from request ${int(config.start)}` : ""} ${rate} (${int(config.trace_span_s)} s of arrivals).`,
  );
  out.push("");
  const header = [
    "policy",
    "hit rate",
    "prefill tokens",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "load spread",
  ];
  const rows = Object.entries(result.policies).map(([name, r]) => [
    rowLabel(name, config.replicas ?? 1),
    percent(r.hit_rate),
    `${(r.prefill_tokens / 1e6).toFixed(2)} M`,
    ms(r.ttft_p50_ms),
    ms(r.ttft_p99_ms),
    `${r.tpot_p50_ms.toFixed(1)} ms`,
    `${r.tpot_p99_ms.toFixed(0)} ms`,
    r.load_spread.toFixed(2),
  ]);
  const widths = header.map((title, i) =>
    Math.max(title.length, ...rows.map((row) => row[i]!.length)),
  );
  const format = (cells: string[]): string =>
    cells
      .map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!)))
      .join("  ");
  out.push(format(header));
  for (const row of rows) out.push(format(row));
  const rejected = Object.entries(result.policies).filter(([, r]) => r.rejected > 0);
  for (const [name, r] of rejected)
    out.push(`  (${name}: ${r.rejected} requests larger than an engine's cache were rejected)`);
  out.push("");
  const gains = Object.entries(result.gains);
  if (gains.length > 0) {
    const kv = result.policies.kv_aware;
    const kvName =
      kv === undefined
        ? "kv_aware_model"
        : kv.mode === "kvedge"
          ? `kv_aware (kvedge${replicasNote(config.replicas ?? 1)})`
          : "kv_aware (kvedge's router, in-process)";
    out.push(`Gains of ${kvName}:`);
    for (const [name, gain] of gains) {
      out.push(
        `  vs ${name.padEnd(14)} ${signed(-gain.prefill_tokens_saved_pct, 1)}% prefill tokens,` +
          ` hit rate ${signed(gain.hit_rate_points, 1)} points, TTFT p50 ${signed(gain.ttft_p50_change_pct)}%,` +
          ` p99 ${signed(gain.ttft_p99_change_pct)}%`,
      );
    }
    out.push("");
  }
  const router = result.router;
  if (router !== null) out.push(...routerLines(router, config), "");
  if (result.index !== null) out.push(`kv_aware's engines, ${indexLine(result.index)}`, "");
  if (result.tiers !== null) out.push(...tierTable(result.tiers), "");
  if (result.admission !== null) out.push(admissionLine(result.admission), "");
  if (result.proxy !== null) out.push(...proxyLines(result.proxy), "");
  out.push(...workerNotes(config));
  const modes = new Set(Object.values(result.policies).map((r) => r.mode));
  out.push(
    `Times are modeled (engine schedule in model time, not wall clock); runs: ${[...modes].join("; ")}.`,
  );
  const kv = result.policies.kv_aware;
  out.push(
    `Took ${result.wall_s.toFixed(0)} s${kv === undefined || router === null ? "" : ` (kvedge replay ${kv.wall_s.toFixed(0)} s at ×${router.achieved_speedup.toFixed(1)})`}.`,
  );
  return `${out.join("\n")}\n`;
}

/** What the proxied run saw: its requests, first bytes, and predicted against observed hits. */
function proxyLines(proxy: ProxyReport): string[] {
  return [
    `kvedge --proxy: ${int(proxy.requests)} OpenAI requests proxied (${proxy.failed} failed, ${proxy.failovers} failovers);` +
      ` time to first byte p50 ${proxy.ttfb_p50_ms.toFixed(1)} ms, p99 ${proxy.ttfb_p99_ms.toFixed(1)} ms (wall, client-measured).`,
    `  Hit rate predicted ${percent(proxy.predicted_hit_rate)}, observed in the answers' usage ${percent(proxy.observed_hit_rate)};` +
      ` ${proxy.suspect_workers} workers flagged, ${proxy.degraded_workers} degraded; ${proxy.active_at_end} requests active at the end.`,
  ];
}

/** kvedge serve's own view of the kv_aware run: route latency, events, its index at the end. */
function routerLines(router: RouterReport, config: DemoConfig): string[] {
  const lines: string[] = [];
  lines.push(
    `kvedge: ${int(router.decisions)} routing decisions, latency p50 ${router.route_latency_p50_ms.toFixed(2)} ms,` +
      ` p99 ${router.route_latency_p99_ms.toFixed(2)} ms (client-measured, WebSocket on loopback);` +
      ` predicted hit rate ${percent(router.predicted_hit_rate)}.`,
  );
  lines.push(
    `  ${int(router.batches_published)} KV event batches published, ${int(router.batches_applied)} applied` +
      ` (${int(router.batches_replayed)} recovered by replay, ${int(router.batches_lost)} lost, ${int(router.gaps)} gaps);` +
      ` ${router.degraded_workers} degraded workers; ${router.lifecycle_errors} failed lifecycle calls.`,
  );
  if (router.predicted.workers < config.workers) lines.push(`  ${indexLine(router.index)}`);
  const p = router.predicted;
  if (p.workers > 0) {
    lines.push(
      `  Predictions at the end (${p.workers} approximate workers): ${int(p.blocks)} blocks predicted,` +
        ` ${int(p.held)} of them cached by the engines (${percent(p.blocks === 0 ? 0 : p.held / p.blocks)});` +
        ` the engines cached ${int(p.engine_blocks)} (prompt and output blocks).`,
    );
  }
  const cluster = router.cluster;
  if (cluster !== null)
    lines.push(
      `  ${cluster.replicas} replicas${cluster.synced ? " over NATS" : ", no bus"}: ${int(cluster.facts_sent)} facts published,` +
        ` ${int(cluster.facts_received)} applied by peers, ${int(cluster.bytes_sent)} bytes on the bus` +
        ` (${int(cluster.bytes_per_route)} per routed request), ${int(cluster.gaps)} gaps;` +
        ` facts applied by peers within ${cluster.lag_p50_ms} ms (p50), ${cluster.lag_p99_ms} ms (p99).`,
    );
  return lines;
}

/** The notes on engines without events and cut streams, each followed by a blank line. */
function workerNotes(config: DemoConfig): string[] {
  const notes: string[] = [];
  if (config.approximate_workers.length > 0) notes.push(approximateLine(config), "");
  if (config.cut_streams !== undefined) notes.push(cutLine(config), "");
  return notes;
}

/** Whose streams were cut, when, and what kvedge routed them on (`--cut-streams`). */
function cutLine(config: DemoConfig): string {
  const fallback =
    config.degraded_fallback === "discount"
      ? "their indexed overlap discounted"
      : "the larger of its predictions of them and their discounted indexed overlap";
  return (
    `Streams cut (--cut-streams ${config.cut_streams}): engines 0-${config.cut_streams! - 1} lost their KV events ` +
    `for ${int(config.cut_ms!)} ms from ${config.cut_from_s!.toFixed(1)} s, without replay; kvedge held them ` +
    `degraded from then on and routed them on ${fallback} (--degraded-fallback ${config.degraded_fallback}).`
  );
}

/** Which engines published no events (`--events none|mixed`). */
function approximateLine(config: DemoConfig): string {
  const which =
    config.events === "none" ? "every engine" : `engines ${config.approximate_workers.join(", ")}`;
  return (
    `Approximate workers (--events ${config.events}): ${which} published no KV events; kvedge predicted` +
    " their caches from its own routing decisions. kv_aware keeps its name."
  );
}
