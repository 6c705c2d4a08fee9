/**
 * The serving benchmark: `kvedge serve` (the compiled dist/kvedge) holding ≥ 1M
 * (block, worker) pairs over 64 workers, driven by a separate load-generator process
 * over keep-alive HTTP and WebSocket.
 *
 *   bun bench/http.ts [--json] [--quick] [--runs N] [--only SUBSTRING] [--binary PATH] [--profile DIR] [--generator c|bun]
 *                     [--threads LIST]
 *
 * Every run starts fresh processes:
 * 1. the fleet (bench/http-fleet.ts): 64 ZMTP PUB sockets publishing the stored events
 *    of bench/http-workload.ts (shared system prompts, document families, unique tails;
 *    block size 16; seeded);
 * 2. `dist/kvedge serve --workers <the 64 endpoints> --request-ttl-secs 0.5`; the
 *    benchmark waits until /v1/workers lists every worker's blocks, then records the
 *    server's RSS and `kvedge_index_bytes`;
 * 3. per scenario, a load generator (bench/http-load.ts) in its own process; a shape
 *    (transport and framing) whose first scenario is open loop is first warmed, unmeasured,
 *    by 2 s of its closed-loop load (see warmUps).
 *
 * Route requests carry 1,024 or 4,096 token ids in JSON (mostly a cached prefix and a
 * unique tail) and `"candidates": 4`. The generator never calls done: routed requests
 * expire after the 0.5 s TTL, so about rate x 0.5 s requests are active (5k-12k, about
 * 80-200 per worker, like a busy fleet), and their load tracking and expiry (each
 * routing decision expires the due ones) are part of what is measured.
 *
 * Scenarios: closed loop (maximum throughput at a fixed concurrency) and open loop
 * (fixed offered rate, latency from the scheduled send time; "send lag" is how late
 * the generator itself sent, its share of that latency) for HTTP with JSON and with
 * MessagePack bodies, WebSocket with one request per frame, WebSocket frames of 16 and
 * 64 requests, and WebSocket binary (MessagePack; in both MessagePack forms token_ids
 * are little-endian u32 bytes) with 1 and 16 per frame. Every number is
 * the median over the runs. For HTTP, the server's own mean time per routing decision
 * (from its /metrics, around each load) splits its CPU per route into the decision and
 * everything else (Bun's request handling, parsing, the answer). `--binary PATH`
 * benchmarks another build of kvedge (e.g. an
 * older commit, for before/after). `--profile DIR` runs the server from source under
 * `bun --cpu-prof` and leaves the profile in DIR (for finding hot spots, not for numbers).
 * `--threads 0,2,w0,w2` measures serve in each thread mode: N route lanes
 * (runtime.route_threads), with a "w" the index writer thread too
 * (runtime.index_threads = 1); every run starts fresh processes for each, in
 * alternating order (A B, B A, ...), so the ratios compare modes measured in the same
 * minutes.
 * The open-loop HTTP and binary WebSocket scenarios are sent by bench/loadgen/open-loop.c
 * (compiled with the system C compiler on first use): no garbage collector and no
 * polling, so the generator's own pauses and CPU stay out of the server's tail as far as
 * this machine allows. `--generator bun` sends them from bench/http-load.ts instead (as
 * every other scenario is), which is also the fallback without a C compiler.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { type LoadResult, type LoadSpec, openLoopGenerator } from "./http-load";
import { benchFlags, killWithBench, median, provenance } from "./lib";
import {
  indexBytes,
  routeDecisions,
  rssOf,
  startFleet,
  startServe,
  stopAll,
  threadCpuOf,
  waitIndexed,
} from "./serve-process";

const ROOT = join(import.meta.dir, "..");
const flags = benchFlags(
  "bun bench/http.ts [--json] [--quick] [--runs N] [--only SUBSTRING] [--binary PATH] [--profile DIR] [--generator c|bun] [--threads LIST]",
  {
    json: { type: "boolean" },
    quick: { type: "boolean" },
    runs: { type: "string" },
    only: { type: "string" },
    binary: { type: "string" },
    profile: { type: "string" },
    generator: { type: "string" },
    threads: { type: "string" },
  },
);
const BINARY = flags.binary ?? join(ROOT, "dist", "kvedge");
const SEED = 20_261_129;
const WORKERS = 64;
const TARGET_PAIRS = 1_050_000;
const REQUEST_TTL_SECS = 0.5;
const CANDIDATES = 4;
/** Goals from the issue: routes/s at the maximum, and offered rate for the latency goal (half). */
const GOAL = { http: 25_000, ws: 50_000 } as const;
const P99_GOAL_MS = 2;

