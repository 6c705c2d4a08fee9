// Goal: after an engine or kvedge process dies and comes back, each worker's index
// equals what its engine really caches, or kvedge says it cannot know (degraded);
// never stale-but-exact. Real processes (`kvedge serve`, `kvedge mock-engine`) on
// loopback; SIGKILL, so nothing gets to say goodbye.
import { afterEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encodeSnapshot, SNAPSHOT_FILE } from "../../src/state/snapshot";
import { kvedgeBinary } from "../support/kvedge";
import type { ServeProcess } from "../support/serve";
import { eventually, freePort } from "../support/wait";
import {
  engineCache,
  expectEqualOrDegraded,
  expectExactAndEqual,
  generate,
  type Json,
  type MockEngineProcess,
  metric,
  prompts,
  restartEngine,
  serveFor,
  settled,
  startMockEngine,
  stopEngine,
  subscribed,
  workerSpec,
  workerView,
} from "./rig";

const engines: MockEngineProcess[] = [];
const serves: ServeProcess[] = [];

afterEach(async () => {
  for (const serve of serves.splice(0)) await serve.stop("SIGTERM");
  for (const engine of engines.splice(0)) await stopEngine(engine);
});

async function engine(replay = true): Promise<MockEngineProcess> {
  const started = await startMockEngine(replay ? {} : { replayEndpoint: null });
  engines.push(started);
  return started;
}

async function restart(old: MockEngineProcess): Promise<MockEngineProcess> {
  const fresh = await restartEngine(old);
  engines[engines.indexOf(old)] = fresh;
  return fresh;
}

/**
 * kvedge for one engine; waits until it subscribed, so no batch is published before it
 * listens, and until its connect probe decided, so the probe sees the ring as it is now
 * (a batch published while it runs could be in its answer: a rebuild, not an empty ring).
 */
async function serve(target: MockEngineProcess, reconnectMs?: number[]): Promise<ServeProcess> {
  const started = await serveFor([workerSpec(1, target)], [], reconnectMs);
  serves.push(started);
  await subscribed(target, 1);
  await settled(started, "1");
  return started;
}

async function killServe(target: ServeProcess, signal: "SIGKILL" | "SIGTERM"): Promise<void> {
  target.kill(signal);
  await target.exited;
  serves.splice(serves.indexOf(target), 1);
}

/** Publishes on the engine until its last seq passes `seq`. */
async function publishPast(target: MockEngineProcess, seq: number, salt: number): Promise<void> {
  for (let round = 0; (await engineCache(target)).lastSeq <= seq; round++) {
    if (round > 50) throw new Error(`engine did not publish past seq ${seq}`);
    const batch = prompts(6, 3, salt * 100 + round);
    await generate(target, batch);
    // Again: a block-aligned prompt recomputes its cached last block (vLLM always computes
    // the last prompt token), which the engine keeps as a second copy and announces.
    if (round === 0) await generate(target, batch);
  }
}

