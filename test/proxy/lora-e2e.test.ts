// Goal: through `kvedge serve --proxy`, a LoRA adapter is the request's `model`, and
// its request is routed on the blocks the engines computed under that adapter, never
// on base-model blocks (nor the other way round). Engine 1 holds a prompt under the
// adapter (it names it by `lora_id` only, read as the configured name), engine 2 holds
// the same prompt for the base model. A model that is neither is refused; /v1/models
// lists the adapter. Method: the compiled binary; engines are real ZMTP publishers
// (vLLM V3 layout: `lora_id`, no name) and recording HTTP fronts on loopback.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { stored, TestEngine } from "../support/engine";
import { type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

type Json = Record<string, any>;
const BS = 16;
const PROMPT = Array.from({ length: 4 * BS + 3 }, (_, i) => 1000 + i);
let engines: TestEngine[] = [];
let fronts: Server<undefined>[] = [];
let serve: ServeProcess;

beforeAll(async () => {
  engines = await Promise.all([1, 2].map(() => new TestEngine({ variant: "vllm-v3" }).start()));
  fronts = [1, 2].map((worker) =>
    Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch: () =>
        Response.json({ id: `w${worker}`, object: "text_completion", choices: [{ text: "ok" }] }),
    }),
  );
  const workers = engines.map(
    (engine, i) => `${i + 1}=${engine.endpoint};http=http://127.0.0.1:${fronts[i]!.port}`,
  );
  serve = await startServe([
    "--proxy",
    "--model",
    "base",
    "--lora-adapters",
    "sql-lora=7",
    "--block-size",
    String(BS),
    "--workers",
    workers.join(","),
  ]);
  await Promise.all(engines.map((engine) => engine.waitForSubscriber()));
  const hashes = (base: bigint) => [0n, 1n, 2n, 3n].map((i) => base + i);
  const tokens = PROMPT.slice(0, 4 * BS);
  engines[0]!.publish([stored(hashes(100n), tokens, BS, null, { loraId: 7, medium: "GPU" })]);
  engines[1]!.publish([stored(hashes(200n), tokens, BS, null, { loraId: null, medium: "GPU" })]);
  const held = async (extra: Json) => {
    const response = await fetch(`${serve.controlUrl}/v1/match`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token_ids: PROMPT, ...extra }),
    });
    return ((await response.json()) as Json).scores as Json[];
  };
  await until(
    async () => (await held({ lora_id: 7 }))[0]?.blocks === 4 && (await held({}))[0]?.blocks === 4,
    "both engines' blocks indexed",
  );
});

afterAll(async () => {
  await serve?.stop();
  for (const front of fronts) front.stop(true);
  await Promise.all(engines.map((engine) => engine.stop()));
});

const complete = (model: string) =>
  fetch(`${serve.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: PROMPT, max_tokens: 1 }),
  });

test("the adapter's request goes to the engine holding the adapter's blocks; the base model's to the other", async () => {
  for (let round = 0; round < 3; round++) {
    const adapter = await complete("sql-lora");
    expect(adapter.status).toBe(200);
    expect(adapter.headers.get("x-kvedge-worker-id")).toBe("1");
    await adapter.arrayBuffer();
    const base = await complete("base");
    expect(base.status).toBe(200);
    expect(base.headers.get("x-kvedge-worker-id")).toBe("2");
    await base.arrayBuffer();
  }
});

test("a model that is neither the served one nor an adapter is refused; /v1/models lists the adapter", async () => {
  const other = await complete("other-lora");
  expect(other.status).toBe(404);
  expect(await other.text()).toContain("does not exist");
  const models = (await (await fetch(`${serve.url}/v1/models`)).json()) as Json;
  expect(models.data.map((m: Json) => [m.id, m.parent ?? null])).toEqual([
    ["base", null],
    ["sql-lora", "base"],
  ]);
});
