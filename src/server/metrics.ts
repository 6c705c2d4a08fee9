/**
 * kvedge's Prometheus metrics (`GET /metrics`): the HTTP and route latency histograms
 * (FastHistogram, ServerMetrics) and the sample sources of the router and the core
 * (src/util/metrics.ts has the registry and `registerSamples`).
 */
import { bufferBudget } from "../util/buffer-budget";
import type { Router } from "../route";
import type { LoadTracker, WorkerLoad } from "../route/load";
import type { Cluster } from "../cluster/cluster";
import type { PeerCounters } from "../cluster/peers";
import type { KvedgeCore } from "../core/core";
import {
  type Labels,
  type MetricsRegistry,
  registerSamples,
  type SampleSource,
} from "../util/metrics";

/** Distinct HTTP `route` label values kept; more are counted as "other" (no label explosion). */
export const HTTP_ROUTE_LABELS_MAX = 64;

const HTTP_BUCKETS_SECONDS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5,
];
const ROUTE_BUCKETS_SECONDS = [
  0.000_001, 0.000_002_5, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5,
  0.001, 0.002_5, 0.01,
];

/** One label set of a FastHistogram: per-bucket (not cumulative) counts, sum and count. */
export interface HistogramSeries {
  readonly labels: Labels;
  readonly counts: Float64Array;
  sum: number;
  count: number;
  /** False after a registry reset until the next observation brings the series back. */
  listed: boolean;
}

/**
 * A Prometheus histogram kept in plain numbers, for the per-request latencies: an
 * observation is a bucket search and three additions on a series the caller holds
 * (prom-client's Histogram hashes and validates the label set on every observation,
 * which showed in request profiles). Registered with a prom-client registry, it renders
 * exactly as a prom-client Histogram of the same name, buckets and labels: same series
 * order, cumulative `_bucket` lines with `le`, then `+Inf`, `_sum`, `_count`.
 */
// See docs/decisions.md#fast-histograms.
export class FastHistogram {
  readonly type = "histogram";
  readonly aggregator = "sum";
  private readonly listed: HistogramSeries[] = [];

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly buckets: readonly number[],
    registry: MetricsRegistry,
  ) {
    registry.registerMetric(this as never);
  }

  /** A new series (the caller keeps it; call once per label set). */
  series(labels: Labels): HistogramSeries {
    const series: HistogramSeries = {
      labels,
      counts: new Float64Array(this.buckets.length),
      sum: 0,
      count: 0,
      listed: true,
    };
    this.listed.push(series);
    return series;
  }

  observe(series: HistogramSeries, value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    const buckets = this.buckets;
    for (let i = 0; i < buckets.length; i++) {
      if (value <= buckets[i]!) {
        series.counts[i]!++;
        break;
      }
    }
    series.sum += value;
    series.count++;
    if (!series.listed) {
      series.listed = true;
      this.listed.push(series);
    }
  }

  /** What prom-client's registry renders (Histogram.getForPromString's shape). */
  getForPromString() {
    const bucketName = `${this.name}_bucket`;
    const values: {
      labels: Labels;
      sharedLabels: Labels;
      value: number;
      metricName: string;
      exemplar?: null;
    }[] = [];
    for (const series of this.listed) {
      let cumulative = 0;
      for (let i = 0; i < this.buckets.length; i++) {
        cumulative += series.counts[i]!;
        values.push({
          labels: { le: this.buckets[i]! as never },
          sharedLabels: series.labels,
          value: cumulative,
          metricName: bucketName,
          exemplar: null,
        });
      }
      values.push({
        labels: { le: "+Inf" },
        sharedLabels: series.labels,
        value: series.count,
        metricName: bucketName,
        exemplar: null,
      });
      values.push({
        labels: {},
        sharedLabels: series.labels,
        value: series.sum,
        metricName: `${this.name}_sum`,
      });
      values.push({
        labels: {},
        sharedLabels: series.labels,
        value: series.count,
        metricName: `${this.name}_count`,
      });
    }
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values,
      aggregator: this.aggregator,
    };
  }

  /** prom-client's `get()`: the same values with the series labels merged in. */
  get() {
    const data = this.getForPromString();
    return {
      ...data,
      values: data.values.map(({ sharedLabels, labels, ...rest }) => ({
        ...rest,
        labels: { ...labels, ...sharedLabels },
      })),
    };
  }

  /** As prom-client's reset: every series goes (and zeroes); observing one brings it back. */
  reset(): void {
    for (const series of this.listed) {
      series.counts.fill(0);
      series.sum = 0;
      series.count = 0;
      series.listed = false;
    }
    this.listed.length = 0;
  }
}

