/**
 * `/v1/ws`: the API for high-rate gateways. One connection carries many requests,
 * each tagged with the client's `id`; answers carry the same `id` and may be matched
 * out of order. A frame holds one request object or an array of them (a batch, answered
 * with an array in one frame). Text frames are JSON; binary frames are MessagePack and
 * get MessagePack answers.
 *
 *   → {"id": 7, "op": "route", "token_ids": [...], "request_id"?: "...", ...}
 *   ← {"id": 7, "status": 200, "result": {...same body as POST /v1/route...}}
 *   ← {"id": 8, "status": 404, "error": "unknown request \"x\""}
 *
 * Ops: route, match, prefill_done, done (the last two take "request_id").
 *
 * With admission on (route.admission), a route held at saturation is answered later,
 * in a frame of its own (in a batch, the answer array leaves it out); a 429 answer
 * carries "retry_after" (seconds). A connection that closes drops its held routes.
 *
 * For high rates, send binary frames with `token_ids` as a MessagePack `bin` of
 * little-endian u32s (4 bytes per token) instead of an array: the server copies them
 * in one step, with no per-token work (the array form, and JSON text, cost a parse per
 * token), and reads such frames without a generic decoder (./request-msgpack.ts). Any
 * length that is not a multiple of 4 bytes is a 400. With msgpackr, `pack({id, op:
 * "route", token_ids: new Uint8Array(tokens.buffer, tokens.byteOffset,
 * tokens.byteLength)})` for a Uint32Array `tokens`. The same form works in HTTP bodies
 * sent as `Content-Type: application/msgpack`.
 */
import { KvedgeError } from "../domain/errors";
import type { ServerWebSocket, WebSocketHandler } from "bun";
import { Unpackr } from "msgpackr";
import { bufferBudget } from "../util/buffer-budget";
import type { Logger } from "../util/log";
import { encodeMsgpack, MsgpackEncoder, type MsgpackValue } from "../wire/msgpack";
import { decideRoute, lifecycleOp, matchOp, routeOp, submitRoute } from "./api";
import { routeAnswer, writeRouteAnswer } from "./route-answer";
import {
  clientError,
  type ErrorObject,
  errorObject,
  INTERNAL_ERROR,
  STATUS_OF,
} from "../http/errors";
import { toJson } from "../http/http";
import type { ServerMetrics } from "./metrics";
import { defaultTokenScanner, parseRequestJson } from "../http/request-json";
import type { KvedgeCore, RouteCall, RouteOutcome } from "../core/core";
import type { TurnBatch } from "./turn";
import { MsgpackRequestReader } from "../wire/request-msgpack";

/**
 * Per connection: bytes of its send queue counted in the process-wide buffer budget,
 * and its routes held by admission (call -> handle), dropped when it closes.
 */
export interface WsData {
  held: number;
  readonly heldRoutes: Map<RouteCall, number>;
}

export const newWsData = (): WsData => ({ held: 0, heldRoutes: new Map() });

/** Largest frame a client may send; a batch of requests fits easily. */
export const WS_FRAME_BYTES_MAX = 16 * 1024 * 1024;
/** Most requests in one batch frame. */
export const WS_BATCH_MAX = 4096;

const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });
/** Reads the usual binary frames without msgpackr (../wire/request-msgpack.ts); others: unpackr. */
const frameReader = new MsgpackRequestReader(WS_BATCH_MAX);
/** Answers are written here and sent at once (send copies the bytes out). */
const encoder = new MsgpackEncoder(64 * 1024);
/** Held routes' answers: released from inside another frame's op, while `encoder` is in use. */
const heldEncoder = new MsgpackEncoder(16 * 1024);
const ID_KEY = encodeMsgpack("id");
const STATUS_KEY = encodeMsgpack("status");
const RESULT_KEY = encodeMsgpack("result");

interface Answer {
  id: unknown;
  status: number;
  result?: unknown;
  error?: ErrorObject;
  retry_after?: number;
}

/** A held route's answer, sent in a frame of its own. */
function sendLater(
  ws: ServerWebSocket<WsData>,
  binary: boolean,
  core: KvedgeCore,
  id: unknown,
  outcome: RouteOutcome,
): void {
  if (!binary) {
    deliver(ws, toJson({ id, status: 200, result: routeAnswer(core, outcome) }));
    return;
  }
  heldEncoder.reset();
  writeRouteFrame(heldEncoder, core, id, outcome);
  deliver(ws, heldEncoder.written());
}

/** `{id, status: 200, result}` for a route, the result written straight from the decision. */
function writeRouteFrame(
  out: MsgpackEncoder,
  core: KvedgeCore,
  id: unknown,
  outcome: RouteOutcome,
): void {
  out.mapHeader(3);
  out.encoded(ID_KEY);
  out.value(id as MsgpackValue);
  out.encoded(STATUS_KEY);
  out.number(200);
  out.encoded(RESULT_KEY);
  writeRouteAnswer(out, core, outcome);
}

