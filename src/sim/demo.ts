/**
 * `kvedge demo`: what KV-aware routing buys, measured on one machine.
 *
 * 1. kv_aware: N networked mock engines in this process and one real `kvedge serve`
 *    child subscribed to them (with replay endpoints). The trace is replayed in scaled
 *    real time: each request is routed through kvedge's WebSocket API, submitted to the
 *    chosen engine, and kvedge hears prefill_done / done when the engine model says so.
 *    kvedge learns what each engine caches only from its KV events (ZMQ).
 * 2. Baselines (round_robin, random, least_loaded, approx_prefix; kv_aware_model on
 *    request): the same trace over fresh engines with the same seeds, routed in-process.
 *    By default in virtual time: an in-process router makes a real-time replay
 *    reproduce the virtual one exactly (test/sim/realtime.test.ts), so waiting for the
 *    wall clock would only cost time. `realtimeBaselines` replays them in real time.
 *
 * Every policy is measured by the same code (./outcome.ts) from the engines' modeled
 * schedule. Router-side numbers for kv_aware come from the client (route latency) and
 * from kvedge itself (/v1/workers, /metrics, and /v1/dump compared with the engines'
 * real cache contents at the end).
 */
import type { IndexOp } from "../index";
import { checkIndex, EventIndex, heldOf, type IndexCheck } from "./index-check";
import { kvedgeRouter, KvedgeClient } from "./kvedge-client";
import { NetworkedEngine } from "./networked-engine";
import { type ProxyReport, runProxyReplay } from "./proxy-replay";
import { percentile, type PolicyReport } from "./outcome";
import {
  createPolicy,
  DEFAULT_KV_AWARE,
  type KvAwareConfig,
  KvAwareModel,
  type PolicyName,
  type RoutingPolicy,
} from "./policies";
import { ReplicatedKvAware } from "./replicas";
import { NatsServer } from "./nats-server";
import type { AdmissionMode } from "../route/admission";
import { policyClient, replayRealtime, type RealtimeProgress } from "./realtime";
import { startServeChild, type ServeChild, waitReady, withServeTail } from "./serve-process";
import { engineSeeds, simulate } from "./simulator";
import { approximateEngines, type DemoOptions, type DemoPolicy } from "./demo-options";
import { exactEngines, workersArg } from "./demo-workers";

export interface DemoPolicyResult extends PolicyReport {
  /** How the policy was run: through kvedge, or in-process in virtual / real time. */
  readonly mode: "kvedge" | "in-process, virtual time" | "in-process, real time";
  readonly wall_s: number;
}

export interface RouterReport {
  readonly decisions: number;
  /** Client-measured: WebSocket send → answer, ms. */
  readonly route_latency_p50_ms: number;
  readonly route_latency_p99_ms: number;
  /** Σ overlap_blocks × block size / Σ prompt tokens: the hit rate kvedge expected. */
  readonly predicted_hit_rate: number;
  readonly batches_published: number;
  /** Bytes of msgpack payload the engines published. */
  readonly event_bytes_published: number;
  readonly batches_applied: number;
  readonly batches_replayed: number;
  readonly batches_lost: number;
  readonly gaps: number;
  readonly degraded_workers: number;
  readonly lifecycle_calls: number;
  readonly lifecycle_errors: number;
  /** Blocks kvedge's index holds / the engines cache, at the end. */
  readonly index_blocks: number;
  readonly engine_cached_blocks: number;
  /**
   * Every exact worker's indexed blocks equal its engine's cached ones at the end (both
   * tiers, every copy).
   */
  readonly index_matches_engines: boolean;
  /** The check in detail, over the exact workers (./index-check.ts). */
  readonly index: IndexCheck;
  /**
   * The approximate workers at the end: blocks kvedge predicted, how many of them the
   * engines really held, and how many the engines held.
   */
  readonly predicted: {
    readonly workers: number;
    readonly blocks: number;
    readonly held: number;
    readonly engine_blocks: number;
  };
  /** Model span / wall time of the kvedge replay. */
  readonly achieved_speedup: number;
  /** With replicas: what they shared (null: one kvedge serve). */
  readonly cluster: ClusterReport | null;
}

