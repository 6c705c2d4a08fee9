/**
 * The fault suite's rig: real `kvedge mock-engine` and `kvedge serve` processes on
 * loopback, and the comparison every fault test ends with: the blocks kvedge's index
 * holds for a worker (from `GET /v1/dump`) against the blocks the engine really caches
 * (`GET /v1/cache` of the mock engine).
 */
import { expect } from "bun:test";
import type { Subprocess } from "bun";
import { spawnMockEngine } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

export type Json = Record<string, any>;

export interface MockEngineSpec {
  /** PUB endpoint; default a free port on 127.0.0.1. */
  readonly endpoint?: string;
  /** Replay ROUTER endpoint; null: no replay; default a free port. */
  readonly replayEndpoint?: string | null;
  readonly httpPort?: number;
  readonly bufferSteps?: number;
  readonly capacityBlocks?: number;
  /** A CPU offload tier of this many blocks. */
  readonly cpuCapacityBlocks?: number;
}

export interface MockEngineProcess {
  readonly endpoint: string;
  readonly replayEndpoint: string | null;
  readonly http: string;
  readonly httpPort: number;
  readonly proc: Subprocess<"ignore", "pipe", "pipe">;
  /** The same engine's addresses, to start a fresh process in its place. */
  readonly spec: MockEngineSpec;
}

/** Starts `kvedge mock-engine` (fast model clock) and waits for its address line. */
export async function startMockEngine(spec: MockEngineSpec = {}): Promise<MockEngineProcess> {
  const replay = spec.replayEndpoint === undefined ? "tcp://127.0.0.1:0" : spec.replayEndpoint;
  const args = [
    "--endpoint",
    spec.endpoint ?? "tcp://127.0.0.1:0",
    "--capacity-blocks",
    String(spec.capacityBlocks ?? 400),
    "--speedup",
    "200",
    "--http-port",
    String(spec.httpPort ?? 0),
    ...(replay === null ? [] : ["--replay-endpoint", replay]),
    ...(spec.bufferSteps === undefined ? [] : ["--buffer-steps", String(spec.bufferSteps)]),
    ...(spec.cpuCapacityBlocks === undefined
      ? []
      : ["--cpu-capacity-blocks", String(spec.cpuCapacityBlocks)]),
  ];
  const { proc, info: line } = await spawnMockEngine(args, { PATH: process.env.PATH ?? "" });
  const httpPort = Number(new URL(line.http).port);
  return {
    endpoint: line.endpoint,
    replayEndpoint: line.replay_endpoint,
    http: line.http,
    httpPort,
    proc,
    spec: { ...spec, endpoint: line.endpoint, replayEndpoint: line.replay_endpoint, httpPort },
  };
}

/** SIGKILLs the engine and starts a new process on the same addresses (an engine restart). */
export async function restartEngine(engine: MockEngineProcess): Promise<MockEngineProcess> {
  engine.proc.kill("SIGKILL");
  await engine.proc.exited;
  // The old sockets' ports may take a moment to free up: a failed start is "not yet".
  const restart = () => startMockEngine(engine.spec);
  return await eventually(restart, 10_000, "the engine to restart on its addresses");
}

export async function stopEngine(engine: MockEngineProcess): Promise<void> {
  engine.proc.kill("SIGKILL");
  await engine.proc.exited;
}

/** The worker spec for `--workers`. */
export function workerSpec(id: number, engine: MockEngineProcess): string {
  return `${id}=${engine.endpoint}${engine.replayEndpoint === null ? "" : `;replay=${engine.replayEndpoint}`}`;
}

/** `kvedge serve` for the engines, with quick reconnects unless `reconnectMs` says otherwise. */
export async function serveFor(
  engines: string[],
  extra: string[] = [],
  reconnectMs = [50, 200],
): Promise<ServeProcess> {
  return await startServe([
    "--warmup-routes",
    "0",
    "--reconnect-min-ms",
    String(reconnectMs[0]),
    "--reconnect-max-ms",
    String(reconnectMs[1]),
    "--workers",
    engines.join(","),
    ...extra,
  ]);
}

/** Waits until `count` subscribers are attached to the engine's PUB (earlier batches would miss them). */
export async function subscribed(engine: MockEngineProcess, count = 1): Promise<void> {
  await eventually(
    async () => {
      const stats = (await (await fetch(`${engine.http}/v1/stats`)).json()) as Json;
      return stats.publisher.subscribers >= count ? true : undefined;
    },
    15_000,
    "kvedge subscribed to the engine",
  );
}

/** Distinct prompts of `blocks` full blocks of 16 tokens, the first `shared` blocks common to all. */
export function prompts(count: number, blocks: number, salt: number, shared = 1): number[][] {
  return Array.from({ length: count }, (_, i) =>
    Array.from({ length: blocks * 16 }, (_, t) =>
      t < shared * 16 ? 1 + t : 1000 + salt * 100_000 + i * 1000 + t,
    ),
  );
}

/** Runs every prompt on the engine (a few output tokens each) and waits for all to finish. */
export async function generate(engine: MockEngineProcess, all: number[][]): Promise<void> {
  await Promise.all(
    all.map(async (tokens) => {
      const response = await fetch(`${engine.http}/v1/generate`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token_ids: tokens, max_tokens: 4 }),
      });
      if (response.status !== 200)
        throw new Error(`generate: ${response.status} ${await response.text()}`);
      await response.arrayBuffer();
    }),
  );
}