describe("engine SIGKILL and restart", () => {
  test("idle after the restart: the worker is cleared, not `exact` with the dead engine's blocks (case 2)", async () => {
    let a = await engine();
    const kvedge = await serve(a);
    await generate(a, prompts(8, 4, 1));
    await expectExactAndEqual(kvedge, "1", a);
    expect((await workerView(kvedge.url, "1"))!.blocks).toBeGreaterThan(0);
    a = await restart(a);
    await expectExactAndEqual(kvedge, "1", a);
    expect((await workerView(kvedge.url, "1"))!.blocks).toBe(0);
    expect(await metric(kvedge.url, 'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"}')).toBe(
      1,
    );
  });

  test("publishing past the old last seq before kvedge reconnects: rebuilt from the ring (case 1)", async () => {
    let a = await engine();
    // Slow reconnects, so the new engine publishes past the old sequence first.
    const kvedge = await serve(a, [3000, 3000]);
    await generate(a, prompts(6, 3, 2));
    await expectExactAndEqual(kvedge, "1", a);
    const oldLast = (await engineCache(a)).lastSeq;
    a = await restart(a);
    await publishPast(a, oldLast, 3);
    expect((await workerView(kvedge.url, "1"))!.state).not.toBe("connected");
    await expectExactAndEqual(kvedge, "1", a);
    expect(await metric(kvedge.url, 'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"}')).toBe(
      1,
    );
    expect(
      await metric(
        kvedge.url,
        'kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="rebuilt"}',
      ),
    ).toBe(1);
  });

  test("without a replay endpoint, a restarted engine that published past the old seq leaves the worker degraded (case 1)", async () => {
    let a = await engine(false);
    const kvedge = await serve(a, [3000, 3000]);
    await generate(a, prompts(6, 3, 4));
    await expectExactAndEqual(kvedge, "1", a);
    const oldLast = (await engineCache(a)).lastSeq;
    a = await restart(a);
    await publishPast(a, oldLast, 5);
    const worker = await expectEqualOrDegraded(kvedge, "1", a);
    expect(worker.degraded).toBe(true);
  });

  test("without a replay endpoint, an idle restarted engine leaves the worker degraded (case 2)", async () => {
    let a = await engine(false);
    const kvedge = await serve(a);
    await generate(a, prompts(6, 3, 6));
    await expectExactAndEqual(kvedge, "1", a);
    a = await restart(a);
    const worker = await expectEqualOrDegraded(kvedge, "1", a);
    expect(worker.degraded).toBe(true);
    // The engine's first batch (seq 0) proves a fresh stream: exact again.
    await generate(a, prompts(2, 2, 7));
    await expectExactAndEqual(kvedge, "1", a);
  });
});

describe("kvedge SIGKILL and restart, engines idle, no snapshot", () => {
  /** An idle engine with blocks, and a second kvedge started after the first was SIGKILLed. */
  async function kvedgeRestarted(
    replay: boolean,
    salt: number,
  ): Promise<{ a: MockEngineProcess; second: ServeProcess }> {
    const a = await engine(replay);
    const first = await serve(a);
    await generate(a, prompts(8, 4, salt));
    await expectExactAndEqual(first, "1", a);
    await killServe(first, "SIGKILL");
    return { a, second: await serve(a) };
  }

  test("with replay: the new kvedge rebuilds each worker from its engine's ring (case 3)", async () => {
    const { a, second } = await kvedgeRestarted(true, 8);
    await expectExactAndEqual(second, "1", a);
    expect((await workerView(second.url, "1"))!.blocks).toBeGreaterThan(0);
  });

  test("without replay: the new kvedge says the worker is degraded, not `exact` with 0 blocks (case 3)", async () => {
    const { a, second } = await kvedgeRestarted(false, 9);
    const worker = await expectEqualOrDegraded(second, "1", a);
    expect(worker.degraded).toBe(true);
  });
});

