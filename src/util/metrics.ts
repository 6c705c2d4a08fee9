/**
 * Prometheus plumbing on prom-client (checked under Bun 1.4.5: counters, gauges with
 * collect callbacks, histograms and the process metrics render correctly, also in the
 * compiled binary): the registry, and *sample sources*, metrics read from plain objects
 * at scrape time. Other modules stay library-free: they keep plain numeric counters, and
 * a sample source reads them (`registerSamples`). Series of a source are rebuilt on every
 * scrape, so a removed worker's series disappear.
 *
 * Names follow Prometheus conventions: `kvedge_` prefix, `_total` for counters,
 * base units in the name (`_seconds`, `_bytes`).
 */
import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client";

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
    if (!source.name.endsWith("_total"))
      throw new Error(`counter ${source.name} must end in _total`);
    new Counter({
      name: source.name,
      help: source.help,
      labelNames,
      registers: [registry],
      collect() {
        this.reset();
        source.collect((value, labels) => {
          if (!(value >= 0) || !Number.isFinite(value))
            throw new Error(`${source.name}: counter value ${value} is not a non-negative number`);
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
