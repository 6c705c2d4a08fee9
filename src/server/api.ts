/**
 * The API operations, independent of transport: each takes a parsed request body and
 * returns the response body (or throws HttpError). HTTP (app.ts) and the WebSocket
 * endpoint (ws.ts) both call these, so the two APIs cannot drift apart.
 */
import type { WorkerEntry } from "../config/workers";
import { checkEndpoint } from "../config";
import { RouteError, type Candidate } from "../route";
import type { LifecycleResult, LoadTracker } from "../route/load";
import { REQUEST_ID_LENGTH_MAX } from "../route/load";
import {
  asObject, HttpError, optionalInt, optionalNumber, optionalString, tokenIds, u64Field,
} from "./http";
import type { KvRouterService, MatchScore } from "./service";
import { encodeMsgpack, type MsgpackWriter } from "../wire/msgpack";

/** Most candidates a route response lists. */
export const CANDIDATES_MAX = 64;
/**
 * Candidates listed when the request does not say: the pick and a few fallbacks. The
 * full list is for debugging; as a default it made every answer ~10 KB and the route
 * ~4x the CPU (44 µs against 10 µs at 64 workers, parse excluded).
 */
export const CANDIDATES_DEFAULT = 4;
const OUTPUT_TOKENS_MAX = 1 << 24;
const DP_RANK_MAX = 0xffff_ffff;
const TOPIC_LENGTH_MAX = 1024;

const scoreJson = (score: MatchScore) => ({
  worker_id: score.workerId.toString(), dp_rank: score.dpRank, blocks: score.blocks,
});

/** POST /v1/match: `{"token_ids":[…], "lora_name"?, "cache_salt"?}` or `{"local_hashes":["…"]}`. */
export function matchOp(service: KvRouterService, raw: unknown) {
  const body = asObject(raw);
  let local: Uint32Array;
  let count: number;
  if (body.local_hashes !== undefined) {
    if (body.token_ids !== undefined) throw new HttpError(400, "give token_ids or local_hashes, not both");
    const hashes = body.local_hashes;
    if (!Array.isArray(hashes)) throw new HttpError(400, "local_hashes must be an array of decimal strings");
    count = hashes.length;
    local = new Uint32Array(2 * count);
    for (let i = 0; i < count; i++) {
      const hash = u64Field(hashes[i], `local_hashes[${i}]`);
      local[2 * i] = Number(hash >> 32n);
      local[2 * i + 1] = Number(hash & 0xffff_ffffn);
    }
  } else {
    const prompt = service.hash(tokenIds(body), optionalString(body, "lora_name"), optionalString(body, "cache_salt"));
    local = prompt.local;
    count = prompt.blockCount;
  }
  return { block_size: service.blockSize, query_blocks: count, scores: service.match(local, count).map(scoreJson) };
}

const candidateJson = (load: LoadTracker, candidate: Candidate) => ({
  worker_id: load.workerIdTextOf(candidate.slot),
  dp_rank: candidate.dpRank,
  overlap_blocks: candidate.overlapBlocks,
  cost: candidate.cost,
  degraded: candidate.degraded,
  active_prefill_tokens: candidate.activePrefillTokens,
  active_decode_blocks: candidate.activeDecodeBlocks,
  active_requests: candidate.activeRequests,
});

export type RouteResult = ReturnType<typeof routeOp>;

/** POST /v1/route: picks a worker and records the request as its load. */
export function routeOp(service: KvRouterService, raw: unknown) {
  const body = asObject(raw);
  const requestId = optionalString(body, "request_id", REQUEST_ID_LENGTH_MAX);
  if (requestId === "") throw new HttpError(400, "request_id must not be empty");
  const input = {
    tokens: tokenIds(body),
    requestId,
    loraName: optionalString(body, "lora_name"),
    cacheSalt: optionalString(body, "cache_salt"),
    expectedOutputTokens: optionalInt(body, "expected_output_tokens", 0, OUTPUT_TOKENS_MAX),
    overlapScoreCredit: optionalNumber(body, "overlap_score_credit", 0, 1e6),
    prefillLoadScale: optionalNumber(body, "prefill_load_scale", 0, 1e6),
    temperature: optionalNumber(body, "temperature", 0, 100),
  };
  const candidatesMax = optionalInt(body, "candidates", 0, CANDIDATES_MAX) ?? CANDIDATES_DEFAULT;
  try {
    const { decision, queryBlocks } = service.route(input, candidatesMax);
    const load = service.router.load;
    const candidates = [];
    for (const candidate of decision.candidates) candidates.push(candidateJson(load, candidate));
    return {
      request_id: decision.requestId,
      worker_id: load.workerIdTextOf(decision.slot),
      dp_rank: decision.dpRank,
      query_blocks: queryBlocks,
      overlap_blocks: decision.overlapBlocks,
      cost: decision.cost,
      candidates,
    };
  } catch (error) {
    if (!(error instanceof RouteError)) throw error;
    const status = error.code === "no_workers" ? 503 : error.code === "duplicate_request" ? 409 : 400;
    throw new HttpError(status, error.message);
  }
}

