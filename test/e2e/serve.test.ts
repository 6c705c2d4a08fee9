// Goal: the compiled `kvedge serve`, as a subprocess on loopback, fed by real ZMTP
// publishers speaking vLLM's KV-event protocol: matches and routes follow the events;
// load is accounted through the request lifecycle; gaps are replayed; an engine
// restart clears its blocks; removing a worker purges it; admin auth, bad input and
// shutdown behave as documented.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { hashTokens } from "../../src/hash";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { kvedgeBinary, runKvedge } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually, until } from "../support/wait";

const BS = 4;
const TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

type Json = Record<string, any>;
const post = async (
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<[number, Json]> => {
  const response = await fetch(url, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json", ...headers },
  });
  return [response.status, (await response.json()) as Json];
};
const get = async (url: string): Promise<[number, Json]> => {
  const response = await fetch(url);
  return [response.status, (await response.json()) as Json];
};
const workerOf = async (serve: ServeProcess, id: string): Promise<Json | undefined> =>
  (await get(`${serve.url}/v1/workers`))[1].workers.find((w: Json) => w.worker_id === id);
const scores = async (serve: ServeProcess, tokens = TOKENS) =>
  (await post(`${serve.url}/v1/match`, { token_ids: tokens }))[1].scores;

describe("serve with two engines", () => {
  let a: TestEngine;
  let b: TestEngine;
  let serve: ServeProcess;

  beforeAll(async () => {
    a = await new TestEngine({ replay: true }).start();
    b = await new TestEngine({ form: "map" }).start();
    serve = await startServe([
      "--block-size",
      String(BS),
      "--workers",
      `1=${a.endpoint};replay=${a.replayEndpoint},2=${b.endpoint}`,
    ]);
    await Promise.all([a.waitForSubscriber(), b.waitForSubscriber()]);
    await eventually(
      async () => ((await get(`${serve.url}/readyz`))[0] === 200 ? true : undefined),
      10_000,
      "readyz",
    );
  });

  afterAll(async () => {
    await serve.stop();
    await Promise.all([a.stop(), b.stop()]);
  });

  test("stored events make the worker match, with the local hashes kvedge computes", async () => {
    a.publish([stored([101n, 102n], TOKENS.slice(0, 8), BS)]);
    b.publish([stored([9001n], TOKENS.slice(0, 4), BS)]);
    const result = await eventually(
      async () => {
        const s = await scores(serve);
        return s.length === 2 ? s : undefined;
      },
      10_000,
      "both engines' blocks",
    );
    expect(result).toEqual([
      { worker_id: "1", dp_rank: 0, blocks: 2 },
      { worker_id: "2", dp_rank: 0, blocks: 1 },
    ]);
    const local = hashTokens(TOKENS, BS).local.map(String);
    const [status, byHash] = await post(`${serve.url}/v1/match`, {
      local_hashes: local.slice(0, 2),
    });
    expect(status).toBe(200);
    expect(byHash).toEqual({ block_size: BS, query_blocks: 2, scores: result });
  });

  test("route picks the worker holding the prefix, then tracks its load through the lifecycle", async () => {
    const [status, decision] = await post(`${serve.url}/v1/route`, {
      token_ids: TOKENS,
      request_id: "req-1",
    });
    expect(status).toBe(200);
    expect(decision).toMatchObject({
      request_id: "req-1",
      worker_id: "1",
      dp_rank: 0,
      overlap_blocks: 2,
      query_blocks: 3,
    });
    expect(decision.candidates.map((c: Json) => c.worker_id).sort()).toEqual(["1", "2"]);
    let worker = await workerOf(serve, "1");
    expect(worker).toMatchObject({
      active_requests: 1,
      routed_total: 1,
      blocks: 2,
      state: "connected",
      degraded: false,
    });
    expect(worker!.active_prefill_tokens).toBe(TOKENS.length - 2 * BS);

    expect(
      (await post(`${serve.url}/v1/route`, { token_ids: TOKENS, request_id: "req-1" }))[0],
    ).toBe(409);
    expect(await post(`${serve.url}/v1/requests/req-1/prefill_done`, {})).toEqual([
      200,
      { request_id: "req-1", status: "ok" },
    ]);
    worker = await workerOf(serve, "1");
    expect(worker!.active_prefill_tokens).toBe(0);
    expect(worker!.active_requests).toBe(1);
    expect(await post(`${serve.url}/v1/requests/req-1/done`, {})).toEqual([
      200,
      { request_id: "req-1", status: "ok" },
    ]);
    expect((await workerOf(serve, "1"))!.active_requests).toBe(0);
    // Idempotent: a second done is fine; an id never seen is 404.
    expect((await post(`${serve.url}/v1/requests/req-1/done`, {}))[0]).toBe(200);
    expect((await post(`${serve.url}/v1/requests/nope/done`, {}))[0]).toBe(404);
  });

  test("a request without an id gets one; misses spread over both workers", async () => {
    const chosen = new Set<string>();
    for (let i = 0; i < 40 && chosen.size < 2; i++) {
      const [status, decision] = await post(`${serve.url}/v1/route`, {
        token_ids: [7000 + i, 1, 2, 3, 4],
      });
      expect(status).toBe(200);
      expect(decision.request_id.length).toBeGreaterThan(0);
      chosen.add(decision.worker_id);
    }
    expect([...chosen].sort()).toEqual(["1", "2"]);
  });

  test("removed events take blocks away", async () => {
    b.publish([removed([9001n])]);
    await eventually(
      async () => ((await scores(serve)).length === 1 ? true : undefined),
      10_000,
      "removal",
    );
    expect(await scores(serve)).toEqual([{ worker_id: "1", dp_rank: 0, blocks: 2 }]);
  });

  test("a lost batch is replayed from the engine's ROUTER; nothing is lost or degraded", async () => {
    a.publish([stored([103n], TOKENS.slice(8, 12), BS, 102n)], true);
    a.publish([stored([201n], [50, 51, 52, 53], BS)]);
    await eventually(
      async () => ((await scores(serve))[0]?.blocks === 3 ? true : undefined),
      10_000,
      "replayed block",
    );
    const worker = await workerOf(serve, "1");
    expect(worker).toMatchObject({ degraded: false, lost_batches: 0, last_seq: 2, blocks: 4 });
  });

  test("a lost batch without a replay endpoint degrades the worker until a clear", async () => {
    b.publish([stored([9100n], [60, 61, 62, 63], BS)], true);
    b.publish([stored([9101n], [70, 71, 72, 73], BS)]);
    const worker = await eventually(
      async () => {
        const w = await workerOf(serve, "2");
        return w?.degraded ? w : undefined;
      },
      10_000,
      "degraded worker 2",
    );
    expect(worker).toMatchObject({ lost_batches: 1 });
    b.publish([cleared]);
    await eventually(
      async () => ((await workerOf(serve, "2"))?.degraded === false ? true : undefined),
      10_000,
      "exact again",
    );
    expect((await workerOf(serve, "2"))!.blocks).toBe(0);
  });

  test("an engine restart (sequence back to 0) clears its blocks", async () => {
    a.publish([stored([299n], [90, 91, 92, 93], BS)]);
    await eventually(
      async () => ((await scores(serve, [90, 91, 92, 93])).length === 1 ? true : undefined),
      10_000,
      "a block",
    );
    await a.restart();
    await a.waitForSubscriber();
    a.publish([stored([301n], [80, 81, 82, 83], BS)]);
    await eventually(
      async () => ((await scores(serve, [80, 81, 82, 83])).length === 1 ? true : undefined),
      10_000,
      "new block",
    );
    expect(await scores(serve)).toEqual([]);
    expect(await scores(serve, [90, 91, 92, 93])).toEqual([]);
    expect((await workerOf(serve, "1"))!.blocks).toBe(1);
    const line = serve.logs.find((l) => l.msg === "restart");
    // The connect probe found an empty ring, or (if the new batch was quicker) a ring that is not ours.
    expect(line).toMatchObject({ worker_id: "1" });
    expect([
      "the engine's replay ring is empty",
      "the replay ring differs from what was applied",
    ]).toContain(String(line!.reason));
  });

  test("dump emits apply-format events that `kvedge apply` rebuilds into the same matches", async () => {
    const dump = await (await fetch(`${serve.url}/v1/dump`)).text();
    const match = JSON.stringify({ op: "match", token_ids: [80, 81, 82, 83] });
    const result = await runKvedge(["apply", "--block-size", String(BS), "-"], {
      stdin: `${dump}${match}\n`,
    });
    expect(result.code).toBe(0);
    const lines = result.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.at(-1).scores).toEqual([{ worker_id: "1", dp_rank: 0, blocks: 1 }]);
  });

  test("metrics expose index, ingest and routing series", async () => {
    const text = await (await fetch(`${serve.url}/metrics`)).text();
    for (const series of [
      'kvedge_index_events_total{type="stored",status="ok"}',
      'kvedge_ingest_replays_total{worker_id="1",dp_rank="0",result="completed"} 3',
      'kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="probe"} 2',
      'kvedge_ingest_resets_total{worker_id="1",dp_rank="0"} 1',
      'kvedge_ingest_lost_batches_total{worker_id="2",dp_rank="0"} 1',
      'kvedge_routed_requests_total{worker_id="1",dp_rank="0"}',
      "kvedge_http_request_duration_seconds_bucket",
      "kvedge_route_decision_duration_seconds_count",
    ])
      expect(text).toContain(series);
  });

  test("DELETE /v1/workers/{id} stops the subscription and purges the worker", async () => {
    const response = await fetch(`${serve.url}/v1/workers/1`, { method: "DELETE" });
    expect(response.status).toBe(200);
    expect(
      (await post(`${serve.url}/v1/match`, { token_ids: [80, 81, 82, 83] }))[1].scores,
    ).toEqual([]);
    expect(await workerOf(serve, "1")).toBeUndefined();
    expect(await (await fetch(`${serve.url}/v1/dump`)).text()).not.toContain('"worker_id":"1"');
    // Its engine's further events go nowhere: kvedge unsubscribed, nobody receives them.
    await until(() => a.pub.subscribedPeers === 0, "kvedge to unsubscribe from the engine");
    const unroutable = a.pub.counters.unroutable;
    a.publish([stored([401n], [90, 91, 92, 93], BS)]);
    expect(a.pub.counters.unroutable).toBe(unroutable + 1);
    expect(
      (await post(`${serve.url}/v1/match`, { token_ids: [90, 91, 92, 93] }))[1].scores,
    ).toEqual([]);
    expect((await fetch(`${serve.url}/v1/workers/1`, { method: "DELETE" })).status).toBe(404);
  });

  test("POST /v1/workers adds an engine at run time; a duplicate is 409", async () => {
    const c = await new TestEngine().start();
    try {
      const [status, body] = await post(`${serve.url}/v1/workers`, {
        worker_id: "3",
        endpoint: c.endpoint,
      });
      expect(status).toBe(201);
      expect(body).toMatchObject({ worker_id: "3", dp_rank: 0 });
      expect(
        (await post(`${serve.url}/v1/workers`, { worker_id: "3", endpoint: c.endpoint }))[0],
      ).toBe(409);
      await c.waitForSubscriber();
      c.publish([stored([1n], [5, 5, 5, 5], BS)]);
      await eventually(
        async () =>
          (await post(`${serve.url}/v1/match`, { token_ids: [5, 5, 5, 5] }))[1].scores.length === 1
            ? true
            : undefined,
        10_000,
        "new engine's block",
      );
    } finally {
      await c.stop();
    }
  });
});

