// Goal: several compiled `kvedge serve --cluster-nats` processes on a real nats-server
// decide on one load view, and keep deciding through every fault: a replica started
// mid-run has the fleet's load before it answers its first route; a replica SIGKILLed
// mid-run has its requests gone from the others within the lease while their routing
// goes on; nats-server restarted mid-run fails no route and the views converge after it
// is back; a replica whose bus is cut (a TCP proxy) says `degraded` and converges after.
// Routes come over HTTP, WebSocket and route lanes. TLS and token authentication work.
// Method: real processes on loopback (nats-server always with -a 127.0.0.1); load views
// from GET /v1/workers compared by worker; every wait is on a condition.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KvedgeClient } from "../../src/sim/kvedge-client";
import { freePort, NatsServer } from "../../src/sim/nats-server";
import { TestEngine } from "../support/engine";
import { startMockEngines, stopMockEngines } from "../support/mock-fleet";
import { type ServeProcess, startServe } from "../support/serve";
import { TcpProxy } from "../support/tcp-proxy";
import { makeTestCertificates } from "../support/tls";
import { until } from "../support/wait";

type Json = Record<string, any>;
const LEASE_MS = 1000;
const BS = 16;

let nats: NatsServer;
let workers = "";
const running: ServeProcess[] = [];

beforeAll(async () => {
  nats = await NatsServer.start();
  // Engines that never answer: the workers are known from the configuration, and the
  // load view (what is shared) does not need their events.
  const ports = await Promise.all([freePort(), freePort(), freePort()]);
  workers = ports.map((port, i) => `${i + 1}=tcp://127.0.0.1:${port}`).join(",");
});

afterAll(async () => {
  await Promise.all(running.map((serve) => serve.stop()));
  await nats?.close();
});

async function replica(
  id: string,
  url = nats.url,
  extra: string[] = [],
  fleet = workers,
): Promise<ServeProcess> {
  const serve = await startServe([
    "--block-size",
    String(BS),
    "--workers",
    fleet,
    "--cluster-nats",
    url,
    "--cluster-replica-id",
    id,
    "--cluster-lease-ms",
    String(LEASE_MS),
    ...extra,
  ]);
  running.push(serve);
  return serve;
}

async function json(url: string): Promise<Json> {
  return (await (await fetch(url)).json()) as Json;
}

/** Per worker: active requests, prefill tokens, decode blocks (the fleet's, as `serve` sees it). */
async function loadView(serve: ServeProcess): Promise<string[]> {
  const body = await json(`${serve.controlUrl}/v1/workers`);
  return (body.workers as Json[]).map(
    (w) =>
      `${w.worker_id}: ${w.active_requests} ${w.active_prefill_tokens} ${w.active_decode_blocks}`,
  );
}

async function sameViews(replicas: ServeProcess[]): Promise<boolean> {
  const views = await Promise.all(replicas.map(loadView));
  return views.every((view) => JSON.stringify(view) === JSON.stringify(views[0]));
}

async function cluster(serve: ServeProcess): Promise<Json> {
  return (await json(`${serve.controlUrl}/v1/status`)).cluster as Json;
}

/**
 * Requests routed round robin over the replicas (HTTP; over a WebSocket where one is
 * given), each finished later on the replica that routed it. Counts every answer that
 * is not a success.
 */
class Traffic {
  failed: string[] = [];
  private readonly active: [number, string][] = [];
  private n = 0;
  private readonly sockets = new Map<number, KvedgeClient>();

  constructor(
    private readonly prefix: string,
    public replicas: ServeProcess[],
  ) {}

  async overWebSocket(index: number): Promise<void> {
    this.sockets.set(index, await KvedgeClient.connect(this.replicas[index]!.url));
  }