const quick = flags.quick === true;
const json = flags.json === true;
const runs = Number(flags.runs ?? (quick ? 1 : 3));
if (!(Number.isInteger(runs) && runs >= 1)) throw new Error("--runs must be a positive integer");
const only = flags.only;
const profileDir = flags.profile;
const generator = openLoopGenerator(flags.generator);
/** Thread modes: "N" = N route lanes, "wN" = the writer thread and N lanes. */
const modes = (flags.threads ?? "0").split(",").map((text) => text.trim());
if (!modes.every((mode) => /^w?\d{1,2}$/.test(mode))) {
  throw new Error(
    "--threads must be a comma-separated list of modes: N (route lanes) or wN (writer thread and N lanes)",
  );
}
const modeArgs = (mode: string): string[] => [
  "--route-threads",
  mode.replace("w", ""),
  "--index-threads",
  mode.startsWith("w") ? "1" : "0",
];

interface Scenario {
  readonly name: string;
  /** Transport and framing ("WS binary 16/frame"), shared by a shape's closed- and open-loop scenarios. */
  readonly shape: string;
  readonly transport: "http" | "ws";
  readonly batch: number;
  readonly binary: boolean;
  readonly mode: "closed" | "open";
  readonly rate: number;
  readonly connections: number;
  readonly window: number;
  readonly promptTokens: number;
}

/** Open-loop rates besides half the goal: ones this machine can sustain, per prompt size. */
const LOW_RATES: Record<number, { http: number; ws: number }> = {
  1024: { http: 4_000, ws: 8_000 },
  4096: { http: 2_000, ws: 4_000 },
};

function allScenarios(): Scenario[] {
  const list: Scenario[] = [];
  for (const promptTokens of [1024, 4096]) {
    const shapes = [
      {
        label: "HTTP",
        transport: "http",
        batch: 1,
        closed: { connections: 32, window: 1 },
        open: { connections: 64 },
      },
      {
        label: "HTTP msgpack",
        transport: "http",
        batch: 1,
        binary: true,
        closed: { connections: 32, window: 1 },
        open: { connections: 64 },
      },
      {
        label: "WS 1/frame",
        transport: "ws",
        batch: 1,
        closed: { connections: 4, window: 32 },
        open: { connections: 4 },
      },
      {
        label: "WS 16/frame",
        transport: "ws",
        batch: 16,
        closed: { connections: 4, window: 4 },
        open: { connections: 4 },
      },
      {
        label: "WS 64/frame",
        transport: "ws",
        batch: 64,
        closed: { connections: 2, window: 2 },
        open: { connections: 4 },
      },
      {
        label: "WS binary 1/frame",
        transport: "ws",
        batch: 1,
        binary: true,
        closed: { connections: 4, window: 32 },
        open: { connections: 4 },
      },
      {
        label: "WS binary 16/frame",
        transport: "ws",
        batch: 16,
        binary: true,
        closed: { connections: 4, window: 4 },
        open: { connections: 4 },
      },
    ] as const;
    for (const shape of shapes) {
      list.push({
        name: `${shape.label}, ${promptTokens} tokens, closed loop`,
        shape: shape.label,
        transport: shape.transport,
        batch: shape.batch,
        binary: "binary" in shape,
        mode: "closed",
        rate: 0,
        connections: shape.closed.connections,
        window: shape.closed.window,
        promptTokens,
      });
      // Half the goal rate only with 1,024 tokens: at 4,096 the generator itself cannot build
      // 25k requests/s (700 MB/s of JSON) on this machine, so it would measure only overload.
      const rates = [
        LOW_RATES[promptTokens]![shape.transport],
        ...(promptTokens === 1024 ? [GOAL[shape.transport] / 2] : []),
      ];
      for (const rate of rates) {
        list.push({
          name: `${shape.label}, ${promptTokens} tokens, open loop ${rate / 1000}k/s`,
          shape: shape.label,
          transport: shape.transport,
          batch: shape.batch,
          binary: "binary" in shape,
          mode: "open",
          rate,
          connections: shape.open.connections,
          window: 1,
          promptTokens,
        });
      }
    }
  }
  return list;
}

