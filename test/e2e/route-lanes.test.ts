// Goal: the compiled `kvedge serve --route-threads 2` (route lanes on Worker threads
// sharing the public port) answers exactly what the single-threaded serve answers, fed
// the same engine events: matches, a sequence of routes (load included), lifecycle
// calls; every other endpoint and /v1/ws work through a lane; bad requests get the same
// errors; the lanes' routes show in /metrics; SIGTERM stops it cleanly. Real binary,
// real Workers, real sockets on loopback.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { unpack } from "msgpackr";
import { stored, TestEngine } from "../support/engine";
import { rawStatus } from "../support/net";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

const BS = 4;
type Json = Record<string, any>;

async function call(
  serve: ServeProcess,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<[number, Json]> {
  const response = await fetch(
    `${serve.url}${path}`,
    body === undefined
      ? {}
      : {
          method: "POST",
          body: typeof body === "string" ? body : JSON.stringify(body),
          headers: { "content-type": "application/json", ...headers },
        },
  );
  return [response.status, (await response.json()) as Json];
}

const prompt = (first: number, length: number) => Array.from({ length }, (_, i) => first + i);

describe("serve with route lanes against serve without", () => {
  let a: TestEngine;
  let b: TestEngine;
  let single: ServeProcess;
  let lanes: ServeProcess;

  beforeAll(async () => {
    a = await new TestEngine().start();
    b = await new TestEngine().start();
    const args = ["--block-size", String(BS), "--workers", `1=${a.endpoint},2=${b.endpoint}`];
    [single, lanes] = await Promise.all([
      startServe([...args, "--route-threads", "0"]),
      startServe([...args, "--route-threads", "2"]),
    ]);
    const subscribed = () => a.pub.subscribedPeers >= 2 && b.pub.subscribedPeers >= 2;
    await eventually(() => (subscribed() ? true : undefined), 10_000, "both servers subscribed");
    a.publish([stored([1n, 2n, 3n, 4n], prompt(1, 16), BS)]);
    b.publish([stored([7n, 8n], prompt(1, 8), BS), stored([9n], prompt(101, 4), BS)]);
    for (const serve of [single, lanes]) {
      await eventually(
        async () => {
          const [, body] = await call(serve, "/v1/match", { token_ids: prompt(1, 16) });
          return body.scores?.length === 2 ? true : undefined;
        },
        10_000,
        "both engines' blocks",
      );
    }
  });

  afterAll(async () => {
    await Promise.all([single?.stop(), lanes?.stop()]);
    await Promise.all([a?.stop(), b?.stop()]);
  });

  test("the lanes started, and say so", () => {
    const threads = lanes.logs.find((line) => line.msg === "threads");
    expect(threads).toMatchObject({ route_threads: 2, index_threads: 0 });
    expect(lanes.logs.find((line) => line.msg === "listening")).toMatchObject({ route_lanes: 2 });
    expect(single.logs.find((line) => line.msg === "listening")).toMatchObject({ route_lanes: 0 });
  });

  test("matches and a sequence of routes with lifecycle calls answer the same", async () => {
    const steps: [string, unknown][] = [];
    for (let i = 0; i < 24; i++) {
      const tokens = [prompt(1, 16), prompt(101, 8 + i), prompt(1, 8 + i)][i % 3]!;
      steps.push(["/v1/match", { token_ids: tokens }]);
      steps.push(["/v1/route", { token_ids: tokens, request_id: `r${i}`, candidates: 2 }]);
      if (i % 4 === 1) steps.push([`/v1/requests/r${i - 1}/prefill_done`, {}]);
      if (i % 4 === 3) steps.push([`/v1/requests/r${i - 2}/done`, {}]);
    }
    steps.push(["/v1/requests/nonesuch/done", {}]);
    steps.push(["/v1/route", { token_ids: prompt(1, 8), request_id: "r3" }]);
    for (const [path, body] of steps) {
      const [want, got] = await Promise.all([call(single, path, body), call(lanes, path, body)]);
      expect({ path, answer: got }).toEqual({ path, answer: want });
    }
  });

  test("a MessagePack answer through a lane is the single serve's", async () => {
    const packed = async (serve: ServeProcess) => {
      const response = await fetch(`${serve.url}/v1/route`, {
        method: "POST",
        body: JSON.stringify({ token_ids: prompt(1, 16), request_id: "mp" }),
        headers: { "content-type": "application/json", accept: "application/msgpack" },
      });
      expect(response.headers.get("content-type")).toBe("application/msgpack");
      return unpack(new Uint8Array(await response.arrayBuffer()));
    };
    const [want, got] = await Promise.all([packed(single), packed(lanes)]);
    expect(got).toEqual(want);
    expect(got.request_id).toBe("mp");
  });

  test("bad requests get the same errors from a lane", async () => {
    const cases: [string, string, Record<string, string>][] = [
      ["/v1/route", "{not json", {}],
      ["/v1/route", JSON.stringify({ token_ids: "x" }), {}],
      ["/v1/route", JSON.stringify({ token_ids: [1] }), { "content-type": "text/plain" }],
      ["/v1/route", JSON.stringify({ token_ids: [1] }), { origin: "http://evil.example" }],
      ["/v1/nonesuch", "{}", {}],
    ];
    for (const [path, body, headers] of cases) {
      const [want, got] = await Promise.all([
        call(single, path, body, headers),
        call(lanes, path, body, headers),
      ]);
      expect(want[0]).toBeGreaterThanOrEqual(400);
      expect({ path, headers, got }).toEqual({ path, headers, got: want });
    }
  });

  test("a malformed Host header gets 400 from a lane as from one thread", async () => {
    for (const serve of [single, lanes]) {
      const port = Number(new URL(serve.url).port);
      for (const host of ["[", "127.0.0.1:1:2", "a b"]) {
        for (const line of ["GET /healthz", "POST /v1/route", "GET /v1/workers"])
          expect(`${host} ${line}: ${await rawStatus(port, host, line)}`).toBe(
            `${host} ${line}: HTTP/1.1 400 Bad Request`,
          );
      }
    }
  });

  test("other endpoints go through the lanes to the main thread", async () => {
    const [status, workers] = await call(lanes, "/v1/workers");
    expect(status).toBe(200);
    expect(workers.workers.map((w: Json) => [w.worker_id, w.blocks])).toEqual([
      ["1", 4],
      ["2", 3],
    ]);
    // The lanes' routes are counted in the main thread's metrics, as the single serve's are.
    const routed = async (serve: ServeProcess): Promise<number> => {
      const text = await (await fetch(`${serve.url}/metrics`)).text();
      const count = "kvedge_http_request_duration_seconds_count{";
      const line = text
        .split("\n")
        .find(
          (l) =>
            l.startsWith(count) && l.includes('route="/v1/route"') && l.includes('status="200"'),
        );
      return Number(line?.split(" ").at(-1));
    };
    expect(await routed(lanes)).toBe(await routed(single));
    expect(await routed(lanes)).toBeGreaterThanOrEqual(24);
    expect((await fetch(`${lanes.url}/readyz`)).status).toBe(200);
  });

  test("/v1/ws through a lane routes like HTTP", async () => {
    const ws = new WebSocket(`${lanes.url.replace("http://", "ws://")}/v1/ws`);
    const answers: Json[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => {
        ws.send(JSON.stringify({ id: 1, op: "match", token_ids: prompt(1, 16) }));
        ws.send(
          JSON.stringify([
            { id: 2, op: "route", token_ids: prompt(1, 12), request_id: "ws1" },
            { id: 3, op: "done", request_id: "ws1" },
          ]),
        );
      };
      ws.onmessage = (event) => {
        const body = JSON.parse(String(event.data));
        answers.push(...(Array.isArray(body) ? body : [body]));
        if (answers.length === 3) resolve();
      };
      ws.onerror = () => reject(new Error("websocket failed"));
    });
    ws.close();
    const statuses = answers.map((answer) => [answer.id, answer.status]);
    expect(statuses).toEqual([
      [1, 200],
      [2, 200],
      [3, 200],
    ]);
    expect(answers[0]!.result.scores[0]).toEqual({ worker_id: "1", dp_rank: 0, blocks: 4 });
    expect(answers[1]!.result.worker_id).toBe("1");
  });

  test("SIGTERM stops the lanes and the process cleanly", async () => {
    expect(await lanes.stop()).toBe(0);
    expect(lanes.logs.at(-1)).toMatchObject({ msg: "stopped" });
  });
});