  async step(): Promise<void> {
    const n = this.n++;
    if (this.active.length > 12 || (n % 3 === 2 && this.active.length > 0)) {
      const [at, id] = this.active.splice(n % this.active.length, 1)[0]!;
      if (at >= this.replicas.length) return;
      await this.lifecycle(at, id, "prefill_done");
      await this.lifecycle(at, id, "done");
      return;
    }
    const at = n % this.replicas.length;
    const id = `${this.prefix}-${n}`;
    const tokens = Array.from({ length: 40 + (n % 7) * 16 }, (_, i) => 1 + (n % 5) * 1000 + i);
    const socket = this.sockets.get(at);
    try {
      if (socket !== undefined) await socket.route(Uint32Array.from(tokens), id);
      else {
        const response = await fetch(`${this.replicas[at]!.url}/v1/route`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ token_ids: tokens, request_id: id }),
        });
        if (response.status !== 200) throw new Error(`HTTP ${response.status}`);
      }
      this.active.push([at, id]);
    } catch (error) {
      this.failed.push(`route ${id} on replica ${at}: ${(error as Error).message}`);
    }
  }

  async run(steps: number): Promise<void> {
    for (let i = 0; i < steps; i++) await this.step();
  }

  /** Runs until `stop` resolves (bounded by `maxSteps`). */
  async during(work: Promise<unknown>, maxSteps = 5000): Promise<void> {
    let done = false;
    const finished = work.finally(() => {
      done = true;
    });
    for (let i = 0; i < maxSteps && !done; i++) {
      await this.step();
      await Bun.sleep(2);
    }
    await finished;
  }

  close(): void {
    for (const socket of this.sockets.values()) socket.close();
  }

  private async lifecycle(at: number, id: string, op: string): Promise<void> {
    const response = await fetch(`${this.replicas[at]!.url}/v1/requests/${id}/${op}`, {
      method: "POST",
    });
    if (response.status !== 200) this.failed.push(`${op} ${id}: HTTP ${response.status}`);
  }
}