function scenarios(): Scenario[] {
  return allScenarios().filter((scenario) => only === undefined || scenario.name.includes(only));
}

/**
 * The closed-loop scenarios to run, unmeasured, before a run's scenarios: one per shape
 * whose first scenario in the list is open loop. A fresh server's code is cold (its
 * first second of routes costs several times the steady state), and an open-loop
 * scenario measured first inherits the backlog that builds meanwhile: with `--only
 * "open loop"` on a slow hour, p99s of 50-450 ms that were all warm-up. A shape whose
 * closed-loop scenario comes first is warmed by it.
 */
function warmUps(list: Scenario[]): Scenario[] {
  const firstOfShape = new Map<string, Scenario>();
  for (const scenario of list) {
    const key = `${scenario.shape}/${scenario.promptTokens}`;
    if (!firstOfShape.has(key)) firstOfShape.set(key, scenario);
  }
  const closed = allScenarios().filter((scenario) => scenario.mode === "closed");
  return [...firstOfShape.values()]
    .filter((first) => first.mode === "open")
    .map(
      (first) =>
        closed.find(
          (scenario) =>
            scenario.shape === first.shape && scenario.promptTokens === first.promptTokens,
        )!,
    );
}

// ---- processes ----------------------------------------------------------------------------

async function runLoad(spec: LoadSpec): Promise<LoadResult> {
  const proc = killWithBench(
    Bun.spawn([process.execPath, join(import.meta.dir, "http-load.ts"), JSON.stringify(spec)], {
      stdout: "pipe",
      stderr: "inherit",
    }),
  );
  const text = await new Response(proc.stdout).text();
  if ((await proc.exited) !== 0)
    throw new Error(`load generator failed (${spec.transport} ${spec.mode})`);
  return JSON.parse(text.trim().split("\n").pop()!);
}

// ---- one run --------------------------------------------------------------------------------

/**
 * A scenario's load result, plus the server's own mean time per routing decision
 * (`kvedge_route_decision_duration_seconds`, HTTP /v1/route only; hashing, index match,
 * cost of every worker, admission) over the load, warm-up included: the part of a
 * route's CPU that is the decision, measured where it runs. Null without HTTP routes.
 */
type ScenarioResult = LoadResult & { readonly decisionUs: number | null };

interface RunRecord {
  readonly indexSeconds: number;
  /** CPU seconds from listening to indexed: main thread, Worker threads (the writer), all. */
  readonly indexCpu: { main: number; workers: number; total: number };
  readonly pairs: number;
  readonly serveRssBytes: number;
  readonly indexBytes: number;
  readonly results: Record<string, ScenarioResult>;
}

