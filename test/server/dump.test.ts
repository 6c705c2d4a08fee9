// Goal: GET /v1/dump cannot be held by a client that stops reading. One dump runs at a
// time and holds a copy of the index, so a client that takes no slice within the stall
// bound is cut: its connection closes, the dump lock and the copy are given back (the
// next dump starts), and the rest of the dump is never produced. A real TCP client
// that stops reading (node:net, paused: the kernel's buffers fill and Bun stops
// pulling), over a real Bun.serve on loopback.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { connect, type Socket } from "node:net";
import { loadConfig } from "../../src/config";
import { KvedgeCore } from "../../src/core/core";
import { type App, startApp } from "../../src/server/app";
import { silentLogger } from "../../src/util/log";
import { createMetricsRegistry } from "../../src/util/metrics";
import { until } from "../support/wait";

let core: KvedgeCore;
let app: App;

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
    adminToken: null,
    core,
    registry: createMetricsRegistry(),
    log: silentLogger,
    dumpStallMs: 300,
  });
  // 800k blocks: over 20 MB of dump text, far more than the kernel's and Bun's buffers.
  const external = new Uint32Array(2 * 64);
  const local = new Uint32Array(2 * 64);
  for (let chain = 0; chain < 12_800; chain++) {
    for (let i = 0; i < 64; i++) {
      external[2 * i + 1] = chain * 64 + i + 1;
      local[2 * i] = chain + 1;
      local[2 * i + 1] = i + 1;
    }
    core.index.applyStored(7n, 0, false, 0, 0, external, local, 64, 0);
  }
});

afterAll(async () => {
  await app.stop(100);
  await core.stop();
});

/** A dump request on a raw socket that reads the first bytes, then stops reading. */
function stalledDump(): Promise<{ socket: Socket; closed: Promise<void>; bytes: () => number }> {
  return new Promise((resolve, reject) => {
    let received = 0;
    const socket = connect({ host: "127.0.0.1", port: app.server.port! });
    const closed = new Promise<void>((done) => socket.once("close", () => done()));
    socket.on("error", () => {}); // the cut may come as a reset
    socket.once("connect", () => {
      socket.write("GET /v1/dump HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    });
    let paused = false;
    socket.on("data", (chunk: Buffer) => {
      received += chunk.length;
      if (paused) return;
      paused = true;
      socket.pause();
      resolve({ socket, closed, bytes: () => received });
    });
    socket.once("close", () => reject(new Error("closed before the dump began")));
  });
}

test("a client that stops reading is cut, the lock and the copy are released, the dump is not produced whole", async () => {
  const full = (await (await fetch(`${app.url}/v1/dump`)).text()).length;
  expect(full).toBeGreaterThan(20 * 1024 * 1024);

  const stalled = await stalledDump();
  // While it is stalled the lock is held: another dump gets 503.
  const busy = await fetch(`${app.url}/v1/dump`);
  expect(busy.status).toBe(503);
  await busy.body?.cancel();

  // The stall is noticed: the lock and the copy are given back (the next dump starts)…
  await until(async () => {
    const next = await fetch(`${app.url}/v1/dump`);
    await next.body?.cancel();
    return next.status === 200;
  }, "the dump lock to be released");
  // …and the connection is cut (Bun's idle timeout, set to the stall bound): no request
  // is in flight any more although the client never read.
  await until(() => app.server.pendingRequests === 0, "the stalled dump's connection to be cut");
  // What the kernel had buffered is all that was ever written: the client reads it, then
  // the end of the connection, without the dump's end.
  let closed = false;
  void stalled.closed.then(() => {
    closed = true;
  });
  stalled.socket.resume();
  await until(() => closed, "the client to read to the end of the cut connection");
  expect(stalled.bytes()).toBeLessThan(full / 3);

  // Dumps go on as before: the next one completes whole.
  const next = await fetch(`${app.url}/v1/dump`);
  expect(next.status).toBe(200);
  expect((await next.text()).length).toBe(full);
}, 30_000);
