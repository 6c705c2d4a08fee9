// Goal: compiled `kvedge serve --cluster-nats` replicas on a real nats-server predict
// one cache for an approximate worker: a request routed through replica A and prefilled
// there makes replica B's /v1/match and route answers show the predicted overlap (kind
// approximate); a shortfall B observes shrinks the worker's capacity on A too; a replica
// started later holds those predictions before it answers its first call (taken from the
// first replica by id when it joins); the metrics count what was shared and applied.
// Method: real processes on loopback (nats-server with -a 127.0.0.1); every wait is on a
// condition (`until`).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { NatsServer } from "../../src/sim/nats-server";
import { type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

type Json = Record<string, any>;
const BS = 4;
const TOKENS = Array.from({ length: 41 }, (_, i) => 100 + i); // 10 full blocks

let nats: NatsServer;
const running: ServeProcess[] = [];

beforeAll(async () => {
  nats = await NatsServer.start();
});

afterAll(async () => {
  await Promise.all(running.map((serve) => serve.stop()));
  await nats?.close();
});

async function replica(id: string): Promise<ServeProcess> {
  const serve = await startServe([
    "--block-size",
    String(BS),
    "--workers",
    "7=none;capacity=400",
    "--cluster-nats",
    nats.url,
    "--cluster-replica-id",
    id,
    "--cluster-lease-ms",
    "1000",
  ]);
  running.push(serve);
  return serve;
}

async function post(url: string, body?: unknown): Promise<[number, Json]> {
  const response = await fetch(url, {
    method: "POST",
    ...(body === undefined
      ? {}
      : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
  });
  return [response.status, (await response.json()) as Json];
}

async function match(serve: ServeProcess): Promise<Json[]> {
  return (await post(`${serve.url}/v1/match`, { token_ids: TOKENS }))[1].scores as Json[];
}

async function worker(serve: ServeProcess): Promise<Json> {
  const body = (await (await fetch(`${serve.url}/v1/workers`)).json()) as Json;
  return (body.workers as Json[]).find((w) => w.worker_id === "7")!;
}

async function metric(serve: ServeProcess, series: string): Promise<number> {
  const text = await (await fetch(`${serve.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(series));
  return line === undefined ? 0 : Number(line.slice(series.length).trim());
}

describe("replicas sharing predictions over NATS", () => {
  let a: ServeProcess;
  let b: ServeProcess;

  beforeAll(async () => {
    [a, b] = await Promise.all([replica("a"), replica("b")]);
    await until(async () => {
      const peers = await Promise.all(
        [a, b].map(async (s) => (await (await fetch(`${s.url}/v1/status`)).json()) as Json),
      );
      return peers.every((status) => status.cluster.peers.length === 1);
    }, "the replicas to hear each other");
  });

  test("a prediction made through A is B's: /v1/match and B's route answer show it", async () => {
    expect(await match(b)).toEqual([]);
    const [status, routed] = await post(`${a.url}/v1/route`, {
      token_ids: TOKENS,
      request_id: "x",
    });
    expect([status, routed.worker_id]).toEqual([200, "7"]);
    expect((await post(`${a.url}/v1/requests/x/prefill_done`))[0]).toBe(200);
    await until(async () => (await match(b)).length > 0, "B to hear A's prediction");
    expect(await match(b)).toEqual([
      { worker_id: "7", dp_rank: 0, blocks: 10, kind: "approximate" },
    ]);
    expect((await worker(b)).predicted_blocks).toBe(10);
    const [, again] = await post(`${b.url}/v1/route`, { token_ids: TOKENS, request_id: "y" });
    expect([again.overlap_blocks, again.candidates[0].overlap_kind]).toEqual([10, "approximate"]);
    expect(await metric(a, 'kvedge_cluster_predictions_total{event="sent"}')).toBe(1);
    expect(await metric(b, 'kvedge_cluster_predictions_total{event="applied"}')).toBe(1);
  });

  test("a shortfall B observes shrinks the capacity on A too", async () => {
    // y was routed on B onto 10 predicted blocks; the engine says it served none.
    expect((await post(`${b.url}/v1/requests/y/prefill_done`, { cached_tokens: 0 }))[0]).toBe(200);
    expect((await worker(b)).predicted_capacity_blocks).toBe(360);
    await until(
      async () => (await worker(a)).predicted_capacity_blocks === 360,
      "A to take B's correction",
    );
    expect(await metric(a, 'kvedge_cluster_predictions_total{event="correction_applied"}')).toBe(1);
  });

  test("a replica started later holds the predictions before its first answer", async () => {
    const c = await replica("c");
    expect(await match(c)).toEqual([
      { worker_id: "7", dp_rank: 0, blocks: 10, kind: "approximate" },
    ]);
    expect(await metric(c, 'kvedge_cluster_predictions_total{event="joined"}')).toBe(10);
    // From the first replica by id only.
    expect(await metric(a, 'kvedge_cluster_predictions_total{event="snapshotted"}')).toBe(10);
    expect(await metric(b, 'kvedge_cluster_predictions_total{event="snapshotted"}')).toBe(0);
  });
});
