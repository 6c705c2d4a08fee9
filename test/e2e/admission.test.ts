// Goal: the compiled `kvedge serve` with route.admission = hold holds a route while its
// one worker's predicted wait is past the bound and answers it when `done` of the
// request ahead frees the worker (over HTTP and over /v1/ws); a client that goes away
// while held is dropped from the queue; over the most held, a route gets 429 with
// Retry-After; a call with the id of a held one gets 409 at once. Real server, real
// sockets on loopback; no timing assertions: "held" is read from /metrics.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { TestEngine } from "../support/engine";
import { metricValue, postJson, type ServeProcess, startServe } from "../support/serve";
import { eventually, until } from "../support/wait";

type Json = Record<string, any>;
// 6,000 prompt tokens at the default 15,000 tokens/s: 400 ms of queued prefill, past the 200 ms bound.
const LONG = Array.from({ length: 6000 }, (_, i) => i + 1);
const SHORT = [9, 8, 7, 6];

describe("serve with admission hold", () => {
  let engine: TestEngine;
  let serve: ServeProcess;

  const post = (path: string, body: unknown, signal?: AbortSignal) =>
    postJson(`${serve.url}${path}`, body, signal);
  const metric = (sample: string) => metricValue(serve.url, sample);
  const heldIs = (count: number) =>
    until(async () => (await metric("kvedge_admission_held")) === count, `${count} held`);

  beforeAll(async () => {
    engine = await new TestEngine().start();
    serve = await startServe([
      "--block-size",
      "4",
      "--workers",
      `1=${engine.endpoint}`,
      "--admission",
      "hold",
      "--admission-bound-ms",
      "200",
      "--admission-max-hold-ms",
      "600000",
      "--admission-max-held",
      "1",
    ]);
  });
  afterAll(async () => {
    await serve?.stop();
    await engine?.stop();
  });

  test("a held HTTP route is answered after done of the request ahead", async () => {
    const first = await post("/v1/route", { request_id: "ahead", token_ids: LONG });
    expect(first.status).toBe(200);
    let answered = false;
    const held = post("/v1/route", { request_id: "held", token_ids: SHORT }).then((response) => {
      answered = true;
      return response;
    });
    await heldIs(1);
    expect(answered).toBe(false);
    // A second call with the held call's id is refused at once, not at the release.
    const twin = await post("/v1/route", { request_id: "held", token_ids: SHORT });
    expect(twin.status).toBe(409);
    expect(((await twin.json()) as Json).error.message).toContain("already held");
    expect(await metric("kvedge_admission_held")).toBe(1);
    expect((await post("/v1/requests/ahead/done", {})).status).toBe(200);
    const response = await held;
    expect(response.status).toBe(200);
    const body = (await response.json()) as Json;
    expect(body).toMatchObject({ request_id: "held", worker_id: "1" });
    expect(await metric("kvedge_admission_held")).toBe(0);
    expect(await metric('kvedge_admission_total{outcome="released"}')).toBe(1);
    expect((await post("/v1/requests/held/done", {})).status).toBe(200);
  });

  test("over the most held, a route is answered 429 with Retry-After; a client gone while held is dropped", async () => {
    expect((await post("/v1/route", { request_id: "big", token_ids: LONG })).status).toBe(200);
    const abort = new AbortController();
    const gone = post("/v1/route", { request_id: "gone", token_ids: SHORT }, abort.signal).catch(
      (error: Error) => error,
    );
    await heldIs(1);
    const refused = await post("/v1/route", { request_id: "refused", token_ids: SHORT });
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(((await refused.json()) as Json).error.message).toContain("held already");
    abort.abort();
    expect(await gone).toBeInstanceOf(Error);
    await heldIs(0);
    expect(await metric('kvedge_admission_total{outcome="dropped"}')).toBe(1);
    expect((await post("/v1/requests/big/done", {})).status).toBe(200);
    // The dropped call was never routed: its id is unknown.
    expect((await post("/v1/requests/gone/done", {})).status).toBe(404);
  });

  test("a held /v1/ws route is answered in a frame of its own when a worker frees", async () => {
    expect((await post("/v1/route", { request_id: "ws-ahead", token_ids: LONG })).status).toBe(200);
    const ws = new WebSocket(`${serve.url.replace("http", "ws")}/v1/ws`);
    const frames: Json[] = [];
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = reject;
    });
    ws.onmessage = (event) => frames.push(JSON.parse(String(event.data)));
    ws.send(JSON.stringify({ id: 7, op: "route", request_id: "ws-held", token_ids: SHORT }));
    await heldIs(1);
    expect(frames).toEqual([]);
    expect((await post("/v1/requests/ws-ahead/done", {})).status).toBe(200);
    const frame = await eventually(() => frames[0], 10_000, "the held answer");
    expect(frame).toMatchObject({
      id: 7,
      status: 200,
      result: { request_id: "ws-held", worker_id: "1" },
    });
    ws.send(JSON.stringify({ id: 8, op: "done", request_id: "ws-held" }));
    await eventually(() => frames[1], 10_000, "the done answer");
    expect(frames[1]).toMatchObject({ id: 8, status: 200 });
    ws.close();
  });

  test("closing a /v1/ws connection drops its held routes", async () => {
    expect((await post("/v1/route", { request_id: "ws-big", token_ids: LONG })).status).toBe(200);
    const ws = new WebSocket(`${serve.url.replace("http", "ws")}/v1/ws`);
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = reject;
    });
    const dropped = await metric('kvedge_admission_total{outcome="dropped"}');
    ws.send(JSON.stringify({ id: 1, op: "route", request_id: "ws-gone", token_ids: SHORT }));
    await heldIs(1);
    ws.close();
    await heldIs(0);
    expect(await metric('kvedge_admission_total{outcome="dropped"}')).toBe(dropped + 1);
    expect((await post("/v1/requests/ws-big/done", {})).status).toBe(200);
    expect((await post("/v1/requests/ws-gone/done", {})).status).toBe(404);
  });
});
