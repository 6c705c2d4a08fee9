// Goal: with `serve --proxy` the control plane is closed to the proxy's clients. On
// the proxy's port an anonymous client (or one with the admin token: the control plane
// is not served there at all) cannot route, match, end or mark another client's
// request, list, add or remove workers, dump, read status or metrics, or open /v1/ws:
// each gets 403 `forbidden`, and nothing changes. The OpenAI endpoints and health are
// served there; everything else is served on the control listener (loopback). A
// malformed Host header gets 400, on one thread and behind route lanes. A worker
// endpoint naming a wildcard address is refused (403) before anything binds. Real
// binary, on one thread and with two route lanes, over loopback.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type MockEngine, startMockEngines, stopMockEngines } from "../support/mock-fleet";
import { freePort, listening, rawStatus } from "../support/net";
import { type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

type Json = Record<string, any>;
const TOKEN = "s3cret";
const admin = { authorization: `Bearer ${TOKEN}` };
const JSON_TYPE = { "content-type": "application/json" };
const PROMPT = Array.from({ length: 40 }, (_, i) => i + 1);

let engines: MockEngine[] = [];

beforeAll(async () => {
  engines = await startMockEngines(1, { speedup: 50, seed: 3 });
});

afterAll(async () => {
  await stopMockEngines(engines);
});

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(url, { method: "POST", body: JSON.stringify(body), headers: { ...JSON_TYPE, ...headers } });

/** Status and error code of a response (code null when it is not an error). */
async function outcome(response: Response): Promise<[number, string | null]> {
  const body = (await response.json().catch(() => ({}))) as Json;
  return [response.status, body.error?.code ?? null];
}

/** A WebSocket to `/v1/ws`: "open" if it opened, else how it ended. */
function openWs(url: string): Promise<string> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${url.replace("http://", "ws://")}/v1/ws`);
    ws.onopen = () => {
      ws.close();
      resolve("open");
    };
    ws.onerror = () => resolve("refused");
  });
}

for (const lanes of [0, 2]) {
  describe(`serve --proxy, ${lanes === 0 ? "one thread" : "two route lanes"}`, () => {
    let serve: ServeProcess;

    beforeAll(async () => {
      const engine = engines[0]!;
      serve = await startServe([
        "--proxy",
        "--admin-token",
        TOKEN,
        "--route-threads",
        String(lanes),
        "--workers",
        `1=${engine.networked.endpoint};http=${engine.http}`,
      ]);
      await until(() => engine.networked.subscribers > 0, "kvedge to subscribe");
    });

    afterAll(async () => {
      await serve?.stop();
    });

    const activeOn = async (): Promise<number> => {
      const body = (await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json;
      return (body.workers as Json[]).reduce((sum, w) => sum + w.active_requests, 0);
    };

    test("two listeners: the proxy's port and the control listener, both on loopback", () => {
      expect(serve.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(serve.controlUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(serve.controlUrl).not.toBe(serve.url);
    });

    test("the proxy's port refuses the decision API and the lifecycle calls: 403, nothing changes", async () => {
      // Another client's request, routed on the control listener, is active.
      const victim = await post(`${serve.controlUrl}/v1/route`, {
        token_ids: PROMPT,
        request_id: "victim",
        expected_output_tokens: 1000,
      });
      expect(victim.status).toBe(200);
      expect(await activeOn()).toBe(1);
      for (const headers of [{}, admin]) {
        const calls = [
          post(`${serve.url}/v1/route`, { token_ids: PROMPT, request_id: "phantom" }, headers),
          post(`${serve.url}/v1/match`, { token_ids: PROMPT }, headers),
          post(`${serve.url}/v1/requests/victim/done`, {}, headers),
          post(`${serve.url}/v1/requests/victim/prefill_done`, {}, headers),
        ];
        for (const response of await Promise.all(calls))
          expect(await outcome(response)).toEqual([403, "forbidden"]);
      }
      // The injected route was not recorded; the victim is still active.
      expect(await activeOn()).toBe(1);
      const ended = await post(`${serve.controlUrl}/v1/requests/victim/done`, {});
      expect(await ended.json()).toEqual({ request_id: "victim", status: "ok" });
      expect(await activeOn()).toBe(0);
    });

    test("the proxy's port refuses workers, dump, status, metrics and the status page: 403", async () => {
      for (const headers of [{}, admin]) {
        const calls = [
          fetch(`${serve.url}/v1/workers`, { headers }),
          post(
            `${serve.url}/v1/workers`,
            { worker_id: "9", endpoint: "tcp://127.0.0.1:1" },
            headers,
          ),
          fetch(`${serve.url}/v1/workers/1`, { method: "DELETE", headers }),
          fetch(`${serve.url}/v1/dump`, { headers }),
          fetch(`${serve.url}/v1/status`, { headers }),
          fetch(`${serve.url}/metrics`, { headers }),
          fetch(`${serve.url}/`, { headers }),
        ];
        for (const response of await Promise.all(calls))
          expect(await outcome(response)).toEqual([403, "forbidden"]);
      }
      const body = (await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json;
      expect(body.workers.map((w: Json) => w.worker_id)).toEqual(["1"]);
    });

    test("the proxy's port refuses /v1/ws; the control listener accepts it", async () => {
      const upgrade = await fetch(`${serve.url}/v1/ws`, {
        headers: {
          upgrade: "websocket",
          connection: "Upgrade",
          "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
          "sec-websocket-version": "13",
        },
      });
      expect(await outcome(upgrade)).toEqual([403, "forbidden"]);
      expect(await openWs(serve.url)).toBe("refused");
      expect(await openWs(serve.controlUrl)).toBe("open");
    });

    test("the proxy's port serves the OpenAI endpoints and health; unknown paths are 404", async () => {
      const completion = await post(`${serve.url}/v1/completions`, {
        prompt: PROMPT,
        max_tokens: 2,
      });
      expect(completion.status).toBe(200);
      await completion.arrayBuffer();
      expect((await fetch(`${serve.url}/v1/models`)).status).toBe(200);
      expect((await fetch(`${serve.url}/healthz`)).status).toBe(200);
      expect((await fetch(`${serve.url}/readyz`)).status).toBe(200);
      expect(await outcome(await fetch(`${serve.url}/v1/nothing`))).toEqual([404, "not_found"]);
      await until(async () => (await activeOn()) === 0, "the completion's load to end");
    });

    test("the control listener serves the control plane; its admin endpoints need the token", async () => {
      expect((await fetch(`${serve.controlUrl}/v1/status`)).status).toBe(200);
      expect((await fetch(`${serve.controlUrl}/metrics`)).status).toBe(200);
      expect((await fetch(`${serve.controlUrl}/`)).status).toBe(200);
      expect(await outcome(await fetch(`${serve.controlUrl}/v1/dump`))).toEqual([
        401,
        "unauthorized",
      ]);
      const routed = await post(`${serve.controlUrl}/v1/route`, { token_ids: PROMPT });
      const id = ((await routed.json()) as Json).request_id as string;
      expect(id).toMatch(/^r-[A-Za-z0-9_-]{22}$/);
      expect((await post(`${serve.controlUrl}/v1/requests/${id}/done`, {})).status).toBe(200);
    });

    test("a proxied request's id is unguessable", async () => {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        const response = await post(`${serve.url}/v1/completions`, {
          prompt: PROMPT,
          max_tokens: 1,
        });
        await response.arrayBuffer();
        ids.push(response.headers.get("x-kvedge-request-id")!);
      }
      for (const id of ids) expect(id).toMatch(/^r-[A-Za-z0-9_-]{22}$/);
      expect(new Set(ids).size).toBe(3);
    });

    test("a malformed Host header gets 400 on both ports", async () => {
      for (const url of [serve.url, serve.controlUrl]) {
        const port = Number(new URL(url).port);
        for (const host of ["[", "127.0.0.1:1:2", "a/b"]) {
          expect(await rawStatus(port, host, "GET /healthz")).toStartWith("HTTP/1.1 400");
          expect(await rawStatus(port, host, "POST /v1/route")).toStartWith("HTTP/1.1 400");
        }
        expect(await rawStatus(port, `127.0.0.1:${port}`, "GET /healthz")).toStartWith(
          "HTTP/1.1 200",
        );
      }
    });

    test("a worker endpoint naming a wildcard address is refused before anything binds", async () => {
      const port = await freePort();
      for (const [field, body] of [
        ["endpoint", { worker_id: "5", endpoint: `tcp://*:${port}` }],
        ["endpoint", { worker_id: "5", endpoint: `tcp://0.0.0.0:${port}` }],
        [
          "replay_endpoint",
          { worker_id: "5", endpoint: "tcp://127.0.0.1:1", replay_endpoint: `tcp://[::]:${port}` },
        ],
      ] as const) {
        const response = await post(`${serve.controlUrl}/v1/workers`, body, admin);
        const answer = (await response.json()) as Json;
        expect(response.status).toBe(403);
        expect(answer.error).toMatchObject({ code: "forbidden", param: field });
        expect(answer.error.message).toContain("ingest.allow_wildcard_endpoints");
      }
      expect(await listening(port)).toBe(false);
      const body = (await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json;
      expect(body.workers.map((w: Json) => w.worker_id)).toEqual(["1"]);
    });
  });
}
