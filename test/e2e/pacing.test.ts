// Goal: the compiled `kvedge serve` with route.pacing = on answers a route at once while
// its worker has fewer than two sent requests still prefilling, and otherwise answers
// it, with the worker chosen on arrival, when prefill_done of one ahead frees a place:
// over HTTP on one thread and behind two route lanes, and over /v1/ws; a client gone
// while waiting has its request ended (its id unknown afterwards). Through the OpenAI
// proxy, a completion that waits reaches the engine only when the one ahead has its
// first token. Real server, real sockets on loopback; no timing assertions: "waiting"
// is read from /metrics.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadTokenizer } from "../../src/proxy/tokenizer";
import { TestEngine } from "../support/engine";
import { type MockEngine, startMockEngines, stopMockEngines } from "../support/mock-fleet";
import { metricValue, postJson, type ServeProcess, startServe } from "../support/serve";
import { QWEN3_DIR } from "../support/tokenizers";
import { eventually, until } from "../support/wait";

type Json = Record<string, any>;
/** Two places per worker, and no longest hold a test could reach. */
const PACING = ["--pacing", "on", "--pacing-per-worker", "2", "--pacing-max-hold-ms", "600000"];
let prompts = 0;
/** A prompt nothing else shares: it takes a place of its own. */
const prompt = () => Array.from({ length: 64 }, (_, i) => ++prompts * 1000 + i);

for (const lanes of [0, 2]) {
  describe(`serve with pacing on, ${lanes} route lanes`, () => {
    let engine: TestEngine;
    let serve: ServeProcess;
    const post = (path: string, body: unknown, signal?: AbortSignal) =>
      postJson(`${serve.url}${path}`, body, signal);
    const metric = (sample: string) => metricValue(serve.url, sample);
    const waitingIs = (count: number) =>
      until(async () => (await metric("kvedge_pacing_held")) === count, `${count} waiting`);
    const route = (id: string, signal?: AbortSignal) =>
      post("/v1/route", { request_id: id, token_ids: prompt() }, signal);

    beforeAll(async () => {
      engine = await new TestEngine().start();
      serve = await startServe([
        "--block-size",
        "4",
        "--workers",
        `1=${engine.endpoint}`,
        ...PACING,
        "--route-threads",
        String(lanes),
      ]);
    });
    afterAll(async () => {
      await serve?.stop();
      await engine?.stop();
    });

    test("the third route waits until prefill_done of one ahead", async () => {
      for (const id of ["a", "b"]) expect((await route(id)).status).toBe(200);
      let answered = false;
      const third = route("c").then((response) => {
        answered = true;
        return response;
      });
      await waitingIs(1);
      expect(answered).toBe(false);
      // Decided on arrival: it is the worker's load already, so its id is taken.
      const twin = await route("c");
      expect(twin.status).toBe(409);
      expect((await post("/v1/requests/a/prefill_done", {})).status).toBe(200);
      const response = await third;
      expect(response.status).toBe(200);
      expect((await response.json()) as Json).toMatchObject({ request_id: "c", worker_id: "1" });
      expect(await metric("kvedge_pacing_held")).toBe(0);
      expect(await metric('kvedge_pacing_total{outcome="released"}')).toBe(1);
      const status = (await (await fetch(`${serve.url}/v1/status`)).json()) as Json;
      expect(status.pacing).toMatchObject({ enabled: true, held_now: 0 });
      expect(status.pacing.counts).toMatchObject({ immediate: 2, paced: 1, released: 1 });
      for (const id of ["a", "b", "c"])
        expect((await post(`/v1/requests/${id}/done`, {})).status).toBe(200);
    });

    test("a client gone while waiting: its request ends", async () => {
      for (const id of ["d", "e"]) expect((await route(id)).status).toBe(200);
      const abort = new AbortController();
      const gone = route("gone", abort.signal).catch((error: Error) => error);
      await waitingIs(1);
      abort.abort();
      expect(await gone).toBeInstanceOf(Error);
      await waitingIs(0);
      expect(await metric('kvedge_pacing_total{outcome="dropped"}')).toBe(1);
      // Ended, not just forgotten: the worker's load counts d and e only.
      const workers = (await (await fetch(`${serve.url}/v1/workers`)).json()) as Json;
      expect(workers.workers[0].active_requests).toBe(2);
      for (const id of ["d", "e"])
        expect((await post(`/v1/requests/${id}/done`, {})).status).toBe(200);
    });

    test("a /v1/ws route that waits is answered in a frame of its own", async () => {
      for (const id of ["f", "g"]) expect((await route(id)).status).toBe(200);
      const ws = new WebSocket(`${serve.url.replace("http", "ws")}/v1/ws`);
      const frames: Json[] = [];
      await new Promise((resolve, reject) => {
        ws.onopen = resolve;
        ws.onerror = reject;
      });
      ws.onmessage = (event) => frames.push(JSON.parse(String(event.data)));
      ws.send(JSON.stringify({ id: 7, op: "route", request_id: "ws", token_ids: prompt() }));
      await waitingIs(1);
      expect(frames).toEqual([]);
      expect((await post("/v1/requests/f/done", {})).status).toBe(200);
      const frame = await eventually(() => frames[0], 10_000, "the answer");
      expect(frame).toMatchObject({ id: 7, status: 200, result: { request_id: "ws" } });
      ws.close();
      for (const id of ["g", "ws"])
        expect((await post(`/v1/requests/${id}/done`, {})).status).toBe(200);
    });
  });
}

describe("the proxy with pacing on", () => {
  let engines: MockEngine[] = [];
  let serve: ServeProcess;
  beforeAll(async () => {
    const tokenizer = loadTokenizer(QWEN3_DIR);
    engines = await startMockEngines(1, { speedup: 20, seed: 7, tokenizer, model: "qwen3" });
    const engine = engines[0]!;
    serve = await startServe([
      "--proxy",
      "--tokenizer",
      QWEN3_DIR,
      "--model",
      "qwen3",
      "--workers",
      `1=${engine.networked.endpoint};http=${engine.http}`,
      ...PACING,
    ]);
  });
  afterAll(async () => {
    await serve?.stop();
    await stopMockEngines(engines);
  });

  test("a completion waits for a place and reaches the engine when one frees", async () => {
    const control = (path: string, body: unknown) => postJson(`${serve.controlUrl}${path}`, body);
    // Two routes through the decision API take the worker's places (not sent anywhere).
    for (const id of ["x", "y"])
      expect((await control("/v1/route", { request_id: id, token_ids: prompt() })).status).toBe(
        200,
      );
    const before = engines[0]!.server.counters.requests;
    const completion = postJson(`${serve.url}/v1/completions`, {
      model: "qwen3",
      prompt: "A request that waits.",
      max_tokens: 2,
    });
    await until(
      async () => (await metricValue(serve.controlUrl, "kvedge_pacing_held")) === 1,
      "1 waiting",
    );
    expect(engines[0]!.server.counters.requests).toBe(before);
    expect((await control("/v1/requests/x/prefill_done", {})).status).toBe(200);
    const response = await completion;
    expect(response.status).toBe(200);
    expect(((await response.json()) as Json).object).toBe("text_completion");
    expect(engines[0]!.server.counters.requests).toBe(before + 1);
    for (const id of ["x", "y"])
      expect((await control(`/v1/requests/${id}/done`, {})).status).toBe(200);
  });
});
