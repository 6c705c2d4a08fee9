// Goal: `kvedge serve --index-threads 1` fed by real `kvedge mock-engine` processes
// (vLLM-like caches with LRU eviction publishing vLLM KV events, driven by generate
// requests) ends with the index and routes of `--index-threads 0` fed the same engines:
// same blocks per worker as each engine caches, same matches, same route answers.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type MockEngineChild, spawnMockEngine } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

type Json = Record<string, any>;
const BS = 16;

type Engine = MockEngineChild;

async function startEngine(seed: number): Promise<Engine> {
  return spawnMockEngine([
    "--endpoint",
    "tcp://127.0.0.1:0",
    "--replay-endpoint",
    "tcp://127.0.0.1:0",
    "--capacity-blocks",
    "24",
    "--speedup",
    "50",
    "--hash-seed",
    String(seed),
  ]);
}

const json = async (url: string, body?: unknown): Promise<Json> => {
  const response = await fetch(
    url,
    body === undefined
      ? {}
      : {
          method: "POST",
          body: JSON.stringify(body),
          headers: { "content-type": "application/json" },
        },
  );
  return (await response.json()) as Json;
};

describe("the writer thread fed by mock engines", () => {
  let engines: Engine[];
  let servers: ServeProcess[];

  beforeAll(async () => {
    engines = await Promise.all([startEngine(3), startEngine(4)]);
    const workers = engines.map(
      (e, i) => `${i + 1}=${e.info.endpoint};replay=${e.info.replay_endpoint}`,
    );
    const args = ["--block-size", String(BS), "--workers", workers.join(",")];
    servers = await Promise.all([
      startServe([...args, "--index-threads", "0"]),
      startServe([...args, "--index-threads", "1"]),
    ]);
    for (const engine of engines) {
      await eventually(
        async () => {
          const stats = await json(`${engine.info.http}/v1/stats`);
          return stats.publisher.subscribers === 2 ? true : undefined;
        },
        10_000,
        "both servers subscribed",
      );
    }
  });

  afterAll(async () => {
    await Promise.all((servers ?? []).map((serve) => serve.stop()));
    for (const engine of engines ?? []) {
      if (engine.proc.exitCode === null) engine.proc.kill("SIGTERM");
    }
  });

  test("prompts through the engines, evictions included: the same index and routes", async () => {
    // Families of prompts sharing prefixes, more blocks than the engines hold: LRU evicts.
    const prompt = (family: number, length: number) =>
      Array.from({ length }, (_, i) => (i < 64 ? 10_000 * family + i : 500_000 + 97 * family + i));
    for (let i = 0; i < 40; i++) {
      const tokens = prompt(i % 5, 64 + 16 * (i % 4));
      await json(`${engines[i % 2]!.info.http}/v1/generate`, { token_ids: tokens, max_tokens: 2 });
    }
    // Both servers at each engine's last batch, holding what each engine caches.
    for (const [i, engine] of engines.entries()) {
      const stats = await json(`${engine.info.http}/v1/stats`);
      for (const serve of servers) {
        await eventually(
          async () => {
            const workers = (await json(`${serve.url}/v1/workers`)).workers as Json[];
            const worker = workers.find((w) => w.worker_id === String(i + 1));
            return worker?.last_seq === stats.publisher.last_seq ? worker : undefined;
          },
          10_000,
          `worker ${i + 1} at seq ${stats.publisher.last_seq}`,
        ).then((worker) => {
          expect(worker.blocks).toBe(stats.cache.cached_blocks);
          expect(worker.degraded).toBe(false);
        });
      }
      expect(stats.cache.evictedBlocks).toBeGreaterThan(0);
    }
    for (let family = 0; family < 5; family++) {
      const body = { token_ids: prompt(family, 112), request_id: `q${family}` };
      const ask = (path: string) =>
        Promise.all(servers.map((serve) => json(`${serve.url}${path}`, body)));
      const [single, threaded] = await ask("/v1/route");
      expect(threaded).toEqual(single!);
      const [m0, m1] = await ask("/v1/match");
      expect(m1).toEqual(m0!);
    }
    const [w0, w1] = await Promise.all(servers.map((serve) => json(`${serve.url}/v1/workers`)));
    // Event lag is each server's own wall-clock reading: it may differ by a millisecond.
    const timeless = (answer: Json) => ({
      ...answer,
      workers: answer.workers.map((w: Json) => ({ ...w, event_lag_ms: null })),
    });
    expect(timeless(w1!)).toEqual(timeless(w0!));
  }, 60_000);
});