export function websocketHandlers(
  core: KvedgeCore,
  log: Logger,
  metrics: ServerMetrics,
  batch: TurnBatch,
): WebSocketHandler<WsData> {
  const api = new WsApi(core, log, metrics);
  return {
    maxPayloadLength: WS_FRAME_BYTES_MAX,
    // Compressing token ids and answers costs more CPU than the bytes are worth on
    // the networks a router runs on.
    perMessageDeflate: false,
    backpressureLimit: 64 * 1024 * 1024,
    closeOnBackpressureLimit: true,
    idleTimeout: 300,
    // A client that does not read grows its send queue: counted in the process-wide
    // budget; past it the connection is closed (1013, try again later).
    drain: account,
    close(ws: ServerWebSocket<WsData>) {
      bufferBudget.give(ws.data.held);
      ws.data.held = 0;
      for (const [call, handle] of ws.data.heldRoutes) core.dropHeld(handle, call);
      ws.data.heldRoutes.clear();
    },
    message(ws: ServerWebSocket<WsData>, message: string | Buffer) {
      // Answered at once (./turn.ts says why), after the HTTP requests that came first.
      batch.drain();
      api.frame(ws, message);
    },
  };
}

/** The ops of `/v1/ws` over the core: a frame in, its answers out. */
class WsApi {
  constructor(
    private readonly core: KvedgeCore,
    private readonly log: Logger,
    private readonly metrics: ServerMetrics,
  ) {}

  /** One frame: a request or a batch of them, answered in one frame (held routes later). */
  frame(ws: ServerWebSocket<WsData>, message: string | Buffer): void {
    const binary = typeof message !== "string";
    // With admission on, answers are objects: a held route leaves its place out of the frame.
    const objects = this.core.mayHold;
    if (binary && frameReader.read(message)) {
      this.readFrame(ws, objects);
      return;
    }
    let parsed: unknown;
    try {
      parsed = binary
        ? unpackr.unpack(message)
        : parseRequestJson(message, defaultTokenScanner, true);
    } catch (error) {
      const what = binary ? "MessagePack" : "JSON";
      const text = `malformed ${what}: ${(error as Error).message}`;
      send(ws, binary, this.errorAnswer(null, new KvedgeError("bad_request", text)));
      return;
    }
    if (Array.isArray(parsed) && parsed.length > WS_BATCH_MAX) {
      const text = `a batch holds at most ${WS_BATCH_MAX} requests`;
      send(ws, binary, this.errorAnswer(null, new KvedgeError("too_large", text)));
      return;
    }
    if (!binary || objects) {
      const requests: unknown[] = Array.isArray(parsed) ? parsed : [parsed];
      const answers = requests.map((request) => this.answer(ws, binary, request, null));
      sendAnswers(ws, binary, Array.isArray(parsed), answers);
      return;
    }
    // MessagePack answers are written as they are made, into one reused buffer.
    encoder.reset();
    if (Array.isArray(parsed)) {
      encoder.arrayHeader(parsed.length);
      for (const request of parsed) this.answer(ws, binary, request, encoder);
    } else {
      this.answer(ws, binary, parsed, encoder);
    }
    deliver(ws, encoder.written());
  }

  /** A binary frame the request reader took (./request-msgpack.ts). */
  private readFrame(ws: ServerWebSocket<WsData>, objects: boolean): void {
    if (objects) {
      const answers: (Answer | null)[] = [];
      for (let i = 0; i < frameReader.count; i++) {
        answers.push(this.answer(ws, true, frameReader.request(i), null));
      }
      sendAnswers(ws, true, frameReader.isBatch, answers);
      return;
    }
    encoder.reset();
    if (frameReader.isBatch) encoder.arrayHeader(frameReader.count);
    for (let i = 0; i < frameReader.count; i++) {
      this.answer(ws, true, frameReader.request(i), encoder);
    }
    deliver(ws, encoder.written());
  }