/** What the engine really caches now, the copies of blocks cached more than once, its CPU tier's. */
export async function engineCache(engine: MockEngineProcess): Promise<{
  lastSeq: number;
  blocks: Set<string>;
  copies: Record<string, number>;
  host: Set<string>;
}> {
  const body = (await (await fetch(`${engine.http}/v1/cache`)).json()) as Json;
  return {
    lastSeq: body.last_seq,
    blocks: new Set(body.block_hashes as string[]),
    copies: body.copies as Record<string, number>,
    host: new Set(body.host_block_hashes as string[]),
  };
}

/** The blocks kvedge's index holds per worker, replaying its dump's stored/removed/cleared events. */
export async function indexHeld(url: string): Promise<Map<string, Set<string>>> {
  const copies = await indexCopies(url);
  return new Map([...copies].map(([worker, held]) => [worker, new Set(held.keys())]));
}

/**
 * Per worker, each held block's copies, replaying the dump (a dump stores a block once
 * per copy the index counts); `tier`: the device's (default) or a lower tier's blocks.
 */
export async function indexCopies(
  url: string,
  tier = "device",
): Promise<Map<string, Map<string, number>>> {
  const text = await (await fetch(`${url}/v1/dump`)).text();
  const held = new Map<string, Map<string, number>>();
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const op = JSON.parse(line) as Json;
    if ((op.tier ?? "device") !== tier && op.op !== "cleared") continue;
    let blocks = held.get(op.worker_id);
    if (blocks === undefined) held.set(op.worker_id, (blocks = new Map()));
    if (op.op === "cleared") blocks.clear();
    for (const hash of (op.block_hashes ?? []) as string[]) {
      const now = (blocks.get(hash) ?? 0) + (op.op === "stored" ? 1 : -1);
      if (now > 0) blocks.set(hash, now);
      else blocks.delete(hash);
    }
  }
  return held;
}

export async function workerView(url: string, id: string): Promise<Json | undefined> {
  const body = (await (await fetch(`${url}/v1/workers`)).json()) as Json;
  return (body.workers as Json[]).find((w) => w.worker_id === id);
}

const sorted = (set: Set<string> | undefined) => [...(set ?? [])].sort();

/**
 * Waits until the worker is connected, not degraded, and has applied the engine's last
 * batch, then asserts its indexed blocks equal the engine's cache exactly, copies included.
 */
export async function expectExactAndEqual(
  serve: ServeProcess,
  id: string,
  engine: MockEngineProcess,
): Promise<void> {
  const truth = await engineCache(engine);
  await eventually(
    async () => {
      const worker = await workerView(serve.url, id);
      return worker?.state === "connected" && !worker.degraded && worker.last_seq === truth.lastSeq
        ? true
        : undefined;
    },
    15_000,
    `worker ${id} exact at seq ${truth.lastSeq}`,
  );
  const held = (await indexCopies(serve.url)).get(id) ?? new Map<string, number>();
  expect(sorted(new Set(held.keys()))).toEqual(sorted(truth.blocks));
  // And every block with as many copies as the engine holds (vLLM's duplicates).
  const copies = Object.fromEntries([...held].filter(([, n]) => n > 1));
  expect(copies).toEqual(truth.copies);
  const host = (await indexCopies(serve.url, "host_pinned")).get(id) ?? new Map<string, number>();
  expect(sorted(new Set(host.keys()))).toEqual(sorted(truth.host));
}

/**
 * The worker's view once it is connected and no replay of its runs: its connect probe (if
 * it has a replay endpoint) has decided. Before that `degraded` means "still asking" (the
 * probe counts as degraded), not what kvedge concluded. Undefined while not so.
 */
async function settledView(url: string, id: string): Promise<Json | undefined> {
  // The probe starts in the same turn as the connect, so "connected" first, then the counts.
  if ((await workerView(url, id))?.state !== "connected") return undefined;
  const replays = (result: string) =>
    metric(url, `kvedge_ingest_replays_total{worker_id="${id}",dp_rank="0",result="${result}"}`);
  const counts = await Promise.all(["requested", "completed", "failed"].map(replays));
  const [requested, completed, failed] = counts;
  if (requested !== completed! + failed!) return undefined;
  const worker = await workerView(url, id);
  return worker?.state === "connected" ? worker : undefined;
}

/** Waits until the worker is connected and its connect probe (if any) has decided. */
export async function settled(serve: ServeProcess, id: string): Promise<Json> {
  const what = `worker ${id} connected, no replay running`;
  return await eventually(() => settledView(serve.url, id), 15_000, what);
}

/**
 * Without a way to learn the engine's state, kvedge must say so: once it is connected
 * again and has decided, the worker is degraded, or equal to the engine (never
 * stale-but-exact).
 */
export async function expectEqualOrDegraded(
  serve: ServeProcess,
  id: string,
  engine: MockEngineProcess,
): Promise<Json> {
  await subscribed(engine);
  const truth = await engineCache(engine);
  return await eventually(
    async () => {
      const worker = await settledView(serve.url, id);
      if (worker === undefined) return undefined;
      if (worker.degraded) return worker;
      const held = (await indexCopies(serve.url)).get(id) ?? new Map<string, number>();
      const copies = Object.fromEntries([...held].filter(([, n]) => n > 1));
      return worker.last_seq === truth.lastSeq &&
        sorted(new Set(held.keys())).join() === sorted(truth.blocks).join() &&
        JSON.stringify(copies) === JSON.stringify(truth.copies)
        ? worker
        : undefined;
    },
    15_000,
    `worker ${id} equal to its engine or degraded`,
  );
}

/** Metric value of one series (first line starting with `series`), or NaN. */
export async function metric(url: string, series: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? Number.NaN : Number(line.slice(series.length + 1));
}
