// Goal: the OpenAI proxy routes through admission as POST /v1/route does. With
// route.admission = hold, a completion whose only worker is past the wait bound is held
// (the engine sees nothing) and forwarded when done of the request ahead frees the
// worker; a client that goes away while held is dropped from the queue and never
// reaches the engine; over the most held it is answered 429 with Retry-After. With
// route.admission = reject and no hold allowed, a saturated fleet answers 429 at once.
// Method: the compiled `kvedge serve --proxy` in front of a mock engine serving the
// OpenAI API (src/sim/engine-openai.ts) and publishing real KV events, all on
// loopback; the saturation is a 6,000-token route recorded through /v1/route (400 ms of
// predicted prefill at the default 15,000 tokens/s). No timing assertions: "held" is
// read from /metrics.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadTokenizer, type PromptTokenizer } from "../../src/proxy/tokenizer";
import { type MockEngine, startMockEngines, stopMockEngines } from "../support/mock-fleet";
import { metricValue, postJson, startServe, type ServeProcess } from "../support/serve";
import { QWEN3_DIR } from "../support/tokenizers";
import { until } from "../support/wait";

type Json = Record<string, any>;
const LONG = Array.from({ length: 6000 }, (_, i) => i + 1);
let tokenizer: PromptTokenizer;
let engines: MockEngine[] = [];

beforeAll(async () => {
  tokenizer = loadTokenizer(QWEN3_DIR);
  engines = await startMockEngines(1, { speedup: 20, seed: 7, tokenizer, model: "qwen3" });
});

afterAll(async () => {
  await stopMockEngines(engines);
});

/** A proxied kvedge in front of the mock engine, with these admission flags. */
function proxied(flags: string[]) {
  let serve: ServeProcess;
  const engine = () => engines[0]!;
  // The decision API and lifecycle calls are the control listener's, completions the proxy's.
  const post = (path: string, body: unknown, signal?: AbortSignal) =>
    postJson(
      `${path.startsWith("/v1/completions") ? serve.url : serve.controlUrl}${path}`,
      body,
      signal,
    );
  const complete = (prompt: string, signal?: AbortSignal) =>
    post("/v1/completions", { model: "qwen3", prompt, max_tokens: 2 }, signal);
  const metric = (sample: string) => metricValue(serve.controlUrl, sample);
  const heldIs = (count: number) =>
    until(async () => (await metric("kvedge_admission_held")) === count, `${count} held`);
  const engineRequests = () => engine().server.counters.requests;
  const start = async () => {
    serve = await startServe([
      "--proxy",
      "--tokenizer",
      QWEN3_DIR,
      "--model",
      "qwen3",
      "--workers",
      `1=${engine().networked.endpoint};http=${engine().http}`,
      ...flags,
    ]);
  };
  const stop = () => serve?.stop();
  const activeRequests = async (): Promise<number> => {
    const body = (await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json;
    return (body.workers as Json[]).reduce((sum, w) => sum + w.active_requests, 0);
  };
  return { post, complete, metric, heldIs, engineRequests, activeRequests, start, stop };
}

describe("the proxy with admission hold", () => {
  const kv = proxied([
    "--admission",
    "hold",
    "--admission-bound-ms",
    "200",
    "--admission-max-hold-ms",
    "600000",
    "--admission-max-held",
    "1",
  ]);
  beforeAll(() => kv.start());
  afterAll(() => kv.stop());

  test("a completion is held while the worker is saturated, forwarded when it frees", async () => {
    expect((await kv.post("/v1/route", { request_id: "ahead", token_ids: LONG })).status).toBe(200);
    const before = kv.engineRequests();
    let answered = false;
    const held = kv.complete("Once upon a time, a request waited.").then((response) => {
      answered = true;
      return response;
    });
    await kv.heldIs(1);
    expect(answered).toBe(false);
    expect(kv.engineRequests()).toBe(before);
    expect((await kv.post("/v1/requests/ahead/done", {})).status).toBe(200);
    const response = await held;
    expect(response.status).toBe(200);
    const body = (await response.json()) as Json;
    expect(body.object).toBe("text_completion");
    expect(kv.engineRequests()).toBe(before + 1);
    expect(await kv.metric("kvedge_admission_held")).toBe(0);
    expect(await kv.metric('kvedge_admission_total{outcome="released"}')).toBe(1);
    expect(await kv.metric('kvedge_proxy_requests_total{outcome="completed"}')).toBe(1);
  });

  test("over the most held: 429; a client gone while held reaches no engine", async () => {
    expect((await kv.post("/v1/route", { request_id: "big", token_ids: LONG })).status).toBe(200);
    const before = kv.engineRequests();
    const abort = new AbortController();
    const gone = kv
      .complete("A client that will not wait.", abort.signal)
      .catch((error: Error) => error);
    await kv.heldIs(1);
    const refused = await kv.complete("One too many.");
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(((await refused.json()) as Json).error.message).toContain("held already");
    abort.abort();
    expect(await gone).toBeInstanceOf(Error);
    await kv.heldIs(0);
    expect(await kv.metric('kvedge_admission_total{outcome="dropped"}')).toBe(1);
    expect(await kv.metric('kvedge_proxy_requests_total{outcome="refused"}')).toBe(1);
    expect(await kv.metric('kvedge_proxy_requests_total{outcome="client_abort"}')).toBe(1);
    // Freeing the worker now routes nothing: the dropped call is gone, and the engine saw neither.
    expect((await kv.post("/v1/requests/big/done", {})).status).toBe(200);
    expect(kv.engineRequests()).toBe(before);
    expect(await kv.activeRequests()).toBe(0);
  });
});

describe("the proxy with admission reject", () => {
  const kv = proxied([
    "--admission",
    "reject",
    "--admission-bound-ms",
    "200",
    "--admission-max-hold-ms",
    "0",
  ]);
  beforeAll(() => kv.start());
  afterAll(() => kv.stop());

  test("a saturated fleet answers 429, Retry-After at once; under the bound, served", async () => {
    expect((await kv.post("/v1/route", { request_id: "ahead", token_ids: LONG })).status).toBe(200);
    const before = kv.engineRequests();
    const refused = await kv.complete("No room for this one.");
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(kv.engineRequests()).toBe(before);
    expect((await kv.post("/v1/requests/ahead/done", {})).status).toBe(200);
    const served = await kv.complete("Room now.");
    expect(served.status).toBe(200);
    await served.arrayBuffer();
    expect(kv.engineRequests()).toBe(before + 1);
    expect(await kv.metric('kvedge_admission_total{outcome="rejected"}')).toBe(1);
  });
});
