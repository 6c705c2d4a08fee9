// Goal: the HTTP edges a browser or a careless client reaches. Bodies must say they are
// JSON or MessagePack (415); a page on another origin (Origin, Sec-Fetch-Site) or a
// DNS-rebound name (Host) cannot change state; /v1/dump streams, and needs the admin
// token when one is set. Over a real Bun.serve on loopback.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { type App, startApp } from "../../src/server/app";
import { DUMP_SLICE_BYTES } from "../../src/server/dump-stream";
import { createMetricsRegistry } from "../../src/util/metrics";
import { KvedgeCore } from "../../src/core/core";
import { silentLogger } from "../../src/util/log";

const TOKEN = "s3cret";
let core: KvedgeCore;
let app: App;
let base = "";

beforeAll(() => {
  core = new KvedgeCore({
    config: loadConfig({ env: {} }).config,
    log: silentLogger,
    random: () => 0.5,
  });
  app = startApp({
    host: "127.0.0.1",
    port: 0,
    bodyLimitBytes: 1 << 20,
    adminToken: TOKEN,
    core,
    registry: createMetricsRegistry(),
    log: silentLogger,
  });
  base = app.url;
});

afterAll(async () => {
  await app.stop(100);
  await core.stop();
});

const JSON_TYPE = { "content-type": "application/json" };
const admin = { authorization: `Bearer ${TOKEN}` };
const routeBody = JSON.stringify({ token_ids: [1, 2, 3, 4] });
const errorOf = async (response: Response): Promise<string> =>
  ((await response.json()) as { error: { message: string } }).error.message;

describe("body types", () => {
  test.each([
    ["text/plain", "not text/plain"],
    ["application/x-www-form-urlencoded", "not application/x-www-form-urlencoded"],
    [null, "send the body as Content-Type: application/json or application/msgpack"],
  ])("a %p body → 415 on every endpoint that reads one", async (type, message) => {
    for (const path of ["/v1/route", "/v1/match", "/v1/workers"]) {
      const headers: Record<string, string> = { ...admin };
      if (type !== null) headers["content-type"] = type;
      // A Blob body: fetch adds no Content-Type of its own.
      const response = await fetch(`${base}${path}`, {
        method: "POST",
        body: new Blob([routeBody]),
        headers,
      });
      expect(response.status).toBe(415);
      expect(await errorOf(response)).toContain(message);
    }
    expect(core.workers()).toEqual([]);
  });

  test("application/json with parameters, in any case, is accepted", async () => {
    const response = await fetch(`${base}/v1/match`, {
      method: "POST",
      body: routeBody,
      headers: { "content-type": "Application/JSON; charset=utf-8" },
    });
    expect(response.status).toBe(200);
  });
});

describe("cross-origin requests", () => {
  const addWorker = (headers: Record<string, string>) =>
    fetch(`${base}/v1/workers`, {
      method: "POST",
      body: JSON.stringify({ worker_id: "5", endpoint: "tcp://127.0.0.1:1" }),
      headers: { ...JSON_TYPE, ...admin, ...headers },
    });

  test.each([
    [{ origin: "http://evil.example" }, "Origin http://evil.example is not this server"],
    [{ origin: "null" }, "Origin null is not this server"],
    [{ "sec-fetch-site": "cross-site" }, "Sec-Fetch-Site: cross-site"],
    [{ "sec-fetch-site": "same-site" }, "Sec-Fetch-Site: same-site"],
  ])("%p → 403, nothing changes", async (headers, message) => {
    for (const response of [
      await addWorker(headers),
      await fetch(`${base}/v1/route`, {
        method: "POST",
        body: routeBody,
        headers: { ...JSON_TYPE, ...headers },
      }),
      await fetch(`${base}/v1/requests/x/done`, { method: "POST", headers }),
      await fetch(`${base}/v1/workers/5`, { method: "DELETE", headers: { ...admin, ...headers } }),
    ]) {
      expect(response.status).toBe(403);
      expect(await errorOf(response)).toContain(message);
    }
    expect(core.workers()).toEqual([]);
    expect(core.router.load.activeRequestCount).toBe(0);
  });

  test("a loopback server refuses other Host names (DNS rebinding), reads included", async () => {
    for (const host of ["evil.example", "evil.example:80", "10.0.0.1"]) {
      const response = await fetch(`${base}/v1/workers`, { headers: { host } });
      expect(response.status).toBe(403);
      expect(await errorOf(response)).toContain("not a loopback name");
    }
    for (const host of ["localhost", `127.0.0.1:${app.server.port}`, "[::1]:9"]) {
      expect((await fetch(`${base}/v1/workers`, { headers: { host } })).status).toBe(200);
    }
  });

  test("a WebSocket upgrade from another origin is refused", async () => {
    const response = await fetch(`${base}/v1/ws`, {
      headers: {
        upgrade: "websocket",
        connection: "Upgrade",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
        origin: "http://evil.example",
      },
    });
    expect(response.status).toBe(403);
  });

  test("same-origin browser requests and non-browser clients pass", async () => {
    const origin = `http://127.0.0.1:${app.server.port}`;
    const ok = await addWorker({ origin, "sec-fetch-site": "same-origin" });
    expect(ok.status).toBe(201);
    const removed = await fetch(`${base}/v1/workers/5`, { method: "DELETE", headers: admin });
    expect(removed.status).toBe(200);
  });
});