interface RouteSeries {
  readonly label: string;
  readonly byStatus: Map<number, HistogramSeries>;
}

/** Latency histograms the server observes directly. */
export class ServerMetrics {
  private readonly http: FastHistogram;
  /** Series of each route label (at most HTTP_ROUTE_LABELS_MAX), by status code. */
  private readonly routes = new Map<string, RouteSeries>();
  private readonly other: RouteSeries = { label: "other", byStatus: new Map() };
  private readonly routeDecision: FastHistogram;
  private readonly routeDecisionSeries: HistogramSeries;

  constructor(registry: MetricsRegistry) {
    this.http = new FastHistogram(
      "kvedge_http_request_duration_seconds",
      "HTTP request handling time, by route template and status code.",
      HTTP_BUCKETS_SECONDS,
      registry,
    );
    this.routeDecision = new FastHistogram(
      "kvedge_route_decision_duration_seconds",
      "Time to choose a worker for one request (cost of every worker, load bookkeeping), for every decision: the API's, the lanes', the proxy's.",
      ROUTE_BUCKETS_SECONDS,
      registry,
    );
    this.routeDecisionSeries = this.routeDecision.series({});
  }

  /**
   * Records one HTTP request. `route` must be the route template ("/v1/requests/{id}/done"),
   * never the raw path; past HTTP_ROUTE_LABELS_MAX distinct values it becomes "other".
   */
  observeHttp(route: string, status: number, seconds: number): void {
    let entry = this.routes.get(route);
    if (entry === undefined) {
      if (this.routes.size >= HTTP_ROUTE_LABELS_MAX) entry = this.other;
      else {
        entry = route === "other" ? this.other : { label: route, byStatus: new Map() };
        this.routes.set(route, entry);
      }
    }
    let series = entry.byStatus.get(status);
    if (series === undefined) {
      series = this.http.series({ route: entry.label, status: String(status) });
      entry.byStatus.set(status, series);
    }
    this.http.observe(series, seconds);
  }

  observeRouteDecision(seconds: number): void {
    this.routeDecision.observe(this.routeDecisionSeries, seconds);
  }

  /** The route decision histogram as it stands: per-bucket counts (not cumulative), bounds in seconds. */
  get routeDecisions(): { readonly bounds: readonly number[]; readonly counts: Float64Array } {
    return { bounds: ROUTE_BUCKETS_SECONDS, counts: this.routeDecisionSeries.counts };
  }
}

/**
 * Router metrics, read from the router's plain counters at scrape time: requests
 * routed and active load per worker, lifecycle events, and the load tracker's memory.
 */
