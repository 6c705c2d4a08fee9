/**
 * Soak: the compiled `kvedge serve` in front of --engines `kvedge mock-engine`
 * processes (small caches, so blocks churn through eviction all the time; a fraction
 * of live messages dropped on purpose, recovered by replay), driven for --seconds
 * (default 600) by a bounded closed loop of requests, with one engine SIGKILLed and
 * restarted every --restart-every seconds (0 = never). All on loopback.
 *
 * kvedge keeps a snapshot (--snapshot-every S seconds, 0 = none) and is dumped
 * (`GET /v1/dump`) every --dump-every S seconds (0 = never), so both copy the index
 * under live writes (src/index/write-pause.ts) all along.
 *
 * Samples kvedge's RSS (VmRSS of its process) and index size every 5 s. At the end the
 * load stops, the engines go idle, and every worker's indexed blocks are compared with
 * its engine's real cache (`GET /v1/cache`); the loss accounting is read from
 * `/v1/workers` and `/metrics`. Exit code 1 if any worker differs while exact.
 *
 *   bun bench/soak.ts [--seconds N] [--engines N] [--restart-every S] [--drop-rate P]
 *     [--snapshot-every S] [--dump-every S] [--log FILE] [--json]
 *
 * --log FILE keeps kvedge's warnings and errors (JSON lines).
 */
import type { Subprocess } from "bun";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchFlags, killWithBench, provenance } from "./lib";

const USAGE =
  "bun bench/soak.ts [--seconds N] [--engines N] [--restart-every S] [--drop-rate P] " +
  "[--snapshot-every S] [--dump-every S] [--log FILE] [--json]";
const flags = benchFlags(USAGE, {
  seconds: { type: "string" },
  engines: { type: "string" },
  "restart-every": { type: "string" },
  "drop-rate": { type: "string" },
  "snapshot-every": { type: "string" },
  "dump-every": { type: "string" },
  json: { type: "boolean" },
  log: { type: "string" },
});
const SECONDS = Number(flags.seconds ?? 600);
const ENGINES = Number(flags.engines ?? 4);
const RESTART_EVERY = Number(flags["restart-every"] ?? 60);
const DROP_RATE = String(flags["drop-rate"] ?? "0.01");
const SNAPSHOT_EVERY = Number(flags["snapshot-every"] ?? 10);
const DUMP_EVERY = Number(flags["dump-every"] ?? 20);
const CONCURRENCY = 4;
const BIN = join(import.meta.dir, "..", "dist", "kvedge");
type Json = Record<string, any>;

/** Every process started here, killed when this one exits however it exits (a crash included). */
const spawned: Subprocess[] = [];
process.on("exit", () => {
  for (const child of spawned) if (child.exitCode === null) child.kill("SIGKILL");
});

interface Engine {
  proc: Subprocess<"ignore", "pipe", "pipe">;
  endpoint: string;
  replay: string;
  http: string;
  httpPort: number;
}

function track<P extends Subprocess>(child: P): P {
  spawned.push(child);
  return killWithBench(child);
}

async function firstLine(proc: Subprocess<"ignore", "pipe", "pipe">): Promise<Json> {
  const reader = proc.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("mock engine exited before listening");
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return JSON.parse(text.slice(0, text.indexOf("\n")));
}

async function startEngine(previous?: Engine): Promise<Engine> {
  for (let attempt = 0; ; attempt++) {
    const proc = track(
      Bun.spawn(
        [
          BIN,
          "mock-engine",
          "--capacity-blocks",
          "600",
          "--speedup",
          "10",
          "--endpoint",
          previous?.endpoint ?? "tcp://127.0.0.1:0",
          "--replay-endpoint",
          previous?.replay ?? "tcp://127.0.0.1:0",
          "--http-port",
          String(previous?.httpPort ?? 0),
          "--drop-rate",
          DROP_RATE,
        ],
        { stdin: "ignore", stdout: "pipe", stderr: "pipe" },
      ),
    );
    void new Response(proc.stderr).text();
    try {
      const line = await firstLine(proc);
      return {
        proc,
        endpoint: line.endpoint,
        replay: line.replay_endpoint,
        http: line.http,
        httpPort: Number(new URL(line.http).port),
      };
    } catch (error) {
      if (attempt > 20) throw error;
      await Bun.sleep(100); // the old process's ports may take a moment to free up
    }
  }
}

function rssMb(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("VmRSS:"))!;
  return Number(line.split(/\s+/)[1]) / 1024;
}

const json = async (url: string) => (await fetch(url)).json() as Promise<Json>;

