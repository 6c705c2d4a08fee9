/**
 * The API operations, independent of transport: each takes a parsed request body,
 * calls the core and returns the response body (or throws a KvedgeError: a malformed
 * request's, or the core's refusal). HTTP (app.ts) and the WebSocket
 * endpoint (ws.ts) both call these, so the two APIs cannot drift apart.
 */
import type { WorkerEntry } from "../config/workers";
import { checkEndpoint } from "../config";
import { CAPACITY_BLOCKS_MAX, checkHttpEndpoint } from "../config/workers";
import { KvedgeError } from "../domain/errors";
import type { LifecycleResult } from "../route/load";
import { REQUEST_ID_LENGTH_MAX } from "../route/load";
import {
  asObject,
  optionalInt,
  optionalNumber,
  optionalString,
  tokenIds,
  u64Field,
} from "../http/http";
import type { Cluster } from "../cluster/cluster";
import type { KvedgeCore, MatchScore, RouteCall, RouteInput, RouteOutcome } from "../core/core";
import type { LoraAdapters } from "../hash";
import { routeAnswer } from "./route-answer";

/** Most candidates a route response lists. */
export const CANDIDATES_MAX = 64;
/**
 * Candidates listed when the request does not say: the pick and a few fallbacks. The
 * full list is for debugging; as a default it made every answer ~10 KB and the route
 * ~4x the CPU (44 µs against 10 µs at 64 workers, parse excluded).
 */
// See docs/decisions.md#four-candidates.
export const CANDIDATES_DEFAULT = 4;
const OUTPUT_TOKENS_MAX = 1 << 24;
const DP_RANK_MAX = 0xffff_ffff;
const TOPIC_LENGTH_MAX = 1024;

/** A match score; the lower tiers' blocks only for a worker that has some (as `kvedge apply`). */
const scoreJson = (score: MatchScore) => {
  const json = {
    worker_id: score.workerId.toString(),
    dp_rank: score.dpRank,
    blocks: score.blocks,
    kind: score.kind,
  };
  const { hostBlocks, diskBlocks, externalBlocks } = score;
  if (hostBlocks + diskBlocks + externalBlocks === 0) return json;
  return { ...json, host_pinned: hostBlocks, disk: diskBlocks, external: externalBlocks };
};

/** POST /v1/match: `{"token_ids":[…], "lora_name"? or "lora_id"?, "cache_salt"?}` or `{"local_hashes":["…"]}`. */
export function matchOp(core: KvedgeCore, raw: unknown) {
  const body = asObject(raw);
  let local: Uint32Array;
  let chain: Uint32Array | undefined;
  let count: number;
  if (body.local_hashes !== undefined) {
    if (body.token_ids !== undefined)
      throw new KvedgeError("bad_request", "give token_ids or local_hashes, not both");
    const hashes = body.local_hashes;
    if (!Array.isArray(hashes))
      throw new KvedgeError("bad_request", "local_hashes must be an array of decimal strings");
    count = hashes.length;
    local = new Uint32Array(2 * count);
    for (let i = 0; i < count; i++) {
      const hash = u64Field(hashes[i], `local_hashes[${i}]`);
      local[2 * i] = Number(hash >> 32n);
      local[2 * i + 1] = Number(hash & 0xffff_ffffn);
    }
  } else {
    const prompt = core.hash(
      tokenIds(body),
      loraOf(body, core.lora),
      optionalString(body, "cache_salt"),
    );
    local = prompt.local;
    chain = prompt.chain;
    count = prompt.blockCount;
  }
  const scores = core.match(local, count, chain).map(scoreJson);
  return { block_size: core.blockSize, query_blocks: count, scores };
}

/** A parsed route request: what the core routes. */
export interface ParsedRoute {
  readonly input: RouteInput;
  readonly candidatesMax: number;
}

const LORA_ID_MAX = 0xffff_ffff;

/**
 * The LoRA adapter a request names, as blocks are keyed (src/hash/lora.ts): its
 * `lora_name`, else its `lora_id` (through the configured adapters); null = base model.
 */
export function loraOf(body: Record<string, unknown>, lora: LoraAdapters): string | null {
  return lora.identity(
    optionalString(body, "lora_name"),
    optionalInt(body, "lora_id", 0, LORA_ID_MAX),
  );
}

