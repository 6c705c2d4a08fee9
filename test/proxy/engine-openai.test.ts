// Goal: the mock engine's OpenAI-compatible API answers as vLLM does (completions and
// chat, streamed as SSE or not, /v1/models), and its usage.cached_tokens is what its
// real prefix cache served: 0 on a new prompt, every reusable full block on a repeat.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadTokenizer, type PromptTokenizer } from "../../src/proxy/tokenizer";
import { EngineServer } from "../../src/sim/engine-server";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { silentLogger } from "../../src/util/log";
import { sseData } from "../support/sse";
import { QWEN3_DIR } from "../support/tokenizers";

type Json = Record<string, any>;
let tokenizer: PromptTokenizer;
const engines: { networked: NetworkedEngine; server: EngineServer; url: string }[] = [];

async function startEngine(withTokenizer: boolean) {
  const networked = new NetworkedEngine({
    index: 0,
    capacityBlocks: 256,
    blockSize: 16,
    hashSeed: 5n,
    endpoint: "tcp://127.0.0.1:0",
    log: silentLogger,
  });
  await networked.start();
  const server = new EngineServer({
    networked,
    speedup: 100,
    host: "127.0.0.1",
    port: 0,
    vocabSize: 1000,
    log: silentLogger,
    openAi: withTokenizer ? { tokenizer, model: "qwen3" } : {},
  });
  const engine = { networked, server, url: server.start() };
  engines.push(engine);
  return engine;
}

const post = async (url: string, body: unknown): Promise<[number, Json]> => {
  const response = await fetch(url, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
  });
  return [response.status, (await response.json()) as Json];
};

let url = "";
beforeAll(async () => {
  tokenizer = loadTokenizer(QWEN3_DIR);
  url = (await startEngine(true)).url;
});

afterAll(async () => {
  for (const engine of engines) {
    await engine.server.stop();
    await engine.networked.close();
  }
});

const messages = [
  { role: "system", content: "You are a careful assistant who answers in one paragraph." },
  {
    role: "user",
    content:
      "Explain what a prefix cache does in an inference engine, and why a router should care about it at all.",
  },
];

describe("mock engine OpenAI API", () => {
  test("/v1/models lists the served model", async () => {
    const body = (await (await fetch(`${url}/v1/models`)).json()) as Json;
    expect(body.object).toBe("list");
    expect(body.data.map((m: Json) => m.id)).toEqual(["qwen3"]);
  });

  test("chat: a repeated conversation is served from the cache, and usage says how much", async () => {
    const prompt = await tokenizer.encode(
      tokenizer.renderChat(messages, { addGenerationPrompt: true }),
      false,
    );
    const [status, first] = await post(`${url}/v1/chat/completions`, {
      model: "qwen3",
      messages,
      max_tokens: 4,
    });
    expect(status).toBe(200);
    expect(first.object).toBe("chat.completion");
    expect(first.choices[0].message.role).toBe("assistant");
    expect(first.choices[0].message.content.split(" t").length - 1).toBe(4);
    expect(first.choices[0].finish_reason).toBe("length");
    expect(first.usage).toEqual({
      prompt_tokens: prompt.length,
      completion_tokens: 4,
      total_tokens: prompt.length + 4,
      prompt_tokens_details: { cached_tokens: 0 },
    });
    const [, second] = await post(`${url}/v1/chat/completions`, {
      messages,
      max_completion_tokens: 2,
    });
    // vLLM computes the last prompt token again: full blocks of the first prompt.length - 1 tokens.
    expect(second.usage.prompt_tokens_details.cached_tokens).toBe(
      Math.floor((prompt.length - 1) / 16) * 16,
    );
    expect(second.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
  });

  test("chat streaming: role chunk, one chunk per token, a usage chunk when asked, then [DONE]", async () => {
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: "stream me" }],
        max_tokens: 3,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    expect(response.headers.get("content-type")).toBe("text/event-stream");
    const data = await sseData(response);
    expect(data.at(-1)).toBe("[DONE]");
    const chunks = data.slice(0, -1).map((line) => JSON.parse(line) as Json);
    expect(chunks.every((chunk) => chunk.object === "chat.completion.chunk")).toBe(true);
    expect(chunks[0]!.choices[0].delta).toEqual({ role: "assistant", content: "" });
    expect(chunks.slice(1, 4).map((chunk) => chunk.choices[0].finish_reason)).toEqual([
      null,
      null,
      "length",
    ]);
    expect(chunks[4]!.choices).toEqual([]);
    expect(chunks[4]!.usage.completion_tokens).toBe(3);
    expect(chunks).toHaveLength(5);
  });

  test("completions: text and token-id prompts share the cache; streams end with [DONE]", async () => {
    const text = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    const ids = Array.from(await tokenizer.encode(text, true));
    const [, first] = await post(`${url}/v1/completions`, { prompt: text, max_tokens: 2 });
    expect(first.object).toBe("text_completion");
    expect(first.usage.prompt_tokens).toBe(ids.length);
    const [, second] = await post(`${url}/v1/completions`, { prompt: [ids], max_tokens: 2 });
    expect(second.usage.prompt_tokens_details.cached_tokens).toBe(
      Math.floor((ids.length - 1) / 16) * 16,
    );
    const streamed = await sseData(
      await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: ids, max_tokens: 2, stream: true }),
      }),
    );
    expect(streamed).toHaveLength(3);
    expect(JSON.parse(streamed[1]!).choices[0].finish_reason).toBe("length");
    expect(streamed[2]).toBe("[DONE]");
  });

  test("bad requests get clear errors", async () => {
    const cases: [string, Json, number, string][] = [
      ["/v1/chat/completions", { model: "other", messages }, 404, "does not exist"],
      ["/v1/chat/completions", { messages: [] }, 400, "messages must be a non-empty array"],
      [
        "/v1/chat/completions",
        { messages: [{ role: "user", content: [{ type: "image_url" }] }] },
        400,
        "only text parts",
      ],
      ["/v1/completions", { prompt: ["a", "b"] }, 400, "one prompt per request"],
      ["/v1/completions", { prompt: [1, -2] }, 400, "prompt[1]"],
      ["/v1/completions", { prompt: "x", max_tokens: 0 }, 400, "max_tokens"],
      ["/v1/completions", { prompt: "x", stream: "yes" }, 400, "stream must be a boolean"],
      ["/v1/completions", { prompt: [1, 2, 3], max_tokens: 100_000 }, 413, "KV blocks"],
    ];
    for (const [path, body, status, message] of cases) {
      const [got, answer] = await post(`${url}${path}`, body);
      expect([path, got]).toEqual([path, status]);
      expect(answer.error.message).toContain(message);
    }
  });

  test("without a tokenizer, token-id prompts work and text prompts say why they cannot", async () => {
    const bare = (await startEngine(false)).url;
    const [status, answer] = await post(`${bare}/v1/completions`, { prompt: "hello" });
    expect(status).toBe(400);
    expect(answer.error.message).toContain("no tokenizer");
    const [ok, done] = await post(`${bare}/v1/completions`, {
      model: "mock",
      prompt: [1, 2, 3],
      max_tokens: 1,
    });
    expect(ok).toBe(200);
    expect(done.usage.prompt_tokens).toBe(3);
  });
});