describe("replicas on one bus", () => {
  let a: ServeProcess;
  let b: ServeProcess;
  let traffic: Traffic;

  beforeAll(async () => {
    [a, b] = await Promise.all([replica("a"), replica("b", nats.url, ["--route-threads", "2"])]);
    await until(async () => (await cluster(a)).peers.length === 1, "a and b to see each other");
    traffic = new Traffic("t", [a, b]);
    await traffic.overWebSocket(0);
  });

  afterEach(() => {
    expect(traffic.failed).toEqual([]);
  });

  afterAll(() => traffic.close());

  test("a replica started mid-run has the fleet's load before its first route", async () => {
    await traffic.run(80);
    await until(() => sameViews([a, b]), "a and b to hold one view");
    const fleet = await loadView(a);
    expect(fleet.some((line) => !line.endsWith(": 0 0 0"))).toBe(true);
    const c = await replica("c");
    if (JSON.stringify(await loadView(c)) !== JSON.stringify(fleet))
      console.log(
        JSON.stringify(
          c.logs.filter((l) => l.component === "cluster"),
          null,
          0,
        ),
      );
    expect(await loadView(c)).toEqual(fleet); // nothing routed on c yet
    const status = await cluster(c);
    expect(status.state).toBe("connected");
    expect(status.peers.map((p: Json) => [p.replica_id, p.state])).toEqual([
      ["a", "synced"],
      ["b", "synced"],
    ]);
    expect(c.logs.some((line) => line.msg === "cluster joined")).toBe(true);
    traffic.replicas = [a, b, c];
    await traffic.run(90);
    const kept = await fetch(`${c.url}/v1/route`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token_ids: Array.from({ length: 48 }, (_, k) => 7000 + k) }),
    });
    expect(kept.status).toBe(200);
    await until(() => sameViews([a, b, c]), "a, b and c to hold one view");
    const workers = (await json(`${c.url}/v1/workers`)).workers as Json[];
    const own = workers.reduce((sum, w) => sum + w.own_active_requests, 0);
    const peers = workers.reduce((sum, w) => sum + w.peer_active_requests, 0);
    expect(own).toBeGreaterThan(0);
    expect(peers).toBeGreaterThan(0);
  });

  test("a replica SIGKILLed mid-run: its requests leave the others within the lease", async () => {
    const c = running.find((serve) => serve.logs.some((l) => l.replica_id === "c"))!;
    for (let i = 0; i < 3; i++) {
      const response = await fetch(`${c.url}/v1/route`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token_ids: Array.from({ length: 64 }, (_, k) => 9000 + k) }),
      });
      expect(response.status).toBe(200);
    }
    await until(
      async () => (await cluster(a)).peers.find((p: Json) => p.replica_id === "c")?.requests >= 3,
      "c's requests on a",
    );
    traffic.replicas = [a, b];
    c.kill("SIGKILL");
    await c.exited;
    running.splice(running.indexOf(c), 1);
    const gone = async () =>
      (await cluster(a)).peers.every((p: Json) => p.replica_id !== "c") &&
      (await cluster(b)).peers.every((p: Json) => p.replica_id !== "c");
    await traffic.during(until(gone, "c to be dropped by a and b", 3 * LEASE_MS + 2000));
    await until(() => sameViews([a, b]), "a and b to hold one view again");
    const workers = (await json(`${a.url}/v1/workers`)).workers as Json[];
    const bOwn = ((await json(`${b.url}/v1/workers`)).workers as Json[]).reduce(
      (sum, w) => sum + w.own_active_requests,
      0,
    );
    expect(workers.reduce((sum, w) => sum + w.peer_active_requests, 0)).toBe(bOwn);
  });

  test("nats-server restarted mid-run: no route fails, degraded meanwhile, views converge", async () => {
    const seen = { degraded: false, since: 0 };
    const outage = (async () => {
      await nats.stop();
      await until(async () => {
        const status = await cluster(a);
        if (status.state === "degraded")
          Object.assign(seen, { degraded: true, since: status.since_ms });
        return seen.degraded;
      }, "a to say degraded");
      await nats.restart();
      await until(async () => (await cluster(a)).state === "connected", "a to reconnect");
      await until(async () => (await cluster(b)).state === "connected", "b to reconnect");
    })();
    await traffic.during(outage);
    expect(seen.since).toBeGreaterThan(0);
    await until(() => sameViews([a, b]), "a and b to hold one view after the restart", 15_000);
    expect((await cluster(a)).peers.map((p: Json) => [p.replica_id, p.state])).toEqual([
      ["b", "synced"],
    ]);
  });

  test("a replica restarted with --state-dir brings its requests back to its peers", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-warm-"));
    try {
      const warm = ["--state-dir", dir];
      let w = await replica("w", nats.url, warm);
      for (let i = 0; i < 3; i++) {
        const response = await fetch(`${w.url}/v1/route`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            token_ids: Array.from({ length: 64 }, (_, k) => 5000 + 64 * i + k),
          }),
        });
        expect(response.status).toBe(200);
      }
      const fromW = async () =>
        (await cluster(a)).peers.find((p: Json) => p.replica_id === "w")?.requests ?? 0;
      await until(async () => (await fromW()) === 3, "a to count w's three requests");
      expect(await w.stop()).toBe(0); // it says it leaves: its requests go at once
      running.splice(running.indexOf(w), 1);
      await until(async () => (await fromW()) === 0, "a to drop w's requests");
      w = await replica("w", nats.url, warm);
      await until(async () => (await fromW()) === 3, "a to count w's restored requests");
      expect(await w.stop()).toBe(0);
      running.splice(running.indexOf(w), 1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the bus cut for one replica: degraded there, one view again after", async () => {
    const proxy = TcpProxy.start(nats.port);
    try {
      const d = await replica("d", `nats://127.0.0.1:${proxy.port}`);
      traffic.replicas = [a, b, d];
      await traffic.run(40);
      await until(() => sameViews([a, b, d]), "a, b and d to hold one view");
      const cut = (async () => {
        proxy.cutAll();
        await until(async () => (await cluster(d)).state === "degraded", "d to say degraded");
        await until(
          async () => (await cluster(a)).peers.length === 1,
          "a to drop d after the lease",
        );
        await until(async () => (await cluster(d)).peers.length === 0, "d to drop its peers");
        proxy.restore();
        await until(async () => (await cluster(d)).state === "connected", "d to reconnect");
      })();
      await traffic.during(cut);
      await until(() => sameViews([a, b, d]), "a, b and d to hold one view after the cut", 15_000);
      const status = await cluster(d);
      expect(status.peers.map((p: Json) => [p.replica_id, p.state])).toEqual([
        ["a", "synced"],
        ["b", "synced"],
      ]);
      const metrics = await (await fetch(`${d.url}/metrics`)).text();
      expect(metrics).toContain("kvedge_cluster_peers 2");
      expect(metrics).toMatch(/kvedge_cluster_events_total\{event="disconnect"\} [1-9]/);
    } finally {
      proxy.stop();
    }
  });
});

