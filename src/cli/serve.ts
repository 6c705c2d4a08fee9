import { ConfigError, configFlagSpecs, flagHelp, loadConfig, renderConfig } from "../config";
import { numaNodeCpus, pinProcess } from "../runtime/affinity";
import { startApp } from "../server/app";
import { RouteLanes } from "../server/lanes";
import { planThreads, type ThreadPlan } from "../runtime/threads";
import { WriterThread } from "../runtime/writer-thread";
import { registerThreadMetrics } from "../runtime/metrics";
import { defaultIndexBudgetBytes } from "../index/budget";
import type { Config } from "../config";
import { bufferBudget } from "../util/buffer-budget";
import { warmUp } from "../server/warmup";
import { warmUpProxy } from "../proxy/warmup";
import {
  registerClusterMetrics,
  registerCoreMetrics,
  registerRouterMetrics,
} from "../server/metrics";
import { createMetricsRegistry, type MetricsRegistry } from "../util/metrics";
import { KvedgeCore } from "../core/core";
import { Cluster } from "../cluster/cluster";
import { registerObservedHitsMetrics, registerProxyMetrics } from "../proxy/metrics";
import { Preparer } from "../proxy/preparer";
import { OpenAiProxy, prepareOptionsOf, proxyOptionsOf, servedModel } from "../proxy/proxy";
import { loadTokenizer, type PromptTokenizer, TokenizerError } from "../proxy/tokenizer";
import { loadSnapshot, PeriodicSnapshots, restoreRequests, saveSnapshot } from "../state/warm";
import { openStateDir, type StateDir, StateDirError } from "../state/dir";
import { createLogger, type Logger } from "../util/log";
import { flagBool, parseFlags, UsageError } from "./args";
import { type Command, HELP_FLAG } from "./command";

const flags = {
  ...HELP_FLAG,
  ...configFlagSpecs(),
  "print-config": { kind: "boolean" },
} as const;

/** How long in-flight requests get to finish after SIGINT/SIGTERM. */
const SHUTDOWN_GRACE_MS = 3_000;
/** After the grace, how long the proxied streams kvedge cuts get to close before the rest is. */
const PROXY_CUT_MS = 500;
/** How long after stopping the process may linger (its last log lines being written). */
const EXIT_LINGER_MS = 1_000;