/** Parses a route request (400 on bad fields). */
export function parseRoute(raw: unknown, lora: LoraAdapters): ParsedRoute {
  const body = asObject(raw);
  const requestId = optionalString(body, "request_id", REQUEST_ID_LENGTH_MAX);
  if (requestId === "") throw new KvedgeError("bad_request", "request_id must not be empty");
  const input = {
    tokens: tokenIds(body),
    requestId,
    loraName: loraOf(body, lora),
    cacheSalt: optionalString(body, "cache_salt"),
    expectedOutputTokens: optionalInt(body, "expected_output_tokens", 0, OUTPUT_TOKENS_MAX),
    overlapScoreCredit: optionalNumber(body, "overlap_score_credit", 0, 1e6),
    prefillLoadScale: optionalNumber(body, "prefill_load_scale", 0, 1e6),
    temperature: optionalNumber(body, "temperature", 0, 100),
  };
  const candidatesMax = optionalInt(body, "candidates", 0, CANDIDATES_MAX) ?? CANDIDATES_DEFAULT;
  return { input, candidatesMax };
}

/** Parses a route request, picks a worker now and records the request as its load. */
export function decideRoute(core: KvedgeCore, raw: unknown): RouteOutcome {
  const { input, candidatesMax } = parseRoute(raw, core.lora);
  return core.route(input, candidatesMax);
}

/**
 * A route through admission (route.admission): `answer` or `fail` is called once, now
 * or when a held call is released; returns a handle to drop the call by if it is held
 * (its client went away), else -1. With admission on, the tokens are copied: a held
 * call outlives the parser's transient arrays.
 */
export function submitRoute(
  core: KvedgeCore,
  raw: unknown,
  answer: (outcome: RouteOutcome) => void,
  fail: (error: unknown) => void,
): { handle: number; call: RouteCall } {
  const { input, candidatesMax } = parseRoute(raw, core.lora);
  const kept = core.mayHold ? { ...input, tokens: input.tokens.slice() } : input;
  const call: RouteCall = { input: kept, candidatesMax, answer, fail };
  return { handle: core.submitRoute(call), call };
}

/** POST /v1/route: picks a worker and records the request as its load. */
export function routeOp(core: KvedgeCore, raw: unknown) {
  return routeAnswer(core, decideRoute(core, raw));
}

/** Most cached tokens a prefill_done may report. */
const CACHED_TOKENS_MAX = 2 ** 31;

/**
 * POST /v1/requests/{id}/prefill_done and /done: idempotent; unknown id → 404.
 * prefill_done's optional body `{"cached_tokens": N}` is what the engine served from
 * its cache (`usage.prompt_tokens_details.cached_tokens`): it corrects an approximate
 * worker's predictions.
 */
export function lifecycleOp(
  core: KvedgeCore,
  requestId: string,
  step: "prefill_done" | "done",
  raw: unknown = null,
) {
  if (requestId.length === 0 || requestId.length > REQUEST_ID_LENGTH_MAX) {
    throw new KvedgeError(
      "bad_request",
      `request id must be 1 to ${REQUEST_ID_LENGTH_MAX} characters`,
    );
  }
  const cached =
    raw === null || step === "done"
      ? null
      : optionalInt(asObject(raw), "cached_tokens", 0, CACHED_TOKENS_MAX);
  const result: LifecycleResult =
    step === "done" ? core.done(requestId) : core.prefillDone(requestId, cached);
  if (result === "unknown")
    throw new KvedgeError("unknown_request", `unknown request ${JSON.stringify(requestId)}`);
  return { request_id: requestId, status: result };
}

