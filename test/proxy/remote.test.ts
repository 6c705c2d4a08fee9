// Goal: a proxied request whose client is a route lane's (src/proxy/lane-end.ts) runs
// the same lifecycle on the main thread (src/proxy/remote.ts) as one of its own, and
// the messages between the two ends keep it exact where they cross: the answer reaches
// the client byte for byte and is counted once with everything given back; a client
// that leaves as the main thread orders the engine request is never sent to the engine;
// a lane that fails ends its requests as their clients' departures; kvedge stopping cuts
// the lane's stream and closes its engine connection. Both ends run here, joined by
// queues this test delivers (structured clones, as between threads), against a real
// HTTP engine on loopback (test/support/faulty-engine.ts) and a real core.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore } from "../../src/core/core";
import { LaneEnd } from "../../src/proxy/lane-end";
import { COMPLETIONS_PATH } from "../../src/proxy/openai";
import { Preparer } from "../../src/proxy/preparer";
import { OpenAiProxy } from "../../src/proxy/proxy";
import { type ProxyEvent, type ProxyOrder, RemoteRequests } from "../../src/proxy/remote";
import { silentLogger } from "../../src/util/log";
import { FaultyEngine, vllmWrites } from "../support/faulty-engine";
import { until } from "../support/wait";

let engine: FaultyEngine;

beforeAll(() => {
  engine = new FaultyEngine().start();
});

afterAll(() => {
  engine?.stop();
});

/** A main thread's proxy and one lane, their messages held until `deliver`. */
async function lanePair() {
  const { config } = loadConfig({ env: {} });
  const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
  await core.addWorker({
    worker_id: 1n,
    dp_rank: 0,
    endpoint: null,
    replay_endpoint: null,
    topic: "",
    http_endpoint: engine.url,
  });
  const options = {
    model: "m",
    adapters: [],
    forwardTokenIds: false,
    limits: { bytes: 1 << 20, tokens: 1 << 20 },
  };
  const preparer = await Preparer.start(options, null, null, 0, silentLogger);
  const proxy = new OpenAiProxy({
    core,
    preparer,
    model: "m",
    bodyLimitBytes: 1 << 20,
    timeouts: { connectMs: 5_000, firstByteMs: 30_000, idleMs: 30_000 },
    upstreamConnections: 16,
    upstreamQueueMs: 1_000,
    log: silentLogger,
  });
  const toMain: ProxyEvent[][] = [];
  const toLane: ProxyOrder[][] = [];
  const lane = new LaneEnd((events, transfer) =>
    toMain.push(structuredClone(events, { transfer })),
  );
  const main = new RemoteRequests(
    proxy,
    (orders) => toLane.push(structuredClone(orders)),
    () => {},
  );
  const deliver = (): void => {
    for (const events of toMain.splice(0)) main.events(events);
    for (const orders of toLane.splice(0)) lane.orders(orders);
  };
  /** Delivers what the two ends post until `check` holds. */
  const settle = (check: () => boolean, what: string) =>
    until(() => {
      deliver();
      return check();
    }, what);
  const send = (body: Record<string, unknown>, signal?: AbortSignal) => {
    const bytes = new TextEncoder().encode(JSON.stringify({ model: "m", max_tokens: 2, ...body }));
    const request = new Request(`http://127.0.0.1${COMPLETIONS_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: bytes,
      ...(signal === undefined ? {} : { signal }),
    });
    return lane.handle(request, COMPLETIONS_PATH, bytes);
  };
  /** Nothing held on either end: no load, no request, no slot, no engine connection. */
  const released = () =>
    core.router.load.activeRequestCount === 0 &&
    proxy.live.size === 0 &&
    proxy.slots.inUse === 0 &&
    main.size === 0 &&
    lane.size === 0 &&
    engine.open === 0;
  return { core, proxy, lane, main, toMain, toLane, deliver, settle, send, released };
}

describe("a lane's proxied requests", () => {
  test("a stream reaches the client byte for byte, counted completed once, everything given back", async () => {
    const pair = await lanePair();
    const pending = pair.send({ prompt: [1, 2, 3], stream: true });
    let response: Response | null = null;
    void pending.then((r) => {
      response = r;
    });
    await pair.settle(() => response !== null, "the answer's head");
    const text = response!.text();
    await pair.settle(() => pair.proxy.counters.completed === 1, "the end counted");
    expect(await text).toBe(vllmWrites(false, false).join(""));
    expect(response!.headers.get("x-kvedge-worker-id")).toBe("1");
    await pair.settle(pair.released, "everything released");
    expect(pair.proxy.counters).toMatchObject({ requests: 1, completed: 1, clientAborts: 0 });
  });

  test("the client leaves as the main thread orders the engine request: never sent", async () => {
    const pair = await lanePair();
    const asked = engine.requests.length;
    const client = new AbortController();
    void pair.send({ prompt: [4, 5, 6], stream: true }, client.signal);
    // The request reaches the main thread, which orders it sent; the order is not delivered yet.
    await until(() => {
      for (const events of pair.toMain.splice(0)) pair.main.events(events);
      return pair.toLane.length > 0;
    }, "the main thread's order");
    expect(pair.toLane.flat().map((order) => order.o)).toEqual(["send"]);
    client.abort();
    await pair.settle(() => pair.proxy.counters.clientAborts === 1, "the departure counted");
    await pair.settle(pair.released, "everything released");
    expect(engine.requests.length).toBe(asked);
  });

  test("a lane that fails: its requests end as their clients left, everything given back", async () => {
    const pair = await lanePair();
    let response: Response | null = null;
    void pair.send({ prompt: [7, 8, 9], stream: true, x_fault: "hang-mid" }).then((r) => {
      response = r;
    });
    await pair.settle(() => response !== null && engine.open === 1, "mid-stream");
    pair.main.laneGone();
    expect(pair.proxy.counters.clientAborts).toBe(1);
    expect(pair.core.router.load.activeRequestCount).toBe(0);
    expect(pair.proxy.live.size).toBe(0);
    expect(pair.proxy.slots.inUse).toBe(0);
    // The lane's end is the test's here (a failed thread's sockets go with it).
    pair.lane.stop();
    await response!.body?.cancel().catch(() => {});
    await until(() => engine.open === 0, "the engine connection closed");
  });

  test("kvedge stops mid-stream: the lane cuts the client's stream and closes the engine connection", async () => {
    const pair = await lanePair();
    let response: Response | null = null;
    void pair.send({ prompt: [10, 11, 12], stream: true, x_fault: "hang-mid" }).then((r) => {
      response = r;
    });
    await pair.settle(() => response !== null && engine.open === 1, "mid-stream");
    const reading = response!.text().then(
      () => "whole",
      () => "cut",
    );
    expect(pair.proxy.stop()).toBe(1);
    await pair.settle(() => engine.open === 0, "the engine connection closed");
    expect(await reading).toBe("cut");
    expect(pair.proxy.counters.shutdowns).toBe(1);
    await pair.settle(pair.released, "everything released");
  });
});