/** A prompt from a skewed pool: 64 shared prefixes × a few suffixes, so caches hit and evict. */
function prompt(random: () => number): number[] {
  const prefix = Math.floor(random() ** 2 * 64);
  const suffix = Math.floor(random() * 400);
  return Array.from({ length: 96 }, (_, t) =>
    t < 64 ? 1 + prefix * 1000 + t : 100_000 + suffix * 100 + t,
  );
}

let state = 12345;
const random = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32;

const engines: Engine[] = [];
for (let i = 0; i < ENGINES; i++) engines.push(await startEngine());
const workers = engines.map((e, i) => `${i + 1}=${e.endpoint};replay=${e.replay}`).join(",");
const stateDir = SNAPSHOT_EVERY > 0 ? mkdtempSync(join(tmpdir(), "kvedge-soak-")) : null;
process.on("exit", () => {
  if (stateDir !== null) rmSync(stateDir, { recursive: true, force: true });
});
const stateFlags =
  stateDir === null
    ? []
    : ["--state-dir", stateDir, "--snapshot-interval-secs", String(SNAPSHOT_EVERY)];
const serve = track(
  Bun.spawn(
    [
      BIN,
      "serve",
      "--port",
      "0",
      "--warmup-routes",
      "0",
      "--log-format",
      "json",
      "--reconnect-min-ms",
      "50",
      "--reconnect-max-ms",
      "500",
      ...stateFlags,
      "--workers",
      workers,
    ],
    { stdin: "ignore", stdout: "pipe", stderr: "pipe" },
  ),
);
let url = "";
{
  const decoder = new TextDecoder();
  let tail = "";
  const reader = serve.stderr.getReader();
  while (url === "") {
    const { value, done } = await reader.read();
    if (done) throw new Error("kvedge serve exited");
    tail += decoder.decode(value);
    for (const line of tail.split("\n"))
      if (line.includes('"listening"')) url = JSON.parse(line).url;
  }
  if (flags.log !== undefined) writeFileSync(flags.log, "");
  const sink = flags.log === undefined ? null : Bun.file(flags.log).writer();
  void (async () => {
    // keep draining its logs so it never blocks on them
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      if (sink === null) continue;
      for (const line of decoder.decode(chunk.value).split("\n"))
        if (/"level":"(warn|error)"/.test(line)) sink.write(`${line}\n`);
      sink.flush();
    }
  })();
}

const started = performance.now();
const deadline = started + SECONDS * 1000;
const samples: { t: number; rss_mb: number; blocks: number }[] = [];
let requests = 0;
let failures = 0;
let restarts = 0;
const dumps = { count: 0, lines: 0, maxMs: 0 };

/** A whole `GET /v1/dump` every DUMP_EVERY seconds while the load runs. */
async function dumper(): Promise<void> {
  while (DUMP_EVERY > 0 && performance.now() + DUMP_EVERY * 1000 < deadline) {
    await Bun.sleep(DUMP_EVERY * 1000);
    const begun = performance.now();
    const text = await (await fetch(`${url}/v1/dump`)).text();
    dumps.maxMs = Math.max(dumps.maxMs, performance.now() - begun);
    dumps.count++;
    dumps.lines += text.split("\n").length - 1;
  }
}

async function loop(): Promise<void> {
  while (performance.now() < deadline) {
    const w = Math.floor(random() * ENGINES);
    try {
      const response = await fetch(`${engines[w]!.http}/v1/generate`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token_ids: prompt(random), max_tokens: 8 }),
      });
      await response.arrayBuffer();
      requests++;
    } catch {
      failures++; // the engine was being restarted
      await Bun.sleep(50);
    }
  }
}

async function sampler(): Promise<void> {
  let nextRestart = started + RESTART_EVERY * 1000;
  while (performance.now() < deadline) {
    const stats = await json(`${url}/v1/workers`);
    samples.push({
      t: Math.round((performance.now() - started) / 1000),
      rss_mb: Math.round(rssMb(serve.pid)),
      blocks: (stats.workers as Json[]).reduce((sum, w) => sum + w.blocks, 0),
    });
    if (RESTART_EVERY > 0 && performance.now() >= nextRestart) {
      nextRestart += RESTART_EVERY * 1000;
      const victim = restarts++ % ENGINES;
      engines[victim]!.proc.kill("SIGKILL");
      await engines[victim]!.proc.exited;
      engines[victim] = await startEngine(engines[victim]);
    }
    await Bun.sleep(Math.min(5000, Math.max(0, deadline - performance.now())));
  }
}