/** The replicas of a replicated run and their bus (client side of `--replicas N`). */
export interface ClusterReport {
  readonly replicas: number;
  readonly synced: boolean;
  /** Own facts the replicas published, and peers' facts they applied. */
  readonly facts_sent: number;
  readonly facts_received: number;
  /** Bytes the replicas published (facts, heartbeats, snapshots), and per routed request. */
  readonly bytes_sent: number;
  readonly bytes_per_route: number;
  readonly gaps: number;
  /** How late peers' facts arrived (ms, the histogram bucket's upper bound). */
  readonly lag_p50_ms: number;
  readonly lag_p99_ms: number;
}

export interface Gain {
  readonly prefill_tokens_saved_pct: number;
  readonly hit_rate_points: number;
  readonly ttft_p50_change_pct: number;
  readonly ttft_p99_change_pct: number;
}

/** kv_aware's route calls by what admission did with them (route.admission; null when off). */
export interface AdmissionReport {
  readonly mode: AdmissionMode;
  readonly immediate: number;
  readonly held: number;
  readonly released: number;
  readonly overdue: number;
  readonly rejected: number;
  readonly dropped: number;
}

/** One kv_aware run of the tier comparison. */
export interface TierRow {
  readonly hit_rate: number;
  /** Of the prompt tokens, those loaded back from the CPU tier. */
  readonly host_hit_rate: number;
  readonly prefill_tokens: number;
  readonly ttft_p50_ms: number;
  readonly ttft_p99_ms: number;
}

/** With a CPU tier: kv_aware routing on both tiers against the device tier only. */
export interface TierComparison {
  readonly cpu_capacity_blocks: number;
  readonly tier_aware: TierRow;
  readonly device_only: TierRow;
}

export interface DemoResult {
  readonly policies: Record<string, DemoPolicyResult>;
  readonly router: RouterReport | null;
  readonly admission: AdmissionReport | null;
  /** In virtual time: kv_aware's engines against an index fed their events in this process. */
  readonly index: IndexCheck | null;
  /** With `cpuCapacityBlocks`: tier-aware against device-only routing. */
  readonly tiers: TierComparison | null;
  /** With `proxy`: what the proxied run saw. */
  readonly proxy: ProxyReport | null;
  /** The kv-aware row against each baseline (negative TTFT change = faster). */
  readonly gains: Record<string, Gain>;
  readonly wall_s: number;
}

/** Runs every requested policy and collects the results. */
export async function runDemo(options: DemoOptions): Promise<DemoResult> {
  const started = performance.now();
  const policies: Record<string, DemoPolicyResult> = {};
  let router: RouterReport | null = null;
  let proxy: ProxyReport | null = null;
  let admission: AdmissionReport | null = null;
  let index: IndexCheck | null = null;
  const mode = admissionModeOf(options);
  for (const policy of options.policies) {
    // Each run leaves ~100 MB of short-lived token arrays; collect them before the next
    // so peak memory is one run's, not the sum of all.
    Bun.gc(true);
    const phaseStarted = performance.now();
    const timed = (report: PolicyReport, how: DemoPolicyResult["mode"]): DemoPolicyResult => ({
      ...report,
      mode: how,
      wall_s: since(phaseStarted),
    });
    if (options.virtual === true) {
      const run = virtualRun(policy, options);
      policies[policy] = timed(run.report, "in-process, virtual time");
      if (run.admission !== null) admission = { mode, ...run.admission };
      index = run.index ?? index;
    } else if (policy === "kv_aware" && options.proxy === true) {
      const run = await runProxyReplay(options);
      policies[policy] = timed(run.report, "kvedge");
      proxy = run.proxy;
    } else if (policy === "kv_aware" || policy === "kv_aware_unsynced") {
      const run = await runKvedge(options, policy === "kv_aware");
      policies[policy] = timed(run.report, "kvedge");
      if (policy === "kv_aware" || router === null) router = run.router;
      if (mode !== "off" && policy === "kv_aware") admission = { mode, ...run.admission };
    } else if (options.realtimeBaselines) {
      policies[policy] = timed(
        await runInProcessRealtime(policy, options),
        "in-process, real time",
      );
    } else {
      policies[policy] = timed(virtualRun(policy, options).report, "in-process, virtual time");
    }
  }
  const tiers = await compareTiers(options, policies.kv_aware);
  const wall = (performance.now() - started) / 1000;
  const gains = gainsOf(policies);
  return { policies, router, index, tiers, proxy, admission, gains, wall_s: wall };
}