export function registerRouterMetrics(registry: MetricsRegistry, router: Router): void {
  const load = router.load;
  const workerLabels = ["worker_id", "dp_rank"] as const;
  const perWorker = (
    name: string,
    help: string,
    type: "counter" | "gauge",
    read: (w: ReturnType<typeof load.workers>[number]) => number,
  ) =>
    registerSamples(registry, {
      name,
      help,
      type,
      labelNames: workerLabels,
      collect(emit) {
        load.sweep();
        for (const w of load.workers())
          emit(read(w), { worker_id: w.workerId.toString(), dp_rank: String(w.dpRank) });
      },
    });
  perWorker(
    "kvedge_routed_requests_total",
    "Requests routed to the worker.",
    "counter",
    (w) => w.routedTotal,
  );
  perWorker(
    "kvedge_worker_active_requests",
    "Requests routed to the worker and not yet done or expired.",
    "gauge",
    (w) => w.activeRequests,
  );
  perWorker(
    "kvedge_worker_active_prefill_tokens",
    "Uncached prompt tokens of the worker's requests whose prefill is not done.",
    "gauge",
    (w) => w.activePrefillTokens,
  );
  perWorker(
    "kvedge_worker_active_decode_blocks",
    "Distinct KV blocks of the worker's active requests (plus expected output blocks if tracked).",
    "gauge",
    (w) => w.activeDecodeBlocks,
  );
  const times = (slot: number) => router.learnedTimes(slot);
  perWorker(
    "kvedge_worker_prefill_tokens_per_second",
    "Prefill speed the router predicts the worker with (learned when route.calibrate is on).",
    "gauge",
    (w) => times(w.slot)?.prefillTokensPerSecond ?? router.ttft.prefillTokensPerSecond,
  );
  perWorker(
    "kvedge_worker_step_base_ms",
    "Scheduler step base cost the router predicts the worker with, ms (learned when route.calibrate is on).",
    "gauge",
    (w) => times(w.slot)?.stepBaseMs ?? router.ttft.stepBaseMs,
  );
  perWorker(
    "kvedge_worker_calibration_samples",
    "Lifecycle timings the worker's time model was learned from.",
    "gauge",
    (w) => times(w.slot)?.samples ?? 0,
  );
  perWorker(
    "kvedge_worker_degraded",
    "1 if the worker lost events it could not replay (its overlap is discounted).",
    "gauge",
    (w) => (w.degraded ? 1 : 0),
  );
  registerSamples(registry, {
    name: "kvedge_request_lifecycle_total",
    help: "Request lifecycle events: admitted, prefill_done, done, expired (TTL), evicted (over the active-request limit), dropped_with_worker, unknown (call for an unknown id).",
    type: "counter",
    labelNames: ["event"],
    collect(emit) {
      const c = load.counters;
      emit(c.admitted, { event: "admitted" });
      emit(c.prefillDone, { event: "prefill_done" });
      emit(c.done, { event: "done" });
      emit(c.expired, { event: "expired" });
      emit(c.evicted, { event: "evicted" });
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

/**
 * Index and ingest metrics: what the index holds and how events got there, per engine
 * source (labels worker_id, dp_rank of the configured source). A removed worker's
 * series disappear with it.
 */
/** Metrics of the core's parts: admission, and the writes held while the index is copied. */
/**
 * Approximate workers: their mode, predicted blocks and capacity, and what predictions
 * did; degraded exact workers routed on predictions (route.degraded_fallback) too.
 */
function registerPredictionMetrics(registry: MetricsRegistry, core: KvedgeCore): void {
  const { predictions } = core;
  registerPredictedWorkers(registry, core);
  registerSamples(registry, {
    name: "kvedge_predicted_blocks_total",
    help: "Predicted blocks stored, refreshed by a later request, evicted at the capacity, expired (TTL), purged by a correction.",
    type: "counter",
    labelNames: ["event"],
    collect(emit) {
      for (const [event, count] of Object.entries(predictions.blocks.counters))
        emit(count, { event });
    },
  });
  registerSamples(registry, {
    name: "kvedge_prediction_answers_total",
    help: "Reported cached tokens of approximate workers' answers against the prediction: shortfall, surplus, confirmed.",
    type: "counter",
    labelNames: ["outcome"],
    collect(emit) {
      const c = predictions.counters;
      emit(c.shortfalls, { outcome: "shortfall" });
      emit(c.surpluses, { outcome: "surplus" });
      emit(c.confirmed, { outcome: "confirmed" });
    },
  });
}

/** Per worker: approximate or not, routed on predictions while degraded or not, and those predictions. */
function registerPredictedWorkers(registry: MetricsRegistry, core: KvedgeCore): void {
  const { predictions, router, fallback } = core;
  /** The predictions a slot is routed on: an approximate worker's, a degraded one's, or none. */
  const blocksOf = (slot: number) =>
    predictions.isApproximate(slot)
      ? predictions.blocks
      : fallback?.isOn(slot) === true
        ? fallback.predictions.blocks
        : null;
  const perWorker = (name: string, help: string, read: (slot: number) => number) =>
    registerSamples(registry, {
      name,
      help,
      type: "gauge",
      labelNames: ["worker_id", "dp_rank"],
      collect(emit) {
        for (const w of router.load.workers())
          emit(read(w.slot), { worker_id: w.workerId.toString(), dp_rank: String(w.dpRank) });
      },
    });
  perWorker(
    "kvedge_worker_approximate",
    "1 if the worker publishes no KV events: its cache is predicted from kvedge's own decisions.",
    (slot) => (predictions.isApproximate(slot) ? 1 : 0),
  );
  perWorker(
    "kvedge_worker_degraded_fallback",
    "1 if the worker is degraded and routed on kvedge's predictions of it (route.degraded_fallback).",
    (slot) => (fallback?.isOn(slot) === true ? 1 : 0),
  );
  perWorker(
    "kvedge_worker_predicted_blocks",
    "Blocks an approximate worker (or a degraded one routed on predictions) is predicted to cache.",
    (slot) => blocksOf(slot)?.heldBy(slot) ?? 0,
  );
  perWorker(
    "kvedge_worker_predicted_capacity_blocks",
    "The capacity those predictions are held to, learned or configured (0: unknown, TTL).",
    (slot) => blocksOf(slot)?.capacityOf(slot) ?? 0,
  );
}

function registerPartMetrics(registry: MetricsRegistry, core: KvedgeCore): void {
  registerAdmissionMetrics(registry, core.admission);
  registerPacingMetrics(registry, core.pacing);
  registerPredictionMetrics(registry, core);
  registerSamples(registry, {
    name: "kvedge_index_held_writes_total",
    type: "counter",
    labelNames: ["what"],
    help:
      "Index writes held while a dump or snapshot copied the index (writes), and copies " +
      "finished at once (settled: a worker removed, or the held writes' bound).",
    collect: (emit) => {
      emit(core.writes.counters.held, { what: "writes" });
      emit(core.writes.counters.settled, { what: "settled" });
    },
  });
}

/** The index's size now: blocks by tier, copies, nodes, lookups, workers, bytes. */
function registerIndexSize(registry: MetricsRegistry, index: KvedgeCore["index"]): void {
  registerSamples(registry, {
    name: "kvedge_index_size",
    type: "gauge",
    help:
      "Index size now: held (block, worker) pairs (device; host_pinned, disk, external: the lower " +
      "tiers), copies beyond the first (device; lower_tier_copies), nodes, lookup entries, workers.",
    labelNames: ["what"],
    collect: (emit) => {
      const stats = index.stats();
      emit(stats.blocks, { what: "blocks" });
      emit(stats.copies, { what: "copies" });
      emit(stats.lowerTiers.host_pinned, { what: "host_pinned" });
      emit(stats.lowerTiers.disk, { what: "disk" });
      emit(stats.lowerTiers.external, { what: "external" });
      emit(stats.lowerTiers.copies, { what: "lower_tier_copies" });
      emit(stats.nodes, { what: "nodes" });
      emit(stats.lookupEntries, { what: "lookup_entries" });
      emit(stats.workers, { what: "workers" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_index_bytes",
    type: "gauge",
    help: "Bytes of typed arrays the index has reserved.",
    labelNames: [],
    collect: (emit) => emit(index.stats().bytes),
  });
}

export function registerCoreMetrics(registry: MetricsRegistry, core: KvedgeCore): void {
  const index = core.index;
  const counter = (
    name: string,
    help: string,
    labelNames: readonly string[],
    collect: SampleSource["collect"],
  ) => registerSamples(registry, { name, help, type: "counter", labelNames, collect });
  const gauge = (
    name: string,
    help: string,
    labelNames: readonly string[],
    collect: SampleSource["collect"],
  ) => registerSamples(registry, { name, help, type: "gauge", labelNames, collect });

  registerPartMetrics(registry, core);
  counter(
    "kvedge_index_events_total",
    "Events applied to the index, by type and status.",
    ["type", "status"],
    (emit) => {
      const c = index.counters;
      emit(c.storedEvents, { type: "stored", status: "ok" });
      emit(c.rejectedParentNotFound, { type: "stored", status: "parent_not_found" });
      emit(c.rejectedBlockSizeMismatch, { type: "stored", status: "block_size_mismatch" });
      emit(c.rejectedCapacity, { type: "stored", status: "capacity_exhausted" });
      emit(c.rejectedInvalid, { type: "stored", status: "invalid" });
      emit(c.removedEvents, { type: "removed", status: "ok" });
      emit(c.clearedEvents, { type: "cleared", status: "ok" });
      emit(c.workersRemoved, { type: "remove_worker", status: "ok" });
    },
  );
  counter(
    "kvedge_index_blocks_total",
    "(block, worker) pairs by what happened: stored, removed, duplicate (one more copy), copy_removed " +
      "(one of several copies, still held), unknown, hash_conflict (producer broke one hash per block).",
    ["op"],
    (emit) => {
      const c = index.counters;
      emit(c.blocksStored, { op: "stored" });
      emit(c.blocksRemoved, { op: "removed" });
      emit(c.blocksDuplicate, { op: "duplicate" });
      emit(c.copiesRemoved, { op: "copy_removed" });
      emit(c.blocksUnknown, { op: "unknown" });
      emit(c.hashConflicts, { op: "hash_conflict" });
    },
  );
  registerIndexSize(registry, index);
  gauge(
    "kvedge_buffered_bytes",
    "Bytes held for unfinished transfers (HTTP bodies, WebSocket send queues, large ZMQ frames), and the budget.",
    ["what"],
    (emit) => {
      emit(bufferBudget.held, { what: "held" });
      emit(bufferBudget.limitBytes, { what: "budget" });
    },
  );
  counter(
    "kvedge_buffer_budget_refused_total",
    "Transfers refused because the buffered-bytes budget was reached.",
    [],
    (emit) => emit(bufferBudget.refused),
  );
  gauge(
    "kvedge_index_memory_budget_bytes",
    "Index bytes past which new stores are refused.",
    [],
    (emit) => emit(core.budget.budgetBytes),
  );
  counter(
    "kvedge_index_budget_refused_total",
    "Stored events, and their blocks, refused at the index memory budget.",
    ["what"],
    (emit) => {
      emit(core.budget.refusedEvents, { what: "events" });
      emit(core.budget.refusedBlocks, { what: "blocks" });
    },
  );
  gauge(
    "kvedge_worker_blocks",
    "Blocks the index says the worker holds.",
    ["worker_id", "dp_rank"],
    (emit) => {
      for (const info of index.workers())
        emit(info.blocks, { worker_id: info.workerId.toString(), dp_rank: String(info.dpRank) });
    },
  );

  const perSource = perSourceOf(registry, core);
  registerBatchMetrics(perSource);
  registerEventMetrics(perSource);
  registerContinuityMetrics(perSource);
  registerConnectionMetrics(perSource);
}

/** Registers one metric with a sample per engine source, labelled by its configured (worker, dp rank). */
type PerSource = (
  name: string,
  help: string,
  type: "counter" | "gauge",
  extra: readonly string[],
  read: (
    source: KvedgeCore["engineSources"][number],
    emit: (value: number, labels?: Labels) => void,
  ) => void,
) => void;

function perSourceOf(registry: MetricsRegistry, core: KvedgeCore): PerSource {
  return (name, help, type, extra, read) =>
    registerSamples(registry, {
      name,
      help,
      type,
      labelNames: ["worker_id", "dp_rank", ...extra],
      collect(emit) {
        for (const source of core.engineSources) {
          const base = {
            worker_id: source.config.workerId.toString(),
            dp_rank: String(source.config.dpRank),
          };
          read(source, (value, labels) =>
            emit(value, labels === undefined ? base : { ...base, ...labels }),
          );
        }
      },
    });
}

/** Per source: bytes, batches and events received, and batches that did not decode. */
function registerBatchMetrics(perSource: PerSource): void {
  perSource(
    "kvedge_ingest_bytes_total",
    "Bytes received from the engine's publisher (ZMTP, all frames).",
    "counter",
    [],
    (source, emit) => emit(source.socketCounters.sub.bytesIn),
  );
  perSource(
    "kvedge_ingest_batches_total",
    "Event batches by outcome: applied, replayed (applied from a replay), duplicate, " +
      "malformed (dropped), incomplete (applied without events that could not be read).",
    "counter",
    ["status"],
    (source, emit) => {
      const c = source.sequencer.counters;
      emit(c.applied, { status: "applied" });
      emit(c.replayed, { status: "replayed" });
      emit(c.duplicates, { status: "duplicate" });
      emit(c.malformed, { status: "malformed" });
      emit(c.incomplete, { status: "incomplete" });
    },
  );
  perSource(
    "kvedge_ingest_events_total",
    "Events decoded, by type.",
    "counter",
    ["type"],
    (source, emit) => {
      const events = source.normalizer.counters.events;
      emit(events.stored, { type: "stored" });
      emit(events.removed, { type: "removed" });
      emit(events.cleared, { type: "cleared" });
    },
  );
  perSource(
    "kvedge_ingest_decode_errors_total",
    "Batches dropped as malformed, by kind.",
    "counter",
    ["kind"],
    (source, emit) => {
      for (const [kind, value] of Object.entries(source.normalizer.counters.decodeErrors))
        emit(value, { kind });
    },
  );
}

/** Per source: events skipped or not indexed, and the storage tiers they named. */
function registerEventMetrics(perSource: PerSource): void {
  perSource(
    "kvedge_ingest_skipped_events_total",
    "Events that could not be read, skipped alone (the rest of their batch applied; " +
      "the worker degraded), by error.",
    "counter",
    ["error"],
    (source, emit) => {
      for (const [error, value] of Object.entries(source.normalizer.counters.skippedEvents))
        emit(value, { error });
    },
  );
  perSource(
    "kvedge_ingest_rejected_blocks_total",
    "Blocks not indexed, by reason.",
    "counter",
    ["reason"],
    (source, emit) => {
      for (const [reason, value] of Object.entries(source.normalizer.counters.rejectedBlocks))
        emit(value, { reason });
    },
  );
  perSource(
    "kvedge_ingest_tier_blocks_total",
    "Blocks in stored/removed events by storage tier (any: a removal of unknown or no medium, from every tier).",
    "counter",
    ["tier"],
    (source, emit) => {
      for (const [tier, value] of Object.entries(source.normalizer.counters.blocksByTier))
        emit(value, { tier });
    },
  );
}

/** Per source: gaps, losses, replays and what each connect or idle probe established. */
function registerContinuityMetrics(perSource: PerSource): void {
  perSource("kvedge_ingest_gaps_total", "Sequence gaps seen.", "counter", [], (source, emit) =>
    emit(source.sequencer.counters.gaps),
  );
  perSource(
    "kvedge_ingest_lost_batches_total",
    "Batches lost for good (no replay, replay failed or too short).",
    "counter",
    [],
    (source, emit) => emit(source.sequencer.counters.lost),
  );
  perSource(
    "kvedge_ingest_replays_total",
    "Replay requests (connect probes included) by outcome.",
    "counter",
    ["result"],
    (source, emit) => {
      const c = source.sequencer.counters;
      emit(c.replaysRequested, { result: "requested" });
      emit(c.replaysCompleted, { result: "completed" });
      emit(c.replaysFailed, { result: "failed" });
    },
  );
  perSource(
    "kvedge_ingest_resets_total",
    "Engine restarts detected (the worker's blocks were cleared).",
    "counter",
    [],
    (source, emit) => emit(source.sequencer.counters.restarts),
  );
  perSource(
    "kvedge_ingest_continuity_total",
    "What each connect probe (replay from 0) established: probe (asked), " +
      "continued (same stream), rebuilt (cleared and rebuilt from a ring starting at 0); " +
      "stray (sequence jumps skipped); idle_probe (a quiet stream asked its ring for a " +
      "lost tail) and tail_batch (batches such probes applied).",
    "counter",
    ["outcome"],
    (source, emit) => {
      const c = source.sequencer.counters;
      emit(c.probes, { outcome: "probe" });
      emit(c.continued, { outcome: "continued" });
      emit(c.rebuilds, { outcome: "rebuilt" });
      emit(c.straySeqs, { outcome: "stray" });
      emit(c.idleProbes, { outcome: "idle_probe" });
      emit(c.idleProbeBatches, { outcome: "tail_batch" });
    },
  );
}

/** Per source: the connection to the engine's publisher and its position. */
function registerConnectionMetrics(perSource: PerSource): void {
  perSource(
    "kvedge_ingest_replay_buffer_dropped_total",
    "Live batches dropped because the bytes held during a replay " +
      "reached ingest.replay_buffer_bytes (then counted lost).",
    "counter",
    [],
    (source, emit) => emit(source.sequencer.counters.bufferDropped),
  );
  perSource(
    "kvedge_ingest_reconnects_total",
    "Re-dials of the engine's publisher.",
    "counter",
    [],
    (source, emit) => emit(source.socketCounters.sub.reconnects),
  );
  perSource(
    "kvedge_ingest_protocol_errors_total",
    "ZMTP protocol errors and malformed messages, by kind.",
    "counter",
    ["kind"],
    (source, emit) => {
      for (const [kind, value] of Object.entries(source.socketCounters.sub.protocolErrors))
        emit(value, { kind });
      emit(source.counters.malformedMessages, { kind: "malformed_message" });
      emit(source.counters.malformedReplayReplies, { kind: "malformed_replay_reply" });
      emit(source.stream.counters.applyErrors, { kind: "apply_error" });
      emit(source.sequencer.counters.oversize, { kind: "oversize_skipped" }); // live and replayed
      emit(source.socketCounters.sub.frameTimeouts, { kind: "frame_timeout" });
    },
  );
  perSource(
    "kvedge_ingest_connected",
    "1 while the engine's publisher is connected.",
    "gauge",
    [],
    (source, emit) => emit(source.state === "connected" ? 1 : 0),
  );
  perSource(
    "kvedge_ingest_last_seq",
    "Last applied batch sequence number (-1 before the first).",
    "gauge",
    [],
    (source, emit) => emit(source.sequencer.lastSeq),
  );
}

/** Admission at saturation (route.admission): calls held now, and what happened to each. */
function registerAdmissionMetrics(
  registry: MetricsRegistry,
  admission: KvedgeCore["admission"],
): void {
  registerSamples(registry, {
    name: "kvedge_admission_held",
    help: "Route calls held by admission now (route.admission).",
    type: "gauge",
    labelNames: [],
    collect: (emit) => emit(admission.held),
  });
  registerSamples(registry, {
    name: "kvedge_admission_total",
    help:
      "Route calls through admission: routed at once, held, released when a worker freed, " +
      "routed past the longest hold, rejected (429), dropped (client gone while held).",
    type: "counter",
    labelNames: ["outcome"],
    collect(emit) {
      const c = admission.counts;
      emit(c.immediate, { outcome: "immediate" });
      emit(c.held, { outcome: "held" });
      emit(c.released, { outcome: "released" });
      emit(c.overdue, { outcome: "overdue" });
      emit(c.rejected, { outcome: "rejected" });
      emit(c.dropped, { outcome: "dropped" });
    },
  });
}

/** Pacing (route.pacing): requests waiting for a place at their engine now, and what happened to each. */
function registerPacingMetrics(registry: MetricsRegistry, pacing: KvedgeCore["pacing"]): void {
  registerSamples(registry, {
    name: "kvedge_pacing_held",
    help: "Routed requests waiting in kvedge for a place at their engine now (route.pacing).",
    type: "gauge",
    labelNames: [],
    collect: (emit) => emit(pacing.held),
  });
  registerSamples(registry, {
    name: "kvedge_pacing_total",
    help:
      "Routed requests under pacing: sent at once, made to wait, sent when a place freed, " +
      "sent past the longest hold, dropped (client gone while waiting).",
    type: "counter",
    labelNames: ["outcome"],
    collect(emit) {
      const c = pacing.counts;
      emit(c.immediate, { outcome: "immediate" });
      emit(c.paced, { outcome: "paced" });
      emit(c.released, { outcome: "released" });
      emit(c.overdue, { outcome: "overdue" });
      emit(c.dropped, { outcome: "dropped" });
    },
  });
}

const LAG_BUCKETS_SECONDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];

/**
 * Several processes deciding as one (`serve --cluster-nats`): the bus's state, the peers,
 * facts sent, received and dropped, how late peers' facts arrive, and how much of each
 * worker's load is peers'.
 */
export function registerClusterMetrics(
  registry: MetricsRegistry,
  cluster: Cluster,
  load: LoadTracker,
): void {
  const node = cluster.node;
  const peers = node.peers;
  const gauge = (name: string, help: string, read: () => number) =>
    registerSamples(registry, { name, help, type: "gauge", collect: (emit) => emit(read()) });
  gauge("kvedge_cluster_peers", "Peers this replica holds the facts of.", () => peers.peers.size);
  gauge(
    "kvedge_cluster_connected",
    "1 while connected to NATS; 0: degraded (deciding on what is known).",
    () => (cluster.status().state === "connected" ? 1 : 0),
  );
  gauge("kvedge_cluster_peer_requests", "Peers' active requests counted as load here.", () => {
    load.sweep();
    return load.peerRequestCount;
  });
  gauge("kvedge_cluster_held_facts", "Peers' requests held for workers not known here.", () => {
    let held = 0;
    for (const peer of peers.peers.values()) held += peer.held.size;
    return held;
  });
  for (const [name, help, read] of [
    [
      "kvedge_worker_peer_active_requests",
      "Of the worker's active requests, those peers routed.",
      (w: WorkerLoad) => w.peerRequests,
    ],
    [
      "kvedge_worker_peer_active_prefill_tokens",
      "Of the worker's active prefill tokens, those of requests peers routed.",
      (w: WorkerLoad) => w.peerPrefillTokens,
    ],
  ] as const) {
    registerSamples(registry, {
      name,
      help,
      type: "gauge",
      labelNames: ["worker_id", "dp_rank"],
      collect(emit) {
        load.sweep();
        for (const w of load.workers())
          emit(read(w), { worker_id: w.workerId.toString(), dp_rank: String(w.dpRank) });
      },
    });
  }
  registerClusterCounters(registry, cluster, load);
  registerClusterPredictions(registry, cluster);
  const lag = new FastHistogram(
    "kvedge_cluster_fact_lag_seconds",
    "From a peer sending a batch of facts to its being applied here (the two processes' wall clocks).",
    LAG_BUCKETS_SECONDS,
    registry,
  );
  const series = lag.series({});
  cluster.onLag = (ms) => lag.observe(series, ms / 1000);
}

/** Peers' predictions by what happened to them, as `kvedge_cluster_predictions_total` names it. */
const PEER_PREDICTION_EVENTS: Record<keyof PeerCounters["predictions"], string> = {
  applied: "applied",
  corrections: "correction_applied",
  joined: "joined",
  unanchored: "unanchored",
  notApproximate: "not_approximate",
  held: "held",
  heldApplied: "held_applied",
  heldDropped: "held_dropped",
};

/** Predictions of approximate workers on the bus (src/cluster/README.md). */
function registerClusterPredictions(registry: MetricsRegistry, cluster: Cluster): void {
  const { outbox, peers } = cluster.node;
  registerSamples(registry, {
    name: "kvedge_cluster_predictions_total",
    help: "Predictions of approximate workers on the bus: this replica's shared (sent; truncated: cut to their first 16,384 new blocks), its corrections shared, its blocks sent to joining replicas (snapshotted); peers' applied, corrections applied, blocks taken when joining (joined), dropped for a block not held here (unanchored) or a worker not approximate here, held for a worker not known yet, then applied or dropped.",
    type: "counter",
    labelNames: ["event"],
    collect(emit) {
      const own = outbox.counters;
      emit(own.predictions, { event: "sent" });
      emit(own.predictionsTruncated, { event: "truncated" });
      emit(own.corrections, { event: "correction_sent" });
      emit(own.predictionsSnapshotted, { event: "snapshotted" });
      for (const [event, count] of Object.entries(peers.counters.predictions))
        emit(count, { event: PEER_PREDICTION_EVENTS[event as keyof PeerCounters["predictions"]] });
    },
  });
}

function registerClusterCounters(registry: MetricsRegistry, cluster: Cluster, load: LoadTracker) {
  const { outbox, peers } = cluster.node;
  registerSamples(registry, {
    name: "kvedge_cluster_facts_total",
    help: "Facts: sent (this replica's own), unsent (the bus was down or full: peers fetch the set), received (peers', applied or held).",
    type: "counter",
    labelNames: ["direction"],
    collect(emit) {
      emit(outbox.counters.facts, { direction: "sent" });
      emit(outbox.counters.unsentFacts, { direction: "unsent" });
      emit(peers.counters.facts, { direction: "received" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_cluster_dropped_total",
    help: "What was dropped: bus messages by reason (bad, stale_epoch, own_replica_id, too_many_peers, …), peers' held facts whose worker never came (held_expired), peers' requests dropped with their peer (peer_lost) or by this replica's TTL (peer_expired).",
    type: "counter",
    labelNames: ["reason"],
    collect(emit) {
      for (const [reason, count] of peers.counters.dropped) emit(count, { reason });
      emit(peers.counters.heldDropped, { reason: "held_expired" });
      emit(load.peerCounters.droppedWithOrigin, { reason: "peer_lost" });
      emit(load.peerCounters.expired, { reason: "peer_expired" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_cluster_events_total",
    help: "Cluster events: gaps seen in a peer's stream, syncs asked, installed and timed out, syncs answered, peers joined, lost (lease or leaving) and restarted, NATS disconnects, batches not published for backpressure.",
    type: "counter",
    labelNames: ["event"],
    collect(emit) {
      const c = peers.counters;
      emit(c.gaps, { event: "gap" });
      emit(c.syncsAsked, { event: "sync_asked" });
      emit(c.syncsInstalled, { event: "sync_installed" });
      emit(c.syncTimeouts, { event: "sync_timeout" });
      emit(cluster.node.counters.syncsAnswered, { event: "sync_answered" });
      emit(c.peersJoined, { event: "peer_joined" });
      emit(c.peersLost, { event: "peer_lost" });
      emit(c.peersRestarted, { event: "peer_restarted" });
      emit(cluster.counters.disconnects, { event: "disconnect" });
      emit(cluster.counters.backpressure, { event: "backpressure" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_cluster_bytes_total",
    help: "Bytes on the bus: published by this replica (facts, heartbeats, snapshots), received from peers.",
    type: "counter",
    labelNames: ["direction"],
    collect(emit) {
      emit(cluster.counters.publishedBytes, { direction: "sent" });
      emit(peers.counters.bytes, { direction: "received" });
    },
  });
}
