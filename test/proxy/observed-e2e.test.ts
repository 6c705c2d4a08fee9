// Goal: through `kvedge serve --proxy`, an engine whose answers report far fewer cached
// tokens than its KV events promise (here: a front that zeroes cached_tokens, as an
// engine with prefix caching off but events on would) is flagged: /v1/workers shows it
// suspect and degraded, the reason is logged, and the honest worker is left alone.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { join } from "node:path";
import { until } from "../support/wait";
import { ROOT } from "../support/kvedge";
import {
  type MockEngine,
  missThenHit,
  startMockEngines,
  stopMockEngines,
  zeroCachedTokensFront,
} from "../support/mock-fleet";
import { startServe, type ServeProcess } from "../support/serve";

type Json = Record<string, any>;
let engines: MockEngine[] = [];
let liar: Server<undefined>;
let serve: ServeProcess;

beforeAll(async () => {
  engines = await startMockEngines(2, { speedup: 50, seed: 7 });
  liar = zeroCachedTokensFront(engines[0]!.http);
  const workers = [
    `1=${engines[0]!.networked.endpoint};http=http://127.0.0.1:${liar.port}`,
    `2=${engines[1]!.networked.endpoint};http=${engines[1]!.http}`,
  ];
  serve = await startServe(["--proxy", "--workers", workers.join(","), "--observed-window", "4"]);
  // Connected is not yet subscribed: events published before the subscription arrives are lost.
  await until(
    () => engines.every((engine) => engine.networked.subscribers > 0),
    "kvedge to subscribe to every engine",
  );
});

afterAll(async () => {
  await serve?.stop();
  await liar?.stop(true);
  await stopMockEngines(engines);
});

const workersOf = async (): Promise<Json[]> =>
  ((await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json).workers as Json[];

test("a worker whose answers show persistently fewer hits than predicted is flagged and discounted", async () => {
  const liarJudged = async () =>
    (await workersOf()).find((w) => w.worker_id === "1")!.observed_hits;
  for (
    let conversation = 0;
    (await liarJudged()).predicted_cached_tokens < 6 * 64 && conversation < 40;
    conversation++
  ) {
    await missThenHit(
      serve,
      Array.from({ length: 80 }, (_, i) => 1 + conversation * 1000 + i),
    );
  }
  const [lying, honest] = await workersOf();
  expect(lying!.observed_hits).toMatchObject({ suspect: true, observed_cached_tokens: 0 });
  expect(lying!.observed_hits.answers).toBeGreaterThanOrEqual(4);
  expect(lying!.degraded).toBe(true);
  expect(honest!.observed_hits.suspect).toBe(false);
  expect(honest!.degraded).toBe(false);
  const line = await serve.waitForLog((l) =>
    String(l.msg).includes("fall persistently below the predicted ones"),
  );
  expect(line.worker_id).toBe("1");
  expect(line.observed_ratio).toBe(0);
  const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
  expect(metrics).toContain('kvedge_worker_hits_suspect{worker_id="1",dp_rank="0"} 1');
});

test("every metric the example Grafana dashboard queries is one kvedge serve --proxy exports", async () => {
  const dashboard = (await Bun.file(
    join(ROOT, "examples", "grafana-dashboard.json"),
  ).json()) as Json;
  const names = new Set<string>();
  for (const panel of dashboard.panels as Json[]) {
    for (const target of panel.targets as Json[])
      for (const name of String(target.expr).match(/kvedge_[a-z_]+/g) ?? []) names.add(name);
  }
  expect(names.size).toBeGreaterThan(8);
  const metrics = await (await fetch(`${serve.controlUrl}/metrics`)).text();
  const exported = new Set(
    [...metrics.matchAll(/^# TYPE (kvedge_[a-z_]+) /gm)].map((match) => match[1]!),
  );
  expect([...names].filter((name) => !exported.has(name))).toEqual([]);
});