export const serveCommand: Command = {
  name: "serve",
  summary:
    "run the router: subscribe to engines, keep the index, answer routing requests over HTTP",
  flags,
  help: `Usage: kvedge serve [--config FILE] [--workers LIST] [options]

Subscribes to every engine's KV-event publisher (ZeroMQ), keeps the global index of
cached blocks, and serves the HTTP/WebSocket API (POST /v1/route, /v1/match, …) on
--host:--port. Settings come from defaults, then the TOML file, then KVEDGE_*
environment variables, then flags; an invalid setting stops the start with one line
naming it. Logs are JSON lines on stderr (pretty on a terminal). SIGINT/SIGTERM stop
it gracefully.

Options:
${flagHelp()}  --print-config         print the resolved settings and where each came from, then exit
  -h, --help             show this help

Example:
  kvedge serve --workers "1=tcp://10.0.0.5:5557;replay=tcp://10.0.0.5:5558,2=tcp://10.0.0.6:5557"
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (parsed.positionals.length > 0)
      throw new UsageError(`unexpected argument '${parsed.positionals[0]}'`);
    let loaded: ReturnType<typeof loadConfig>;
    try {
      loaded = loadConfig({ flags: parsed.flags });
    } catch (error) {
      if (error instanceof ConfigError) {
        process.stderr.write(`kvedge serve: ${error.message}\n`);
        return 2;
      }
      throw error;
    }
    if (flagBool(parsed, "print-config")) {
      process.stdout.write(renderConfig(loaded));
      return 0;
    }
    const { config } = loaded;
    const format = config.server.log_format === "auto" ? undefined : config.server.log_format;
    const log = createLogger({
      level: config.server.log_level,
      ...(format === undefined ? {} : { format }),
    });
    for (const warning of loaded.warnings) log.warn(warning);
    // Before anything slow: routing on other tokens than the engine's would give no hits, silently.
    let tokenizer: PromptTokenizer | null = null;
    if (config.proxy.enabled && config.proxy.tokenizer !== null) {
      try {
        tokenizer = loadTokenizer(config.proxy.tokenizer);
      } catch (error) {
        if (!(error instanceof TokenizerError)) throw error;
        process.stderr.write(`kvedge serve: proxy.tokenizer: ${error.message}\n`);
        return 2;
      }
    } else if (config.proxy.enabled) {
      log.warn(
        "proxy without a tokenizer: only /v1/completions with token-id prompts are accepted; text is refused (set proxy.tokenizer)",
      );
    }

    const state = openState(config.state.dir, log);
    if (typeof state === "number") return state;
    const stopping = new StopRequest(); // before anything opens (see there)
    const plan = pinAndPlan(config, log);

    await warmUpBeforeListening(config, tokenizer, plan, log);
    bufferBudget.limitBytes = config.server.buffer_budget_bytes;
    const writer = plan.indexThreads === 0 ? null : await startWriter(config, plan);
    const core = new KvedgeCore({ config, log, ...(writer === null ? {} : { writer }) });
    const proxy = config.proxy.enabled ? await startProxy(config, core, tokenizer, log) : null;
    const stateDir = state?.path ?? null;
    const stateLog = log.child({ component: "state" });
    const saved = stateDir === null ? null : loadSnapshot(core, stateDir, config.workers, stateLog);
    await core.start(); // snapshot and sources before the port opens (docs/operations.md)
    // The peers' sets name workers: joined once the configured ones are known.
    const cluster = await startCluster(config, core, log);
    if (cluster === "failed") return stopped(2, null, core, writer);
    if (saved !== null) restoreRequests(core, saved, stateLog);
    const registry = metricsOf(core, proxy, plan, writer, cluster);
    let serving: Serving;
    try {
      serving = await listen(config, plan, { core, writer, registry, proxy, cluster }, log);
    } catch (error) {
      process.stderr.write(`kvedge serve: ${(error as Error).message}\n`);
      return stopped(1, cluster, core, writer);
    }
    const periodic = stateDir === null ? null : new PeriodicSnapshots(core, stateDir, stateLog);
    const snapshots =
      periodic === null
        ? null
        : setInterval(() => void periodic.tick(), config.state.snapshot_interval_secs * 1000);
    log.info("listening", {
      ...whereServing(serving, proxy !== null, writer),
      block_size: config.index.block_size,
      backend: config.index.backend,
      workers: config.workers.length,
    });

    const signal = await stopping.reason(writer, log);
    await stopServing(serving, proxy, log);
    if (snapshots !== null) clearInterval(snapshots);
    await periodic?.idle();
    if (stateDir !== null && (await saveSnapshot(core, stateDir, stateLog)))
      log.info("snapshot written", { dir: stateDir });
    await stopped(0, cluster, core, writer);
    log.info("stopped");
    return exitSoon(signal === "writer_failed" ? 1 : 0);
  },
};

/**
 * The hot paths run on scratch pieces before listening, so the first real requests run
 * compiled code (docs/decisions.md#warm-up): routes, and with the proxy its path as this
 * thread carries it (a lane's I/O is each lane's: src/server/lane.ts warms that).
 * Only an optimization: a failure is logged and kvedge serves cold rather than not at all.
 */
async function warmUpBeforeListening(
  config: Config,
  tokenizer: PromptTokenizer | null,
  plan: ThreadPlan,
  log: Logger,
): Promise<void> {
  const failed = (error: unknown) =>
    log.error("warm-up failed; serving without it", {
      error: error instanceof Error ? error.message : String(error),
    });
  try {
    const warm = warmUp(config, config.server.warmup_routes);
    if (warm.routes > 0) log.info("warmed up", { routes: warm.routes, ms: Math.round(warm.ms) });
  } catch (error) {
    failed(error);
  }
  if (!config.proxy.enabled) return;
  try {
    const warm = await warmUpProxy({
      config,
      requests: config.proxy.warmup_streams,
      tokenizer,
      paths: plan.routeThreads > 0 ? ["lane"] : ["local"],
    });
    if (warm.requests > 0)
      log.info("warmed up", { proxy_requests: warm.requests, ms: Math.round(warm.ms) });
  } catch (error) {
    failed(error);
  }
}

/**
 * `code`, and the process ends with it a moment later: connections to engines given up on
 * may still be with the kernel (src/http/client.ts) and must not keep it. Not needed
 * otherwise: the timer does not hold the process.
 */
function exitSoon(code: number): number {
  setTimeout(() => process.exit(code), EXIT_LINGER_MS).unref();
  return code;
}

/** The OpenAI proxy, its tokenizer threads started (`tokenizer` loaded already, or null). */
async function startProxy(
  config: Config,
  core: KvedgeCore,
  tokenizer: PromptTokenizer | null,
  log: Logger,
): Promise<OpenAiProxy> {
  const settings = config.proxy;
  const model = servedModel(config, tokenizer);
  const proxyLog = log.child({ component: "proxy" });
  const adapters = core.lora.adapters.map((adapter) => adapter.name);
  const options = prepareOptionsOf(config, model, adapters);
  const threads = settings.tokenizer === null ? 0 : settings.tokenizer_threads;
  const preparer = await Preparer.start(options, tokenizer, settings.tokenizer, threads, proxyLog);
  const proxy = new OpenAiProxy(proxyOptionsOf(config, core, preparer, proxyLog));
  const missing = config.workers
    .filter((worker) => worker.http_endpoint == null)
    .map((worker) => worker.worker_id.toString());
  if (missing.length > 0)
    log.warn("workers without an http_endpoint are never proxied to", {
      workers: missing.join(","),
    });
  log.info("proxy enabled", {
    model,
    tokenizer: settings.tokenizer,
    vocab_size: tokenizer?.vocabSize ?? null,
    tokenizer_threads: preparer.threads,
  });
  return proxy;
}

/**
 * Stops serving: no new connections, in-flight requests get the grace period; then
 * the proxied requests still running are ended (engine connections closed, their
 * streams cut), and what is left is closed.
 */
async function stopServing(
  serving: Serving,
  proxy: OpenAiProxy | null,
  log: Logger,
): Promise<void> {
  const cut = () => {
    const ended = proxy?.stop() ?? 0;
    if (ended > 0) log.info("ended proxied requests still running", { requests: ended });
  };
  const timer = setTimeout(cut, SHUTDOWN_GRACE_MS);
  await serving.stop(SHUTDOWN_GRACE_MS + PROXY_CUT_MS);
  clearTimeout(timer);
  cut();
  await proxy?.preparer.stop();
}

/**
 * The state directory, checked, locked and cleaned before anything starts; null without
 * state.dir; an exit code after a one-line refusal (2: unusable, 1: another process has it).
 */
function openState(path: string | null, log: Logger): StateDir | null | number {
  if (path === null) return null;
  try {
    const state = openStateDir(path);
    const fields = { dir: path, stale_temp_files_removed: state.staleRemoved };
    if (!state.locked)
      log.warn("state.dir is not locked: flock needs glibc; one process per directory", fields);
    else if (state.staleRemoved > 0) log.info("state directory locked", fields);
    return state;
  } catch (error) {
    if (!(error instanceof StateDirError)) throw error;
    process.stderr.write(`kvedge serve: ${error.message}\n`);
    return error.busy ? 1 : 2;
  }
}

/** The loopback address of `host`'s family: the main thread's own server, behind lanes. */
function loopbackOf(host: string): string {
  return host.includes(":") ? "::1" : "127.0.0.1";
}

function urlOf(host: string, port: number): string {
  return `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
}