describe("kvedge restart with a snapshot (--state-dir)", () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  /** An engine whose replay ring (8 batches) no longer reaches back to seq 0. */
  async function longRunningEngine(): Promise<MockEngineProcess> {
    const started = await startMockEngine({ bufferSteps: 8 });
    engines.push(started);
    return started;
  }

  async function serveWithState(
    target: MockEngineProcess,
    dir: string | null,
  ): Promise<ServeProcess> {
    const started = await serveFor(
      [workerSpec(1, target)],
      dir === null ? [] : ["--state-dir", dir, "--snapshot-interval-secs", "1"],
    );
    serves.push(started);
    return started;
  }

  function stateDir(): string {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-state-"));
    dirs.push(dir);
    return dir;
  }

  /** An engine past its ring's reach back to 0, and a kvedge (keeping state in `dir`) exact on it. */
  async function caughtUp(
    dir: string | null,
    salt: number,
  ): Promise<{ a: MockEngineProcess; first: ServeProcess }> {
    const a = await longRunningEngine();
    const first = await serveWithState(a, dir);
    await subscribed(a);
    await publishPast(a, 12, salt);
    await expectExactAndEqual(first, "1", a);
    return { a, first };
  }

  test("SIGTERM writes a snapshot; the next kvedge loads it and catches up by replay from the saved seq, active requests kept", async () => {
    const dir = stateDir();
    const { a, first } = await caughtUp(dir, 20);
    const route = (id: string) =>
      fetch(`${first.url}/v1/route`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          request_id: id,
          token_ids: Array.from({ length: 40 }, (_, i) => i + 1),
        }),
      });
    for (const id of ["kept-1", "kept-2", "done-3"]) expect((await route(id)).status).toBe(200);
    expect(
      (await fetch(`${first.url}/v1/requests/kept-2/prefill_done`, { method: "POST" })).status,
    ).toBe(200);
    expect((await fetch(`${first.url}/v1/requests/done-3/done`, { method: "POST" })).status).toBe(
      200,
    );
    const loadOf = async (target: ServeProcess) => {
      const { workers } = (await (await fetch(`${target.url}/v1/workers`)).json()) as {
        workers: Record<string, unknown>[];
      };
      const { active_requests, active_prefill_tokens, active_decode_blocks } = workers[0]!;
      return { active_requests, active_prefill_tokens, active_decode_blocks };
    };
    const before = await loadOf(first);
    expect(before.active_requests).toBe(2);
    await killServe(first, "SIGTERM");
    // A little more while kvedge is down (less than the ring holds).
    await generate(a, prompts(1, 2, 21));
    const second = await serveWithState(a, dir);
    await second.waitForLog((line) => line.msg === "snapshot loaded");
    await expectExactAndEqual(second, "1", a);
    // Block-aligned prompts run again recomputed their last blocks (more copies): the snapshot kept them.
    expect(Object.keys((await engineCache(a)).copies).length).toBeGreaterThan(0);
    expect(
      await metric(
        second.url,
        'kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="continued"}',
      ),
    ).toBe(1);
    expect(await loadOf(second)).toEqual(before);
    expect((await fetch(`${second.url}/v1/requests/kept-1/done`, { method: "POST" })).status).toBe(
      200,
    );
    expect((await loadOf(second)).active_requests).toBe(1);
  });

  test("an engine with a CPU tier: the snapshot keeps both tiers; after the restart the index equals the engine on both", async () => {
    const dir = stateDir();
    // A small device cache: blocks keep spilling to the CPU tier (and its own evictions).
    const a = await startMockEngine({ capacityBlocks: 24, cpuCapacityBlocks: 40 });
    engines.push(a);
    const first = await serveWithState(a, dir);
    await subscribed(a);
    for (let round = 0; round < 6; round++) await generate(a, prompts(4, 3, 40 + round));
    await expectExactAndEqual(first, "1", a);
    const truth = await engineCache(a);
    expect(truth.host.size).toBeGreaterThan(0);
    await killServe(first, "SIGTERM");
    const second = await serveWithState(a, dir);
    await second.waitForLog((line) => line.msg === "snapshot loaded");
    await expectExactAndEqual(second, "1", a);
  });

  test("SIGKILL: the last periodic snapshot is loaded and caught up", async () => {
    const dir = stateDir();
    const { a, first } = await caughtUp(dir, 22);
    const synced = performance.now();
    await eventually(
      () =>
        (statSync(join(dir, "kvedge.snapshot"), { throwIfNoEntry: false })?.mtimeMs ?? 0) >
        performance.timeOrigin + synced
          ? true
          : undefined,
      10_000,
      "a snapshot after the index caught up",
    );
    await killServe(first, "SIGKILL");
    const second = await serveWithState(a, dir);
    await expectExactAndEqual(second, "1", a);
  });

  test("without the snapshot, the same situation leaves the worker degraded (the ring no longer starts at 0)", async () => {
    const { a, first } = await caughtUp(null, 23);
    await killServe(first, "SIGKILL");
    const second = await serveWithState(a, null);
    const worker = await expectEqualOrDegraded(second, "1", a);
    expect(worker.degraded).toBe(true);
    expect(worker.lost_batches).toBeGreaterThan(0);
  });

  test("a corrupt snapshot is refused with one log line; kvedge starts empty and rebuilds what it can", async () => {
    const dir = stateDir();
    writeFileSync(join(dir, "kvedge.snapshot"), "KVEDGE-SNAPSHOT\n\x01\x00\x00\x00garbage");
    const a = await engine();
    const kvedge = await serveWithState(a, dir);
    const refused = await kvedge.waitForLog(
      (line) => line.msg === "snapshot refused; starting empty",
    );
    expect(String(refused.reason)).toContain("truncated");
    await subscribed(a);
    await generate(a, prompts(2, 2, 24));
    await expectExactAndEqual(kvedge, "1", a);
  });
});