async function oneRun(run: number, list: Scenario[], mode: string): Promise<RunRecord> {
  const fleet = await startFleet(SEED, WORKERS, TARGET_PAIRS);
  const args = ["--request-ttl-secs", String(REQUEST_TTL_SECS), ...modeArgs(mode)];
  const serve = await startServe(BINARY, fleet, args, profileDir);
  try {
    const listening = threadCpuOf(serve.pid);
    const indexSeconds = await waitIndexed(serve, fleet, 180_000);
    const indexed = threadCpuOf(serve.pid);
    const indexCpu = {
      main: indexed.main - listening.main,
      workers: indexed.workers - listening.workers,
      total: indexed.total - listening.total,
    };
    const record: RunRecord = {
      indexSeconds,
      indexCpu,
      pairs: fleet.pairs,
      serveRssBytes: rssOf(serve.pid),
      indexBytes: await indexBytes(serve),
      results: {},
    };
    if (!json) {
      console.error(
        `run ${run}, threads ${mode}: ${fleet.pairs} pairs indexed in ${indexSeconds.toFixed(1)} s; serve RSS ${(record.serveRssBytes / 2 ** 20).toFixed(0)} MiB, ` +
          `kvedge_index_bytes ${(record.indexBytes / 2 ** 20).toFixed(1)} MiB`,
      );
      const perPair = (seconds: number) => ((1e9 * seconds) / fleet.pairs).toFixed(0);
      console.error(
        `  indexing CPU per pair: main thread ${perPair(indexCpu.main)} ns, ` +
          `Workers ${perPair(indexCpu.workers)} ns, process ${perPair(indexCpu.total)} ns`,
      );
    }
    let uniqueBase = run * 1000;
    const load = (scenario: Scenario, warmupMs: number, durationMs: number) =>
      runLoad({
        host: serve.host,
        port: serve.port,
        transport: scenario.transport,
        batch: scenario.batch,
        binary: scenario.binary,
        mode: scenario.mode,
        rate: scenario.rate,
        connections: scenario.connections,
        window: scenario.window,
        promptTokens: scenario.promptTokens,
        poolSize: scenario.promptTokens === 1024 ? 4096 : 1024,
        candidates: CANDIDATES,
        warmupMs,
        durationMs,
        seed: SEED,
        fleetWorkers: WORKERS,
        fleetPairs: TARGET_PAIRS,
        uniqueBase: uniqueBase++,
        serverPid: serve.pid,
        generator:
          scenario.mode === "open" && (scenario.transport === "http" || scenario.binary)
            ? generator
            : "bun",
      });
    // Let the TTL expire a load's requests before the next one starts.
    const expire = () => Bun.sleep(REQUEST_TTL_SECS * 1000 + 500);
    for (const scenario of warmUps(list)) {
      const result = await load(scenario, 0, quick ? 1_000 : 2_000);
      if (!json)
        console.error(`  (warm-up, not measured) ${scenario.name}: ${formatResult(result)}`);
      await expire();
    }
    for (const scenario of list) {
      const before = await routeDecisions(serve);
      const loaded = await load(scenario, quick ? 500 : 1_000, quick ? 2_000 : 4_000);
      const after = await routeDecisions(serve);
      const decisions = after.count - before.count;
      const result = {
        ...loaded,
        decisionUs: decisions > 0 ? (1e6 * (after.seconds - before.seconds)) / decisions : null,
      };
      record.results[scenario.name] = result;
      if (!json) console.error(`  ${scenario.name}: ${formatResult(result)}`);
      await expire();
    }
    return record;
  } finally {
    await stopAll(serve, fleet);
  }
}

const fmtMs = (ms: number | null) =>
  ms === null || Number.isNaN(ms) ? "-" : ms < 10 ? ms.toFixed(2) : ms.toFixed(0);
const fmtRate = (rate: number) => `${(rate / 1000).toFixed(1)}k`;

