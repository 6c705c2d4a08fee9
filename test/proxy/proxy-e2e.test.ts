// Goal: `kvedge serve --proxy` (the compiled binary) in front of mock engines that
// publish real KV events and serve the OpenAI API. A real HTTP client streams chat
// completions through it: the answer arrives as the engine sent it, follow-up turns of
// a conversation land on the worker that holds it, observed hits match predicted, and
// active requests return to 0 after completions, client disconnects and engine
// failures. A tokenizer that does not load stops the start with one line.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadTokenizer, type PromptTokenizer } from "../../src/proxy/tokenizer";
import { until } from "../support/wait";
import { kvedgeBinary, productEnv } from "../support/kvedge";
import { type MockEngine, startMockEngines, stopMockEngines } from "../support/mock-fleet";
import { startServe, type ServeProcess } from "../support/serve";
import { sseData } from "../support/sse";
import { QWEN3_DIR } from "../support/tokenizers";

type Json = Record<string, any>;
const WORKERS = 3;
let engines: MockEngine[] = [];
let serve: ServeProcess;
let tokenizer: PromptTokenizer;

beforeAll(async () => {
  tokenizer = loadTokenizer(QWEN3_DIR);
  engines = await startMockEngines(WORKERS, { speedup: 20, seed: 100, tokenizer, model: "qwen3" });
  const workers = engines.map(
    (engine, i) => `${i + 1}=${engine.networked.endpoint};http=${engine.http}`,
  );
  serve = await startServe([
    "--proxy",
    "--tokenizer",
    QWEN3_DIR,
    "--model",
    "qwen3",
    "--workers",
    workers.join(","),
    "--observed-window",
    "4",
  ]);
  // Connected is not yet subscribed: events published before the subscription arrives are lost.
  await until(
    () => engines.every((engine) => engine.networked.subscribers > 0),
    "kvedge to subscribe to every engine",
  );
});

afterAll(async () => {
  await serve?.stop();
  await stopMockEngines(engines);
});