describe("kvedge startup with a snapshot", () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  function stateDir(): string {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-state-"));
    dirs.push(dir);
    return dir;
  }

  /** Whether something accepts TCP connections on the port now. */
  const accepts = (port: number): Promise<boolean> =>
    new Promise((resolve) => {
      Bun.connect({
        hostname: "127.0.0.1",
        port,
        socket: {
          open: (socket) => {
            socket.end();
            resolve(true);
          },
          data() {},
          error: () => resolve(false),
          connectError: () => resolve(false),
        },
      }).catch(() => resolve(false));
    });

  test("the port opens once the snapshot is loaded: the first answer routes on it", async () => {
    const dir = stateDir();
    // One worker holding a 1M-block chain: loading it takes long enough to be seen.
    const blocks = 1_000_000;
    const words = new Uint32Array(7 + 4 * blocks);
    words.set([1, 0, 0, 0, 0, 0, blocks]);
    for (let i = 0; i < blocks; i++) {
      words[7 + 2 * i + 1] = i + 1;
      words[7 + 2 * blocks + 2 * i + 1] = i + 1;
    }
    writeFileSync(
      join(dir, SNAPSHOT_FILE),
      encodeSnapshot({
        blockSize: 16,
        createdAt: new Date().toISOString(),
        workerIds: [1n],
        words,
        positions: [
          { workerId: 1n, dpRank: 0, lastSeq: 41, fingerprint: 7, degraded: false, ranks: [0] },
        ],
      }),
    );
    const [port, nobody] = [freePort(), freePort()];
    const lines: Record<string, unknown>[] = [];
    const child = Bun.spawn(
      [
        kvedgeBinary(),
        "serve",
        "--port",
        String(port),
        "--log-format",
        "json",
        "--warmup-routes",
        "0",
        "--state-dir",
        dir,
        "--workers",
        `1=tcp://127.0.0.1:${nobody}`,
      ],
      {
        stdin: "ignore",
        stdout: "ignore",
        stderr: "pipe",
        env: { PATH: process.env.PATH ?? "" },
      },
    );
    const reading = (async () => {
      let text = "";
      for await (const chunk of child.stderr) text += new TextDecoder().decode(chunk);
      for (const line of text.split("\n")) if (line.startsWith("{")) lines.push(JSON.parse(line));
    })();
    try {
      let openedAt = 0;
      for (let tries = 0; openedAt === 0 && tries < 20_000 && child.exitCode === null; tries++) {
        if (await accepts(port)) openedAt = Date.now();
        else await Bun.sleep(2);
      }
      expect(openedAt).toBeGreaterThan(0);
      const url = `http://127.0.0.1:${port}`;
      const listed = (await (await fetch(`${url}/v1/workers`)).json()) as { workers: Json[] };
      const workers = listed.workers.map((w) => [w.worker_id, w.blocks, w.degraded]);
      expect(workers).toEqual([["1", blocks, true]]);
      // Alive, not ready: the engine's state is not established yet (nobody listens there).
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      expect((await fetch(`${url}/readyz`)).status).toBe(503);
      child.kill("SIGKILL");
      await child.exited;
      await reading;
      const loaded = lines.find((line) => line.msg === "snapshot loaded");
      expect(loaded?.blocks).toBe(blocks);
      // Loaded (logged) before anything could connect.
      expect(Date.parse(String(loaded!.time))).toBeLessThanOrEqual(openedAt);
    } finally {
      child.kill("SIGKILL");
      await child.exited;
    }
  });
});