describe("route lanes with admission hold", () => {
  // 6,000 prompt tokens at 15,000 tokens/s: 400 ms of queued prefill, past the 200 ms bound.
  const LONG = prompt(1, 6000);
  const holding = async (
    run: (serve: ServeProcess) => Promise<void>,
    indexThreads = 0,
  ): Promise<void> => {
    const engine = await new TestEngine().start();
    const serve = await startServe([
      "--block-size",
      "4",
      "--workers",
      `1=${engine.endpoint}`,
      "--route-threads",
      "2",
      "--index-threads",
      String(indexThreads),
      "--admission",
      "hold",
      "--admission-bound-ms",
      "200",
      "--admission-max-hold-ms",
      "600000",
    ]);
    try {
      await run(serve);
    } finally {
      await serve.stop();
      await engine.stop();
    }
  };
  const metric = async (serve: ServeProcess, name: string): Promise<number> => {
    const text = await (await fetch(`${serve.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith(`${name} `));
    return Number(line?.split(" ").at(-1));
  };
  const heldIs = (serve: ServeProcess, count: number, what: string) =>
    eventually(
      async () => ((await metric(serve, "kvedge_admission_held")) === count ? true : undefined),
      10_000,
      what,
    );

  test("a route held on the main thread is answered through its lane once done frees", () =>
    holding(async (serve) => {
      const [ahead] = await call(serve, "/v1/route", { request_id: "ahead", token_ids: LONG });
      expect(ahead).toBe(200);
      let answered = false;
      const second = { request_id: "held", token_ids: [9, 8, 7, 6] };
      const held = call(serve, "/v1/route", second).then((got) => {
        answered = true;
        return got;
      });
      await heldIs(serve, 1, "one route held");
      expect(answered).toBe(false);
      expect((await call(serve, "/v1/requests/ahead/done", {}))[0]).toBe(200);
      const [status, body] = await held;
      expect(status).toBe(200);
      expect(body).toMatchObject({ request_id: "held", worker_id: "1" });
    }));

  // With the writer thread too: lanes then look matches up, except with admission on.
  test.each([0, 1])(
    "a held route whose client goes away is dropped, as on one thread " + "(index threads: %d)",
    (indexThreads) =>
      holding(async (serve) => {
        expect((await call(serve, "/v1/route", { request_id: "ahead", token_ids: LONG }))[0]).toBe(
          200,
        );
        const client = new AbortController();
        const gone = fetch(`${serve.url}/v1/route`, {
          method: "POST",
          body: JSON.stringify({ request_id: "gone", token_ids: [9, 8, 7, 6] }),
          headers: { "content-type": "application/json" },
          signal: client.signal,
        }).catch((error: unknown) => error);
        await heldIs(serve, 1, "one route held");
        client.abort();
        await gone;
        await heldIs(serve, 0, "the held route dropped");
        expect(await metric(serve, 'kvedge_admission_total{outcome="dropped"}')).toBe(1);
        // Freeing the worker routes nothing: "gone" was never answered, so it is not active.
        expect((await call(serve, "/v1/requests/ahead/done", {}))[0]).toBe(200);
        expect(await metric(serve, 'kvedge_admission_total{outcome="released"}')).toBe(0);
        const [again, body] = await call(serve, "/v1/route", {
          request_id: "gone",
          token_ids: [9],
        });
        expect([again, body.request_id]).toEqual([200, "gone"]);
        expect(await metric(serve, "kvedge_admission_held")).toBe(0);
      }, indexThreads),
  );
});
