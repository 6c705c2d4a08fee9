// Goal: networked mock engines feeding the compiled `kvedge serve` over real sockets:
// the index kvedge serves (GET /v1/dump) equals the engines' real cache contents at
// several checkpoints — for array- and map-form engines, and for an engine whose live
// messages are dropped on purpose (serve must recover them from its replay ROUTER) —
// and `kvedge apply` on that dump answers prefix matches exactly as the engines' caches
// say they should.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { IndexOp } from "../../src/index/ops";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { engineSeeds, requestTokens, routeQuery } from "../../src/sim/simulator";
import { DEFAULT_VOCAB_SIZE } from "../../src/sim/tokens";
import { transformTrace, type Trace } from "../../src/sim/trace";
import { runKvedge } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { cachedPaths, expectIndexEqualsEngines, VirtualRig } from "../sim/fleet-rig";
import { until } from "../support/wait";

const dropped = (seq: number): boolean => seq % 9 === 4;
let trace: Trace;
let engines: NetworkedEngine[] = [];
let serve: ServeProcess | null = null;
const ids = ["10", "11", "12"];

type Json = Record<string, any>;
const getJson = async (url: string): Promise<Json> => (await fetch(url)).json() as Promise<Json>;
const dump = async (): Promise<IndexOp[]> => {
  const text = await (await fetch(`${serve!.url}/v1/dump`)).text();
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as IndexOp);
};

beforeAll(async () => {
  trace = transformTrace(await loadConversationTrace(), { requests: 120, timeScale: 0.5 });
  const seeds = engineSeeds(5, 3);
  const specs = [{ form: "array" }, { form: "map" }, { form: "array", drop: dropped }] as const;
  engines = await Promise.all(
    specs.map((spec, w) =>
      new NetworkedEngine({
        index: w,
        capacityBlocks: 2048,
        hashSeed: seeds[w]!,
        endpoint: "tcp://127.0.0.1:0",
        replayEndpoint: "tcp://127.0.0.1:0",
        form: spec.form,
        ...("drop" in spec ? { dropLive: spec.drop } : {}),
      }).start(),
    ),
  );
  const workers = engines
    .map((engine, w) => `${ids[w]}=${engine.endpoint};replay=${engine.replayEndpoint}`)
    .join(",");
  serve = await startServe(["--workers", workers]);
  for (const engine of engines) await engine.waitForSubscriber(10_000);
});

afterAll(async () => {
  await serve?.stop();
  await Promise.all(engines.map((engine) => engine.close()));
});

async function caughtUp(): Promise<void> {
  await until(async () => {
    const workers = (await getJson(`${serve!.url}/v1/workers`)).workers as Json[];
    return engines.every(
      (engine, w) => workers.find((view) => view.worker_id === ids[w])?.last_seq === engine.lastSeq,
    );
  }, "kvedge serve to apply every batch");
}

describe("networked mock engines → kvedge serve", () => {
  test("GET /v1/dump equals the engines' caches at every checkpoint; dropped batches are replayed", async () => {
    const rig = new VirtualRig(engines, trace);
    let blocks = 0;
    for (const checkpoint of [30, 60, 90, 120, Infinity]) {
      if (checkpoint === Infinity) rig.drain();
      else rig.runTo(checkpoint);
      rig.settleDrops(dropped);
      await caughtUp();
      blocks += expectIndexEqualsEngines(await dump(), engines, ids);
    }
    expect(blocks).toBeGreaterThan(10_000);
    expect(engines[2]!.counters.droppedLive).toBeGreaterThan(3);
    const workers = (await getJson(`${serve!.url}/v1/workers`)).workers as Json[];
    for (const view of workers) {
      expect(view.lost_batches).toBe(0);
      expect(view.degraded).toBe(false);
    }
    const metrics = await (await fetch(`${serve!.url}/metrics`)).text();
    const replayed = metrics
      .split("\n")
      .find(
        (line) =>
          line.startsWith("kvedge_ingest_batches_total") &&
          line.includes('worker_id="12"') &&
          line.includes('status="replayed"'),
      );
    expect(Number(replayed?.split(" ").at(-1))).toBeGreaterThanOrEqual(
      engines[2]!.counters.droppedLive,
    );
    expect(engines[2]!.counters.replayRequests).toBeGreaterThan(0);
  });

  test("kvedge apply on the dump matches prompts exactly as deep as each engine caches them", async () => {
    const ops = await dump();
    const paths = engines.map((engine) => new Set(cachedPaths(engine).values()));
    const lines = ops.map((op) => JSON.stringify(op));
    const expected: { worker_id: string; dp_rank: number; blocks: number }[][] = [];
    for (let i = 0; i < trace.count; i += 7) {
      const tokens = requestTokens(trace, i, DEFAULT_VOCAB_SIZE);
      const query = routeQuery(i, tokens, trace.inputLength[i]!, 16);
      lines.push(
        JSON.stringify({
          op: "match",
          token_ids: Array.from(tokens.subarray(0, query.promptLength)),
        }),
      );
      const scores = engines
        .map((_, w) => {
          let depth = 0;
          while (depth < query.promptBlocks) {
            const path =
              (BigInt(query.path[2 * depth]!) << 32n) | BigInt(query.path[2 * depth + 1]!);
            if (!paths[w]!.has(path)) break;
            depth++;
          }
          return { worker_id: ids[w]!, dp_rank: 0, blocks: depth };
        })
        .filter((score) => score.blocks > 0)
        .sort((a, b) => b.blocks - a.blocks || a.worker_id.localeCompare(b.worker_id));
      expected.push(scores);
    }
    expect(expected.some((scores) => scores.length > 0)).toBe(true);
    const result = await runKvedge(["apply", "--block-size", "16", "-"], {
      stdin: `${lines.join("\n")}\n`,
    });
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    const answers = result.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Json);
    expect(answers.map((answer) => answer.scores)).toEqual(expected);
  });
});