/**
 * kvedge's router in virtual time: kv_aware predicts the engines that publish no events;
 * kv_aware_model (exact knowledge) predicts nothing.
 */
function virtualKvAware(policy: DemoPolicy, options: DemoOptions): KvAwareConfig {
  if (policy !== "kv_aware") return options.kvAware ?? DEFAULT_KV_AWARE;
  const approximate = approximateOf(options);
  return {
    ...(options.kvAware ?? DEFAULT_KV_AWARE),
    approximate,
    predictions: {
      capacityBlocks: options.predictedCapacityBlocks ?? options.capacityBlocks,
      correct: options.correct ?? true,
    },
  };
}

const since = (startedMs: number): number => (performance.now() - startedMs) / 1000;

/**
 * One policy replayed in virtual time: kvedge's router for kv_aware (as replicas, synced
 * or not, with `options.replicas`; predicting the engines that publish nothing;
 * `lowerTiers` false: on their device tier only), else the baseline. kv_aware's exact
 * engines also feed an index of this process through kvedge's ingest, checked against
 * them at the end.
 */
function virtualRun(
  policy: DemoPolicy,
  options: DemoOptions,
  lowerTiers = true,
): {
  report: PolicyReport;
  admission: Omit<AdmissionReport, "mode"> | null;
  index: IndexCheck | null;
} {
  options.progress?.(`${policy}: replaying in virtual time…`);
  const kvedge = policy === "kv_aware" || policy === "kv_aware_unsynced";
  const kvAware = kvedge
    ? replicated(virtualKvAware("kv_aware", options), options, policy === "kv_aware")
    : virtualKvAware(policy, options);
  const approximate = new Set(approximateOf(options));
  const exact = Array.from({ length: options.workers }, (_, w) => w).filter(
    (w) => !approximate.has(w),
  );
  const events =
    policy === "kv_aware" && exact.length > 0
      ? new EventIndex(options.workers, options.blockSize)
      : null;
  let admission: Omit<AdmissionReport, "mode"> | null = null;
  let index: IndexCheck | null = null;
  const report = simulate(options.trace, {
    policy: kvedge ? "kv_aware_model" : (policy as PolicyName),
    workers: options.workers,
    capacityBlocks: options.capacityBlocks,
    cpuCapacityBlocks: options.cpuCapacityBlocks,
    blockSize: options.blockSize,
    time: options.time,
    seed: options.seed,
    vocabSize: options.vocabSize,
    // A real-time demo's baselines run as they always did: without kvedge's settings.
    ...(options.virtual === true ? { kvAware: { ...kvAware, lowerTiers } } : {}),
    ...(events === null
      ? {}
      : {
          onBatch: (worker, batch) => {
            if (!approximate.has(worker)) events.apply(worker, batch);
          },
          onEngines: (engines) => {
            index = events.check(
              engines.map((engine) => engine.cache),
              exact,
            );
          },
        }),
    ...(options.streamCut === undefined ? {} : { streamCut: options.streamCut }),
    onFinish: (finished) => {
      if (policy === "kv_aware") admission = admissionOf(finished);
    },
  });
  options.progress?.("");
  return { report, admission, index };
}