describe("bad input", () => {
  let serve: ServeProcess;
  beforeAll(async () => {
    serve = await startServe(["--block-size", String(BS), "--body-limit-bytes", "4096"]);
  });
  afterAll(async () => {
    await serve.stop();
  });

  const body = (value: unknown) => JSON.stringify(value);
  test.each([
    ["malformed JSON", "POST", "/v1/route", "{", 400, "malformed JSON"],
    ["negative token", "POST", "/v1/route", body({ token_ids: [1, -2] }), 400, "token_ids[1]"],
    [
      "token over 2^32",
      "POST",
      "/v1/route",
      body({ token_ids: [4294967296] }),
      400,
      "token_ids[0]",
    ],
    ["no workers", "POST", "/v1/route", body({ token_ids: [1, 2, 3, 4] }), 503, "no worker"],
    [
      "hash over 2^64",
      "POST",
      "/v1/match",
      body({ local_hashes: ["18446744073709551616"] }),
      400,
      "local_hashes[0]",
    ],
    [
      "wrong type",
      "POST",
      "/v1/match",
      body({ token_ids: "x" }),
      400,
      "token_ids must be an array",
    ],
    [
      "body over the limit",
      "POST",
      "/v1/match",
      body({ token_ids: Array(3000).fill(1) }),
      413,
      "over the limit",
    ],
    ["unknown route", "GET", "/v1/nothing", undefined, 404, "no such endpoint"],
    ["wrong method", "GET", "/v1/route", undefined, 405, "GET is not allowed"],
    ["bad worker id", "DELETE", "/v1/workers/abc", undefined, 400, "worker id must be"],
    ["unknown worker", "DELETE", "/v1/workers/77", undefined, 404, "unknown worker"],
    [
      "bad endpoint",
      "POST",
      "/v1/workers",
      body({ worker_id: "5", endpoint: "http://x:1" }),
      400,
      "endpoint has scheme",
    ],
    [
      "unknown field",
      "POST",
      "/v1/workers",
      body({ worker_id: "5", endpoint: "tcp://127.0.0.1:1", bogus: 1 }),
      400,
      "unknown field bogus",
    ],
  ])("%s → %s %s %#", async (_label, method, path, requestBody, status, message) => {
    const response = await fetch(`${serve.url}${path}`, {
      method,
      body: requestBody,
      headers: { "content-type": "application/json" },
    });
    expect(response.status).toBe(status);
    expect(((await response.json()) as Json).error.message).toContain(message);
  });

  test("bad input leaves the core working and is counted", async () => {
    expect((await get(`${serve.url}/healthz`))[0]).toBe(200);
    const text = await (await fetch(`${serve.url}/metrics`)).text();
    expect(text).toMatch(
      /kvedge_http_request_duration_seconds_count\{route="\/v1\/route",status="400"\} [1-9]/,
    );
  });
});

