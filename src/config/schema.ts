/**
 * Every kvedge setting, once: its key in the TOML file, its flag, its environment
 * variable, its type, default and help.
 *
 * Naming rule: the TOML key is `<section>.<name>`; the flag is `--<flag>`; the
 * environment variable is `KVEDGE_` + the flag in upper case with `-` as `_`
 * (`--admin-token` -> `KVEDGE_ADMIN_TOKEN`). Precedence: defaults < file < environment
 * < flags. The `[[workers]]` list is the exception to "one value per key": a list from
 * a higher source replaces the whole list from a lower one.
 */
import { ADMISSION_MODES, DEFAULT_ADMISSION } from "../route/admission";
import { DEFAULT_PACING, PACING_MODES } from "../route/pacing";
import { DEFAULT_TTFT_SETTINGS, ROUTE_POLICIES } from "../route/ttft";
import { DEFAULT_PREDICTED_TTL_MS, PREDICT_AT } from "../route/predictions";
import {
  DEFAULT_PENDING_RECOMPUTE_WEIGHT,
  DEFAULT_ROUTE_WEIGHTS,
  DEGRADED_FALLBACKS,
} from "../route/router";
import type { WorkerEntry } from "./workers";
import type { LoraAdapter } from "../hash";
import {
  boolean,
  cpuList,
  decimal,
  integer,
  loraAdapterList,
  oneOf,
  text,
  type ValueType,
} from "./values";

export const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
export const LOG_FORMATS = ["auto", "json", "pretty"] as const;
export const INDEX_BACKENDS = ["crtc", "positional", "reference"] as const;

/** The resolved configuration; field names are the TOML keys. */
export interface Config {
  readonly server: {
    readonly host: string;
    readonly port: number;
    readonly admin_token: string | null;
    readonly control_host: string;
    readonly control_port: number;
    readonly body_limit_bytes: number;
    readonly buffer_budget_bytes: number;
    readonly log_level: (typeof LOG_LEVELS)[number];
    readonly log_format: (typeof LOG_FORMATS)[number];
    readonly warmup_routes: number;
  };
  readonly index: {
    readonly block_size: number;
    readonly backend: (typeof INDEX_BACKENDS)[number];
    readonly memory_budget_bytes: number | null;
    readonly lora_adapters: readonly LoraAdapter[];
  };
  readonly route: {
    readonly policy: (typeof ROUTE_POLICIES)[number];
    readonly prefill_tokens_per_sec: number;
    readonly step_base_ms: number;
    readonly kv_read_ms_per_million_tokens: number;
    readonly max_batched_tokens: number;
    readonly recompute_weight: number;
    readonly calibrate: boolean;
    readonly overlap_score_credit: number;
    readonly overlap_score_credit_decay: number;
    readonly prefill_load_scale: number;
    readonly decode_active_request_weight: number;
    readonly temperature: number;
    readonly degraded_overlap_weight: number;
    readonly lower_tiers: boolean;
    readonly host_cache_hit_weight: number;
    readonly disk_cache_hit_weight: number;
    readonly host_reload_ms_per_million_tokens: number;
    readonly disk_reload_ms_per_million_tokens: number;
    readonly request_ttl_secs: number;
    readonly max_active_requests: number;
    readonly track_output_blocks: boolean;
    readonly pending_credit: boolean;
    readonly pending_recompute_weight: number;
    readonly predict_at: (typeof PREDICT_AT)[number];
    readonly predicted_capacity_blocks: number | null;
    readonly predicted_ttl_secs: number;
    readonly predicted_correction: boolean;
    readonly degraded_fallback: (typeof DEGRADED_FALLBACKS)[number];
    readonly admission: (typeof ADMISSION_MODES)[number];
    readonly admission_bound_ms: number;
    readonly admission_max_hold_ms: number;
    readonly admission_max_held: number;
    readonly admission_prefill_weight: number;
    readonly pacing: (typeof PACING_MODES)[number];
    readonly pacing_per_worker: number;
    readonly pacing_max_hold_ms: number;
  };
  readonly ingest: {
    readonly max_message_bytes: number;
    readonly heartbeat_interval_ms: number;
    readonly heartbeat_timeout_ms: number;
    readonly frame_timeout_ms: number;
    readonly reconnect_min_ms: number;
    readonly reconnect_max_ms: number;
    readonly replay_timeout_ms: number;
    readonly replay_deadline_ms: number;
    readonly replay_buffer_bytes: number;
    readonly idle_probe_ms: number;
    readonly allow_wildcard_endpoints: boolean;
  };
  readonly state: {
    readonly dir: string | null;
    readonly snapshot_interval_secs: number;
  };
  readonly proxy: {
    readonly enabled: boolean;
    readonly tokenizer: string | null;
    readonly model: string | null;
    readonly forward_token_ids: boolean;
    readonly observed_hit_floor: number;
    readonly observed_window: number;
    readonly connect_timeout_ms: number;
    readonly first_byte_timeout_ms: number;
    readonly idle_timeout_ms: number;
    readonly upstream_connections: number;
    readonly upstream_queue_timeout_ms: number;
    readonly max_prompt_tokens: number;
    readonly max_prompt_bytes: number;
    readonly tokenizer_threads: number;
    readonly warmup_streams: number;
  };
  readonly cluster: {
    readonly nats_url: string | null;
    readonly name: string;
    readonly replica_id: string | null;
    readonly lease_ms: number;
    readonly join_timeout_ms: number;
    readonly stagger_ms: number;
    readonly token: string | null;
    readonly user: string | null;
    readonly password: string | null;
    readonly credentials_file: string | null;
    readonly nkey_seed_file: string | null;
    readonly tls_ca_file: string | null;
    readonly tls_cert_file: string | null;
    readonly tls_key_file: string | null;
  };
  readonly runtime: {
    readonly cpus: readonly number[] | null;
    readonly numa_node: number | null;
    readonly index_threads: number | null;
    readonly route_threads: number | null;
  };
  readonly workers: readonly WorkerEntry[];
}

