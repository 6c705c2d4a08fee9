// Goal: `kvedge mock-engine` as a subprocess: it prints its addresses, answers its HTTP
// API (generate, streaming, prefix reuse, bad input, reset), and publishes vLLM KV
// events (map form here) that our ingest path turns into an index matching what the
// engine reported; its replay ROUTER serves every batch; SIGTERM stops it cleanly.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Subprocess } from "bun";
import { createIndex, MatchResult } from "../../src/index";
import { EngineSource } from "../../src/ingest/source";
import { promptHashes } from "../../src/route";
import { DEFAULT_SEED } from "../../src/hash";
import { silentLogger } from "../../src/util/log";
import { DealerSocket } from "../../src/wire/zmtp";
import { spawnMockEngine } from "../support/kvedge";
import { until } from "../support/wait";

type Json = Record<string, any>;
let proc: Subprocess<"ignore", "pipe", "pipe">;
let info: Json;
let source: EngineSource;
const index = createIndex("crtc", 16);
const PROMPT = Array.from({ length: 100 }, (_, i) => 1000 + i);

const post = async (path: string, body: unknown): Promise<[number, Json]> => {
  const response = await fetch(`${info.http}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
  });
  return [response.status, (await response.json()) as Json];
};
const stats = async (): Promise<Json> =>
  (await fetch(`${info.http}/v1/stats`)).json() as Promise<Json>;

function matchBlocks(tokens: number[]): number {
  const prompt = promptHashes(Uint32Array.from(tokens), 16, DEFAULT_SEED);
  const result = new MatchResult(4);
  index.findMatches(prompt.local, prompt.blockCount, result);
  return result.count === 0 ? 0 : result.blocks[0]!;
}

beforeAll(async () => {
  ({ proc, info } = await spawnMockEngine([
    "--endpoint",
    "tcp://127.0.0.1:0",
    "--replay-endpoint",
    "tcp://127.0.0.1:0",
    "--capacity-blocks",
    "64",
    "--speedup",
    "50",
    "--map-form",
    "--hash-seed",
    "7",
  ]));
  source = new EngineSource(
    {
      workerId: 1n,
      dpRank: 0,
      endpoint: info.endpoint,
      replayEndpoint: info.replay_endpoint,
      topic: "",
    },
    { blockSize: 16, sink: index, log: silentLogger },
  );
  await source.start();
  await until(
    async () => (await stats()).publisher.subscribers === 1,
    "the engine to see our subscription",
  );
});

afterAll(async () => {
  await source?.stop();
  if (proc.exitCode === null) proc.kill("SIGKILL");
});

describe("kvedge mock-engine", () => {
  test("prints where it listens", () => {
    expect(info.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(info.replay_endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(info.http).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(info.capacity_blocks).toBe(64);
  });

  test("generate answers with modeled times; a repeated prompt reuses its cached blocks; events reach the index", async () => {
    const [status, first] = await post("/v1/generate", {
      request_id: "a",
      token_ids: PROMPT,
      max_tokens: 5,
    });
    expect(status).toBe(200);
    expect(first).toMatchObject({
      request_id: "a",
      prompt_tokens: 100,
      cached_tokens: 0,
      output_tokens: 5,
    });
    expect(first.ttft_ms).toBeGreaterThan(0);
    expect(first.e2e_ms).toBeGreaterThan(first.ttft_ms);
    const [, second] = await post("/v1/generate", { token_ids: PROMPT, max_tokens: 1 });
    expect(second.cached_tokens).toBe(96); // ⌊99 / 16⌋ blocks: the last prompt token is always computed
    expect(second.ttft_ms).toBeLessThan(first.ttft_ms);
    await until(
      () => source.sequencer.lastSeq >= 0 && matchBlocks(PROMPT) === 6,
      "the prompt's 6 blocks in the index",
    );
    const s = await stats();
    await until(() => source.sequencer.lastSeq === s.publisher.last_seq, "every batch to arrive");
    expect(index.stats().blocks).toBe(s.cache.cached_blocks);
    expect(s.requests).toEqual({ requests: 2, completed: 2, rejected: 0 });
  });

  test("stream: a first_token line, then done", async () => {
    const response = await fetch(`${info.http}/v1/generate`, {
      method: "POST",
      body: JSON.stringify({ request_id: "s", token_ids: [5, 6, 7], max_tokens: 3, stream: true }),
      headers: { "content-type": "application/json" },
    });
    expect(response.headers.get("content-type")).toContain("application/x-ndjson");
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Json);
    expect(lines.map((line) => line.event)).toEqual(["first_token", "done"]);
    expect(lines[1]).toMatchObject({ request_id: "s", prompt_tokens: 3, output_tokens: 3 });
    expect(lines[0]!.ttft_ms).toBe(lines[1]!.ttft_ms);
  });

  test("bad requests get clear errors", async () => {
    expect((await post("/v1/generate", { token_ids: PROMPT }))[1].error.message).toContain(
      "max_tokens",
    );
    expect((await post("/v1/generate", { token_ids: [1, -2], max_tokens: 1 }))[0]).toBe(400);
    const [status, body] = await post("/v1/generate", {
      token_ids: Array.from({ length: 2000 }, (_, i) => i),
      max_tokens: 1,
    });
    expect(status).toBe(413);
    expect(body.error.message).toContain("64");
    expect((await fetch(`${info.http}/nope`)).status).toBe(404);
  });

  test("the replay ROUTER serves every batch since start, then seq −1", async () => {
    const last = (await stats()).publisher.last_seq as number;
    const dealer = new DealerSocket();
    const seqs: bigint[] = [];
    dealer.onMessage = (frames) => {
      seqs.push(new DataView(frames[2]!.buffer, frames[2]!.byteOffset, 8).getBigUint64(0));
    };
    dealer.connect(info.replay_endpoint);
    dealer.send([new Uint8Array(0), new Uint8Array(8)]);
    try {
      await until(() => seqs.at(-1) === 0xffff_ffff_ffff_ffffn, "the end of the replay");
    } finally {
      await dealer.close();
    }
    expect(seqs.length).toBe(last + 2);
    expect(seqs.slice(0, -1)).toEqual(Array.from({ length: last + 1 }, (_, i) => BigInt(i)));
  });

  test("reset clears the cache and the index hears AllBlocksCleared", async () => {
    const [status, body] = await post("/v1/reset", {});
    expect(status).toBe(200);
    expect(body.status).toBe("cleared");
    await until(() => source.normalizer.counters.events.cleared === 1, "AllBlocksCleared");
    expect(index.stats().blocks).toBe(0);
    expect((await stats()).cache.cached_blocks).toBe(0);
  });

  test("SIGTERM stops it with exit code 0", async () => {
    proc.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
  });
});