export function workersOp(core: KvedgeCore, cluster: Cluster | null = null) {
  const shared = cluster?.status() ?? null;
  return {
    block_size: core.blockSize,
    // Load below counts every replica's requests (own_ and peer_ split it); null: this process alone.
    cluster:
      shared === null
        ? null
        : {
            state: shared.state,
            since_ms: shared.since_ms,
            replica_id: shared.replica_id,
            peers: shared.peers.length,
          },
    workers: core.workers().map((view) => ({
      worker_id: view.workerId.toString(),
      dp_rank: view.dpRank,
      endpoint: view.endpoint,
      replay_endpoint: view.replayEndpoint,
      topic: view.topic,
      state: view.state,
      degraded: view.degraded,
      degraded_reason: view.degradedReason,
      blocks: view.blocks,
      active_requests: view.activeRequests,
      active_prefill_tokens: view.activePrefillTokens,
      active_decode_blocks: view.activeDecodeBlocks,
      own_active_requests: view.activeRequests - view.peerActiveRequests,
      own_active_prefill_tokens: view.activePrefillTokens - view.peerActivePrefillTokens,
      peer_active_requests: view.peerActiveRequests,
      peer_active_prefill_tokens: view.peerActivePrefillTokens,
      routed_total: view.routedTotal,
      last_seq: view.lastSeq,
      lost_batches: view.lostBatches,
      event_lag_ms: view.eventLagMs,
      http_endpoint: view.httpEndpoint,
      mode: view.mode,
      predicted_blocks: view.predicted?.blocks ?? null,
      predicted_capacity_blocks: view.predicted?.capacityBlocks ?? null,
      observed_hits: {
        answers: view.observed.answers,
        answers_without_usage: view.observed.answersWithoutUsage,
        bad_answers: view.observed.badAnswers,
        prompt_tokens: view.observed.promptTokens,
        predicted_cached_tokens: view.observed.predictedTokens,
        observed_cached_tokens: view.observed.observedTokens,
        recent_ratio: view.observed.recentRatio,
        suspect: view.observed.suspect,
        under_predicted: view.observed.underPredicted,
      },
      prefill_tokens_per_sec: view.times.prefillTokensPerSecond,
      step_base_ms: view.times.stepBaseMs,
      calibration_samples: view.times.samples,
    })),
  };
}

function httpEndpointOf(value: string | null): string | null {
  if (value === null) return null;
  try {
    return checkHttpEndpoint(value);
  } catch (error) {
    throw new KvedgeError("bad_request", `http_endpoint ${(error as Error).message}`);
  }
}

/**
 * POST /v1/workers: `{"worker_id","dp_rank"?,"endpoint"?,"replay_endpoint"?,"topic"?,
 * "http_endpoint"?,"capacity_blocks"?}`. Without an endpoint the worker is approximate
 * (its cache predicted from kvedge's decisions, at most capacity_blocks). A worker that
 * exists in the other mode switches (status "switched").
 */
export async function addWorkerOp(core: KvedgeCore, raw: unknown) {
  const body = asObject(raw);
  const known = new Set([
    "worker_id",
    "dp_rank",
    "endpoint",
    "replay_endpoint",
    "topic",
    "http_endpoint",
    "capacity_blocks",
  ]);
  for (const key of Object.keys(body))
    if (!known.has(key)) throw new KvedgeError("bad_request", `unknown field ${key}`);
  const endpointOf = (field: string, bindable: boolean): string | null => {
    const value = optionalString(body, field);
    if (value === null) return null;
    try {
      return checkEndpoint(value, bindable);
    } catch (error) {
      throw new KvedgeError("bad_request", `${field} ${(error as Error).message}`);
    }
  };
  const endpoint = endpointOf("endpoint", true);
  const capacity = optionalInt(body, "capacity_blocks", 1, CAPACITY_BLOCKS_MAX);
  const entry: WorkerEntry = {
    worker_id: u64Field(body.worker_id, "worker_id"),
    dp_rank: optionalInt(body, "dp_rank", 0, DP_RANK_MAX) ?? 0,
    endpoint,
    replay_endpoint: endpointOf("replay_endpoint", false),
    topic: optionalString(body, "topic", TOPIC_LENGTH_MAX) ?? "",
    http_endpoint: httpEndpointOf(optionalString(body, "http_endpoint")),
    capacity_blocks: capacity,
  };
  const status = await core.addWorker(entry);
  return {
    worker_id: entry.worker_id.toString(),
    dp_rank: entry.dp_rank,
    endpoint,
    mode: endpoint === null ? "approximate" : "exact",
    status,
  };
}

/** DELETE /v1/workers/{id}: stops its sources and purges its blocks; 404 if unknown. */
export async function removeWorkerOp(core: KvedgeCore, id: string) {
  const workerId = u64Field(id, "worker id");
  if (!(await core.removeWorker(workerId)))
    throw new KvedgeError("unknown_worker", `unknown worker ${id}`);
  return { worker_id: id, status: "removed" };
}
