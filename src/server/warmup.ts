/**
 * Warm-up before serving: a fresh process runs its first routes several times slower
 * than its steady state while the JIT compiles the hot path (measured in one process,
 * binary frames: ~50 µs for each of the first 100 routes, ~10 µs after 5,000), and at
 * high request rates that start builds a queue that takes a second or more to drain
 * (bench/JOURNAL.md, round 7; see docs/decisions.md#warm-up). So before
 * `kvedge serve` listens, it routes synthetic requests through the same code on a
 * scratch core of its own (own index, load tracker and metrics; nothing reaches the
 * real ones): binary and text WebSocket frames through the frame handler, JSON and
 * MessagePack bodies as the HTTP route endpoint reads and answers them, each request
 * finished with `done`. The compiled code is shared by every instance, so the real
 * core starts warm. Every answer is checked: a warm-up request that fails is a bug.
 * `bun bench/cold-start.ts` measures the first routes of a fresh server with and without.
 */
import type { ServerWebSocket } from "bun";
import { pack, unpack } from "msgpackr";
import { Registry } from "prom-client";
import type { Config } from "../config";
import { silentLogger } from "../util/log";
import { xorshift32 } from "../util/random";
import { decideRoute, lifecycleOp } from "./api";
import { routeAnswer, writeRouteAnswer } from "./route-answer";
import { msgpackReply, parseBody, reply } from "../http/http";
import { ServerMetrics } from "./metrics";
import { KvedgeCore } from "../core/core";
import { TurnBatch } from "./turn";
import { type WsData, websocketHandlers } from "./ws";

/** As many workers as a large fleet: loops over candidates run as long as they will for real. */
const WORKERS = 64;
const PROMPT_TOKENS = 1024;
const PER_FRAME = 16;
/** Token ids of the synthetic prompts stay below this (any real vocabulary is larger). */
const VOCABULARY = 32_000;

export interface WarmupResult {
  readonly routes: number;
  readonly ms: number;
}

/** Routes about `routes` synthetic requests (0: none) on a scratch core built from `config`. */
export function warmUp(config: Config, routes: number): WarmupResult {
  const started = performance.now();
  if (routes <= 0) return { routes: 0, ms: 0 };
  // Admission off: a scratch route must be answered in its frame.
  const core = new KvedgeCore({
    config: { ...config, workers: [], route: { ...config.route, admission: "off" } },
    log: silentLogger,
  });
  const random = xorshift32(0x5741524d);
  const token = () => random() % VOCABULARY;

  // Workers hold a shared system prompt and a document each, so requests match
  // partly, on several workers, as real ones do.
  const system = Uint32Array.from({ length: PROMPT_TOKENS / 4 }, token);
  const documents = Array.from({ length: WORKERS }, () =>
    Uint32Array.from({ length: PROMPT_TOKENS / 2 }, token),
  );
  for (let w = 0; w < WORKERS; w++) {
    const held = new Uint32Array(system.length + documents[w]!.length);
    held.set(system);
    held.set(documents[w]!, system.length);
    core.seedWorker(BigInt(w + 1), 0, held);
  }
  const prompt = (): Uint32Array => {
    const tokens = Uint32Array.from({ length: PROMPT_TOKENS }, token);
    const covered = (random() % 3) * (PROMPT_TOKENS / 4); // none, the system prompt, or it and half a document
    const document = documents[random() % WORKERS]!;
    tokens.set(system.subarray(0, Math.min(covered, system.length)));
    if (covered > system.length)
      tokens.set(document.subarray(0, covered - system.length), system.length);
    return tokens;
  };
  const bin = (tokens: Uint32Array) =>
    new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);

  let failed = "";
  const check = (answer: { status?: number; error?: string }) => {
    if (answer.status !== 200 && failed === "") failed = `${answer.status}: ${answer.error}`;
  };
  const socket = {
    send: (message: string | Uint8Array) => {
      const answers = typeof message === "string" ? JSON.parse(message) : unpack(message);
      for (const answer of Array.isArray(answers) ? answers : [answers]) check(answer);
      return message.length;
    },
  } as unknown as ServerWebSocket<WsData>;
  const onFrame = websocketHandlers(
    core,
    silentLogger,
    new ServerMetrics(new Registry()),
    new TurnBatch(silentLogger),
  ).message!;

  let routed = 0;
  for (let round = 0; routed < routes; round++) {
    const id = (k: number) => `warmup-${round}-${k}`;
    switch (round % 4) {
      case 0: {
        // binary WebSocket frames of 16 routes, then their dones
        const ops = Array.from({ length: PER_FRAME }, (_, k) => ({
          id: k,
          op: "route",
          request_id: id(k),
          candidates: 4,
          token_ids: bin(prompt()),
        }));
        onFrame(socket, Buffer.from(pack(ops)));
        onFrame(
          socket,
          Buffer.from(
            pack(ops.map((op) => ({ id: op.id, op: "done", request_id: op.request_id }))),
          ),
        );
        routed += PER_FRAME;
        break;
      }
      case 1: // a JSON text frame
        onFrame(
          socket,
          JSON.stringify({ id: 1, op: "route", request_id: id(0), token_ids: [...prompt()] }),
        );
        onFrame(socket, JSON.stringify({ id: 2, op: "done", request_id: id(0) }));
        routed++;
        break;
      case 2: {
        // an HTTP JSON body, answered as /v1/route answers it
        const outcome = decideRoute(
          core,
          parseBody(
            { json: JSON.stringify({ request_id: id(0), token_ids: [...prompt()] }) },
            true,
          ),
        );
        reply(null, 200, routeAnswer(core, outcome));
        lifecycleOp(core, id(0), "done");
        routed++;
        break;
      }
      default: {
        // an HTTP MessagePack body
        const outcome = decideRoute(
          core,
          parseBody({ msgpack: pack({ request_id: id(0), token_ids: bin(prompt()) }) }, true),
        );
        msgpackReply(200, (encoder) => writeRouteAnswer(encoder, core, outcome));
        lifecycleOp(core, id(0), "done");
        routed++;
      }
    }
  }
  if (failed !== "") throw new Error(`warm-up request failed (${failed})`);
  const active = core.activeRequestCount;
  if (active !== 0) throw new Error(`warm-up left ${active} requests active`);
  return { routes: routed, ms: performance.now() - started };
}
