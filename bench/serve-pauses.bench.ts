/**
 * Pauses of the serve path in one process: what stops `kvedge serve` from answering on
 * time, without sockets or a load generator sharing the cores (bench/http.ts measures
 * the same thing end to end, where both add their own stalls).
 *
 * Frames of 16 route requests arrive at a fixed rate (default 25k routes/s, half the
 * WebSocket goal), each a fresh copy of a MessagePack frame as the binary WebSocket API
 * receives it (1,024-token prompts of the bench/http.ts fleet, `token_ids` as bytes),
 * and go through the WebSocket frame handler of `kvedge serve` (decode, 16 routing
 * decisions, MessagePack answers) with a stand-in socket that drops what it is sent.
 * Requests are never finished, so they expire after the TTL (0.5 s, as in bench/http.ts):
 * about 12.5k are active, and expiry and the memory of finished ids run as they do there.
 *
 * `--done-lag FRAMES` makes the frames a gateway's that calls done: each frame also
 * finishes, with 16 `done` ops, the requests of the frame sent FRAMES earlier (about
 * 16 x FRAMES stay active); with 0, each route is followed by its own `done` in the same
 * frame, so the tracker empties at every request.
 *
 * A frame's latency is from when it was due to when its answers were sent; the tail
 * is the pauses (young-generation collections run every ~100 ms at this rate). Each run
 * is a fresh process; the figures are medians over the runs.
 *
 *   bun bench/serve-pauses.bench.ts [--json] [--runs N] [--rate ROUTES_PER_S] [--seconds S] [--done-lag FRAMES]
 */
import type { ServerWebSocket } from "bun";
import { pack, unpack } from "msgpackr";
import { ServerMetrics } from "../src/server/metrics";
import { createMetricsRegistry } from "../src/util/metrics";
import { TurnBatch } from "../src/server/turn";
import { websocketHandlers, type WsData } from "../src/server/ws";
import { silentLogger } from "../src/util/log";
import { BLOCK_SIZE, buildPrompt, mix } from "./http-workload";
import { benchFlags, killWithBench, median, prng, provenance } from "./lib";
import { FLEET_SEED, fleetCore } from "./serve-fleet";

// `--one`: a single run, in this process (the parent starts one per run).
const flags = benchFlags(
  "bun bench/serve-pauses.bench.ts [--json] [--runs N] [--rate ROUTES_PER_S] [--seconds S] [--done-lag FRAMES]",
  {
    json: { type: "boolean" },
    runs: { type: "string" },
    rate: { type: "string" },
    seconds: { type: "string" },
    "done-lag": { type: "string" },
    one: { type: "boolean" },
  },
);
const positive = (value: string | undefined, fallback: number, name: string): number => {
  const number = Number(value ?? fallback);
  if (!(number > 0 && Number.isFinite(number)))
    throw new Error(`${name} must be a positive number`);
  return number;
};
const RATE = positive(flags.rate, 25_000, "--rate");
const SECONDS = positive(flags.seconds, 6, "--seconds");
const RUNS = positive(flags.runs, 3, "--runs");
const PER_FRAME = 16;
const PROMPT_TOKENS = 1024;
const FRAMES = 512;
/** Frames between a request's route and its done; absent: never done (TTL). */
const DONE_LAG = flags["done-lag"] === undefined ? null : Number(flags["done-lag"]);
if (DONE_LAG !== null && !(Number.isInteger(DONE_LAG) && DONE_LAG >= 0 && DONE_LAG < FRAMES)) {
  throw new Error(`--done-lag must be an integer in [0, ${FRAMES})`);
}
const WARMUP_MS = 1_000;

interface RunResult {
  readonly frames: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly p999Ms: number;
  readonly maxMs: number;
  /** Frames answered more than 2 ms after they were due. */
  readonly over2Ms: number;
}