export interface Setting<T = unknown> {
  /** `section.name` in the TOML file. */
  readonly key: string;
  /** The long flag, without `--`. */
  readonly flag: string;
  readonly type: ValueType<T>;
  /** null = unset (only for optional settings). */
  readonly default: T | null;
  readonly optional?: boolean;
  /** Never printed (rendered as "set" / "not set"). */
  readonly secret?: boolean;
  readonly help: string;
}

const MIB = 1024 * 1024;
const HOST = /^[A-Za-z0-9._:-]+$/;
const TOKEN = /^[\x21-\x7e]+$/;
const HOUR_MS = 3_600_000;
/** One NATS server URL, or several separated by commas; no credentials in them (set them apart). */
const NATS_URLS = /^(nats|tls):\/\/[A-Za-z0-9._:[\]-]+(,(nats|tls):\/\/[A-Za-z0-9._:[\]-]+)*$/;
/** Subject tokens NATS takes as they are, dot-separated. */
const SUBJECT = /^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$/;
const FILE = (v: string) => v.length > 0 && !v.includes("\0");

function setting<T>(spec: Setting<T>): Setting {
  return spec as Setting;
}

export const SETTINGS: readonly Setting[] = [
  setting({
    key: "server.host",
    flag: "host",
    type: text("a host name or IP address", "HOST", (v) => HOST.test(v)),
    default: "127.0.0.1",
    help: "Address the HTTP server listens on (0.0.0.0 or :: for all interfaces).",
  }),
  setting({
    key: "server.port",
    flag: "port",
    type: integer(0, 65_535),
    default: 8080,
    help: "HTTP port (0 picks a free one).",
  }),
  setting({
    key: "server.admin_token",
    flag: "admin-token",
    type: text("printable ASCII without spaces", "TOKEN", (v) => TOKEN.test(v)),
    default: null,
    optional: true,
    secret: true,
    help: "Bearer token required to add or remove workers over HTTP; unset = no token needed (keep the default loopback bind then).",
  }),
  setting({
    key: "server.control_host",
    flag: "control-host",
    type: text("a host name or IP address", "HOST", (v) => HOST.test(v)),
    default: "127.0.0.1",
    help: "With proxy.enabled: the control listener's address. It serves everything but the OpenAI endpoints (the decision API, lifecycle calls, workers, dump, status page, metrics), which the proxy's port refuses (403); keep it on loopback or a trusted network.",
  }),
  setting({
    key: "server.control_port",
    flag: "control-port",
    type: integer(0, 65_535),
    default: 8081,
    help: "With proxy.enabled: the control listener's port (0 picks a free one).",
  }),
  setting({
    key: "server.body_limit_bytes",
    flag: "body-limit-bytes",
    type: integer(1024, 1024 * MIB),
    default: 8 * MIB,
    help: "Largest HTTP request body accepted.",
  }),
  setting({
    key: "server.buffer_budget_bytes",
    flag: "buffer-budget-bytes",
    type: integer(MIB, 1024 * 1024 * MIB),
    default: 1024 * MIB,
    help: "Bytes the whole process may hold for unfinished transfers (HTTP bodies being received, WebSocket send queues, large ZMQ frames being reassembled); past it new ones are refused: 503, WebSocket close 1013, ZMQ connection dropped and redialed.",
  }),
  setting({
    key: "server.log_level",
    flag: "log-level",
    type: oneOf(LOG_LEVELS),
    default: "info",
    help: "Least severe log level written.",
  }),
  setting({
    key: "server.log_format",
    flag: "log-format",
    type: oneOf(LOG_FORMATS),
    default: "auto",
    help: "Log lines as JSON, or compact text; auto = text on a terminal, JSON otherwise.",
  }),
  setting({
    key: "server.warmup_routes",
    flag: "warmup-routes",
    type: integer(0, 1_000_000),
    default: 4096,
    help: "Synthetic routes run on a scratch index before listening, so the first real ones do not wait for the JIT (0 = none).",
  }),
  setting({
    key: "index.block_size",
    flag: "block-size",
    type: integer(1, 65_536),
    default: 16,
    help: "Tokens per KV block; must equal the engines' block (page) size.",
  }),
  setting({
    key: "index.backend",
    flag: "index-backend",
    type: oneOf(INDEX_BACKENDS),
    default: "crtc",
    help: "Index data structure: crtc (compressed radix tree), positional ((position, hash) map), reference (the simple test oracle).",
  }),
  setting({
    key: "index.memory_budget_bytes",
    flag: "index-memory-budget-bytes",
    type: integer(1024 * 1024, Number.MAX_SAFE_INTEGER),
    default: null,
    optional: true,
    help: "Index memory past which new stores are refused (counted; the worker is degraded until the engine clears its cache or restarts); unset = half the machine's or cgroup's memory.",
  }),
  setting({
    key: "index.lora_adapters",
    flag: "lora-adapters",
    type: loraAdapterList,
    default: [],
    help: "LoRA adapters as NAME[=ID],...: an engine that names an adapter only by its lora_id (vLLM before 0.13, or an id in a request) is read as this name; the proxy serves these names as models. Blocks of an id with no name here are keyed by the id, never as base-model blocks.",
  }),
  setting({
    key: "route.policy",
    flag: "route-policy",
    type: oneOf(ROUTE_POLICIES),
    default: "ttft",
    help: "ttft: lowest predicted time to first token plus the recompute charge; dynamo: Dynamo's block cost (the weights below).",
  }),
  setting({
    key: "route.prefill_tokens_per_sec",
    flag: "prefill-tokens-per-sec",
    type: decimal(1, 1e9),
    default: DEFAULT_TTFT_SETTINGS.prefillTokensPerSecond,
    help: "Engine time model: prompt tokens an engine prefills per second.",
  }),
  setting({
    key: "route.step_base_ms",
    flag: "step-base-ms",
    type: decimal(0, 60_000),
    default: DEFAULT_TTFT_SETTINGS.stepBaseMs,
    help: "Engine time model: fixed cost of one scheduler step (reading the weights), ms.",
  }),
  setting({
    key: "route.kv_read_ms_per_million_tokens",
    flag: "kv-read-ms-per-million-tokens",
    type: decimal(0, 1e6),
    default: DEFAULT_TTFT_SETTINGS.kvReadMsPerMillionTokens,
    help: "Engine time model: step time to read the KV of one million active context tokens, ms.",
  }),
  setting({
    key: "route.max_batched_tokens",
    flag: "max-batched-tokens",
    type: integer(1, 1 << 24),
    default: DEFAULT_TTFT_SETTINGS.maxBatchedTokens,
    help: "Engine time model: tokens per scheduler step (vLLM max_num_batched_tokens).",
  }),
  setting({
    key: "route.recompute_weight",
    flag: "recompute-weight",
    type: decimal(0, 1e6),
    default: DEFAULT_TTFT_SETTINGS.recomputeWeight,
    help: "ttft policy: cost per ms of prefill a choice adds (what leaving the worker holding a prefix costs).",
  }),
  setting({
    key: "route.calibrate",
    flag: "calibrate",
    type: boolean,
    default: false,
    help: "Learn the fleet's prefill speed and step base from route -> prefill_done timings, a worker's own when clearly off (shown in /v1/workers and /metrics).",
  }),
  setting({
    key: "route.overlap_score_credit",
    flag: "overlap-score-credit",
    type: decimal(0, 1e6),
    default: 1,
    help: "Prefill blocks credited per block a worker already holds.",
  }),
  setting({
    key: "route.overlap_score_credit_decay",
    flag: "overlap-score-credit-decay",
    type: decimal(0, 1e6),
    default: 0,
    help: "Shrinks the credit of workers with more queued prefill than the least busy one (0 = off).",
  }),
  setting({
    key: "route.prefill_load_scale",
    flag: "prefill-load-scale",
    type: decimal(0, 1e6),
    default: 1,
    help: "Weight of prefill blocks (after the overlap credit) against decode blocks.",
  }),
  setting({
    key: "route.decode_active_request_weight",
    flag: "decode-active-request-weight",
    type: decimal(0, 1e6),
    default: 0,
    help: "Extra cost, in blocks, per request active on a worker.",
  }),
  setting({
    key: "route.temperature",
    flag: "router-temperature",
    type: decimal(0, 100),
    default: 0,
    help: "0 = lowest cost wins (random among ties); > 0 = softmax over normalized costs.",
  }),
  setting({
    key: "route.degraded_overlap_weight",
    flag: "degraded-overlap-weight",
    type: decimal(0, 1),
    default: 0.5,
    help: "Factor on the overlap of a worker whose events were lost without replay.",
  }),
  setting({
    key: "route.lower_tiers",
    flag: "lower-tiers",
    type: boolean,
    default: true,
    help: "Route on the blocks engines keep in host memory, disk or external storage after the device's (false: the device tier only).",
  }),
  setting({
    key: "route.host_cache_hit_weight",
    flag: "host-cache-hit-weight",
    type: decimal(0, 1),
    default: DEFAULT_ROUTE_WEIGHTS.hostCacheHitWeight,
    help: "dynamo policy: credit of a host-tier block after the device's, in device blocks (Dynamo's default).",
  }),
  setting({
    key: "route.disk_cache_hit_weight",
    flag: "disk-cache-hit-weight",
    type: decimal(0, 1),
    default: DEFAULT_ROUTE_WEIGHTS.diskCacheHitWeight,
    help: "dynamo policy: credit of a disk or external block after the host's, in device blocks (Dynamo's default).",
  }),
  setting({
    key: "route.host_reload_ms_per_million_tokens",
    flag: "host-reload-ms-per-million-tokens",
    type: decimal(0, 1e9),
    default: DEFAULT_TTFT_SETTINGS.hostReloadMsPerMillionTokens,
    help: "ttft policy: time to copy the KV of one million tokens from host memory to the device, ms (128 KiB a token over PCIe Gen5 x16 at ~50 GB/s).",
  }),
  setting({
    key: "route.disk_reload_ms_per_million_tokens",
    flag: "disk-reload-ms-per-million-tokens",
    type: decimal(0, 1e9),
    default: DEFAULT_TTFT_SETTINGS.diskReloadMsPerMillionTokens,
    help: "ttft policy: the same from disk or external storage, ms (128 KiB a token at ~7 GB/s, one NVMe Gen4 drive).",
  }),
  setting({
    key: "route.request_ttl_secs",
    flag: "request-ttl-secs",
    type: decimal(0.01, 604_800),
    default: 300,
    help: "A routed request with no lifecycle call for this long stops counting as load.",
  }),
  setting({
    key: "route.max_active_requests",
    flag: "max-active-requests",
    type: integer(1, 100_000_000),
    default: 1_000_000,
    help: "Most requests counted as load at once; past it the least recently touched one stops counting (evicted).",
  }),
  setting({
    key: "route.track_output_blocks",
    flag: "track-output-blocks",
    type: boolean,
    default: false,
    help: "Count each request's expected_output_tokens as decode blocks until done.",
  }),
  setting({
    key: "route.pending_credit",
    flag: "pending-credit",
    type: boolean,
    default: true,
    help: "ttft policy: a worker's active requests' prompt blocks count as cached there for a request sharing them, before the engine's events say so (vLLM caches a step's blocks when it schedules them; a burst sharing a prefix then lands on its holder).",
  }),
  setting({
    key: "route.pending_recompute_weight",
    flag: "pending-recompute-weight",
    type: decimal(0, 1e6),
    default: DEFAULT_PENDING_RECOMPUTE_WEIGHT,
    help: "ttft policy: the recompute charge per ms of prefill only pending on another worker (a burst's prefix in flight), instead of recompute_weight: a burst stays on its holder until that queue is about this many times the prefix's prefill, then spreads (the smaller of it and recompute_weight is used).",
  }),
  setting({
    key: "route.predict_at",
    flag: "predict-at",
    type: oneOf(PREDICT_AT),
    default: "prefill_done",
    help: "Approximate workers (no event endpoint): a routed request's prompt blocks become predicted blocks of its worker at prefill_done (the engine computed them) or at route time.",
  }),
  setting({
    key: "route.predicted_capacity_blocks",
    flag: "predicted-capacity-blocks",
    type: integer(1, 1 << 30),
    default: null,
    optional: true,
    help: "Approximate workers: KV capacity in blocks of index.block_size (vLLM's num_gpu_blocks, in kvedge blocks), unless a worker sets capacity_blocks; predictions past it are evicted tail first. Unset = unknown: predictions expire after predicted_ttl_secs.",
  }),
  setting({
    key: "route.predicted_ttl_secs",
    flag: "predicted-ttl-secs",
    type: decimal(0.001, 604_800),
    default: DEFAULT_PREDICTED_TTL_MS / 1000,
    help: "Approximate workers without a known capacity: a predicted block unused this long expires (Dynamo's approximate mode: 120 s).",
  }),
  setting({
    key: "route.predicted_correction",
    flag: "predicted-correction",
    type: boolean,
    default: true,
    help: "Approximate workers: an engine that reports fewer cached tokens than predicted (the proxy's usage.prompt_tokens_details.cached_tokens, or prefill_done's cached_tokens) has what an LRU cache lost before that block dropped from its predictions and its capacity shrunk.",
  }),
  setting({
    key: "route.degraded_fallback",
    flag: "degraded-fallback",
    type: oneOf(DEGRADED_FALLBACKS),
    default: "predictions",
    help: "An exact worker whose events were lost (degraded): predictions = from the moment it degrades kvedge also predicts its cache from its own decisions, as for an approximate worker, and routes it on the larger of those predictions and its indexed overlap times degraded_overlap_weight, until it is exact again; discount = on its indexed overlap times degraded_overlap_weight only.",
  }),
  setting({
    key: "route.admission",
    flag: "admission",
    type: oneOf(ADMISSION_MODES),
    default: DEFAULT_ADMISSION.mode,
    help: "When every worker's predicted wait is past the bound: off (route anyway), hold (answer when a worker frees, shortest prefill first), reject (hold, then 429 past the longest hold).",
  }),
  setting({
    key: "route.admission_bound_ms",
    flag: "admission-bound-ms",
    type: decimal(0, 3_600_000),
    default: DEFAULT_ADMISSION.boundMs,
    help: "Admission: a call is held while every worker's predicted wait for it (predicted TTFT less its own prefill) is above this, ms.",
  }),
  setting({
    key: "route.admission_max_hold_ms",
    flag: "admission-max-hold-ms",
    type: decimal(0, 3_600_000),
    default: DEFAULT_ADMISSION.maxHoldMs,
    help: "Admission: longest a call is held, ms; then it is routed anyway (hold) or answered 429 (reject).",
  }),
  setting({
    key: "route.admission_max_held",
    flag: "admission-max-held",
    type: integer(1, 1_000_000),
    default: DEFAULT_ADMISSION.maxHeld,
    help: "Admission: most calls held at once; one more is answered 429.",
  }),
  setting({
    key: "route.admission_prefill_weight",
    flag: "admission-prefill-weight",
    type: decimal(0, 1e6),
    default: DEFAULT_ADMISSION.prefillWeight,
    help: "Admission order: ms of waiting one ms of predicted prefill is worth (0 = arrival order; higher = shorter prompts first).",
  }),
  setting({
    key: "route.pacing",
    flag: "pacing",
    type: oneOf(PACING_MODES),
    default: DEFAULT_PACING.mode,
    help: "on: a routed request is sent to its engine only while fewer than route.pacing_per_worker sent there are still prefilling, or while those have route.max_batched_tokens or more left to prefill; the rest wait in kvedge in arrival order, so prompts that arrive together get their first tokens one after another instead of all at the end of one large step. Needs prefill_done (the proxy reports it itself).",
  }),
  setting({
    key: "route.pacing_per_worker",
    flag: "pacing-per-worker",
    type: integer(1, 1_000_000),
    default: DEFAULT_PACING.perWorker,
    help: "Pacing: requests sent to one worker and still prefilling, at most (unless they have a full step, route.max_batched_tokens, left to prefill).",
  }),
  setting({
    key: "route.pacing_max_hold_ms",
    flag: "pacing-max-hold-ms",
    type: decimal(0, 3_600_000),
    default: DEFAULT_PACING.maxHoldMs,
    help: "Pacing: longest a request waits in kvedge, ms; then it is sent anyway (a client that never reports prefill_done).",
  }),
  setting({
    key: "ingest.max_message_bytes",
    flag: "max-message-bytes",
    type: integer(4096, 1024 * MIB),
    default: 16 * MIB,
    help: "Largest ZMQ message accepted from an engine; a larger one is read past without being held, counted and skipped (the connection stays; the lost batch is a sequence gap, replayed if the engine has a replay endpoint).",
  }),
  setting({
    key: "ingest.heartbeat_interval_ms",
    flag: "heartbeat-interval-ms",
    type: integer(0, HOUR_MS),
    default: 5000,
    help: "ZMTP PING interval on engine connections (0 = off).",
  }),
  setting({
    key: "ingest.heartbeat_timeout_ms",
    flag: "heartbeat-timeout-ms",
    type: integer(1, HOUR_MS),
    default: 15_000,
    help: "A connection silent for this long is dropped and reconnected.",
  }),
  setting({
    key: "ingest.frame_timeout_ms",
    flag: "frame-timeout-ms",
    type: integer(1, HOUR_MS),
    default: 10_000,
    help: "A ZMQ frame (or multi-frame message) begun and not finished within this time drops the connection (a trickling peer), which is then reconnected.",
  }),
  setting({
    key: "ingest.reconnect_min_ms",
    flag: "reconnect-min-ms",
    type: integer(1, HOUR_MS),
    default: 100,
    help: "First reconnect delay; doubles up to reconnect_max_ms.",
  }),
  setting({
    key: "ingest.reconnect_max_ms",
    flag: "reconnect-max-ms",
    type: integer(1, HOUR_MS),
    default: 5000,
    help: "Longest reconnect delay.",
  }),
  setting({
    key: "ingest.replay_timeout_ms",
    flag: "replay-timeout-ms",
    type: integer(1, HOUR_MS),
    default: 5000,
    help: "How long to wait for each replay reply before giving up and marking the worker degraded.",
  }),
  setting({
    key: "ingest.replay_deadline_ms",
    flag: "replay-deadline-ms",
    type: integer(1, HOUR_MS),
    default: 30_000,
    help: "Longest a whole replay may take (however fast its replies come) before it is abandoned as failed.",
  }),
  setting({
    key: "ingest.replay_buffer_bytes",
    flag: "replay-buffer-bytes",
    type: integer(64 * 1024, 16 * 1024 * MIB),
    default: 64 * MIB,
    help: "Payload bytes one engine's source holds while a replay runs (live batches past it are dropped, then counted lost).",
  }),
  setting({
    key: "ingest.idle_probe_ms",
    flag: "idle-probe-ms",
    type: integer(0, HOUR_MS),
    default: 1000,
    help: "A stream with a replay endpoint that has been quiet this long asks it for anything after the last batch applied (a lost tail shows then, not at the next publish); one small request per quiet period per stream. 0 = never.",
  }),
  setting({
    key: "ingest.allow_wildcard_endpoints",
    flag: "allow-wildcard-endpoints",
    type: boolean,
    default: false,
    help: "Accept worker endpoints that name a wildcard address (tcp://*:PORT, which makes kvedge bind every interface; tcp://0.0.0.0:PORT, tcp://[::]:PORT), in the config and in POST /v1/workers; off = refused.",
  }),
  setting({
    key: "state.dir",
    flag: "state-dir",
    type: text("a directory path", "DIR", (v) => v.length > 0 && !v.includes("\0")),
    default: null,
    optional: true,
    help: "Keep a snapshot of the index and of each engine stream's position here; load it at start (warm restart).",
  }),
  setting({
    key: "state.snapshot_interval_secs",
    flag: "snapshot-interval-secs",
    type: integer(1, 86_400),
    default: 60,
    help: "Seconds between snapshots when state.dir is set (one is also written at SIGTERM/SIGINT).",
  }),
  setting({
    key: "proxy.enabled",
    flag: "proxy",
    type: boolean,
    default: false,
    help: "Serve OpenAI-compatible /v1/completions, /v1/chat/completions and /v1/models: tokenize, route, forward to the worker's http_endpoint.",
  }),
  setting({
    key: "proxy.tokenizer",
    flag: "tokenizer",
    type: text("a directory", "DIR", (v) => v.length > 0),
    default: null,
    optional: true,
    help: "Directory with the model's tokenizer.json and tokenizer_config.json (unset = only token-id prompts are proxied).",
  }),
  setting({
    key: "proxy.model",
    flag: "model",
    type: text("a model name", "NAME", (v) => v.length > 0 && v.length <= 256),
    default: null,
    optional: true,
    help: "Model name the proxy serves (unset = the tokenizer's name_or_path, else its directory name).",
  }),
  setting({
    key: "proxy.forward_token_ids",
    flag: "forward-token-ids",
    type: boolean,
    default: false,
    help: "Forward /v1/completions prompts as the token ids kvedge computed, so the engine does not tokenize again.",
  }),
  setting({
    key: "proxy.observed_hit_floor",
    flag: "observed-hit-floor",
    type: decimal(0, 1),
    default: 0.5,
    help: "A worker whose observed cached tokens stay below this fraction of the predicted ones is flagged, its overlap discounted like a degraded one (0 = never).",
  }),
  setting({
    key: "proxy.observed_window",
    flag: "observed-window",
    type: integer(1, 1_000_000),
    default: 32,
    help: "Answers (with a predicted hit) that the observed-hit check averages over; also the fewest it judges on.",
  }),
  setting({
    key: "proxy.connect_timeout_ms",
    flag: "connect-timeout-ms",
    type: integer(1, HOUR_MS),
    default: 5_000,
    help: "Longest wait for a connection to an engine; past it the next candidate is tried (nothing was sent). 5 s is Envoy's default connect timeout.",
  }),
  setting({
    key: "proxy.first_byte_timeout_ms",
    flag: "first-byte-timeout-ms",
    type: integer(1, 24 * HOUR_MS),
    default: 600_000,
    help: "Longest wait, once connected, for the engine's answer to begin; past it the client gets 504 and the engine connection is closed (the request is never sent elsewhere). A plain (not streamed) answer begins only when it is complete. 600 s is the OpenAI Python client's default timeout.",
  }),
  setting({
    key: "proxy.idle_timeout_ms",
    flag: "idle-timeout-ms",
    type: integer(1, 24 * HOUR_MS),
    default: 300_000,
    help: "Longest pause in an engine's answer once it has begun (a queue or a long prefill before the first token included); past it the client's stream is cut and the engine connection closed. 300 s is the idle timeout Bun's fetch applied before kvedge had its own.",
  }),
  setting({
    key: "proxy.upstream_connections",
    flag: "upstream-connections",
    type: integer(1, 1_000_000),
    default: 4096,
    help: "Engine connections open at once, over all engines (one per proxied request in flight, on the main thread or on the route lane the client came to; each client stream also holds one file descriptor). Past it requests wait in a queue as deep, up to proxy.upstream_queue_timeout_ms, then get 503 with Retry-After.",
  }),
  setting({
    key: "proxy.upstream_queue_timeout_ms",
    flag: "upstream-queue-timeout-ms",
    type: integer(1, HOUR_MS),
    default: 5_000,
    help: "Longest wait for a free engine connection (proxy.upstream_connections) before 503; as HAProxy's queue timeout, it defaults to the connect timeout's default.",
  }),
  setting({
    key: "proxy.max_prompt_tokens",
    flag: "max-prompt-tokens",
    type: integer(1, 4_000_000),
    default: 1_048_576,
    help: "Largest prompt proxied, in tokens (the longest contexts served today are about 1M tokens); a larger one gets 400.",
  }),
  setting({
    key: "proxy.max_prompt_bytes",
    flag: "max-prompt-bytes",
    type: integer(1024, 1024 * MIB),
    default: 8 * MIB,
    help: "Largest prompt text kvedge tokenizes, in UTF-8 bytes (a completions prompt, or a chat as its template renders it); a larger one gets 400 before it is tokenized.",
  }),
  setting({
    key: "proxy.tokenizer_threads",
    flag: "tokenizer-threads",
    type: integer(0, 64),
    default: 1,
    help: "Threads that tokenize large prompts (bodies over 16 KiB) and render their chat templates, off the thread that answers routes and health checks; 0 = on that thread (a 4 MB chat then stalls it for about 0.4 s).",
  }),
  setting({
    key: "proxy.warmup_streams",
    flag: "warmup-streams",
    type: integer(0, 100_000),
    default: 1024,
    help: "Proxied requests run against a scratch engine before listening, on the main thread and in each route lane, so the first real burst does not wait for the JIT (0 = none).",
  }),
  setting({
    key: "cluster.nats_url",
    flag: "cluster-nats",
    type: text(
      "nats://HOST:PORT or tls://HOST:PORT, several separated by commas, without credentials",
      "URL",
      (v) => NATS_URLS.test(v),
    ),
    default: null,
    optional: true,
    help: "NATS server(s) this process shares its routing facts over with the other kvedge processes of the fleet (unset = one process, as it decides alone). Credentials go in cluster.token / user / password / credentials_file, never in the URL.",
  }),
  setting({
    key: "cluster.name",
    flag: "cluster-name",
    type: text("NATS subject tokens (letters, digits, _ and -, joined by dots)", "NAME", (v) =>
      SUBJECT.test(v),
    ),
    default: "kvedge",
    help: "The fleet's subject prefix: processes with the same name on one NATS decide as one; other names are other fleets.",
  }),
  setting({
    key: "cluster.replica_id",
    flag: "cluster-replica-id",
    type: text("1 to 64 letters, digits, '.', '_' or '-'", "ID", (v) =>
      /^[A-Za-z0-9._-]{1,64}$/.test(v),
    ),
    default: null,
    optional: true,
    help: "This process's name among its peers (unset = host name, process id and a random suffix: unique per process start). Two running processes must never share one.",
  }),
  setting({
    key: "cluster.lease_ms",
    flag: "cluster-lease-ms",
    type: integer(500, 600_000),
    default: 3000,
    help: "A peer not heard for this long (it heartbeats every fifth of it) is taken for gone: its requests stop counting as load.",
  }),
  setting({
    key: "cluster.join_timeout_ms",
    flag: "cluster-join-timeout-ms",
    type: integer(0, 600_000),
    default: 2000,
    help: "How long a starting process waits for NATS and its peers' current sets before it opens its port (past it: it starts alone and says so, and takes them in when they come).",
  }),
  setting({
    key: "cluster.stagger_ms",
    flag: "cluster-stagger-ms",
    type: decimal(0, 1000),
    default: 0,
    help: "Replicas decide contested routes (the two cheapest workers within 5% of each other) in turn: the replica ranked k among the fleet's replica ids waits k × this many ms first, so decisions taken at the same moment on several replicas see each other's facts instead of all picking the same worker. Set it to about the bus's lag (kvedge_cluster_fact_lag_seconds, p99); 0 = every replica decides at once on what it has heard.",
  }),
  setting({
    key: "cluster.token",
    flag: "cluster-token",
    type: text("printable ASCII without spaces", "TOKEN", (v) => TOKEN.test(v)),
    default: null,
    optional: true,
    secret: true,
    help: "NATS token authentication.",
  }),
  setting({
    key: "cluster.user",
    flag: "cluster-user",
    type: text("printable ASCII without spaces", "USER", (v) => TOKEN.test(v)),
    default: null,
    optional: true,
    help: "NATS user (with cluster.password).",
  }),
  setting({
    key: "cluster.password",
    flag: "cluster-password",
    type: text("printable ASCII without spaces", "PASSWORD", (v) => TOKEN.test(v)),
    default: null,
    optional: true,
    secret: true,
    help: "NATS password (with cluster.user).",
  }),
  setting({
    key: "cluster.credentials_file",
    flag: "cluster-credentials",
    type: text("a file path", "FILE", FILE),
    default: null,
    optional: true,
    help: "NATS credentials file (.creds: a user JWT and its nkey seed).",
  }),
  setting({
    key: "cluster.nkey_seed_file",
    flag: "cluster-nkey-seed-file",
    type: text("a file path", "FILE", FILE),
    default: null,
    optional: true,
    help: "File holding a NATS nkey seed (SU...), for nkey authentication.",
  }),
  setting({
    key: "cluster.tls_ca_file",
    flag: "cluster-tls-ca",
    type: text("a file path", "FILE", FILE),
    default: null,
    optional: true,
    help: "CA certificate(s) (PEM) that NATS's server certificate must chain to; set it (or use tls:// URLs) to talk TLS.",
  }),
  setting({
    key: "cluster.tls_cert_file",
    flag: "cluster-tls-cert",
    type: text("a file path", "FILE", FILE),
    default: null,
    optional: true,
    help: "Client certificate (PEM) for NATS servers that verify clients (mutual TLS), with cluster.tls_key_file.",
  }),
  setting({
    key: "cluster.tls_key_file",
    flag: "cluster-tls-key",
    type: text("a file path", "FILE", FILE),
    default: null,
    optional: true,
    secret: true,
    help: "The client certificate's private key (PEM).",
  }),
  setting({
    key: "runtime.cpus",
    flag: "cpus",
    type: cpuList,
    default: null,
    optional: true,
    help: 'CPUs to pin kvedge\'s threads to, e.g. "0-3,8" (unset = no pinning).',
  }),
  setting({
    key: "runtime.numa_node",
    flag: "numa-node",
    type: integer(0, 1023),
    default: null,
    optional: true,
    help: "Pin to this NUMA node's CPUs (memory follows: pages are allocated on the node that first touches them); runtime.cpus wins if both are set.",
  }),
  setting({
    key: "runtime.index_threads",
    flag: "index-threads",
    type: integer(0, 1),
    default: null,
    optional: true,
    help: "0 = engine events are applied to the index on the main thread, between requests; 1 = on a writer thread of its own, fed through a shared-memory ring, while routes read the writer's index in shared memory (src/runtime/README.md). Unset = 0.",
  }),
  setting({
    key: "runtime.route_threads",
    flag: "route-threads",
    type: integer(0, 1024),
    default: null,
    optional: true,
    help: "0 = routes are answered on the main thread; N = N route lanes (threads sharing the port) parse, hash and answer, the main thread decides. Unset = from the CPU set (runtime.cpus, else the NUMA node's, else the CPUs the process may use): none below 4 CPUs (on 2 cores lanes measured 0.4x the routes/s), else the CPUs minus 2, at most 3 (past that the main thread's share of each route is the limit).",
  }),
];

/** `[[workers]]` entries; `--workers` / KVEDGE_WORKERS in the compact form. */
export const WORKERS_FLAG = "workers";
/** The config file path; KVEDGE_CONFIG in the environment. */
export const CONFIG_FLAG = "config";

export const SECTIONS = [...new Set(SETTINGS.map((s) => s.key.split(".")[0]!))];

export function envName(flag: string): string {
  return `KVEDGE_${flag.toUpperCase().replaceAll("-", "_")}`;
}

/** KVEDGE_* variables read by other parts of kvedge, not settings. */
export const OTHER_ENV = new Set(["KVEDGE_NATIVE", "KVEDGE_NATIVE_AVX2", "KVEDGE_VERIFY"]);