/** POST /v1/requests/{id}/prefill_done and /done: idempotent; unknown id → 404. */
export function lifecycleOp(service: KvRouterService, requestId: string, step: "prefill_done" | "done") {
  if (requestId.length === 0 || requestId.length > REQUEST_ID_LENGTH_MAX) {
    throw new HttpError(400, `request id must be 1 to ${REQUEST_ID_LENGTH_MAX} characters`);
  }
  const result: LifecycleResult = step === "done" ? service.done(requestId) : service.prefillDone(requestId);
  if (result === "unknown") throw new HttpError(404, `unknown request ${JSON.stringify(requestId)}`);
  return { request_id: requestId, status: result };
}

export function workersOp(service: KvRouterService) {
  return {
    block_size: service.blockSize,
    workers: service.workers().map((view) => ({
      worker_id: view.workerId.toString(),
      dp_rank: view.dpRank,
      endpoint: view.endpoint,
      replay_endpoint: view.replayEndpoint,
      topic: view.topic,
      state: view.state,
      degraded: view.degraded,
      blocks: view.blocks,
      active_requests: view.activeRequests,
      active_prefill_tokens: view.activePrefillTokens,
      active_decode_blocks: view.activeDecodeBlocks,
      routed_total: view.routedTotal,
      last_seq: view.lastSeq,
      lost_batches: view.lostBatches,
    })),
  };
}

/** POST /v1/workers: `{"worker_id","dp_rank"?,"endpoint","replay_endpoint"?,"topic"?}`. */
export async function addWorkerOp(service: KvRouterService, raw: unknown) {
  const body = asObject(raw);
  const known = new Set(["worker_id", "dp_rank", "endpoint", "replay_endpoint", "topic"]);
  for (const key of Object.keys(body)) if (!known.has(key)) throw new HttpError(400, `unknown field ${key}`);
  const endpointOf = (field: string, bindable: boolean): string | null => {
    const value = optionalString(body, field);
    if (value === null) return null;
    try {
      return checkEndpoint(value, bindable);
    } catch (error) {
      throw new HttpError(400, `${field} ${(error as Error).message}`);
    }
  };
  const endpoint = endpointOf("endpoint", true);
  if (endpoint === null) throw new HttpError(400, "endpoint is required");
  const entry: WorkerEntry = {
    worker_id: u64Field(body.worker_id, "worker_id"),
    dp_rank: optionalInt(body, "dp_rank", 0, DP_RANK_MAX) ?? 0,
    endpoint,
    replay_endpoint: endpointOf("replay_endpoint", false),
    topic: optionalString(body, "topic", TOPIC_LENGTH_MAX) ?? "",
  };
  await service.addWorker(entry);
  return { worker_id: entry.worker_id.toString(), dp_rank: entry.dp_rank, endpoint, status: "added" };
}

/** DELETE /v1/workers/{id}: stops its sources and purges its blocks; 404 if unknown. */
export async function removeWorkerOp(service: KvRouterService, id: string) {
  const workerId = u64Field(id, "worker id");
  if (!(await service.removeWorker(workerId))) throw new HttpError(404, `unknown worker ${id}`);
  return { worker_id: id, status: "removed" };
}

const key = (name: string) => encodeMsgpack(name);
const K = {
  request_id: key("request_id"), worker_id: key("worker_id"), dp_rank: key("dp_rank"), query_blocks: key("query_blocks"),
  overlap_blocks: key("overlap_blocks"), cost: key("cost"), candidates: key("candidates"), degraded: key("degraded"),
  active_prefill_tokens: key("active_prefill_tokens"), active_decode_blocks: key("active_decode_blocks"),
  active_requests: key("active_requests"),
};

/**
 * A route result as MessagePack, the same map `writer.value(result)` writes, field by
 * field with keys encoded once: the answer of every WebSocket route, where the generic
 * walk over the objects was one of the largest costs.
 */
export function writeRouteResult(writer: MsgpackWriter, result: RouteResult): void {
  writer.mapHeader(7);
  writer.encoded(K.request_id);
  writer.string(result.request_id);
  writer.encoded(K.worker_id);
  writer.string(result.worker_id);
  writer.encoded(K.dp_rank);
  writer.number(result.dp_rank);
  writer.encoded(K.query_blocks);
  writer.number(result.query_blocks);
  writer.encoded(K.overlap_blocks);
  writer.number(result.overlap_blocks);
  writer.encoded(K.cost);
  writer.number(result.cost);
  writer.encoded(K.candidates);
  writer.arrayHeader(result.candidates.length);
  for (const candidate of result.candidates) {
    writer.mapHeader(8);
    writer.encoded(K.worker_id);
    writer.string(candidate.worker_id);
    writer.encoded(K.dp_rank);
    writer.number(candidate.dp_rank);
    writer.encoded(K.overlap_blocks);
    writer.number(candidate.overlap_blocks);
    writer.encoded(K.cost);
    writer.number(candidate.cost);
    writer.encoded(K.degraded);
    writer.bool(candidate.degraded);
    writer.encoded(K.active_prefill_tokens);
    writer.number(candidate.active_prefill_tokens);
    writer.encoded(K.active_decode_blocks);
    writer.number(candidate.active_decode_blocks);
    writer.encoded(K.active_requests);
    writer.number(candidate.active_requests);
  }
}
