// Goal: the compiled `kvedge serve --index-threads 1` (engine events sequenced and
// applied on the writer thread, routes reading its index in shared memory) answers
// exactly what `--index-threads 0` answers, fed the same engine events through real
// sockets: matches and a sequence of routes while events stream, the workers' blocks
// and trust (a lost batch degrades, a clear restores), removing a worker; also with
// route lanes on top; SIGTERM stops it cleanly; state.dir with it is refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { runKvedge } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

const BS = 4;
type Json = Record<string, any>;

async function call(
  serve: ServeProcess,
  path: string,
  body?: unknown,
  method = "POST",
): Promise<[number, Json]> {
  const bare = body === undefined && method === "POST";
  const response = await fetch(
    `${serve.url}${path}`,
    bare
      ? {}
      : {
          method,
          ...(body === undefined ? {} : { body: JSON.stringify(body) }),
          headers: { "content-type": "application/json" },
        },
  );
  return [response.status, (await response.json()) as Json];
}

const prompt = (first: number, length: number) => Array.from({ length }, (_, i) => first + i);
const workersOf = async (serve: ServeProcess) => {
  const [, body] = await call(serve, "/v1/workers", undefined, "GET");
  return body.workers.map((w: Json) => ({
    id: w.worker_id,
    blocks: w.blocks,
    degraded: w.degraded,
    lastSeq: w.last_seq,
  }));
};