describe("the proxy", () => {
  test("a request proxied by one replica is load on the others while it runs", async () => {
    const engines = await startMockEngines(2, { speedup: 1, seed: 5 });
    try {
      const fleet = engines
        .map((engine, i) => `${i + 1}=${engine.networked.endpoint};http=${engine.http}`)
        .join(",");
      const proxy = ["--proxy", "--cluster-name", "proxied"];
      const [p, q] = await Promise.all([
        replica("p", nats.url, proxy, fleet),
        replica("q", nats.url, proxy, fleet),
      ]);
      await until(async () => (await cluster(q)).peers.length === 1, "p and q to see each other");
      // A long completion (model time = wall time): it is active on q's view while p serves it.
      const answer = fetch(`${p.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          prompt: Array.from({ length: 64 }, (_, i) => i + 1),
          max_tokens: 300,
        }),
      });
      await until(async () => {
        const workers = (await json(`${q.controlUrl}/v1/workers`)).workers as Json[];
        return workers.some((w) => w.peer_active_requests === 1);
      }, "q to count p's request");
      expect((await answer).status).toBe(200);
      await until(async () => {
        const workers = (await json(`${q.controlUrl}/v1/workers`)).workers as Json[];
        return workers.every((w) => w.active_requests === 0);
      }, "the request's end to reach q");
    } finally {
      await stopMockEngines(engines);
    }
  });
});

describe("NATS not there at the start", () => {
  test("a replica starts alone, degraded, joins when NATS comes; stops cleanly either way", async () => {
    const port = await freePort();
    const url = `nats://127.0.0.1:${port}`;
    // A real engine: the replica is ready when it is connected, bus or no bus.
    const engine = await new TestEngine().start();
    const late = ["--cluster-name", "late", "--cluster-join-timeout-ms", "200"];
    const early = await replica("early", url, late, `1=${engine.endpoint}`);
    expect(early.logs.some((line) => String(line.msg).includes("NATS not reachable"))).toBe(true);
    const status = await cluster(early);
    expect(status.state).toBe("degraded");
    expect(status.since_ms).toBeGreaterThan(0);
    await until(async () => (await fetch(`${early.url}/readyz`)).status === 200, "early ready");
    const gone = await replica("gone", url, late);
    expect(await gone.stop()).toBe(0); // its connect attempts end with it
    const server = await NatsServer.start({ port });
    try {
      await until(async () => (await cluster(early)).state === "connected", "early to connect");
      const other = await replica("other", url, ["--cluster-name", "late"]);
      await until(async () => (await cluster(early)).peers.length === 1, "early to see other");
      expect(await Promise.all([other.stop(), early.stop()])).toEqual([0, 0]);
    } finally {
      await server.close();
      await engine.stop();
    }
  });
});

describe("authentication and TLS", () => {
  let dir: string;
  let secure: NatsServer;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "kvedge-tls-"));
    const certificates = makeTestCertificates(dir);
    secure = await NatsServer.start({
      args: [
        "--auth",
        "s3cret-token",
        "--tls",
        "--tlscert",
        certificates.cert,
        "--tlskey",
        certificates.key,
      ],
    });
  });

  afterAll(async () => {
    await secure?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("replicas join over TLS with a token; a wrong token stops the start with its reason", async () => {
    const url = `tls://127.0.0.1:${secure.port}`;
    const auth = ["--cluster-name", "secure", "--cluster-tls-ca", join(dir, "ca.pem")];
    const [e, f] = await Promise.all([
      replica("e", url, [...auth, "--cluster-token", "s3cret-token"]),
      replica("f", url, [...auth, "--cluster-token", "s3cret-token"]),
    ]);
    await until(async () => (await cluster(e)).peers.length === 1, "e and f to see each other");
    expect((await cluster(f)).server).toBe(`127.0.0.1:${secure.port}`);
    await expect(replica("g", url, [...auth, "--cluster-token", "wrong"])).rejects.toThrow(
      /exited with code 2/,
    );
  });
});