function formatResult(r: LoadResult | ScenarioResult): string {
  return (
    `${fmtRate(r.routesPerSecond)} routes/s, p50 ${fmtMs(r.p50Ms)} ms, p99 ${fmtMs(r.p99Ms)} ms, p99.9 ${fmtMs(r.p999Ms)} ms, ` +
    `serve CPU ${(100 * r.serverCpu).toFixed(0)} % (${((1e6 * r.serverCpu) / r.routesPerSecond).toFixed(0)} µs/route` +
    `${r.serverMainCpu === undefined ? "" : `, main thread ${((1e6 * r.serverMainCpu) / r.routesPerSecond).toFixed(0)}`}), generator CPU ${(100 * r.generatorCpu).toFixed(0)} %` +
    ("decisionUs" in r && r.decisionUs !== null ? `, decision ${r.decisionUs.toFixed(1)} µs` : "") +
    (r.errors > 0 ? `, ${r.errors} errors (${r.sampleError})` : "") +
    (r.unanswered > 0 ? `, ${r.unanswered} unanswered` : "")
  );
}

// ---- main -----------------------------------------------------------------------------------

if (!existsSync(BINARY) && profileDir === undefined) {
  console.error(`bench/http.ts: ${BINARY} is missing; build it first with: bun build.ts --host`);
  process.exit(1);
}
const list = scenarios();
/** Per thread mode, its runs; the modes alternate order from run to run. */
const recordsOf = new Map<string, RunRecord[]>(modes.map((mode) => [mode, []]));
for (let run = 1; run <= runs; run++) {
  const order = run % 2 === 1 ? modes : [...modes].reverse();
  for (const mode of order) recordsOf.get(mode)!.push(await oneRun(run, list, mode));
}

function rowsOf(mode: string, records: RunRecord[]) {
  return list.map((scenario) => {
    const of = (pick: (r: ScenarioResult) => number) =>
      median(records.map((record) => pick(record.results[scenario.name]!)));
    return {
      scenario: scenario.name,
      threads: mode,
      indexSeconds: median(records.map((record) => record.indexSeconds)),
      indexCpuNsPerPair: {
        main: median(records.map((record) => (1e9 * record.indexCpu.main) / record.pairs)),
        workers: median(records.map((record) => (1e9 * record.indexCpu.workers) / record.pairs)),
        total: median(records.map((record) => (1e9 * record.indexCpu.total) / record.pairs)),
      },
      transport: scenario.transport,
      batch: scenario.batch,
      binary: scenario.binary,
      mode: scenario.mode,
      offeredRate: scenario.mode === "open" ? scenario.rate : null,
      promptTokens: scenario.promptTokens,
      connections: scenario.connections,
      window: scenario.mode === "closed" ? scenario.window : null,
      routesPerSecond: of((r) => r.routesPerSecond),
      p50Ms: of((r) => r.p50Ms),
      p99Ms: of((r) => r.p99Ms),
      p999Ms: of((r) => r.p999Ms),
      sendLagP99Ms: scenario.mode === "open" ? of((r) => r.sendLagP99Ms!) : null,
      serverCpu: of((r) => r.serverCpu),
      serverCpuUsPerRoute: of((r) =>
        r.routesPerSecond > 0 ? (1e6 * r.serverCpu) / r.routesPerSecond : NaN,
      ),
      mainCpuUsPerRoute: of((r) =>
        r.routesPerSecond > 0 && r.serverMainCpu !== undefined
          ? (1e6 * r.serverMainCpu) / r.routesPerSecond
          : NaN,
      ),
      generatorCpu: of((r) => r.generatorCpu),
      decisionUs: scenario.transport === "http" ? of((r) => r.decisionUs ?? NaN) : null,
      errors: records.reduce((sum, record) => sum + record.results[scenario.name]!.errors, 0),
      unanswered: records.reduce(
        (sum, record) => sum + record.results[scenario.name]!.unanswered,
        0,
      ),
      runs: records.map((record) => record.results[scenario.name]!),
    };
  });
}
const rows = modes.flatMap((mode) => rowsOf(mode, recordsOf.get(mode)!));
const records = [...recordsOf.values()].flat();
const med = (pick: (record: RunRecord) => number) => median(records.map(pick));
const setup = {
  binary: profileDir === undefined ? BINARY : "bun src/cli/main.ts (profiling)",
  workers: WORKERS,
  pairs: records[0]!.pairs,
  blockSize: 16,
  requestTtlSecs: REQUEST_TTL_SECS,
  candidates: CANDIDATES,
  openLoopGenerator: generator,
  threads: modes,
  indexSeconds: med((r) => r.indexSeconds),
  serveRssBytes: med((r) => r.serveRssBytes),
  indexBytes: med((r) => r.indexBytes),
  runs: runs,
};