await Promise.all([sampler(), dumper(), ...Array.from({ length: CONCURRENCY }, loop)]);

// Quiesce: engines idle, then every worker must be exact and equal, or degraded with its losses counted.
const compare = async () => {
  const rows: Json[] = [];
  const view = await json(`${url}/v1/workers`);
  const dump = await (await fetch(`${url}/v1/dump`)).text();
  // Per worker, each held block's copies (a dump stores a block once per copy).
  const held = new Map<string, Map<string, number>>();
  for (const line of dump.split("\n")) {
    if (line === "") continue;
    const op = JSON.parse(line);
    const copies = held.get(op.worker_id) ?? new Map<string, number>();
    held.set(op.worker_id, copies);
    for (const h of op.block_hashes ?? []) {
      const now = (copies.get(h) ?? 0) + (op.op === "stored" ? 1 : -1);
      if (now > 0) copies.set(h, now);
      else copies.delete(h);
    }
  }
  for (const [i, engine] of engines.entries()) {
    const cache = await json(`${engine.http}/v1/cache`);
    const worker = (view.workers as Json[]).find((w) => w.worker_id === String(i + 1))!;
    const mine = held.get(String(i + 1)) ?? new Map<string, number>();
    const truth = new Set<string>(cache.block_hashes);
    const copiesOf = (h: string): number => (cache.copies as Json)[h] ?? 1;
    const equal = mine.size === truth.size && [...truth].every((h) => mine.get(h) === copiesOf(h));
    rows.push({
      worker: i + 1,
      engine_blocks: truth.size,
      engine_copies: Object.values(cache.copies as Json).reduce((a: number, n) => a + n - 1, 0),
      index_blocks: mine.size,
      equal,
      degraded: worker.degraded,
      caught_up: worker.last_seq === cache.last_seq,
      lost_batches: worker.lost_batches,
    });
  }
  return rows;
};
let rows: Json[] = [];
for (let attempt = 0; attempt < 50; attempt++) {
  await Bun.sleep(200);
  rows = await compare();
  if (rows.every((r) => r.caught_up && (r.equal || r.degraded))) break;
  // A trailing batch dropped on purpose is noticed only at the next one: nudge those engines.
  await Promise.all(
    rows
      .filter((r) => !r.caught_up)
      .map((r) =>
        fetch(`${engines[r.worker - 1]!.http}/v1/generate`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ token_ids: prompt(random), max_tokens: 1 }),
        }).then((response) => response.arrayBuffer()),
      ),
  );
}
const metrics = await (await fetch(`${url}/metrics`)).text();
const sum = (series: string, label = "") =>
  metrics
    .split("\n")
    .filter((l) => l.startsWith(series) && l.includes(label))
    .reduce((total, l) => total + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
const steady = samples.filter((s) => s.t >= Math.min(60, SECONDS / 4));
const result = {
  ...provenance(),
  seconds: SECONDS,
  engines: ENGINES,
  restart_every_s: RESTART_EVERY,
  drop_rate: Number(DROP_RATE),
  requests,
  request_failures: failures,
  engine_restarts: restarts,
  snapshot_every_s: SNAPSHOT_EVERY,
  dumps: { ...dumps, maxMs: Math.round(dumps.maxMs) },
  held_writes: sum("kvedge_index_held_writes_total{", 'what="writes"'),
  rss_mb: {
    first: samples[0]?.rss_mb,
    steady_min: Math.min(...steady.map((s) => s.rss_mb)),
    steady_max: Math.max(...steady.map((s) => s.rss_mb)),
    last: samples.at(-1)?.rss_mb,
  },
  index_blocks_last: samples.at(-1)?.blocks,
  resets: sum("kvedge_ingest_resets_total{"),
  replays_completed: sum("kvedge_ingest_replays_total{", 'result="completed"'),
  rebuilds: sum("kvedge_ingest_continuity_total{", 'outcome="rebuilt"'),
  lost_batches: sum("kvedge_ingest_lost_batches_total{"),
  gaps: sum("kvedge_ingest_gaps_total{"),
  workers: rows,
  samples: flags.json ? samples : undefined,
};
serve.kill("SIGTERM");
await serve.exited;
for (const engine of engines) engine.proc.kill("SIGTERM");
await Promise.all(engines.map((e) => e.proc.exited));
const bad = rows.filter((r) => !r.equal && !r.degraded);
if (flags.json) console.log(JSON.stringify(result));
else console.log(JSON.stringify({ ...result, samples: undefined }, null, 2));
process.exitCode = bad.length > 0 ? 1 : 0;