  /**
   * Answers one request: returns the answer, or with `out`, writes it there as
   * MessagePack (a route's answer straight from the decision, with no objects made).
   * Null: written to `out`, or a route held by admission (answered later by `sendLater`).
   */
  private answer(
    ws: ServerWebSocket<WsData>,
    binary: boolean,
    request: unknown,
    out: MsgpackEncoder | null,
  ): Answer | null {
    const started = performance.now();
    let id: unknown = null;
    let op = "invalid";
    let response: Answer | null = null;
    try {
      if (typeof request !== "object" || request === null || Array.isArray(request)) {
        throw new KvedgeError("bad_request", "each request must be an object with an id and an op");
      }
      const body = request as Record<string, unknown>;
      id = body.id ?? null;
      op = typeof body.op === "string" ? body.op : "invalid";
      if (op === "route" && this.core.mayHold) {
        response = this.admitted(ws, binary, id, body);
      } else if (out !== null && op === "route") {
        writeRouteFrame(out, this.core, id, decideRoute(this.core, body));
      } else {
        response = { id, status: 200, result: run(this.core, op, body) };
      }
    } catch (error) {
      response = this.errorAnswer(id, error);
    }
    const label = OP_LABELS.get(op) ?? "/v1/ws invalid";
    const seconds = (performance.now() - started) / 1000;
    this.metrics.observeHttp(label, response === null ? 200 : response.status, seconds);
    if (out === null || response === null) return response;
    out.value(response as unknown as MsgpackValue);
    return null;
  }

  private errorAnswer(id: unknown, error: unknown): Answer {
    const client = clientError(error);
    if (client === null) {
      const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
      this.log.error("websocket request failed", { error: text });
    }
    const refusal = client ?? INTERNAL_ERROR;
    const answer: Answer = {
      id,
      status: STATUS_OF[refusal.code],
      error: errorObject(refusal),
    };
    if (client?.retryAfterSecs != null) answer.retry_after = client.retryAfterSecs;
    return answer;
  }

  /** A route through admission: its answer now, or null when held (sent later in its own frame). */
  private admitted(
    ws: ServerWebSocket<WsData>,
    binary: boolean,
    id: unknown,
    body: Record<string, unknown>,
  ): Answer | null {
    const core = this.core;
    let now: Answer | null = null;
    let held = false;
    const { handle, call } = submitRoute(
      core,
      body,
      (outcome) => {
        if (!held) now = { id, status: 200, result: routeAnswer(core, outcome) };
        else if (ws.data.heldRoutes.delete(call)) sendLater(ws, binary, core, id, outcome);
      },
      (error) => {
        if (!held) now = this.errorAnswer(id, error);
        else if (ws.data.heldRoutes.delete(call)) {
          sendAnswer(ws, binary, this.errorAnswer(id, error), heldEncoder);
        }
      },
    );
    if (handle < 0) return now;
    held = true;
    ws.data.heldRoutes.set(call, handle);
    return null;
  }
}

/** A frame's answers, held routes left out (nothing is sent when every one was held). */
function sendAnswers(
  ws: ServerWebSocket<WsData>,
  binary: boolean,
  batched: boolean,
  answers: (Answer | null)[],
): void {
  const ready = answers.filter((answer) => answer !== null);
  if (ready.length === 0 && answers.length > 0) return;
  sendAnswer(ws, binary, batched ? ready : ready[0], encoder);
}

/** Sends; a send that queued (backpressure, -1) is counted in the buffer budget. */
function deliver(ws: ServerWebSocket<WsData>, payload: string | Uint8Array): void {
  if (ws.send(payload) === -1) account(ws);
}

function account(ws: ServerWebSocket<WsData>): void {
  const data = ws.data;
  const queued = ws.getBufferedAmount();
  const grown = queued - data.held;
  if (grown <= 0 || bufferBudget.take(grown)) {
    if (grown < 0) bufferBudget.give(-grown);
    data.held = queued;
    return;
  }
  ws.close(1013, "kvedge holds its limit of buffered bytes; try again later");
}

/** The metrics' route label of each op. */
const OP_LABELS = new Map(
  ["route", "match", "prefill_done", "done"].map((op) => [op, `/v1/ws ${op}`]),
);

function run(core: KvedgeCore, op: string, body: Record<string, unknown>): unknown {
  switch (op) {
    case "route":
      return routeOp(core, body);
    case "match":
      return matchOp(core, body);
    case "prefill_done":
    case "done": {
      const requestId = body.request_id;
      if (typeof requestId !== "string")
        throw new KvedgeError("bad_request", "request_id must be a string");
      return lifecycleOp(core, requestId, op, body);
    }
    default: {
      const known = "route, match, prefill_done or done";
      throw new KvedgeError("bad_request", `unknown op ${JSON.stringify(op)}: use ${known}`);
    }
  }
}

function send(ws: ServerWebSocket<WsData>, binary: boolean, payload: unknown): void {
  sendAnswer(ws, binary, payload, encoder);
}

function sendAnswer(
  ws: ServerWebSocket<WsData>,
  binary: boolean,
  payload: unknown,
  into: MsgpackEncoder,
): void {
  if (!binary) {
    deliver(ws, toJson(payload));
    return;
  }
  into.reset();
  into.value(payload as MsgpackValue);
  deliver(ws, into.written());
}