async function oneRun(): Promise<RunResult> {
  const { core, fleet } = fleetCore({ KVEDGE_REQUEST_TTL_SECS: "0.5" });
  const onMessage = websocketHandlers(
    core,
    silentLogger,
    new ServerMetrics(createMetricsRegistry()),
    new TurnBatch(silentLogger),
  ).message;
  if (onMessage === undefined) throw new Error("the WebSocket handlers have no message handler");
  const random = prng(FLEET_SEED ^ 0x70617573);
  // Frames as a gateway sends them; every request's last block is its own.
  // Request ids repeat every FRAMES frames, by when the lag has finished them.
  const requestId = (f: number, k: number) => `f${(f + FRAMES) % FRAMES}-${k}`;
  const frames = Array.from({ length: FRAMES }, (_, f) => {
    const ops: object[] = [];
    for (let k = 0; k < PER_FRAME; k++) {
      const { tokens } = buildPrompt(fleet, random, PROMPT_TOKENS / BLOCK_SIZE, 5_000_000 + f);
      for (let i = tokens.length - BLOCK_SIZE; i < tokens.length; i++)
        tokens[i] = 100_000 + (mix(f, k, i) % 28_000);
      const route = { id: k, op: "route", candidates: 4, token_ids: new Uint8Array(tokens.buffer) };
      if (DONE_LAG === null) ops.push(route);
      else ops.push({ ...route, request_id: requestId(f, k) });
      if (DONE_LAG === 0) ops.push({ id: PER_FRAME + k, op: "done", request_id: requestId(f, k) });
    }
    if (DONE_LAG !== null && DONE_LAG > 0) {
      for (let k = 0; k < PER_FRAME; k++)
        ops.push({ id: PER_FRAME + k, op: "done", request_id: requestId(f - DONE_LAG, k) });
    }
    return pack(ops);
  });
  let answered = 0;
  // The first answers are checked (every op succeeded, or a done of a request not yet
  // routed in the first lap: 404), then only counted.
  let checked = 0;
  const socket = {
    send: (bytes: Uint8Array) => {
      answered += bytes.length;
      if (checked++ < FRAMES) {
        for (const answer of unpack(bytes) as { status: number }[]) {
          if (answer.status !== 200 && !(answer.status === 404 && checked <= (DONE_LAG ?? 0))) {
            throw new Error(`an op failed: ${JSON.stringify(answer)}`);
          }
        }
      }
    },
  } as unknown as ServerWebSocket<WsData>;

  const interval = (1000 * PER_FRAME) / RATE;
  const start = performance.now() + 200;
  const measureFrom = start + WARMUP_MS;
  const end = measureFrom + SECONDS * 1000;
  const latencies: number[] = [];
  let due = 0;
  await new Promise<void>((resolve) => {
    const poll = () => {
      for (
        let at = start + due * interval;
        at <= performance.now() && at < end;
        at = start + ++due * interval
      ) {
        // A fresh buffer per frame, as the runtime hands each message to the handler.
        onMessage(socket, Buffer.from(frames[due % FRAMES]!));
        if (at >= measureFrom) latencies.push(performance.now() - at);
      }
      if (start + due * interval >= end) resolve();
      else setImmediate(poll);
    };
    poll();
  });
  if (answered === 0) throw new Error("no answers were sent");
  latencies.sort((a, b) => a - b);
  const at = (p: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))]!;
  return {
    frames: latencies.length,
    p50Ms: at(0.5),
    p99Ms: at(0.99),
    p999Ms: at(0.999),
    maxMs: latencies[latencies.length - 1]!,
    over2Ms: latencies.filter((ms) => ms > 2).length,
  };
}

if (flags.one === true) {
  console.log(JSON.stringify(await oneRun()));
} else {
  const runs: RunResult[] = [];
  for (let i = 0; i < RUNS; i++) {
    const lag = DONE_LAG === null ? [] : ["--done-lag", String(DONE_LAG)];
    const child = killWithBench(
      Bun.spawn(
        [
          process.execPath,
          import.meta.path,
          "--one",
          "--rate",
          String(RATE),
          "--seconds",
          String(SECONDS),
          ...lag,
        ],
        {
          stdout: "pipe",
          stderr: "inherit",
        },
      ),
    );
    const text = await new Response(child.stdout).text();
    if ((await child.exited) !== 0) throw new Error("a run failed");
    runs.push(JSON.parse(text.trim().split("\n").pop()!) as RunResult);
  }
  const of = (pick: (r: RunResult) => number) => median(runs.map(pick));
  const summary = {
    p50Ms: of((r) => r.p50Ms),
    p99Ms: of((r) => r.p99Ms),
    p999Ms: of((r) => r.p999Ms),
    maxMs: of((r) => r.maxMs),
    over2Ms: of((r) => r.over2Ms),
  };
  if (flags.json === true) {
    console.log(
      JSON.stringify({
        bench: "serve-pauses",
        provenance: provenance(),
        rate: RATE,
        perFrame: PER_FRAME,
        seconds: SECONDS,
        doneLag: DONE_LAG,
        summary,
        runs,
      }),
    );
  } else {
    const done =
      DONE_LAG === null
        ? "never done (TTL)"
        : DONE_LAG === 0
          ? "each done at once"
          : `done ${DONE_LAG} frames later`;
    console.log(
      `${RATE / 1000}k routes/s in frames of ${PER_FRAME}, ${done}, ${SECONDS} s x ${RUNS} runs (median): ` +
        `p50 ${summary.p50Ms.toFixed(2)} ms, p99 ${summary.p99Ms.toFixed(2)} ms, p99.9 ${summary.p999Ms.toFixed(2)} ms, ` +
        `max ${summary.maxMs.toFixed(2)} ms; frames over 2 ms: ${summary.over2Ms} of ${runs[0]!.frames}`,
    );
    for (const r of runs)
      console.log(
        `  run: p50 ${r.p50Ms.toFixed(2)}, p99 ${r.p99Ms.toFixed(2)}, p99.9 ${r.p999Ms.toFixed(2)}, max ${r.maxMs.toFixed(2)} ms, over 2 ms ${r.over2Ms}`,
      );
  }
}