describe("admin auth", () => {
  let serve: ServeProcess;
  beforeAll(async () => {
    serve = await startServe(["--block-size", String(BS)], { KVEDGE_ADMIN_TOKEN: "s3cret" });
  });
  afterAll(async () => {
    await serve.stop();
  });

  test("mutating worker endpoints need the bearer token; reads do not", async () => {
    const body = { worker_id: "8", endpoint: "tcp://127.0.0.1:9" };
    expect((await post(`${serve.url}/v1/workers`, body))[0]).toBe(401);
    expect(
      (await post(`${serve.url}/v1/workers`, body, { authorization: "Bearer wrong!" }))[0],
    ).toBe(401);
    expect(
      (await post(`${serve.url}/v1/workers`, body, { authorization: "Bearer s3cret" }))[0],
    ).toBe(201);
    expect((await fetch(`${serve.url}/v1/workers/8`, { method: "DELETE" })).status).toBe(401);
    expect(
      (
        await fetch(`${serve.url}/v1/workers/8`, {
          method: "DELETE",
          headers: { authorization: "Bearer s3cret" },
        })
      ).status,
    ).toBe(200);
    expect((await get(`${serve.url}/v1/workers`))[0]).toBe(200);
  });
});

describe("the active-request limit", () => {
  test("past it, the least recently touched request stops counting and is reported evicted", async () => {
    const engine = await new TestEngine().start();
    const serve = await startServe([
      "--block-size",
      String(BS),
      "--workers",
      `1=${engine.endpoint}`,
      "--max-active-requests",
      "2",
    ]);
    try {
      await engine.waitForSubscriber();
      for (const id of ["r1", "r2", "r3"])
        expect(
          (await post(`${serve.url}/v1/route`, { token_ids: TOKENS, request_id: id }))[0],
        ).toBe(200);
      expect((await workerOf(serve, "1"))!.active_requests).toBe(2);
      expect(await post(`${serve.url}/v1/requests/r1/done`, {})).toEqual([
        200,
        { request_id: "r1", status: "evicted" },
      ]);
      expect(await post(`${serve.url}/v1/requests/r3/done`, {})).toEqual([
        200,
        { request_id: "r3", status: "ok" },
      ]);
      const metrics = await (await fetch(`${serve.url}/metrics`)).text();
      expect(metrics).toContain('kvedge_request_lifecycle_total{event="evicted"} 1');
    } finally {
      await serve.stop();
      await engine.stop();
    }
  });
});