/** With a CPU tier: kv_aware once more, routing on the device tier only, against the run above. */
async function compareTiers(
  options: DemoOptions,
  tierAware: PolicyReport | undefined,
): Promise<TierComparison | null> {
  if (options.cpuCapacityBlocks === 0 || tierAware === undefined) return null;
  Bun.gc(true);
  let deviceOnly: PolicyReport;
  if (options.virtual === true) deviceOnly = virtualRun("kv_aware", options, false).report;
  else {
    const serveArgs = [...options.serveArgs, "--no-lower-tiers"];
    const name = "kv_aware (device tier only)";
    deviceOnly = (await runKvedge({ ...options, serveArgs }, true, name)).report;
  }
  const row = (report: PolicyReport): TierRow => ({
    hit_rate: report.hit_rate,
    host_hit_rate:
      report.prompt_tokens === 0 ? 0 : report.host_cached_tokens / report.prompt_tokens,
    prefill_tokens: report.prefill_tokens,
    ttft_p50_ms: report.ttft_p50_ms,
    ttft_p99_ms: report.ttft_p99_ms,
  });
  return {
    cpu_capacity_blocks: options.cpuCapacityBlocks,
    tier_aware: row(tierAware),
    device_only: row(deviceOnly),
  };
}

/** kv_aware's router settings in virtual time, as `options.replicas` replicas, synced or not. */
function replicated(base: KvAwareConfig, options: DemoOptions, synced: boolean): KvAwareConfig {
  const replicas = options.replicas ?? 1;
  if (replicas <= 1) return base;
  return synced
    ? {
        ...base,
        replicas,
        syncDelayMs: options.syncDelayMs ?? 0,
        staggerMs: options.staggerMs ?? 0,
      }
    : { ...base, replicas, syncDelayMs: null };
}

/** What admission did in a virtual replay (summed over replicas); null when off. */
function admissionOf(finished: RoutingPolicy): Omit<AdmissionReport, "mode"> | null {
  const models =
    finished instanceof ReplicatedKvAware
      ? finished.replicas
      : finished instanceof KvAwareModel
        ? [finished]
        : [];
  let sum: Record<string, number> | null = null;
  for (const model of models) {
    if (model.admission === null) continue;
    sum ??= {};
    for (const [key, value] of Object.entries(model.admission.counts))
      sum[key] = (sum[key] ?? 0) + value;
  }
  return sum as Omit<AdmissionReport, "mode"> | null;
}

/** Whether kvedge may answer a route later (admission, pacing): the replay then does not wait for it. */
function mayHold(options: DemoOptions): boolean {
  return admissionModeOf(options) !== "off" || options.kvAware?.pacing?.mode === "on";
}

function admissionModeOf(options: DemoOptions): AdmissionMode {
  return options.kvAware?.admission?.mode ?? "off";
}

/**
 * How long the real-time replay holds its engines for a route's answer when kvedge may
 * hold routes (wall ms): a held route waits for a worker to free, which held engines
 * would never do.
 */
const HELD_ANSWER_WAIT_MS = 10;

/** The kv-aware row (kvedge, else the in-process model) against every other policy. */
export function gainsOf(policies: Record<string, PolicyReport>): Record<string, Gain> {
  const kv = policies.kv_aware ?? policies.kv_aware_model;
  if (kv === undefined) return {};
  const gains: Record<string, Gain> = {};
  for (const [name, other] of Object.entries(policies)) {
    // Every other row, kvedge's unsynced replicas included (what the bus buys).
    if (other === kv || (name.startsWith("kv_aware") && name !== "kv_aware_unsynced")) continue;
    gains[name] = {
      prefill_tokens_saved_pct: pct(other.prefill_tokens - kv.prefill_tokens, other.prefill_tokens),
      hit_rate_points: 100 * (kv.hit_rate - other.hit_rate),
      ttft_p50_change_pct: pct(kv.ttft_p50_ms - other.ttft_p50_ms, other.ttft_p50_ms),
      ttft_p99_change_pct: pct(kv.ttft_p99_ms - other.ttft_p99_ms, other.ttft_p99_ms),
    };
  }
  return gains;
}