describe("serve with the writer thread against serve without", () => {
  let a: TestEngine;
  let b: TestEngine;
  let servers: ServeProcess[];

  beforeAll(async () => {
    a = await new TestEngine({ replay: true }).start();
    b = await new TestEngine().start();
    const workers = `1=${a.endpoint};replay=${a.replayEndpoint},2=${b.endpoint}`;
    const args = ["--block-size", String(BS), "--workers", workers];
    servers = await Promise.all([
      startServe([...args, "--index-threads", "0", "--route-threads", "0"]),
      startServe([...args, "--index-threads", "1", "--route-threads", "0"]),
      startServe([...args, "--index-threads", "1", "--route-threads", "2"]),
    ]);
    const subscribed = () => a.pub.subscribedPeers >= 3 && b.pub.subscribedPeers >= 3;
    await eventually(() => (subscribed() ? true : undefined), 10_000, "every server subscribed");
    for (const serve of servers) {
      const ready = async () => (await call(serve, "/readyz", undefined, "GET"))[0] === 200;
      await eventually(async () => ((await ready()) ? true : undefined), 10_000, "ready");
    }
  });

  afterAll(async () => {
    await Promise.all((servers ?? []).map((serve) => serve.stop()));
    await Promise.all([a?.stop(), b?.stop()]);
  });

  /** Every server shows the same workers, at the engines' last batches. */
  const settled = async (seqA: number, seqB: number) => {
    for (const serve of servers) {
      await eventually(
        async () => {
          const workers = await workersOf(serve);
          const at = (id: string) => workers.find((w: Json) => w.id === id)?.lastSeq;
          return at("1") === seqA && at("2") === seqB ? true : undefined;
        },
        10_000,
        `seqs ${seqA}, ${seqB}`,
      );
    }
    const [want, ...others] = await Promise.all(servers.map(workersOf));
    for (const got of others) expect(got).toEqual(want);
  };

  test("the threads started, and say so", () => {
    const threads = (serve: ServeProcess) => serve.logs.find((line) => line.msg === "threads");
    expect(threads(servers[1]!)).toMatchObject({ index_threads: 1, route_threads: 0 });
    expect(threads(servers[2]!)).toMatchObject({ index_threads: 1, route_threads: 2 });
  });

  test("events, matches and routes answer the same on every server", async () => {
    let seqA = -1;
    let seqB = -1;
    for (let round = 0; round < 12; round++) {
      const first = 1 + 100 * (round % 3);
      const hashes = Array.from({ length: 6 }, (_, i) => BigInt(1000 * round + i + 1));
      seqA = Number(a.publish([stored(hashes, prompt(first, 6 * BS), BS)]));
      seqB = Number(b.publish([stored(hashes.slice(0, 2), prompt(first, 2 * BS), BS)]));
      if (round % 4 === 3) seqA = Number(a.publish([removed(hashes.slice(2, 4))]));
      await settled(seqA, seqB);
      for (const tokens of [prompt(first, 6 * BS), prompt(1, 3 * BS), prompt(101, 5 * BS + 2)]) {
        const body = { token_ids: tokens, request_id: `r${round}-${tokens[0]}-${tokens.length}` };
        const routes = servers.map((serve) => call(serve, "/v1/route", body));
        const [want, ...others] = await Promise.all(routes);
        for (const got of others) expect(got).toEqual(want!);
        const match = { token_ids: tokens };
        const matches = await Promise.all(servers.map((serve) => call(serve, "/v1/match", match)));
        for (const got of matches.slice(1)) expect(got).toEqual(matches[0]!);
        expect(want![0]).toBe(200);
      }
    }
  });

  test("a lost batch degrades the worker everywhere; a clear makes it exact again", async () => {
    const seqA = Number(a.publish([stored([90_001n], prompt(7000, BS), BS)]));
    b.publish([stored([90_002n], prompt(7000, BS), BS)], true);
    let seqB = Number(b.publish([stored([90_003n], prompt(8000, BS), BS)]));
    await settled(seqA, seqB);
    for (const workers of await Promise.all(servers.map(workersOf))) {
      expect(workers.find((w: Json) => w.id === "2").degraded).toBe(true);
    }
    seqB = Number(b.publish([cleared]));
    await settled(seqA, seqB);
    for (const workers of await Promise.all(servers.map(workersOf))) {
      expect(workers.find((w: Json) => w.id === "2")).toMatchObject({ degraded: false, blocks: 0 });
    }
  });

  test("removing a worker purges it on every server", async () => {
    for (const serve of servers) {
      expect((await call(serve, "/v1/workers/2", undefined, "DELETE"))[0]).toBe(200);
    }
    for (const serve of servers) {
      await eventually(
        async () => {
          const [, body] = await call(serve, "/v1/match", { token_ids: prompt(1, 6 * BS) });
          return body.scores.every((score: Json) => score.worker_id !== "2") ? true : undefined;
        },
        10_000,
        "worker 2 gone from matches",
      );
    }
    const [want, ...others] = await Promise.all(servers.map(workersOf));
    for (const got of others) expect(got).toEqual(want);
    expect(want.map((w: Json) => w.id)).toEqual(["1"]);
  });

  test("the ring's counters are in /metrics", async () => {
    const text = await (await fetch(`${servers[1]!.url}/metrics`)).text();
    const value = (prefix: string) =>
      Number(
        text
          .split("\n")
          .find((l) => l.startsWith(prefix))
          ?.split(" ")
          .at(-1),
      );
    expect(value('kvedge_event_ring_records_total{outcome="written"}')).toBeGreaterThan(20);
    expect(value('kvedge_event_ring_records_total{outcome="dropped"}')).toBe(0);
    expect(value('kvedge_event_ring_bytes{what="capacity"}')).toBe(64 * 1024 * 1024);
    expect(value('kvedge_threads{role="writer"}')).toBe(1);
    expect(value("kvedge_event_ring_wakes_total")).toBeGreaterThan(0);
  });

  test("a dump is refused with 501 on the writer-thread server", async () => {
    const response = await fetch(`${servers[1]!.url}/v1/dump`);
    expect(response.status).toBe(501);
  });

  test("SIGTERM stops the threads and the process cleanly", async () => {
    for (const serve of servers.slice(1)) {
      expect(await serve.stop()).toBe(0);
      expect(serve.logs.at(-1)).toMatchObject({ msg: "stopped" });
    }
  });

  test("state.dir with the writer thread is refused at start", async () => {
    const args = ["serve", "--index-threads", "1", "--state-dir", "/tmp/nonesuch-kvedge"];
    const result = await runKvedge(args);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("cannot be used with runtime.index_threads");
  });
});

describe("threads pinned to CPUs of their own", () => {
  test("--cpus 0,1 with a writer and a lane: the writer on CPU 1, the lane on CPU 0", async () => {
    const args = ["--cpus", "0,1", "--index-threads", "1", "--route-threads", "1"];
    const serve = await startServe(args);
    try {
      const listening = serve.logs.find((line) => line.msg === "listening");
      expect(listening).toMatchObject({ writer_cpus: "1", lane_cpus: "0", route_lanes: 1 });
      const line = (msg: string) => serve.logs.find((logged) => logged.msg === msg);
      expect(line("pinned to CPUs")).toMatchObject({ cpus: "0,1" });
      expect(line("threads")).toMatchObject({ shared_cpus: true });
    } finally {
      expect(await serve.stop()).toBe(0);
    }
  });
});
