/**
 * Prometheus metrics of the proxy and of observed hits. Predicted and observed cached
 * tokens are per worker, so `rate(observed) / rate(predicted)` is the fraction of the
 * router's predicted hits that the engines really served.
 */
import { type MetricsRegistry, registerSamples } from "../util/metrics";
import type { KvedgeCore } from "../core/core";
import type { OpenAiProxy } from "./proxy";

export function registerObservedHitsMetrics(registry: MetricsRegistry, core: KvedgeCore): void {
  const perWorker = (
    name: string,
    help: string,
    type: "counter" | "gauge",
    read: (view: ReturnType<KvedgeCore["workers"]>[number]) => number | null,
  ) =>
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

export function registerProxyMetrics(registry: MetricsRegistry, proxy: OpenAiProxy): void {
  registerSamples(registry, {
    name: "kvedge_proxy_requests_total",
    help: "Proxied OpenAI requests by outcome: completed, client_abort, engine_error, unreachable (502), rejected (before routing), refused (at routing: no workers, admission's 429).",
    type: "counter",
    labelNames: ["outcome"],
    collect(emit) {
      const c = proxy.counters;
      emit(c.completed, { outcome: "completed" });
      emit(c.clientAborts, { outcome: "client_abort" });
      emit(c.engineErrors, { outcome: "engine_error" });
      emit(c.unreachable, { outcome: "unreachable" });
      emit(c.rejected, { outcome: "rejected" });
      emit(c.refused, { outcome: "refused" });
    },
  });
  registerSamples(registry, {
    name: "kvedge_proxy_failovers_total",
    help: "Times a chosen engine could not be reached and the next candidate was tried.",
    type: "counter",
    collect: (emit) => emit(proxy.counters.failovers),
  });
}
