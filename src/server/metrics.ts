/**
 * Prometheus metrics (`GET /metrics`), on prom-client (checked under Bun 1.4.5:
 * counters, gauges with collect callbacks, histograms and the process metrics render
 * correctly, also in the compiled binary).
 *
 * Other modules stay library-free: they keep plain numeric counters, and a *sample
 * source* registered here reads them at scrape time (`registerSamples`). Series of a
 * source are rebuilt on every scrape, so a removed worker's series disappear.
 *
 * Names follow Prometheus conventions: `kvedge_` prefix, `_total` for counters,
 * base units in the name (`_seconds`, `_bytes`).
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Router } from "../route";

export type MetricsRegistry = Registry;

/** Process metrics kept from prom-client's defaults: the ones that read true under Bun. */
const PROCESS_METRICS = [
  "process_cpu_user_seconds_total",
  "process_cpu_system_seconds_total",
  "process_cpu_seconds_total",
  "process_start_time_seconds",
  "process_resident_memory_bytes",
  "process_open_fds",
  "process_max_fds",
] as const;

/**
 * A registry with the standard process metrics. (prom-client's Node-specific defaults
 * are left out: under Bun its heap-space gauges read 0 and process_heap_bytes reports
 * virtual memory.)
 */
export function createMetricsRegistry(): MetricsRegistry {
  const registry = new Registry();
  const scratch = new Registry();
  collectDefaultMetrics({ register: scratch });
  for (const name of PROCESS_METRICS) {
    const metric = scratch.getSingleMetric(name);
    if (metric === undefined) throw new Error(`prom-client no longer provides ${name}`);
    registry.registerMetric(metric);
  }
  return registry;
}

export type Labels = Readonly<Record<string, string>>;

/** A metric whose values are read from plain objects at scrape time. */
export interface SampleSource {
  readonly name: string;
  readonly help: string;
  readonly type: "counter" | "gauge";
  readonly labelNames?: readonly string[];
  /** Emits every current sample; called once per scrape. */
  collect(emit: (value: number, labels?: Labels) => void): void;
}

export function registerSamples(registry: MetricsRegistry, source: SampleSource): void {
  const labelNames = [...(source.labelNames ?? [])];
  if (source.type === "counter") {
    if (!source.name.endsWith("_total")) throw new Error(`counter ${source.name} must end in _total`);
    new Counter({
      name: source.name,
      help: source.help,
      labelNames,
      registers: [registry],
      collect() {
        this.reset();
        source.collect((value, labels) => {
          if (!(value >= 0) || !Number.isFinite(value)) throw new Error(`${source.name}: counter value ${value} is not a non-negative number`);
          if (labels === undefined) this.inc(value);
          else this.inc(labels, value);
        });
      },
    });
    return;
  }
  new Gauge({
    name: source.name,
    help: source.help,
    labelNames,
    registers: [registry],
    collect() {
      this.reset();
      source.collect((value, labels) => {
        if (labels === undefined) this.set(value);
        else this.set(labels, value);
      });
    },
  });
}

/** Distinct HTTP `route` label values kept; more are counted as "other" (no label explosion). */
export const HTTP_ROUTE_LABELS_MAX = 64;

const HTTP_BUCKETS_SECONDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];
const ROUTE_BUCKETS_SECONDS = [
  0.000_001, 0.000_002_5, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.01,
];

/** Latency histograms the server observes directly. */
export class ServerMetrics {
  private readonly http: Histogram<"route" | "status">;
  private readonly httpChildren = new Map<string, Histogram.Internal<"route" | "status">>();
  private readonly httpRoutes = new Set<string>();
  private readonly routeDecision: Histogram;

