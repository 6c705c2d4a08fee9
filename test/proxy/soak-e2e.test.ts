// Goal: a short version of the soak (bench/proxy-load.ts --scenario soak runs it for 5
// minutes): 400 proxied requests from 20 clients at once through the compiled `kvedge
// serve --proxy` behind two route lanes, ending every way a request can (the client
// leaving before the answer or mid-stream, the engine failing before or mid-answer,
// hanging past the first-byte and idle timeouts). Every stream the client reads to its
// end has its [DONE]; afterwards nothing is held: no load, nothing in flight, no
// engine connection open, and every request kvedge saw was counted under one outcome.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { xorshift32 } from "../../src/util/random";
import { TestEngine } from "../support/engine";
import { FaultyEngine } from "../support/faulty-engine";
import { soak } from "../support/proxy-soak";
import { metricsOf, type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

let engine: FaultyEngine;
let events: TestEngine;
let serve: ServeProcess;

beforeAll(async () => {
  engine = new FaultyEngine().start();
  events = await new TestEngine().start();
  serve = await startServe([
    "--proxy",
    "--model",
    "m",
    "--warmup-routes",
    "0",
    "--warmup-streams",
    "0",
    "--route-threads",
    "2",
    "--first-byte-timeout-ms",
    "300",
    "--idle-timeout-ms",
    "300",
    "--workers",
    `1=${events.endpoint};http=${engine.url}`,
  ]);
});

afterAll(async () => {
  await serve?.stop();
  engine?.stop();
  await events?.stop();
});

const metrics = () => metricsOf(serve.controlUrl);

test("400 requests ending every way: every read stream whole, nothing held after", async () => {
  const next = xorshift32(42);
  const counts = await soak({
    url: serve.url,
    clients: 20,
    stop: (sent) => sent.requests >= 400,
    random: () => next() / 2 ** 32,
  });
  expect(counts.truncated).toBe(0);
  expect(counts.answered).toBeGreaterThan(100);
  expect(counts.left + counts.cut + counts.errors).toBeGreaterThan(50);
  await until(async () => {
    const m = await metrics();
    return (
      m.get('kvedge_worker_active_requests{worker_id="1",dp_rank="0"}') === 0 &&
      m.get("kvedge_proxy_in_flight") === 0 &&
      m.get("kvedge_proxy_upstream_connections") === 0 &&
      engine.open === 0
    );
  }, "everything released");
  const m = await metrics();
  const ended = [...m]
    .filter(([key]) => key.startsWith("kvedge_proxy_requests_total{"))
    .reduce((sum, [, value]) => sum + value, 0);
  // Each request kvedge saw ended once; the clients that left at once may not have reached it.
  expect(ended).toBeLessThanOrEqual(counts.requests);
  expect(ended).toBeGreaterThanOrEqual(counts.requests - counts.left);
}, 120_000);
