/**
 * The processes of the serving benchmarks: the engine fleet (bench/http-fleet.ts) and
 * `kvedge serve` subscribed to it, started fresh for each run, and their teardown.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { killWithBench } from "./lib";

const ROOT = join(import.meta.dir, "..");

async function readLine(stream: ReadableStream<Uint8Array>, reader = stream.getReader()): Promise<{ line: string; reader: typeof reader }> {
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended before a line: ${text}`);
    text += decoder.decode(value, { stream: true });
    const newline = text.indexOf("\n");
    if (newline >= 0) {
      reader.releaseLock();
      return { line: text.slice(0, newline), reader };
    }
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
  const proc = killWithBench(Bun.spawn([process.execPath, join(import.meta.dir, "http-fleet.ts"), String(seed), String(workers), String(pairs)], {
    stdin: "pipe", stdout: "pipe", stderr: "inherit",
  }));
  const { line } = await readLine(proc.stdout);
  return { proc, ...JSON.parse(line) };
}

export interface Serve {
  readonly proc: Subprocess<"ignore", "ignore", "pipe">;
  readonly host: string;
  readonly port: number;
  readonly url: string;
}

/**
 * `kvedge serve` (the executable `binary`) subscribed to every engine of the fleet, with
 * `extraArgs`; resolves once it listens. With `profileDir`, runs from source under
 * `bun --cpu-prof` instead and leaves the profile there.
 */
export async function startServe(binary: string, fleet: Fleet, extraArgs: string[], profileDir?: string): Promise<Serve> {
  const workers = fleet.endpoints.map((endpoint, w) => `${w + 1}=${endpoint}`).join(",");
  const args = ["serve", "--port", "0", "--log-format", "json", "--log-level", "info", ...extraArgs, "--workers", workers];
  const command = profileDir === undefined
    ? [binary, ...args]
    : [process.execPath, "--cpu-prof", "--cpu-prof-interval=250", `--cpu-prof-dir=${profileDir}`, join(ROOT, "src", "cli", "main.ts"), ...args];
  const proc = killWithBench(Bun.spawn(command, { stdin: "ignore", stdout: "ignore", stderr: "pipe" }));
  const reader = proc.stderr.getReader();
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`kvedge serve exited before listening: ${text}`);
    text += decoder.decode(value, { stream: true });
    const listening = text.split("\n").map((line) => { try { return JSON.parse(line); } catch { return null; } })
      .find((line) => line?.msg === "listening");
    if (listening !== undefined) {
      const url = new URL(String(listening.url));
      // Keep draining stderr so the server never blocks on a full pipe.
      void (async () => { while (!(await reader.read()).done); })();
      return { proc, host: url.hostname, port: Number(url.port), url: String(listening.url) };
    }
  }
}

/** Waits until /v1/workers shows every worker of the fleet with all its blocks; seconds waited. */
export async function waitIndexed(serve: Serve, fleet: Fleet, timeoutMs: number): Promise<number> {
  const started = performance.now();
  for (;;) {
    const response = await fetch(`${serve.url}/v1/workers`);
    const body = (await response.json()) as { workers: { worker_id: string; blocks: number }[] };
    const blocks = new Map(body.workers.map((worker) => [Number(worker.worker_id), worker.blocks]));
    if (fleet.pairsPerWorker.every((pairs, w) => blocks.get(w + 1) === pairs)) return (performance.now() - started) / 1000;
    if (performance.now() - started > timeoutMs) {
      const total = [...blocks.values()].reduce((a, b) => a + b, 0);
      throw new Error(`indexed ${total} of ${fleet.pairs} pairs after ${timeoutMs} ms`);
    }
    await Bun.sleep(100);
  }
}

export function rssOf(pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match === null ? 0 : Number(match[1]) * 1024;
}

export async function indexBytes(serve: Serve): Promise<number> {
  const text = await (await fetch(`${serve.url}/metrics`)).text();
  const match = /^kvedge_index_bytes (\S+)$/m.exec(text);
  return match === null ? NaN : Number(match[1]);
}

/** Stops the server (gracefully) and the fleet, and waits for both. */
export async function stopAll(serve: Serve, fleet: Fleet): Promise<void> {
  serve.proc.kill("SIGTERM");
  await serve.proc.exited;
  fleet.proc.stdin.end();
  fleet.proc.kill("SIGTERM");
  await fleet.proc.exited;
}