describe("/v1/dump", () => {
  test("needs the admin token when one is set", async () => {
    expect((await fetch(`${base}/v1/dump`)).status).toBe(401);
    expect(
      (await fetch(`${base}/v1/dump`, { headers: { authorization: "Bearer wrong" } })).status,
    ).toBe(401);
    expect((await fetch(`${base}/v1/dump`, { headers: admin })).status).toBe(200);
  });

  test("streams in slices a turn apart: other requests are answered while it runs; one dump at a time", async () => {
    // ~40k blocks: a dump of several MB, far more than one slice.
    const index = core.index;
    const external = new Uint32Array(2 * 64);
    const local = new Uint32Array(2 * 64);
    for (let chain = 0; chain < 640; chain++) {
      for (let i = 0; i < 64; i++) {
        external[2 * i + 1] = chain * 64 + i + 1;
        local[2 * i] = chain + 1;
        local[2 * i + 1] = i + 1;
      }
      index.applyStored(7n, 0, false, 0, 0, external, local, 64, 0);
    }
    const expected = `${index
      .dump()
      .map((op) => JSON.stringify(op))
      .join("\n")}\n`;
    const response = await fetch(`${base}/v1/dump`, { headers: admin });
    expect(response.headers.get("content-type")).toBe("application/x-ndjson");
    const busy = await fetch(`${base}/v1/dump`, { headers: admin });
    expect(busy.status).toBe(503);
    const reader = response.body!.getReader();
    const first = await reader.read();
    // The dump has started and is not finished: a match is answered in between.
    const match = await fetch(`${base}/v1/workers`);
    expect(match.status).toBe(200);
    let text = new TextDecoder().decode(first.value!);
    for (;;) {
      const next = await reader.read();
      if (next.done) break;
      text += new TextDecoder().decode(next.value);
    }
    // Written in slices of at most DUMP_SLICE_BYTES (how many reads the client saw
    // depends on how fast it read, not on the server).
    expect(text.length).toBeGreaterThan(4 * DUMP_SLICE_BYTES);
    expect(text).toBe(expected);
    // Done: the next dump may start. A client that hangs up mid-dump ends it too.
    const abort = new AbortController();
    const abandoned = await fetch(`${base}/v1/dump`, { headers: admin, signal: abort.signal });
    expect(abandoned.status).toBe(200);
    await abandoned.body!.getReader().read();
    abort.abort();
    let next = 503;
    for (let i = 0; i < 200 && next === 503; i++) {
      await Bun.sleep(10);
      const response = await fetch(`${base}/v1/dump`, { headers: admin });
      next = response.status;
      await response.body?.cancel();
    }
    expect(next).toBe(200);
    index.removeWorker(7n);
  });
});

describe("methods", () => {
  /** Sends a raw request line; resolves with what came back ("" if the connection closed with nothing). */
  const raw = (line: string): Promise<string> =>
    new Promise((resolve) => {
      let got = "";
      const done = () => resolve(got);
      Bun.connect({
        hostname: "127.0.0.1",
        port: app.server.port!,
        socket: {
          open: (socket) =>
            void socket.write(`${line}\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n`),
          data: (socket, chunk) => {
            got += Buffer.from(chunk).toString("latin1");
            if (got.includes("\r\n\r\n")) socket.end();
          },
          close: done,
          error: done,
        },
      });
    });

  test.each([
    "PUT /v1/route",
    "PATCH /v1/workers",
    "OPTIONS /v1/workers",
    "DELETE /v1/dump",
    "POST /healthz",
  ])("%p: a method the endpoint does not take → 405 with Allow", async (line) => {
    const answer = await raw(`${line} HTTP/1.1`);
    expect(answer).toStartWith("HTTP/1.1 405");
    expect(answer).toMatch(/\r\nallow: [A-Z, ]+\r\n/i);
  });

  // Bun's HTTP parser (uWebSockets, strict method validation) refuses a method it does
  // not know, or one in lower case, before any handler runs: it closes the connection
  // without a response. kvedge cannot answer those with 405; it keeps serving.
  test.each(["FOO /v1/workers", "get /v1/workers"])(
    "%p: closed by Bun's parser with no response; serving goes on",
    async (line) => {
      expect(await raw(`${line} HTTP/1.1`)).toBe("");
      expect((await fetch(`${base}/v1/workers`)).status).toBe(200);
    },
  );
});