if (json) {
  console.log(
    JSON.stringify({
      bench: "http",
      provenance: provenance(),
      goals: { ...GOAL, p99Ms: P99_GOAL_MS },
      setup,
      rows,
    }),
  );
} else {
  console.log(
    `\nkvedge serve, ${setup.pairs} (block, worker) pairs over ${WORKERS} workers, median of ${records.length} run(s)`,
  );
  console.log(
    `index ready in ${setup.indexSeconds.toFixed(1)} s; serve RSS ${(setup.serveRssBytes / 2 ** 20).toFixed(0)} MiB; ` +
      `kvedge_index_bytes ${(setup.indexBytes / 2 ** 20).toFixed(1)} MiB; open-loop HTTP and binary WS sent by the ${generator === "c" ? "C" : "Bun"} generator\n`,
  );
  console.log(
    "| scenario | threads | index ready s | routes/s | p50 ms | p99 ms | p99.9 ms | send lag p99 ms | serve CPU | serve CPU µs/route | main thread µs/route | of it, decision µs | generator CPU |",
  );
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
  for (const row of rows) {
    console.log(
      `| ${row.scenario} | ${row.threads} | ${row.indexSeconds.toFixed(1)} | ${fmtRate(row.routesPerSecond)} | ${fmtMs(row.p50Ms)} | ${fmtMs(row.p99Ms)} | ${fmtMs(row.p999Ms)} | ${fmtMs(row.sendLagP99Ms)} ` +
        `| ${(100 * row.serverCpu).toFixed(0)} % | ${row.serverCpuUsPerRoute.toFixed(0)} | ${Number.isNaN(row.mainCpuUsPerRoute) ? "-" : row.mainCpuUsPerRoute.toFixed(0)} | ${row.decisionUs === null ? "-" : row.decisionUs.toFixed(1)} ` +
        `| ${(100 * row.generatorCpu).toFixed(0)} % |`,
    );
  }
  if (modes.length > 1) {
    console.log(`\nRatios against threads ${modes[0]} (medians of the paired runs):`);
    const base = new Map(
      rows.filter((row) => row.threads === modes[0]).map((row) => [row.scenario, row]),
    );
    for (const row of rows.filter((r, i) => rows.findIndex((o) => o.threads === r.threads) === i)) {
      const ns = row.indexCpuNsPerPair;
      console.log(
        `  threads ${row.threads}: indexing CPU per pair ${ns.main.toFixed(0)} ns main thread, ` +
          `${ns.workers.toFixed(0)} ns Workers, ${ns.total.toFixed(0)} ns process`,
      );
    }
    for (const row of rows.filter((r) => r.threads !== modes[0])) {
      const a = base.get(row.scenario)!;
      console.log(
        `  ${row.scenario}, threads ${row.threads}: index ready x${(row.indexSeconds / a.indexSeconds).toFixed(2)}, routes/s x${(row.routesPerSecond / a.routesPerSecond).toFixed(2)}, ` +
          `CPU µs/route x${(row.serverCpuUsPerRoute / a.serverCpuUsPerRoute).toFixed(2)}, ` +
          `main-thread µs/route x${(row.mainCpuUsPerRoute / a.mainCpuUsPerRoute).toFixed(2)}, p99 x${(row.p99Ms / a.p99Ms).toFixed(2)}`,
      );
    }
  }
}