  constructor(registry: MetricsRegistry) {
    this.http = new Histogram({
      name: "kvedge_http_request_duration_seconds",
      help: "HTTP request handling time, by route template and status code.",
      labelNames: ["route", "status"],
      buckets: HTTP_BUCKETS_SECONDS,
      registers: [registry],
    });
    this.routeDecision = new Histogram({
      name: "kvedge_route_decision_duration_seconds",
      help: "Time to choose a worker for one request (cost of every worker, load bookkeeping).",
      buckets: ROUTE_BUCKETS_SECONDS,
      registers: [registry],
    });
  }

  /**
   * Records one HTTP request. `route` must be the route template ("/v1/requests/{id}/done"),
   * never the raw path; past HTTP_ROUTE_LABELS_MAX distinct values it becomes "other".
   */
  observeHttp(route: string, status: number, seconds: number): void {
    let label = route;
    if (!this.httpRoutes.has(label)) {
      if (this.httpRoutes.size >= HTTP_ROUTE_LABELS_MAX) label = "other";
      else this.httpRoutes.add(label);
    }
    const key = `${status} ${label}`;
    let child = this.httpChildren.get(key);
    if (child === undefined) {
      child = this.http.labels(label, String(status));
      this.httpChildren.set(key, child);
    }
    child.observe(seconds);
  }

  observeRouteDecision(seconds: number): void {
    this.routeDecision.observe(seconds);
  }
}

/**
 * Router metrics, read from the router's plain counters at scrape time: requests
 * routed and active load per worker, lifecycle events, and the load tracker's memory.
 */
export function registerRouterMetrics(registry: MetricsRegistry, router: Router): void {
  const load = router.load;
  const workerLabels = ["worker_id", "dp_rank"] as const;
  const perWorker = (name: string, help: string, type: "counter" | "gauge", read: (w: ReturnType<typeof load.workers>[number]) => number) =>
    registerSamples(registry, {
      name, help, type, labelNames: workerLabels,
      collect(emit) {
        load.sweepIfDue();
        for (const w of load.workers()) emit(read(w), { worker_id: w.workerId.toString(), dp_rank: String(w.dpRank) });
      },
    });
  perWorker("kvedge_routed_requests_total", "Requests routed to the worker.", "counter", (w) => w.routedTotal);
  perWorker("kvedge_worker_active_requests", "Requests routed to the worker and not yet done or expired.", "gauge", (w) => w.activeRequests);
  perWorker("kvedge_worker_active_prefill_tokens", "Uncached prompt tokens of the worker's requests whose prefill is not done.", "gauge",
    (w) => w.activePrefillTokens);
  perWorker("kvedge_worker_active_decode_blocks", "Distinct KV blocks of the worker's active requests (plus expected output blocks if tracked).",
    "gauge", (w) => w.activeDecodeBlocks);
  perWorker("kvedge_worker_degraded", "1 if the worker lost events it could not replay (its overlap is discounted).", "gauge",
    (w) => (w.degraded ? 1 : 0));
  registerSamples(registry, {
    name: "kvedge_request_lifecycle_total",
    help: "Request lifecycle events: admitted, prefill_done, done, expired (TTL), dropped_with_worker, unknown (call for an unknown id).",
    type: "counter",
    labelNames: ["event"],
    collect(emit) {
      const c = load.counters;
      emit(c.admitted, { event: "admitted" });
      emit(c.prefillDone, { event: "prefill_done" });
      emit(c.done, { event: "done" });
      emit(c.expired, { event: "expired" });
      emit(c.droppedWithWorker, { event: "dropped_with_worker" });
      emit(c.unknown, { event: "unknown" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_route_tracked_blocks",
    help: "Distinct prefix blocks of active requests (each position once, however many workers hold it).",
    type: "gauge",
    collect: (emit) => emit(load.blocks.blockCount),
  });
  registerSamples(registry, {
    name: "kvedge_route_tracker_bytes",
    help: "Approximate memory of the load tracker's tree of active request chains.",
    type: "gauge",
    collect: (emit) => emit(load.blocks.bytes),
  });
}