/** Event ring size: a few hundred ms of a busy fleet's batches; past it, drops (and replays). */
const RING_BYTES = 64 * 1024 * 1024;

function startWriter(config: Config, plan: ThreadPlan): Promise<WriterThread> {
  return WriterThread.start({
    ringBytes: RING_BYTES,
    cpus: plan.writerCpus,
    blockSize: config.index.block_size,
    backend: "crtc",
    budgetBytes: config.index.memory_budget_bytes ?? defaultIndexBudgetBytes(),
    sequencer: {
      replayTimeoutMs: config.ingest.replay_timeout_ms,
      replayDeadlineMs: config.ingest.replay_deadline_ms,
      replayBufferBytes: config.ingest.replay_buffer_bytes,
      idleProbeMs: config.ingest.idle_probe_ms,
    },
    loraAdapters: config.index.lora_adapters,
    logLevel: config.server.log_level,
    // The main thread and every lane may read at once.
    sharedReaders: 1 + plan.routeThreads,
  });
}

interface Serving {
  readonly url: string;
  /** Where the control plane is served: `url`, or the control listener with the proxy. */
  readonly controlUrl: string;
  readonly lanes: RouteLanes | null;
  stop(graceMs: number): Promise<void>;
}

/**
 * The HTTP server, and the route lanes: with lanes, they own the public port and the
 * main thread's server listens on loopback only, for what the lanes pass on. With the
 * proxy, the public port serves only the OpenAI endpoints and health; everything else
 * is the control listener's (src/server/surface.ts): with lanes, the main thread's
 * server is that listener.
 */
