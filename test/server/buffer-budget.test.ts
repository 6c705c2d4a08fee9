// Goal: one process-wide budget bounds the bytes held for unfinished transfers. Past
// it, new holders are refused (HTTP 503, WebSocket close 1013, ZMTP connection dropped)
// while the holders already in carry on, and every byte comes back when they end.
// Real Bun.serve and ZMTP sockets on loopback; the misbehaving peers are raw sockets.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { connect, type Socket as NetSocket } from "node:net";
import { loadConfig } from "../../src/config";
import { type App, startApp } from "../../src/server/app";
import { createMetricsRegistry } from "../../src/util/metrics";
import { KvedgeCore } from "../../src/core/core";
import { bufferBudget } from "../../src/util/buffer-budget";
import { silentLogger } from "../../src/util/log";
import { SubSocket } from "../../src/wire/zmtp";
import { concat, greetingBytes, RawPeer, readyBytes } from "../wire/zmtp-raw";
import { eventually } from "../support/wait";

const LIMIT = 1 << 20;
let core: KvedgeCore;
let app: App;
let port = 0;
const saved = bufferBudget.limitBytes;

beforeAll(() => {
  bufferBudget.limitBytes = LIMIT;
  core = new KvedgeCore({
    config: loadConfig({ env: {} }).config,
    log: silentLogger,
    random: () => 0.5,
  });
  app = startApp({
    host: "127.0.0.1",
    port: 0,
    bodyLimitBytes: 8 << 20,
    adminToken: null,
    core,
    registry: createMetricsRegistry(),
    log: silentLogger,
  });
  port = app.server.port!;
});

afterAll(async () => {
  await app.stop(100);
  await core.stop();
  bufferBudget.limitBytes = saved;
});

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const until = (condition: () => boolean, what: string, timeoutMs = 10_000) =>
  eventually(() => condition() || undefined, timeoutMs, what);

/** A raw HTTP client: writes what it is told, collects what comes back. */
function rawHttp(): Promise<{ socket: NetSocket; received: () => string; closed: () => boolean }> {
  return new Promise((resolve) => {
    let text = "";
    let ended = false;
    const socket = connect({ host: "127.0.0.1", port }, () =>
      resolve({ socket, received: () => text, closed: () => ended }),
    );
    socket.on("data", (chunk) => {
      text += chunk.toString("latin1");
    });
    socket.on("close", () => {
      ended = true;
    });
    socket.on("error", () => {});
    cleanups.push(() => socket.destroy());
  });
}

const routeHead = (length: number) =>
  `POST /v1/match HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

describe("HTTP bodies", () => {
  test("half-sent bodies hold their declared size; past the budget new bodies get 503; all of it comes back", async () => {
    const half: Awaited<ReturnType<typeof rawHttp>>[] = [];
    for (let i = 0; i < 2; i++) {
      const client = await rawHttp();
      client.socket.write(`${routeHead(400_000)}{"token_ids":[`);
      half.push(client);
    }
    await until(() => bufferBudget.held === 800_000, "two bodies held");
    const refused = await rawHttp();
    refused.socket.write(`${routeHead(400_000)}{"token_ids":[`);
    await until(() => refused.received().includes("\r\n\r\n"), "the refusal");
    expect(refused.received()).toStartWith("HTTP/1.1 503");
    expect(refused.received()).toContain("limit of 1048576 bytes");
    expect(bufferBudget.held).toBe(800_000);
    // Requests without a body are unaffected.
    expect((await fetch(`${app.url}/v1/workers`)).status).toBe(200);
    // One finishes its body: answered, and its bytes come back.
    const body = `1,2,3]}${" ".repeat(400_000 - 14 - 7)}`;
    half[0]!.socket.write(body);
    await until(() => half[0]!.received().includes("\r\n\r\n"), "the finished request's answer");
    expect(half[0]!.received()).toStartWith("HTTP/1.1 200");
    expect(bufferBudget.held).toBe(400_000);
    // The other hangs up mid-body: its bytes come back too.
    half[1]!.socket.destroy();
    await until(() => bufferBudget.held === 0, "the abandoned body released");
  });
});

describe("WebSocket send queues", () => {
  test("a client that never reads is closed (1013) when its queue would pass the budget; others go on", async () => {
    const client = await rawHttp();
    client.socket.write(
      "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    await until(() => client.received().includes("101"), "the upgrade");
    client.socket.pause(); // never read again: the server's send queue grows
    // Masked text frames: a batch of 64 route requests each, answered with ~40 KB.
    const payload = Buffer.from(
      JSON.stringify(
        Array.from({ length: 64 }, (_, i) => ({ id: i, op: "match", token_ids: [1, 2, 3, 4] })),
      ),
    );
    const frame = Buffer.alloc(8 + payload.length);
    frame[0] = 0x81;
    frame[1] = 0x80 | 126;
    frame.writeUInt16BE(payload.length, 2);
    const mask = [1, 2, 3, 4];
    frame.set(mask, 4);
    for (let i = 0; i < payload.length; i++) frame[8 + i] = payload[i]! ^ mask[i % 4]!;
    let sent = 0;
    const refusedBefore = bufferBudget.refused;
    while (bufferBudget.refused === refusedBefore && sent < 5_000) {
      client.socket.write(frame);
      sent++;
      if (sent % 50 === 0) await Bun.sleep(1);
    }
    await until(() => bufferBudget.refused > refusedBefore, "the budget refusing the queue");
    expect(bufferBudget.held).toBeLessThanOrEqual(LIMIT);
    // The connection was closed; its bytes came back.
    await until(() => bufferBudget.held === 0, "the closed connection's queue released");
    expect((await fetch(`${app.url}/v1/workers`)).status).toBe(200);
  });
});

describe("ZMTP frames being reassembled", () => {
  test("peers mid-way through large frames hold them; past the budget a new one is dropped; the rest deliver", async () => {
    const sub = new SubSocket({ maxMessageBytes: 8 << 20 });
    cleanups.push(() => sub.close());
    sub.subscribe("");
    const got: number[] = [];
    sub.onMessage = (frames) => got.push(frames[0]!.length);
    const bound = await sub.bind("tcp://127.0.0.1:0");
    const header = (size: number) => {
      const bytes = new Uint8Array(9);
      bytes[0] = 0x02;
      new DataView(bytes.buffer).setBigUint64(1, BigInt(size));
      return bytes;
    };
    const peers: RawPeer[] = [];
    for (let i = 0; i < 3; i++) {
      const peer = await RawPeer.connect(bound);
      cleanups.push(() => peer.close());
      await peer.write(concat(greetingBytes(), readyBytes({ "Socket-Type": "PUB" })));
      peers.push(peer);
    }
    await until(() => sub.peers.length === 3, "three handshakes");
    await peers[0]!.write(concat(header(400_000), new Uint8Array(1000)));
    await peers[1]!.write(concat(header(400_000), new Uint8Array(1000)));
    await until(() => bufferBudget.held === 800_000, "two frames held");
    await peers[2]!.write(concat(header(400_000), new Uint8Array(1000)));
    await until(() => peers[2]!.closed, "the third peer dropped");
    expect(sub.counters.protocolErrors.buffer_budget).toBe(1);
    await peers[0]!.write(new Uint8Array(399_000));
    await until(() => got.length === 1, "the first frame delivered");
    expect(got).toEqual([400_000]);
    await peers[1]!.close();
    await until(() => bufferBudget.held === 0, "every frame's bytes back");
  });
});
