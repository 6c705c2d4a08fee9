/**
 * Prometheus metrics of the proxy and of observed hits. Predicted and observed cached
 * tokens are per worker, so `rate(observed) / rate(predicted)` is the fraction of the
 * router's predicted hits that the engines really served.
 */
import { type MetricsRegistry, registerSamples } from "../util/metrics";
import type { KvedgeCore } from "../core/core";
import type { OpenAiProxy, Outcome } from "./proxy";

type WorkerView = ReturnType<KvedgeCore["workers"]>[number];

/** A series with one sample per worker and dp rank. */
function perWorkerSeries(
  registry: MetricsRegistry,
  core: KvedgeCore,
  name: string,
  help: string,
  type: "counter" | "gauge",
  read: (view: WorkerView) => number | null,
): void {
  registerSamples(registry, {
    name,
    help,
    type,
    labelNames: ["worker_id", "dp_rank"],
    collect(emit) {
      for (const view of core.workers()) {
        const value = read(view);
        if (value !== null)
          emit(value, { worker_id: view.workerId.toString(), dp_rank: String(view.dpRank) });
      }
    },
  });
}

export function registerObservedHitsMetrics(registry: MetricsRegistry, core: KvedgeCore): void {
  const perWorker = (
    name: string,
    help: string,
    type: "counter" | "gauge",
    read: (view: WorkerView) => number | null,
  ) => perWorkerSeries(registry, core, name, help, type, read);
  perWorker(
    "kvedge_observed_prompt_tokens_total",
    "Prompt tokens of the proxied answers that carried usage (the hit rates' denominator).",
    "counter",
    (view) => view.observed.promptTokens,
  );
  perWorker(
    "kvedge_predicted_cached_tokens_total",
    "Prompt tokens the router predicted the worker would serve from its cache, over answers with usage.",
    "counter",
    (view) => view.observed.predictedTokens,
  );
  perWorker(
    "kvedge_observed_cached_tokens_total",
    "Prompt tokens the worker's answers reported cached (usage.prompt_tokens_details.cached_tokens).",
    "counter",
    (view) => view.observed.observedTokens,
  );
  perWorker(
    "kvedge_observed_answers_total",
    "Proxied answers per worker, with or without usage.",
    "counter",
    (view) => view.observed.answers,
  );
  perWorker(
    "kvedge_observed_bad_answers_total",
    "Proxied answers whose cached_tokens could not be true (not an integer in [0, prompt tokens]): ignored.",
    "counter",
    (view) => view.observed.badAnswers,
  );
  perWorker(
    "kvedge_observed_hit_ratio",
    "Recent observed / predicted cached tokens (weighted over proxy.observed_window answers).",
    "gauge",
    (view) => view.observed.recentRatio,
  );
  perWorker(
    "kvedge_worker_hits_suspect",
    "1 if the worker's observed hits fall persistently below the predicted ones (its overlap is discounted).",
    "gauge",
    (view) => (view.observed.suspect ? 1 : 0),
  );
}

/** Each outcome's label on kvedge_proxy_requests_total. */
const OUTCOME_LABELS: Readonly<Record<Outcome, string>> = {
  completed: "completed",
  errorAnswers: "error_answer",
  clientAborts: "client_abort",
  engineErrors: "engine_error",
  engineTimeouts: "engine_timeout",
  stalls: "stall",
  unreachable: "unreachable",
  busy: "busy",
  rejected: "rejected",
  refused: "refused",
  shutdowns: "shutdown",
};

export function registerProxyMetrics(registry: MetricsRegistry, proxy: OpenAiProxy): void {
  registerSamples(registry, {
    name: "kvedge_proxy_requests_total",
    help:
      "Proxied OpenAI requests that ended, by outcome (one each): completed (2xx relayed to the end), error_answer (the engine's error status relayed), " +
      "client_abort (the client left, in any phase), engine_error (the engine failed after taking the request: 502 or a cut stream), " +
      "engine_timeout (504: no answer within proxy.first_byte_timeout_ms), stall (the answer paused past proxy.idle_timeout_ms: cut), " +
      "unreachable (502: no engine could be connected to), busy (503: no engine connection in time, or the buffer budget full), " +
      "rejected (before routing), refused (at routing: no workers, admission's 429), shutdown (ended by kvedge stopping).",
    type: "counter",
    labelNames: ["outcome"],
    collect(emit) {
      const c = proxy.counters;
      for (const [outcome, label] of Object.entries(OUTCOME_LABELS))
        emit(c[outcome as Outcome], { outcome: label });
    },
  });
  registerSamples(registry, {
    name: "kvedge_proxy_in_flight",
    help: "Proxied requests not ended yet (preparing, held, queued for a connection, or being answered).",
    type: "gauge",
    collect: (emit) => emit(proxy.live.size),
  });
  registerSamples(registry, {
    name: "kvedge_proxy_failovers_total",
    help: "Times a chosen engine could not be connected to and the next candidate was tried.",
    type: "counter",
    collect: (emit) => emit(proxy.counters.failovers),
  });
  registerSamples(registry, {
    name: "kvedge_proxy_upstream_connections",
    help: "Engine connections held now (at most proxy.upstream_connections).",
    type: "gauge",
    collect: (emit) => emit(proxy.slots.inUse),
  });
  registerSamples(registry, {
    name: "kvedge_proxy_upstream_queued",
    help: "Proxied requests waiting for an engine connection (proxy.upstream_connections reached).",
    type: "gauge",
    collect: (emit) => emit(proxy.slots.queued),
  });
  registerSamples(registry, {
    name: "kvedge_proxy_prepared_total",
    help: "Proxied requests parsed and tokenized, by where: inline (small bodies) or on a tokenizer thread.",
    type: "counter",
    labelNames: ["where"],
    collect(emit) {
      emit(proxy.preparer.counts.inline, { where: "inline" });
      emit(proxy.preparer.counts.thread, { where: "thread" });
    },
  });
}