const workersOf = async (): Promise<Json[]> =>
  ((await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json).workers as Json[];
const activeRequests = async (): Promise<number> =>
  (await workersOf()).reduce((sum, w) => sum + w.active_requests, 0);

const chat = (messages: Json[], extra: Json = {}) =>
  fetch(`${serve.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "qwen3", messages, max_tokens: 8, stream: true, ...extra }),
  });

/** Waits until the index holds the conversation's prompt, as the engine cached it. */
async function indexed(messages: Json[]): Promise<void> {
  const tokens = await tokenizer.encode(
    tokenizer.renderChat(messages, { addGenerationPrompt: true }),
    false,
  );
  const need = Math.floor((tokens.length - 1) / 16);
  await until(async () => {
    const response = await fetch(`${serve.controlUrl}/v1/match`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token_ids: Array.from(tokens) }),
    });
    const scores = ((await response.json()) as Json).scores as Json[];
    return scores.length > 0 && scores[0]!.blocks >= need;
  }, "the engine's KV events to reach the index");
}

function conversation(topic: number): Json[] {
  return [
    {
      role: "system",
      content: `You are assistant number ${topic}. You answer questions about topic ${topic} in detail, citing sources.`,
    },
    {
      role: "user",
      content:
        `Tell me everything about subject ${topic}: its history, its present state, and where it is going next. `.repeat(
          3,
        ),
    },
  ];
}

describe("kvedge serve --proxy", () => {
  test("/v1/models names the served model", async () => {
    const body = (await (await fetch(`${serve.url}/v1/models`)).json()) as Json;
    expect(body.data.map((m: Json) => m.id)).toEqual(["qwen3"]);
  });

  test("streamed chat arrives as the engine sent it; follow-up turns land on the worker holding the conversation", async () => {
    // First turns all at once: each routed one is load on its worker, so they spread.
    const first = await Promise.all(
      Array.from({ length: 6 }, async (_, topic) => {
        const response = await chat(conversation(topic));
        return { response, data: await sseData(response) };
      }),
    );
    const holders = new Map<number, string>();
    for (const [topic, { response, data }] of first.entries()) {
      expect(response.status).toBe(200);
      expect(response.headers.get("content-type")).toBe("text/event-stream");
      // Usage was asked for on the client's behalf and not passed on: the stream it asked for.
      expect(data.at(-1)).toBe("[DONE]");
      const chunks = data.slice(0, -1).map((line) => JSON.parse(line) as Json);
      expect(chunks).toHaveLength(1 + 8);
      expect(
        chunks.every(
          (chunk) => chunk.object === "chat.completion.chunk" && chunk.usage === undefined,
        ),
      ).toBe(true);
      holders.set(topic, response.headers.get("x-kvedge-worker-id")!);
      await indexed(conversation(topic));
    }
    expect(new Set(holders.values()).size).toBe(WORKERS);
    for (let topic = 0; topic < 6; topic++) {
      const messages = [
        ...conversation(topic),
        { role: "assistant", content: "An answer." },
        { role: "user", content: "Go on." },
      ];
      const response = await chat(messages, { stream_options: { include_usage: true } });
      const data = await sseData(response);
      const usage = JSON.parse(data.at(-2)!) as Json;
      expect(usage.choices).toEqual([]);
      expect(usage.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
      expect(response.headers.get("x-kvedge-worker-id")).toBe(holders.get(topic)!);
    }
    expect(await activeRequests()).toBe(0);
  });

  test("observed hits per worker match the predicted ones; nobody is flagged", async () => {
    const workers = await workersOf();
    const answers = workers.reduce((sum, w) => sum + w.observed_hits.answers, 0);
    expect(answers).toBe(12);
    for (const worker of workers) {
      expect(worker.observed_hits.suspect).toBe(false);
      expect(worker.observed_hits.observed_cached_tokens).toBeGreaterThanOrEqual(
        worker.observed_hits.predicted_cached_tokens,
      );
    }
    const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
    expect(metrics).toMatch(
      /kvedge_observed_cached_tokens_total\{worker_id="\d",dp_rank="0"\} [1-9]/,
    );
    expect(metrics).toContain('kvedge_proxy_requests_total{outcome="completed"} 12');
  });

  test("non-streamed completions pass through with usage; the load is released", async () => {
    const response = await fetch(`${serve.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: "Once upon a time, in a land far away, there lived a router.",
        max_tokens: 3,
      }),
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as Json;
    expect(body.object).toBe("text_completion");
    expect(body.usage.completion_tokens).toBe(3);
    expect(await activeRequests()).toBe(0);
  });

  test("a client that goes away mid-stream releases the request's load", async () => {
    const controller = new AbortController();
    const response = await fetch(`${serve.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      signal: controller.signal,
      body: JSON.stringify({ messages: conversation(99), max_tokens: 3000, stream: true }),
    });
    const reader = response.body!.getReader();
    await reader.read(); // the first token
    expect(await activeRequests()).toBe(1);
    controller.abort();
    await until(
      async () => (await activeRequests()) === 0,
      "the aborted request's load to be released",
    );
    const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
    expect(metrics).toContain('kvedge_proxy_requests_total{outcome="client_abort"} 1');
  });

  test("bad requests are refused before routing, with the error the engine would give", async () => {
    const cases: [Json, number, string][] = [
      [{ model: "other", messages: [{ role: "user", content: "x" }] }, 404, "does not exist"],
      [{ messages: "x" }, 400, "messages must be a non-empty array"],
      [{ messages: [{ role: "user", content: "x" }], max_tokens: -1 }, 400, "max_tokens"],
    ];
    for (const [body, status, message] of cases) {
      const response = await fetch(`${serve.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      expect(response.status).toBe(status);
      expect(((await response.json()) as Json).error.message).toContain(message);
    }
    expect(await activeRequests()).toBe(0);
  });

  test("an engine that dies mid-answer ends the client's stream and releases the load; then it is skipped for the next candidate", async () => {
    const messages = conversation(0);
    const response = await chat([...messages, { role: "user", content: "more" }], {
      max_tokens: 3000,
    });
    const worker = Number(response.headers.get("x-kvedge-worker-id"));
    const reader = response.body!.getReader();
    await reader.read();
    await engines[worker - 1]!.server.stop(); // closes its connections
    let failed = false;
    try {
      for (;;) if ((await reader.read()).done) break;
    } catch {
      failed = true;
    }
    expect(failed).toBe(true);
    await until(
      async () => (await activeRequests()) === 0,
      "the broken request's load to be released",
    );
    // Its KV publisher lives on, so the index still sends this conversation to it: the
    // connection is refused and the next candidate answers.
    const retry = await chat(messages);
    expect(retry.status).toBe(200);
    expect(Number(retry.headers.get("x-kvedge-worker-id"))).not.toBe(worker);
    expect((await sseData(retry)).at(-1)).toBe("[DONE]");
    expect(await activeRequests()).toBe(0);
    const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
    expect(metrics).toMatch(/kvedge_proxy_failovers_total [1-9]/);
    expect(metrics).toContain('kvedge_proxy_requests_total{outcome="engine_error"} 1');
  });
});

describe("kvedge serve --proxy start-up", () => {
  test("a tokenizer that does not load stops the start with one line", async () => {
    const proc = Bun.spawn(
      [kvedgeBinary(), "serve", "--proxy", "--tokenizer", "/nonexistent/model", "--port", "0"],
      {
        stdout: "pipe",
        stderr: "pipe",
        env: productEnv(),
      },
    );
    expect(await proc.exited).toBe(2);
    const stderr = await new Response(proc.stderr).text();
    expect(stderr).toBe(
      "kvedge serve: proxy.tokenizer: /nonexistent/model/tokenizer.json does not exist\n",
    );
  });
});