describe("lifecycle of the process", () => {
  const running: ServeProcess[] = [];
  afterEach(async () => {
    for (const serve of running.splice(0)) serve.kill("SIGKILL");
  });

  test.each(["SIGTERM", "SIGINT"] as const)("%s stops it cleanly with exit 0", async (signal) => {
    const engine = await new TestEngine().start();
    const serve = await startServe([
      "--block-size",
      String(BS),
      "--workers",
      `1=${engine.endpoint}`,
    ]);
    running.push(serve);
    await engine.waitForSubscriber();
    expect(await serve.stop(signal)).toBe(0);
    expect(serve.logs.map((l) => l.msg)).toContain("stopped");
    await engine.stop();
  });

  // The handlers are in before the port opens: a signal as soon as the line shows is a
  // clean stop, not the default death by signal (exit 143). Sent from the stderr reader
  // itself, in the same turn the line arrives, to give the child as little time as can be.
  test.each([
    ["SIGTERM", []],
    ["SIGINT", []],
    ["SIGTERM", ["--index-threads", "1", "--route-threads", "1"]],
  ] as const)("%s sent on the `listening` line %j exits 0", async (signal, extra) => {
    const args = ["serve", "--port", "0", "--log-format", "json", "--warmup-routes", "0", ...extra];
    const child = Bun.spawn([kvedgeBinary(), ...args], {
      stdin: "ignore",
      stdout: "ignore",
      stderr: "pipe",
      env: { PATH: process.env.PATH ?? "" },
    });
    let text = "";
    let sent = false;
    try {
      for await (const chunk of child.stderr) {
        text += new TextDecoder().decode(chunk);
        if (!sent && text.includes('"msg":"listening"')) {
          child.kill(signal);
          sent = true;
        }
      }
      expect(sent).toBe(true);
      expect(await child.exited).toBe(0);
      expect(text).toContain('"msg":"stopped"');
    } finally {
      child.kill("SIGKILL");
    }
  });

  test("an invalid setting refuses to start, naming the key", async () => {
    const result = await runKvedge(["serve", "--port", "99999"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("port");
    const file = await runKvedge(["serve", "--config", "/nonexistent/kvedge.toml"]);
    expect(file.code).toBe(2);
    expect(file.stderr).toContain("/nonexistent/kvedge.toml");
  });
});

describe("a kvedge that starts after its engine", () => {
  test("recovers what the engine published before it subscribed, through replay from 0", async () => {
    const engine = await new TestEngine({ replay: true }).start();
    // Published before any subscriber exists: lost on the wire, kept in the replay ring.
    engine.publish([stored([1n, 2n], TOKENS.slice(0, 8), BS)]);
    engine.publish([stored([3n], TOKENS.slice(8, 12), BS, 2n)]);
    engine.publish([removed([3n])]);
    const serve = await startServe([
      "--block-size",
      String(BS),
      "--workers",
      `1=${engine.endpoint};replay=${engine.replayEndpoint}`,
    ]);
    try {
      await engine.waitForSubscriber();
      engine.publish([stored([4n], [9, 9, 9, 9], BS)]); // seq 3: a gap from 0
      const worker = await eventually(
        async () => {
          const w = await workerOf(serve, "1");
          return w?.last_seq === 3 ? w : undefined;
        },
        10_000,
        "replayed history",
      );
      expect(worker).toMatchObject({ blocks: 3, degraded: false, lost_batches: 0 });
      expect(await scores(serve)).toEqual([{ worker_id: "1", dp_rank: 0, blocks: 2 }]);
    } finally {
      await serve.stop();
      await engine.stop();
    }
  });
});
