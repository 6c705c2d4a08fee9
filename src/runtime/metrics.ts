/**
 * Prometheus metrics of the threads: the event ring to the writer thread (records
 * written, dropped at a full ring, refused as oversize; its fill; wakes) and the
 * threads running. Registered by `kvedge serve` for the modes it runs.
 */
import { type MetricsRegistry, registerSamples } from "../util/metrics";
import type { ThreadPlan } from "./threads";
import type { WriterThread } from "./writer-thread";

export function registerThreadMetrics(
  registry: MetricsRegistry,
  plan: ThreadPlan,
  writer: WriterThread | null,
): void {
  registerSamples(registry, {
    name: "kvedge_threads",
    type: "gauge",
    labelNames: ["role"],
    help: "kvedge's own threads besides the main one, by role.",
    collect(emit) {
      emit(plan.indexThreads, { role: "writer" });
      emit(plan.routeThreads, { role: "route_lane" });
    },
  });
  if (writer === null) return;
  const producer = writer.producer;
  registerSamples(registry, {
    name: "kvedge_event_ring_records_total",
    type: "counter",
    labelNames: ["outcome"],
    help:
      "Records the socket thread offered the writer thread's ring: written, " +
      "dropped (ring full), refused (over half the ring).",
    collect(emit) {
      emit(producer.counters.written, { outcome: "written" });
      emit(producer.counters.droppedFull, { outcome: "dropped" });
      emit(producer.counters.oversize, { outcome: "oversize" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_event_ring_bytes",
    type: "gauge",
    labelNames: ["what"],
    help: "The event ring: bytes written and not yet applied, the most ever, its capacity.",
    collect(emit) {
      emit(producer.used, { what: "used" });
      emit(producer.counters.usedMax, { what: "used_max" });
      emit(producer.capacity, { what: "capacity" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_event_ring_wakes_total",
    type: "counter",
    help: "Times the socket thread woke the sleeping writer thread (one per burst at most).",
    collect: (emit) => emit(producer.wakes),
  });
}