const pct = (part: number, whole: number): number => (whole === 0 ? 0 : (100 * part) / whole);

async function startEngines(options: DemoOptions, withReplay: boolean): Promise<NetworkedEngine[]> {
  const seeds = engineSeeds(options.seed, options.workers);
  const silent = new Set(approximateEngines(options.events ?? "all", options.workers));
  const engines: NetworkedEngine[] = [];
  try {
    for (let w = 0; w < options.workers; w++) {
      engines.push(
        await new NetworkedEngine({
          index: w,
          capacityBlocks: options.capacityBlocks,
          blockSize: options.blockSize,
          hashSeed: seeds[w]!,
          cpuCapacityBlocks: options.cpuCapacityBlocks,
          time: options.time,
          endpoint: "tcp://127.0.0.1:0",
          replayEndpoint: withReplay ? "tcp://127.0.0.1:0" : null,
          form: options.form,
          silent: silent.has(w),
        }).start(),
      );
    }
  } catch (error) {
    await Promise.all(engines.map((engine) => engine.close()));
    throw error;
  }
  return engines;
}

function progressLine(name: string, progress: RealtimeProgress, startedMs: number): string {
  const width = 24;
  const fraction = progress.total === 0 ? 1 : progress.routed / progress.total;
  const filled = Math.round(fraction * width);
  const wall = (performance.now() - startedMs) / 1000;
  const speed = wall > 0 ? progress.modelMs / 1000 / wall : 0;
  return (
    `${name.padEnd(14)} [${"#".repeat(filled)}${".".repeat(width - filled)}] ${progress.routed}/${progress.total} requests` +
    `  model ${clock(progress.modelMs)}/${clock(progress.spanMs)}  ×${speed.toFixed(1)}  ${wall.toFixed(0)} s`
  );
}

