// Goal: after an engine or kvedge process dies and comes back, each worker's index
// equals what its engine really caches, or kvedge says it cannot know (degraded);
// never stale-but-exact. Real processes (`kvedge serve`, `kvedge mock-engine`) on
// loopback; SIGKILL, so nothing gets to say goodbye.
import { afterEach, describe, expect, test } from "bun:test";
import type { ServeProcess } from "../support/serve";
import {
  engineCache, expectEqualOrDegraded, expectExactAndEqual, generate, type MockEngineProcess, metric, prompts, restartEngine,
  serveFor, startMockEngine, stopEngine, subscribed, workerSpec, workerView,
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

/** kvedge for one engine; waits until it subscribed, so no batch is published before it listens. */
async function serve(target: MockEngineProcess, reconnectMs?: number[]): Promise<ServeProcess> {
  const started = await serveFor([workerSpec(1, target)], [], reconnectMs);
  serves.push(started);
  await subscribed(target, 1);
  return started;
}

/** Publishes on the engine until its last seq passes `seq`. */
async function publishPast(target: MockEngineProcess, seq: number, salt: number): Promise<void> {
  for (let round = 0; (await engineCache(target)).lastSeq <= seq; round++) {
    if (round > 50) throw new Error(`engine did not publish past seq ${seq}`);
    await generate(target, prompts(6, 3, salt * 100 + round));
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
    expect(await metric(kvedge.url, 'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"}')).toBe(1);
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
    expect(await metric(kvedge.url, 'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"}')).toBe(1);
    expect(await metric(kvedge.url, 'kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="rebuilt"}')).toBe(1);
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
  test("with replay: the new kvedge rebuilds each worker from its engine's ring (case 3)", async () => {
    const a = await engine();
    const first = await serve(a);
    await generate(a, prompts(8, 4, 8));
    await expectExactAndEqual(first, "1", a);
    first.proc.kill("SIGKILL");
    await first.proc.exited;
    serves.splice(serves.indexOf(first), 1);
    const second = await serve(a);
    await expectExactAndEqual(second, "1", a);
    expect((await workerView(second.url, "1"))!.blocks).toBeGreaterThan(0);
  });

  test("without replay: the new kvedge says the worker is degraded, not `exact` with 0 blocks (case 3)", async () => {
    const a = await engine(false);
    const first = await serve(a);
    await generate(a, prompts(8, 4, 9));
    await expectExactAndEqual(first, "1", a);
    first.proc.kill("SIGKILL");
    await first.proc.exited;
    serves.splice(serves.indexOf(first), 1);
    const second = await serve(a);
    const worker = await expectEqualOrDegraded(second, "1", a);
    expect(worker.degraded).toBe(true);
  });
});