interface Serves {
  readonly core: KvedgeCore;
  readonly writer: WriterThread | null;
  readonly registry: MetricsRegistry;
  readonly proxy: OpenAiProxy | null;
  readonly cluster: Cluster | null;
}

async function listen(
  config: Config,
  plan: ThreadPlan,
  serves: Serves,
  log: Logger,
): Promise<Serving> {
  const { core, writer, registry, proxy, cluster } = serves;
  const { server } = config;
  const lanesOn = plan.routeThreads > 0;
  const control = proxy === null ? null : { host: server.control_host, port: server.control_port };
  const mainAt = lanesOn
    ? (control ?? { host: loopbackOf(server.host), port: 0 })
    : { host: server.host, port: server.port };
  const app = startApp({
    ...mainAt,
    control: lanesOn ? null : control,
    bodyLimitBytes: server.body_limit_bytes,
    adminToken: server.admin_token,
    core,
    registry,
    log: log.child({ component: "http" }),
    proxy,
    cluster,
  });
  if (!lanesOn) {
    const stop = (graceMs: number) => app.stop(graceMs);
    return { url: app.url, controlUrl: app.controlUrl, lanes: null, stop };
  }
  let lanes: RouteLanes;
  try {
    lanes = await RouteLanes.start({
      host: server.host,
      port: server.port,
      mainUrl: reachable(app.url),
      bodyLimitBytes: server.body_limit_bytes,
      core,
      metrics: app.metrics,
      log: log.child({ component: "lanes" }),
      cpus: plan.laneCpus,
      index: writer?.descriptor ?? null,
      surface: proxy === null ? "all" : "proxy",
      proxy,
      warmup: proxy === null ? null : laneWarmup(config),
    });
  } catch (error) {
    await app.stop(0);
    throw new Error(`cannot start the route lanes: ${(error as Error).message}`);
  }
  return {
    url: urlOf(server.host, lanes.port),
    controlUrl: proxy === null ? urlOf(server.host, lanes.port) : app.url,
    lanes,
    async stop(graceMs) {
      await lanes.stop(graceMs);
      await app.stop(graceMs);
    },
  };
}

/** What each lane warms its proxied path with (its scratch core's settings, no workers). */
function laneWarmup(config: Config) {
  return { streams: config.proxy.warmup_streams, config: { ...config, workers: [] } };
}

