// Goal: the compiled `kvedge serve` with a worker that publishes no KV events: it is
// approximate in /v1/workers, the metrics and every answer; a routed request's blocks
// become its predicted blocks at prefill_done (HTTP body and WebSocket field
// `cached_tokens` accepted and checked); a shortfall shrinks its capacity; it becomes
// exact when an endpoint is posted (its predictions gone, degraded and predicted anew
// until its first batch, then its events rebuilding it, its load kept) and approximate
// again when posted without one, with no restart.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { stored, TestEngine } from "../support/engine";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

const BS = 4;
const TOKENS = Array.from({ length: 41 }, (_, i) => 100 + i); // 10 full blocks

type Json = Record<string, any>;
const post = async (url: string, body?: unknown): Promise<[number, Json]> => {
  const response = await fetch(url, {
    method: "POST",
    ...(body === undefined
      ? {}
      : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
  });
  return [response.status, (await response.json()) as Json];
};
const get = async (url: string): Promise<Json> => (await fetch(url)).json() as Promise<Json>;

describe("serve with an approximate worker", () => {
  let serve: ServeProcess;
  let engine: TestEngine;
  const worker = async (id: string): Promise<Json> =>
    (await get(`${serve.url}/v1/workers`)).workers.find((w: Json) => w.worker_id === id);

  beforeAll(async () => {
    engine = await new TestEngine().start();
    serve = await startServe([
      "--block-size",
      String(BS),
      "--workers",
      "7=none;capacity=400",
      "--predicted-capacity-blocks",
      "1000",
    ]);
  });

  afterAll(async () => {
    await serve.stop();
    await engine.stop();
  });

  test("its mode, capacity and predicted blocks are shown", async () => {
    const w = await worker("7");
    expect([w.mode, w.endpoint, w.predicted_blocks, w.predicted_capacity_blocks]).toEqual([
      "approximate",
      null,
      0,
      400,
    ]);
    expect((await get(`${serve.url}/readyz`)).ready).toBe(true);
  });

  test("route -> prefill_done predicts the prompt's blocks; answers say they are approximate", async () => {
    const [status, routed] = await post(`${serve.url}/v1/route`, {
      token_ids: TOKENS,
      request_id: "a",
    });
    expect([status, routed.worker_id, routed.candidates[0].overlap_kind]).toEqual([
      200,
      "7",
      "approximate",
    ]);
    expect((await worker("7")).predicted_blocks).toBe(0); // predict_at = prefill_done
    expect((await post(`${serve.url}/v1/requests/a/prefill_done`))[0]).toBe(200);
    expect((await worker("7")).predicted_blocks).toBe(10);
    const match = await post(`${serve.url}/v1/match`, { token_ids: TOKENS });
    expect(match[1].scores).toEqual([
      { worker_id: "7", dp_rank: 0, blocks: 10, kind: "approximate" },
    ]);
    const [, again] = await post(`${serve.url}/v1/route`, { token_ids: TOKENS, request_id: "b" });
    expect([again.overlap_blocks, again.candidates[0].overlap_kind]).toEqual([10, "approximate"]);
  });

  test("prefill_done's cached_tokens (HTTP body, WebSocket field) corrects; a bad one is 400", async () => {
    const [bad, error] = await post(`${serve.url}/v1/requests/b/prefill_done`, {
      cached_tokens: -1,
    });
    expect([bad, error.error.code]).toEqual([400, "bad_request"]);
    // b was predicted 10 blocks (capped at the 10 reusable), the engine served none.
    const [ok] = await post(`${serve.url}/v1/requests/b/prefill_done`, { cached_tokens: 0 });
    expect(ok).toBe(200);
    expect((await worker("7")).predicted_capacity_blocks).toBe(360);
    const ws = new WebSocket(`${serve.url.replace("http", "ws")}/v1/ws`);
    await new Promise((resolve) => ws.addEventListener("open", resolve, { once: true }));
    const answers: Json[] = [];
    ws.addEventListener("message", (event) => answers.push(JSON.parse(String(event.data))));
    ws.send(JSON.stringify({ op: "route", id: 1, token_ids: TOKENS, request_id: "c" }));
    ws.send(JSON.stringify({ op: "prefill_done", id: 2, request_id: "c", cached_tokens: 40 }));
    await eventually(async () => (answers.length === 2 ? true : undefined), 5_000, "ws answers");
    ws.close();
    expect(answers.map((a) => a.status)).toEqual([200, 200]);
    const metrics = await (await fetch(`${serve.url}/metrics`)).text();
    expect(metrics).toContain('kvedge_worker_approximate{worker_id="7",dp_rank="0"} 1');
    expect(metrics).toContain('kvedge_prediction_answers_total{outcome="shortfall"} 1');
    expect(metrics).toContain('kvedge_prediction_answers_total{outcome="confirmed"} 1');
  });

  test("an endpoint makes it exact without a restart: predictions gone, events rebuild it, load kept", async () => {
    const before = await worker("7");
    const [status, added] = await post(`${serve.url}/v1/workers`, {
      worker_id: "7",
      endpoint: engine.endpoint,
    });
    expect([status, added.status, added.mode]).toEqual([201, "switched", "exact"]);
    await engine.waitForSubscriber();
    const exact = await worker("7");
    // Its state is unknown until its first batch (no replay endpoint): degraded, and
    // routed on predictions from its switch on (route.degraded_fallback), none yet.
    expect([exact.mode, exact.blocks, exact.degraded, exact.predicted_blocks]).toEqual([
      "exact",
      0,
      true,
      0,
    ]);
    expect(exact.active_requests).toBe(before.active_requests);
    engine.publish([stored([11n, 12n], TOKENS.slice(0, 8), BS)]);
    await eventually(
      async () => ((await worker("7")).blocks === 2 ? true : undefined),
      5_000,
      "events",
    );
    const known = await worker("7");
    expect([known.degraded, known.predicted_blocks]).toEqual([false, null]);
    const match = await post(`${serve.url}/v1/match`, { token_ids: TOKENS });
    expect(match[1].scores).toEqual([{ worker_id: "7", dp_rank: 0, blocks: 2, kind: "exact" }]);
    // Posting it again with an endpoint: it exists in that mode.
    expect(
      (await post(`${serve.url}/v1/workers`, { worker_id: "7", endpoint: engine.endpoint }))[0],
    ).toBe(409);
  });

  test("posted without an endpoint it is approximate again; its exact blocks are gone", async () => {
    const [status, added] = await post(`${serve.url}/v1/workers`, { worker_id: "7" });
    expect([status, added.status, added.mode]).toEqual([201, "switched", "approximate"]);
    const w = await worker("7");
    // No capacity given this time: the fleet default.
    expect([w.mode, w.blocks, w.predicted_blocks, w.predicted_capacity_blocks]).toEqual([
      "approximate",
      0,
      0,
      1000,
    ]);
    expect(
      await (
        await fetch(`${serve.url}/v1/match`, {
          method: "POST",
          body: JSON.stringify({ token_ids: TOKENS }),
          headers: { "content-type": "application/json" },
        })
      ).json(),
    ).toMatchObject({ scores: [] });
  });
});