function clock(ms: number): string {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  return `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
}

/**
 * kv_aware through real `kvedge serve` processes: one, or `options.replicas` of them,
 * request i to replica i mod N; `synced`, they share their facts over a local
 * nats-server (bound to 127.0.0.1), else each decides on its own load.
 */
async function runKvedge(
  options: DemoOptions,
  synced: boolean,
  name = synced ? "kv_aware" : "kv_aware_unsynced",
): Promise<KvedgeRun> {
  const engines = await startEngines(options, true);
  const fleet: Replicas = { serves: [], nats: null };
  const clients: KvedgeClient[] = [];
  try {
    await startReplicas(options, engines, fleet, name, synced);
    for (const serve of fleet.serves) clients.push(await KvedgeClient.connect(serve.url));
    const workerIds = engines.map((_, w) => String(w));
    // Approximate workers hear what their engines served from cache (prefill_done's cached_tokens).
    const reportCached = (options.correct ?? true) && approximateOf(options).length > 0;
    const count = options.trace.count;
    const { router, stats } = kvedgeRouter(clients, workerIds, count, "demo-", reportCached);
    const startedMs = performance.now();
    const run = await replayRealtime(name, {
      trace: options.trace,
      engines,
      router,
      speedup: options.speedup,
      blockSize: options.blockSize,
      vocabSize: options.vocabSize,
      ...(mayHold(options) ? { answerWaitMs: HELD_ANSWER_WAIT_MS } : {}),
      ...(options.progress === null
        ? {}
        : {
            progress: (p: RealtimeProgress) => options.progress!(progressLine(name, p, startedMs)),
          }),
    });
    options.progress?.("");
    for (const client of clients) await client.settle();
    const urls = fleet.serves.map((serve) => serve.url);
    const routerReport = await routerSide(urls, engines, workerIds, clients, stats, options);
    const metrics = await Promise.all(
      urls.map(async (url) => (await fetch(`${url}/metrics`)).text()),
    );
    const replicas = urls.length;
    const cluster = replicas > 1 ? clusterReport(metrics, synced, routerReport.decisions) : null;
    return {
      report: run.report,
      router: { ...routerReport, achieved_speedup: run.achievedSpeedup, cluster },
      admission: admissionCounts(metrics),
    };
  } catch (error) {
    throw withServeTail(error, fleet.serves[0] ?? null);
  } finally {
    for (const client of clients) client.close();
    await Promise.all(fleet.serves.map((serve) => serve.stop()));
    await fleet.nats?.close();
    await Promise.all(engines.map((engine) => engine.close()));
  }
}

/** The kvedge serve processes of a run, and their nats-server (null: none). */
interface Replicas {
  readonly serves: ServeChild[];
  nats: NatsServer | null;
}

/** Starts the replicas (and, synced with several, their nats-server) into `fleet`; waits until ready. */
async function startReplicas(
  options: DemoOptions,
  engines: readonly NetworkedEngine[],
  fleet: Replicas,
  name: string,
  synced: boolean,
): Promise<void> {
  const replicas = options.replicas ?? 1;
  if (synced && replicas > 1) {
    options.progress?.(`${name}: starting nats-server…`);
    fleet.nats = await NatsServer.start();
  }
  options.progress?.(`${name}: starting ${replicas > 1 ? `${replicas} × ` : ""}kvedge serve…`);
  for (let i = 0; i < replicas; i++) {
    const cluster =
      fleet.nats === null
        ? []
        : ["--cluster-nats", fleet.nats.url, "--cluster-replica-id", `r${i}`].concat([
            "--cluster-stagger-ms",
            String(options.staggerMs ?? 0),
          ]);
    fleet.serves.push(
      await startServeChild({
        args: [
          ...["--workers", workersArg(engines, options, null)],
          ...["--block-size", String(options.blockSize), "--log-level", "info"],
          ...cluster,
          ...options.serveArgs,
        ],
        ...(options.kvedgeCommand === undefined ? {} : { command: options.kvedgeCommand }),
      }),
    );
  }
  const exact = exactEngines(engines, options);
  for (const serve of fleet.serves) await waitReady(serve.url, exact, replicas);
}

/** What the replicas' bus carried, from their /metrics. */
function clusterReport(
  metrics: readonly string[],
  synced: boolean,
  decisions: number,
): ClusterReport {
  const sum = (name: string, match: string) =>
    metrics.reduce((total, text) => total + metricSum(text, name, match), 0);
  const bytes = sum("kvedge_cluster_bytes_total", 'direction="sent"');
  return {
    replicas: metrics.length,
    synced,
    facts_sent: sum("kvedge_cluster_facts_total", 'direction="sent"'),
    facts_received: sum("kvedge_cluster_facts_total", 'direction="received"'),
    bytes_sent: bytes,
    bytes_per_route: decisions === 0 ? 0 : bytes / decisions,
    gaps: sum("kvedge_cluster_events_total", 'event="gap"'),
    lag_p50_ms: lagQuantile(metrics, 0.5),
    lag_p99_ms: lagQuantile(metrics, 0.99),
  };
}

/** A quantile of the replicas' fact lag, as the upper bound of its histogram bucket (ms). */
function lagQuantile(metrics: readonly string[], q: number): number {
  const counts = new Map<number, number>();
  for (const text of metrics) {
    for (const line of text.split("\n")) {
      const match = /^kvedge_cluster_fact_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$/.exec(line);
      if (match === null) continue;
      const le = match[1] === "+Inf" ? Infinity : Number(match[1]);
      counts.set(le, (counts.get(le) ?? 0) + Number(match[2]));
    }
  }
  const bounds = [...counts.keys()].sort((a, b) => a - b);
  const total = counts.get(Infinity) ?? 0;
  for (const le of bounds) if (total > 0 && counts.get(le)! >= q * total) return le * 1000;
  return 0;
}

interface KvedgeRun {
  readonly report: PolicyReport;
  readonly router: RouterReport;
  readonly admission: Omit<AdmissionReport, "mode">;
}

/** kvedge serve's admission counts, from its /metrics (summed over replicas). */
function admissionCounts(metrics: readonly string[]): Omit<AdmissionReport, "mode"> {
  const count = (outcome: string) =>
    metrics.reduce(
      (sum, text) => sum + metricSum(text, "kvedge_admission_total", `outcome="${outcome}"`),
      0,
    );
  return {
    immediate: count("immediate"),
    held: count("held"),
    released: count("released"),
    overdue: count("overdue"),
    rejected: count("rejected"),
    dropped: count("dropped"),
  };
}

/** Waits for /readyz and for every engine to see its subscriber (nothing published is lost). */
interface WorkerJson {
  readonly worker_id: string;
  readonly degraded: boolean;
  readonly blocks: number;
  readonly last_seq: number;
  readonly lost_batches: number;
}

async function getJson<T>(url: string): Promise<T> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`GET ${url}: HTTP ${response.status}`);
  return (await response.json()) as T;
}

/** Sums a Prometheus counter's samples whose labels contain `match`. */
function metricSum(text: string, name: string, match = ""): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (!line.includes(match)) continue;
    sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

/** The engines that publish no events in this demo. */
function approximateOf(options: DemoOptions): number[] {
  return approximateEngines(options.events ?? "all", options.workers);
}

/**
 * kvedge's side of the run: each replica's index against the engines' caches (every one
 * must match), ingest counters from the first, client-measured latencies and lifecycle calls.
 */
async function routerSide(
  urls: readonly string[],
  engines: readonly NetworkedEngine[],
  workerIds: readonly string[],
  clients: readonly KvedgeClient[],
  stats: ReturnType<typeof kvedgeRouter>["stats"],
  options: DemoOptions,
): Promise<Omit<RouterReport, "achieved_speedup" | "cluster">> {
  const approximate = new Set(approximateOf(options));
  let first: ({ workers: WorkerJson[] } & Awaited<ReturnType<typeof indexAgainstEngines>>) | null =
    null;
  let matches = true;
  for (const url of urls) {
    const workers = await caughtUp(url, engines, workerIds, approximate);
    const compared = await indexAgainstEngines(url, engines, workerIds, approximate);
    matches &&= compared.check.index_matches_engines;
    first ??= { workers, ...compared };
  }
  const { workers, check, predicted } = first!;
  const metrics = await (await fetch(`${urls[0]}/metrics`)).text();
  let overlapTokens = 0;
  let promptTokens = 0;
  for (let i = 0; i < stats.overlapBlocks.length; i++) {
    overlapTokens += stats.overlapBlocks[i]! * options.blockSize;
    promptTokens += stats.promptTokens[i]!;
  }
  const latencies = Float64Array.from(
    stats.latencyMs.filter((value) => !Number.isNaN(value)),
  ).sort();
  const lifecycle = (read: (client: KvedgeClient) => number) =>
    clients.reduce((sum, client) => sum + read(client), 0);
  return {
    decisions: latencies.length,
    route_latency_p50_ms: percentile(latencies, 0.5),
    route_latency_p99_ms: percentile(latencies, 0.99),
    predicted_hit_rate: promptTokens === 0 ? 0 : overlapTokens / promptTokens,
    batches_published: engines.reduce((sum, engine) => sum + engine.counters.batches, 0),
    event_bytes_published: engines.reduce((sum, engine) => sum + engine.counters.bytes, 0),
    batches_applied: metricSum(metrics, "kvedge_ingest_batches_total", 'status="applied"'),
    batches_replayed: metricSum(metrics, "kvedge_ingest_batches_total", 'status="replayed"'),
    batches_lost: workers.reduce((sum, view) => sum + view.lost_batches, 0),
    gaps: metricSum(metrics, "kvedge_ingest_gaps_total"),
    degraded_workers: workers.filter((view) => view.degraded).length,
    lifecycle_calls: lifecycle((client) => client.counters.lifecycleCalls),
    lifecycle_errors: lifecycle((client) => client.counters.lifecycleErrors),
    index_blocks: workers.reduce(
      (sum, view) => sum + (approximate.has(Number(view.worker_id)) ? 0 : view.blocks),
      0,
    ),
    engine_cached_blocks: check.engine_cached_blocks,
    index_matches_engines: matches,
    index: check,
    predicted,
  };
}

/** /v1/workers once kvedge has applied every exact engine's last batch (or after 10 s). */
async function caughtUp(
  url: string,
  engines: readonly NetworkedEngine[],
  workerIds: readonly string[],
  approximate: ReadonlySet<number>,
): Promise<WorkerJson[]> {
  const deadline = performance.now() + 10_000;
  for (;;) {
    const workers = (await getJson<{ workers: WorkerJson[] }>(`${url}/v1/workers`)).workers;
    const done = engines.every(
      (engine, w) =>
        approximate.has(w) ||
        workers.find((view) => view.worker_id === workerIds[w])?.last_seq === engine.lastSeq,
    );
    if (done || performance.now() > deadline) return workers;
    await Bun.sleep(20);
  }
}

/** kvedge's index (its dump) against the exact engines' caches, and its predictions of the others. */
async function indexAgainstEngines(
  url: string,
  engines: readonly NetworkedEngine[],
  workerIds: readonly string[],
  approximate: ReadonlySet<number>,
): Promise<{ check: IndexCheck; predicted: RouterReport["predicted"] }> {
  const dump = await (await fetch(`${url}/v1/dump`)).text();
  const ops = dump
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as IndexOp);
  const exact = engines.map((_, w) => w).filter((w) => !approximate.has(w));
  const check = checkIndex(
    ops,
    exact.map((w) => engines[w]!.engine.cache),
    exact.map((w) => workerIds[w]!),
  );
  return { check, predicted: predictedAgainstEngines(ops, engines, workerIds, approximate) };
}

/**
 * The approximate workers' predictions at the end against what their engines really
 * hold (predicted blocks are named by their sequence hash, an engine block's `path`).
 */
function predictedAgainstEngines(
  ops: readonly IndexOp[],
  engines: readonly NetworkedEngine[],
  workerIds: readonly string[],
  approximate: ReadonlySet<number>,
): RouterReport["predicted"] {
  const held = heldOf(ops);
  const predicted = { workers: approximate.size, blocks: 0, held: 0, engine_blocks: 0 };
  for (const w of approximate) {
    const snapshot = engines[w]!.engine.cache.snapshot();
    const paths = new Set(snapshot.map((block) => `device ${block.path}`));
    const indexed = held.get(workerIds[w]!) ?? new Map<string, number>();
    predicted.blocks += indexed.size;
    predicted.engine_blocks += snapshot.length;
    for (const key of indexed.keys()) if (paths.has(key)) predicted.held++;
  }
  return predicted;
}

async function runInProcessRealtime(
  policy: Exclude<DemoPolicy, "kv_aware">,
  options: DemoOptions,
): Promise<PolicyReport> {
  const engines = await startEngines(options, false);
  try {
    const routing = createPolicy(policy as PolicyName, {
      workers: options.workers,
      blockSize: options.blockSize,
      seed: options.seed,
      probe: (worker, query) =>
        engines[worker]!.engine.cache.visiblePrefixBlocks(query.tokens, query.promptLength),
    });
    const startedMs = performance.now();
    const run = await replayRealtime(policy, {
      trace: options.trace,
      engines,
      router: policyClient(routing),
      speedup: options.speedup,
      blockSize: options.blockSize,
      vocabSize: options.vocabSize,
      ...(options.progress === null
        ? {}
        : {
            progress: (p: RealtimeProgress) =>
              options.progress!(progressLine(policy, p, startedMs)),
          }),
    });
    options.progress?.("");
    return run.report;
  } finally {
    await Promise.all(engines.map((engine) => engine.close()));
  }
}
