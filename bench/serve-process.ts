/**
 * The processes of the serving benchmarks: the engine fleet (bench/http-fleet.ts) and
 * `kvedge serve` subscribed to it, started fresh for each run, and their teardown.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { startServeChild } from "../src/sim/serve-process";
import { killWithBench } from "./lib";

const ROOT = join(import.meta.dir, "..");

/**
 * Reads `reader` until a whole line that `wanted` accepts, and returns it; `what` names
 * the line in the error if the stream ends first.
 */
async function lineWhere(
  reader: { read(): Promise<{ done: boolean; value?: Uint8Array }> },
  wanted: (line: string) => boolean,
  what: string,
): Promise<string> {
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended before ${what}: ${text}`);
    text += decoder.decode(value, { stream: true });
    const lines = text.split("\n");
    const found = lines.slice(0, -1).find(wanted);
    if (found !== undefined) return found;
  }
}

export interface Fleet {
  readonly proc: Subprocess<"pipe", "pipe", "inherit">;
  readonly endpoints: string[];
  readonly pairsPerWorker: number[];
  readonly pairs: number;
}

/** The fleet process (bench/http-fleet.ts): `workers` ZMTP PUB sockets publishing about `pairs` stored (block, worker) pairs. */
export async function startFleet(seed: number, workers: number, pairs: number): Promise<Fleet> {
  const proc = killWithBench(
    Bun.spawn(
      [
        process.execPath,
        join(import.meta.dir, "http-fleet.ts"),
        String(seed),
        String(workers),
        String(pairs),
      ],
      {
        stdin: "pipe",
        stdout: "pipe",
        stderr: "inherit",
      },
    ),
  );
  const line = await lineWhere(proc.stdout.getReader(), () => true, "the fleet's endpoints");
  return { proc, ...JSON.parse(line) };
}

export interface Serve {
  readonly pid: number;
  /** SIGTERM, and waits for the exit. */
  stop(): Promise<number>;
  readonly host: string;
  readonly port: number;
  readonly url: string;
}

/**
 * `kvedge serve` (the executable `binary`) subscribed to every engine of the fleet, with
 * `extraArgs`; resolves once it listens. With `profileDir`, runs from source under
 * `bun --cpu-prof` instead and leaves the profile there.
 */
export async function startServe(
  binary: string,
  fleet: Fleet,
  extraArgs: string[],
  profileDir?: string,
): Promise<Serve> {
  const workers = fleet.endpoints.map((endpoint, w) => `${w + 1}=${endpoint}`).join(",");
  const profile = [
    process.execPath,
    "--cpu-prof",
    "--cpu-prof-interval=250",
    `--cpu-prof-dir=${profileDir}`,
    join(ROOT, "src", "cli", "main.ts"),
  ];
  // The demo's starter: it waits for the listening line, keeps draining the logs and
  // stops the child when the bench is stopped.
  const child = await startServeChild({
    command: profileDir === undefined ? [binary] : profile,
    args: ["--log-level", "info", ...extraArgs, "--workers", workers],
    startTimeoutMs: 60_000,
  });
  const url = new URL(child.url);
  return {
    pid: child.pid,
    stop: () => child.stop(),
    host: url.hostname,
    port: Number(url.port),
    url: url.origin,
  };
}

/** Waits until /v1/workers shows every worker of the fleet with all its blocks; seconds waited. */
export async function waitIndexed(serve: Serve, fleet: Fleet, timeoutMs: number): Promise<number> {
  const started = performance.now();
  for (;;) {
    const response = await fetch(`${serve.url}/v1/workers`);
    const body = (await response.json()) as { workers: { worker_id: string; blocks: number }[] };
    const blocks = new Map(body.workers.map((worker) => [Number(worker.worker_id), worker.blocks]));
    if (fleet.pairsPerWorker.every((pairs, w) => blocks.get(w + 1) === pairs))
      return (performance.now() - started) / 1000;
    if (performance.now() - started > timeoutMs) {
      const total = [...blocks.values()].reduce((a, b) => a + b, 0);
      throw new Error(`indexed ${total} of ${fleet.pairs} pairs after ${timeoutMs} ms`);
    }
    await Bun.sleep(100);
  }
}

/** CPU seconds (user + system) of a process's threads: its main thread, its Workers, all. */
export function threadCpuOf(pid: number): { main: number; workers: number; total: number } {
  let main = 0;
  let workers = 0;
  let total = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let stat: string;
    let comm: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
      comm = readFileSync(`/proc/${pid}/task/${tid}/comm`, "utf8").trim();
    } catch {
      continue; // a thread that exited meanwhile
    }
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const seconds = (Number(fields[11]) + Number(fields[12])) / 100;
    total += seconds;
    if (tid === String(pid)) main += seconds;
    else if (comm === "Worker") workers += seconds;
  }
  return { main, workers, total };
}

export function rssOf(pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match === null ? 0 : Number(match[1]) * 1024;
}

export async function indexBytes(serve: Serve): Promise<number> {
  return metricValue(await metricsText(serve), "kvedge_index_bytes");
}

/** The server's routing decisions so far (HTTP /v1/route only): their count and total seconds. */
export async function routeDecisions(serve: Serve): Promise<{ count: number; seconds: number }> {
  const text = await metricsText(serve);
  return {
    count: metricValue(text, "kvedge_route_decision_duration_seconds_count"),
    seconds: metricValue(text, "kvedge_route_decision_duration_seconds_sum"),
  };
}

async function metricsText(serve: Serve): Promise<string> {
  return await (await fetch(`${serve.url}/metrics`)).text();
}

/** An unlabelled sample's value in Prometheus text; NaN when it is missing. */
function metricValue(text: string, name: string): number {
  const match = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
  return match === null ? NaN : Number(match[1]);
}

/** Stops the server (gracefully) and the fleet, and waits for both. */
export async function stopAll(serve: Serve, fleet: Fleet): Promise<void> {
  await serve.stop();
  fleet.proc.stdin.end();
  fleet.proc.kill("SIGTERM");
  await fleet.proc.exited;
}
