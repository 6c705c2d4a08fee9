// Goal: what `kvedge serve --proxy` sends the engine. A chat request's body goes out
// byte for byte as the client sent it; a streamed one without usage gets
// stream_options.include_usage added (and the usage chunk is kept from the client);
// with --forward-token-ids a completions prompt goes out as the token ids kvedge
// computed. Behind it: a recording engine front on loopback.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { loadTokenizer } from "../../src/proxy/tokenizer";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { silentLogger } from "../../src/util/log";
import { until } from "../support/wait";
import { startServe, type ServeProcess } from "../support/serve";
import { sseData } from "../support/sse";
import { QWEN3_DIR } from "../support/tokenizers";

type Json = Record<string, any>;
const received: { path: string; body: string; headers: Headers }[] = [];
let publisher: NetworkedEngine;
let engine: Server<undefined>;
let serve: ServeProcess;

const usage = {
  prompt_tokens: 5,
  completion_tokens: 1,
  total_tokens: 6,
  prompt_tokens_details: { cached_tokens: 0 },
};

beforeAll(async () => {
  publisher = await new NetworkedEngine({
    index: 0,
    capacityBlocks: 64,
    hashSeed: 1n,
    endpoint: "tcp://127.0.0.1:0",
    log: silentLogger,
  }).start();
  engine = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(request) {
      const body = await request.text();
      received.push({ path: new URL(request.url).pathname, body, headers: request.headers });
      const parsed = JSON.parse(body) as Json;
      if (parsed.stream !== true)
        return Response.json({
          id: "x",
          object: "text_completion",
          choices: [{ index: 0, text: "hi" }],
          usage,
        });
      const events = [{ id: "x", choices: [{ index: 0, delta: { content: "hi" } }] }];
      if (parsed.stream_options?.include_usage === true)
        events.push({ id: "x", choices: [], usage } as never);
      const text = `${events.map((event) => `data: ${JSON.stringify(event)}\n\n`).join("")}data: [DONE]\n\n`;
      return new Response(text, { headers: { "content-type": "text/event-stream" } });
    },
  });
  serve = await startServe([
    "--proxy",
    "--tokenizer",
    QWEN3_DIR,
    "--forward-token-ids",
    "--workers",
    `1=${publisher.endpoint};http=http://127.0.0.1:${engine.port}`,
  ]);
  await until(async () => publisher.subscribers === 1, "kvedge to subscribe");
});

afterAll(async () => {
  await serve?.stop();
  await engine?.stop(true);
  await publisher?.close();
});

const post = (path: string, body: string) =>
  fetch(`${serve.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });

test("a chat body is forwarded byte for byte", async () => {
  const body =
    '{"messages":[{"role":"user","content":"Héllo \\u00e9 there"}],  "max_tokens": 3, "temperature": 0.25, "extra_field": {"kept": true}}';
  const response = await post("/v1/chat/completions", body);
  expect(response.status).toBe(200);
  await response.arrayBuffer();
  expect(received.at(-1)!.path).toBe("/v1/chat/completions");
  expect(received.at(-1)!.body).toBe(body);
});

test("a stream that did not ask for usage: usage is asked for, and its chunk is not passed on", async () => {
  const response = await post(
    "/v1/chat/completions",
    JSON.stringify({ messages: [{ role: "user", content: "x" }], stream: true }),
  );
  const data = await sseData(response);
  expect(data).toEqual([
    JSON.stringify({ id: "x", choices: [{ index: 0, delta: { content: "hi" } }] }),
    "[DONE]",
  ]);
  expect(JSON.parse(received.at(-1)!.body).stream_options).toEqual({ include_usage: true });
  const workers = ((await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json)
    .workers as Json[];
  expect(workers[0]!.observed_hits.answers).toBeGreaterThanOrEqual(1);
  expect(workers[0]!.active_requests).toBe(0);
});

test("--forward-token-ids: a completions prompt goes out as kvedge's token ids", async () => {
  const text = "The engine must not tokenize this differently. 日本語も。";
  const response = await post("/v1/completions", JSON.stringify({ prompt: text, max_tokens: 1 }));
  expect(response.status).toBe(200);
  await response.arrayBuffer();
  const ids = Array.from(await loadTokenizer(QWEN3_DIR).encode(text, true));
  expect(JSON.parse(received.at(-1)!.body)).toEqual({ prompt: ids, max_tokens: 1 });
});
