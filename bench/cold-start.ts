/**
 * The first routes of a fresh `kvedge serve`, with and without its warm-up
 * (`--warmup-routes`, src/server/warmup.ts): what a gateway's requests cost right after
 * a start or a deploy, while the JIT has not compiled the hot path yet.
 *
 *   bun bench/cold-start.ts [--json] [--runs N] [--routes N] [--binary PATH]
 *
 * Each run starts, for each setting (no warm-up, the default), a fresh fleet and server
 * (bench/serve-process.ts: 64 engines, ≥ 1M (block, worker) pairs), waits until every
 * block is indexed, then sends `--routes` (default 5,000) route requests one at a time
 * over /v1/ws, each a binary frame of one 1,024-token request (bench/http-workload.ts
 * prompts), and records each round trip. Reported per setting, medians over the runs:
 * the median round trip of routes 1-100, 101-1,000 and 1,001 to the end, and the
 * server's CPU time for all of them (/proc, 10 ms ticks).
 */
import { join } from "node:path";
import { pack, unpack } from "msgpackr";
import { processCpuSeconds } from "./http-load";
import { BLOCK_SIZE, buildFleet, buildPrompt } from "./http-workload";
import { benchFlags, median, prng, provenance } from "./lib";
import { startFleet, startServe, stopAll, waitIndexed } from "./serve-process";

const flags = benchFlags(
  "bun bench/cold-start.ts [--json] [--runs N] [--routes N] [--binary PATH]",
  {
    json: { type: "boolean" },
    runs: { type: "string" },
    routes: { type: "string" },
    binary: { type: "string" },
  },
);
const RUNS = Number(flags.runs ?? 3);
const ROUTES = Number(flags.routes ?? 5_000);
if (!(Number.isInteger(RUNS) && RUNS >= 1)) throw new Error("--runs must be a positive integer");
if (!(Number.isInteger(ROUTES) && ROUTES > 1_000))
  throw new Error("--routes must be an integer over 1,000");
const BINARY = flags.binary ?? join(import.meta.dir, "..", "dist", "kvedge");
const SEED = 20_261_129;
const WORKERS = 64;
const PAIRS = 1_050_000;
const SETTINGS = [
  { name: "no warm-up", args: ["--warmup-routes", "0"] },
  { name: "warm-up (default)", args: [] },
];

interface RunResult {
  readonly first100Us: number;
  readonly next900Us: number;
  readonly restUs: number;
  readonly serverCpuMs: number;
}

const fleetModel = buildFleet(SEED, WORKERS, PAIRS);

async function oneRun(run: number, extraArgs: string[]): Promise<RunResult> {
  const fleet = await startFleet(SEED, WORKERS, PAIRS);
  const serve = await startServe(BINARY, fleet, extraArgs);
  try {
    await waitIndexed(serve, fleet, 180_000);
    const random = prng(SEED ^ run);
    const frames = Array.from({ length: ROUTES }, (_, i) => {
      const { tokens } = buildPrompt(
        fleetModel,
        random,
        1024 / BLOCK_SIZE,
        7_000_000 + 10_000 * run + i,
      );
      return pack({ id: i, op: "route", candidates: 4, token_ids: new Uint8Array(tokens.buffer) });
    });
    const socket = new WebSocket(`ws://${serve.host}:${serve.port}/v1/ws`);
    socket.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      socket.onopen = resolve;
      socket.onerror = reject;
    });
    const roundTrips = new Float64Array(ROUTES);
    const cpuBefore = processCpuSeconds(serve.pid);
    await new Promise<void>((resolve, reject) => {
      let i = 0;
      let sentAt = 0;
      const send = () => {
        sentAt = performance.now();
        socket.send(frames[i]!);
      };
      socket.onmessage = (event) => {
        roundTrips[i] = performance.now() - sentAt;
        const answer = unpack(new Uint8Array(event.data as ArrayBuffer)) as {
          status: number;
          error?: string;
        };
        if (answer.status !== 200)
          return reject(new Error(`route ${i} failed: ${answer.status} ${answer.error}`));
        if (++i === ROUTES) return resolve();
        send();
      };
      send();
    });
    const serverCpuMs = 1000 * (processCpuSeconds(serve.pid) - cpuBefore);
    socket.close();
    const medianUs = (from: number, to: number) =>
      1000 * median([...roundTrips.subarray(from, to)]);
    return {
      first100Us: medianUs(0, 100),
      next900Us: medianUs(100, 1_000),
      restUs: medianUs(1_000, ROUTES),
      serverCpuMs,
    };
  } finally {
    await stopAll(serve, fleet);
  }
}

const results = new Map<string, RunResult[]>(SETTINGS.map((setting) => [setting.name, []]));
for (let run = 0; run < RUNS; run++) {
  for (const setting of SETTINGS) {
    const result = await oneRun(run, setting.args);
    results.get(setting.name)!.push(result);
    if (!flags.json) {
      console.error(
        `run ${run + 1}, ${setting.name}: routes 1-100 ${result.first100Us.toFixed(0)} µs, 101-1000 ${result.next900Us.toFixed(0)} µs, ` +
          `1001-${ROUTES} ${result.restUs.toFixed(0)} µs (median round trips); server CPU ${result.serverCpuMs.toFixed(0)} ms`,
      );
    }
  }
}
const rows = SETTINGS.map(({ name }) => {
  const runs = results.get(name)!;
  const of = (pick: (r: RunResult) => number) => median(runs.map(pick));
  return {
    setting: name,
    first100Us: of((r) => r.first100Us),
    next900Us: of((r) => r.next900Us),
    restUs: of((r) => r.restUs),
    serverCpuMs: of((r) => r.serverCpuMs),
    runs,
  };
});
if (flags.json)
  console.log(
    JSON.stringify({ bench: "cold-start", provenance: provenance(), routes: ROUTES, rows }),
  );
else {
  console.log(
    `\nfirst ${ROUTES} routes of a fresh kvedge serve, one at a time over /v1/ws (binary, 1,024 tokens); median of ${RUNS} runs`,
  );
  console.log(
    "| setting | routes 1-100 µs | 101-1,000 µs | 1,001-" +
      ROUTES +
      " µs | server CPU ms |\n|---|---:|---:|---:|---:|",
  );
  for (const r of rows)
    console.log(
      `| ${r.setting} | ${r.first100Us.toFixed(0)} | ${r.next900Us.toFixed(0)} | ${r.restUs.toFixed(0)} | ${r.serverCpuMs.toFixed(0)} |`,
    );
}