/** Leaves the cluster, stops the core and the writer thread; returns `code`. */
async function stopped(
  code: number,
  cluster: Cluster | null,
  core: KvedgeCore,
  writer: WriterThread | null,
): Promise<number> {
  await cluster?.stop();
  await core.stop();
  await writer?.stop();
  return code;
}

/**
 * With cluster.nats_url: joins the other processes of the fleet before the port opens
 * (bounded; src/cluster/cluster.ts). A client option that cannot be read stops the start.
 */
async function startCluster(
  config: Config,
  core: KvedgeCore,
  log: Logger,
): Promise<Cluster | null | "failed"> {
  if (config.cluster.nats_url === null) return null;
  try {
    return await Cluster.start(config.cluster, core, log.child({ component: "cluster" }));
  } catch (error) {
    process.stderr.write(`kvedge serve: cluster: ${(error as Error).message}\n`);
    return "failed";
  }
}

/** A URL a lane can connect to: a wildcard listener is reached on loopback. */
function reachable(url: string): string {
  return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:");
}

function metricsOf(
  core: KvedgeCore,
  proxy: OpenAiProxy | null,
  plan: ThreadPlan,
  writer: WriterThread | null,
  cluster: Cluster | null,
): MetricsRegistry {
  const registry = createMetricsRegistry();
  registerRouterMetrics(registry, core.router);
  registerCoreMetrics(registry, core);
  registerObservedHitsMetrics(registry, core);
  if (proxy !== null) registerProxyMetrics(registry, proxy);
  registerThreadMetrics(registry, plan, writer);
  if (cluster !== null) registerClusterMetrics(registry, cluster, core.router.load);
  return registry;
}

/**
 * What ends serving: SIGINT/SIGTERM, or the writer thread's failure. The handlers go in
 * when serving begins, before the port opens: a signal that comes before them kills the
 * process with 143, so one sent as soon as the `listening` line shows must find them.
 * One that comes during the start lets it finish, then stops.
 */
class StopRequest {
  private end: (reason: string) => void = () => {};
  private readonly ended = new Promise<string>((resolve) => (this.end = resolve));

  constructor() {
    process.once("SIGINT", () => this.end("SIGINT"));
    process.once("SIGTERM", () => this.end("SIGTERM"));
  }

  /** Resolves with what ended serving, logged. */
  async reason(writer: WriterThread | null, log: Logger): Promise<string> {
    // Without its writer the index would stand still, silently: stop (a supervisor restarts).
    if (writer !== null) {
      writer.onFailure = (error) => {
        log.error("the writer thread failed", { error });
        this.end("writer_failed");
      };
    }
    const reason = await this.ended;
    log.info("shutting down", { signal: reason });
    return reason;
  }
}

/** The `listening` line's addresses (the control listener's with the proxy) and threads. */
function whereServing(serving: Serving, proxied: boolean, writer: WriterThread | null) {
  return {
    url: serving.url,
    ...(proxied ? { control_url: serving.controlUrl } : {}),
    route_lanes: serving.lanes?.count ?? 0,
    ...threadCpus(writer, serving.lanes),
  };
}

/** Where the writer and the lanes run (the `listening` line): "1" and "2;3". */
function threadCpus(writer: WriterThread | null, lanes: RouteLanes | null) {
  return {
    writer_cpus: writer?.cpus.join(",") ?? null,
    lane_cpus: lanes?.cpus.map((cpus) => cpus.join(",")).join(";") ?? null,
  };
}

/** Pins the process to its CPU set (if any) and plans its threads on it. */
function pinAndPlan(config: Config, log: Logger): ThreadPlan {
  const { runtime } = config;
  const node = runtime.numa_node;
  const cpus = runtime.cpus ?? (node === null ? null : numaNodeCpus(node));
  if (cpus !== null) {
    const threads = pinProcess(cpus);
    log.info("pinned to CPUs", { cpus: cpus.join(","), threads });
  }
  const plan = planThreads(runtime, cpus);
  log.info("threads", {
    index_threads: plan.indexThreads,
    route_threads: plan.routeThreads,
    shared_cpus: plan.shared,
  });
  return plan;
}
