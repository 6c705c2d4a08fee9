// Goal: replay servers that misbehave (silent, garbage, endless), live floods while a
// replay runs, and stray sequence numbers end with the index equal to what the engine
// caches, or with the worker degraded and every lost batch counted; routing never
// waits forever on a replay. A scripted engine (real ZMTP sockets) feeds a real
// `kvedge serve` process.
import { afterEach, describe, expect, test } from "bun:test";
import type { KvEvent } from "../../src/wire/kv-events";
import { stored } from "../support/engine";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";
import { indexHeld, metric, workerView } from "./rig";
import { type ReplayMode, ScriptedEngine } from "./scripted";

const BS = 16;
const cleanups: (() => Promise<unknown>)[] = [];

afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

/** A one-block store whose hash and tokens are derived from `n`. */
const block = (n: number): KvEvent =>
  stored(
    [BigInt(1000 + n)],
    Array.from({ length: BS }, (_, t) => n * 100 + t + 1),
    BS,
  );

/** A store of `blocks` chained blocks (a big batch), hashes from `base`. */
function bigStore(base: number, blocks: number): KvEvent {
  const hashes = Array.from({ length: blocks }, (_, i) => BigInt(base + i));
  const tokens = Array.from({ length: blocks * BS }, (_, t) => base + t + 1);
  return stored(hashes, tokens, BS);
}

async function setup(
  mode: ReplayMode,
  env: Record<string, string> = {},
): Promise<{ engine: ScriptedEngine; serve: ServeProcess }> {
  const engine = await new ScriptedEngine().start();
  engine.mode = mode;
  cleanups.push(() => engine.stop());
  // Settings through the environment, so the same test runs against builds without them.
  const serve = await startServe(
    ["--warmup-routes", "0", "--workers", `1=${engine.endpoint};replay=${engine.replayEndpoint}`],
    { KVEDGE_REPLAY_TIMEOUT_MS: "1000", KVEDGE_REPLAY_DEADLINE_MS: "1500", ...env },
  );
  cleanups.push(() => serve.stop());
  await engine.waitForSubscriber();
  return { engine, serve };
}

const sorted = (set: Set<string> | undefined) => [...(set ?? [])].sort();

async function held(serve: ServeProcess): Promise<string[]> {
  return sorted((await indexHeld(serve.url)).get("1"));
}

describe("replay servers that misbehave", () => {
  test("an endless replay ends at its deadline; the live batches held meanwhile get indexed (case 7)", async () => {
    const { engine, serve } = await setup("endless");
    engine.publish(0n, [block(0)]);
    engine.publish(1n, [block(1)], { lose: true });
    engine.publish(2n, [block(2)]);
    engine.publish(3n, [block(3)]);
    // Seq 1 can't be recovered (the replay never ends): its block is missing, and kvedge says so.
    const want = sorted(new Set(["1000", "1002", "1003"]));
    await eventually(
      async () => ((await held(serve)).join() === want.join() ? true : undefined),
      15_000,
      "live blocks indexed",
    );
    const worker = await workerView(serve.url, "1");
    expect(worker).toMatchObject({ degraded: true, lost_batches: 1, last_seq: 3 });
    expect(
      await metric(
        serve.url,
        'kvedge_ingest_replays_total{worker_id="1",dp_rank="0",result="failed"}',
      ),
    ).toBeGreaterThanOrEqual(1);
  });

  test("live batches held during a replay are capped in bytes; what is dropped is counted lost (case 7)", async () => {
    const { engine, serve } = await setup("endless", { KVEDGE_REPLAY_BUFFER_BYTES: "1048576" });
    // 8 batches of ~300 KB each while the connect probe hangs: about 3 fit in 1 MiB.
    for (let i = 0; i < 8; i++) engine.publish(BigInt(i), [bigStore(1_000_000 * (i + 1), 4000)]);
    const worker = await eventually(
      async () => {
        const w = await workerView(serve.url, "1");
        return w?.last_seq === 7 ? w : undefined;
      },
      15_000,
      "every batch applied or counted lost",
    );
    const dropped = await metric(
      serve.url,
      'kvedge_ingest_replay_buffer_dropped_total{worker_id="1",dp_rank="0"}',
    );
    expect(dropped).toBeGreaterThanOrEqual(4);
    expect(worker.degraded).toBe(true);
    expect(worker.lost_batches).toBe(dropped);
  });

  for (const mode of ["silent", "garbage"] as const) {
    test(`a ${mode} replay server fails the probe; live batches from 0 still make the worker exact and equal`, async () => {
      const { engine, serve } = await setup(mode);
      for (let i = 0; i < 4; i++) engine.publish(BigInt(i), [block(i)]);
      await eventually(
        async () => {
          const w = await workerView(serve.url, "1");
          return w?.last_seq === 3 && !w.degraded ? true : undefined;
        },
        15_000,
        "worker exact at seq 3",
      );
      expect(await held(serve)).toEqual(sorted(engine.truth));
    });
  }
});

describe("sequence jumps", () => {
  test("one stray batch with seq 2^53 - 1: one batch counted lost, nothing cleared (case 10)", async () => {
    const { engine, serve } = await setup("good");
    for (let i = 0; i < 3; i++) engine.publish(BigInt(i), [block(i)]);
    await eventually(
      async () => ((await workerView(serve.url, "1"))?.last_seq === 2 ? true : undefined),
      15_000,
      "seq 2",
    );
    engine.publish(2n ** 53n - 1n, [block(99)], { bogus: true });
    engine.publish(3n, [block(3)]);
    engine.publish(4n, [block(4)]);
    await eventually(
      async () => ((await workerView(serve.url, "1"))?.last_seq === 4 ? true : undefined),
      15_000,
      "seq 4",
    );
    expect(await held(serve)).toEqual(sorted(engine.truth));
    const worker = await workerView(serve.url, "1");
    expect(worker).toMatchObject({ lost_batches: 1, blocks: 5 });
    expect(await metric(serve.url, 'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"}')).toBe(
      0,
    );
  });
});
