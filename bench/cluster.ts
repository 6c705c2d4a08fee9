/**
 * What deciding as one costs: N compiled `kvedge serve` replicas on a nats-server on
 * loopback (`--cluster-nats`), against the same N replicas without it, under the same
 * routes (round robin over the replicas, each request's prefill_done and done on the
 * replica that routed it, over WebSocket). Per routed request: the replicas' CPU
 * (user + system of every thread, from /proc), nats-server's CPU, and the bytes the
 * replicas published; the difference between the two setups is the bus's cost.
 *
 * Workload (seeded): prompts of 64-256 blocks of 16 tokens, one of 32 shared prefixes
 * of 16-64 blocks plus a unique tail; 8 workers known from the configuration (engines
 * that never answer: no KV events, so the CPU measured is routing and the bus).
 *
 *   bun build.ts --host && bun bench/cluster.ts [--replicas 2,3,4] [--requests N] [--runs R] [--json]
 */
import { freePort, NatsServer } from "../src/sim/nats-server";
import { KvedgeClient } from "../src/sim/kvedge-client";
import { type ServeChild, startServeChild } from "../src/sim/serve-process";
import { benchFlags, median, prng, provenance } from "./lib";
import { threadCpuOf } from "./serve-process";
import { join } from "node:path";

const flags = benchFlags(
  "bun bench/cluster.ts [--replicas 2,3,4] [--requests N] [--runs R] [--json]",
  {
    replicas: { type: "string" },
    requests: { type: "string" },
    runs: { type: "string" },
    json: { type: "boolean" },
  },
);
const REPLICAS = (flags.replicas ?? "2,3,4").split(",").map(Number);
const REQUESTS = Number(flags.requests ?? 12_000);
const RUNS = Number(flags.runs ?? 3);
const IN_FLIGHT = 16;
const BINARY = join(import.meta.dir, "..", "dist", "kvedge");

const random = prng(7);
const prefixes = Array.from({ length: 32 }, () =>
  Uint32Array.from({ length: (16 + (random() % 49)) * 16 }, () => random() % 50_000),
);
const prompts = Array.from({ length: 512 }, () => {
  const prefix = prefixes[random() % prefixes.length]!;
  const tokens = new Uint32Array((64 + (random() % 193)) * 16);
  tokens.set(prefix);
  for (let i = prefix.length; i < tokens.length; i++) tokens[i] = random() % 50_000;
  return tokens;
});

interface Run {
  readonly replicaCpuUs: number;
  readonly natsCpuUs: number;
  readonly bytesPublished: number;
}

async function run(replicas: number, synced: boolean): Promise<Run> {
  const nats = synced ? await NatsServer.start() : null;
  const ports = await Promise.all(Array.from({ length: 8 }, () => freePort()));
  const workers = ports.map((port, i) => `${i + 1}=tcp://127.0.0.1:${port}`).join(",");
  const serves: ServeChild[] = [];
  const clients: KvedgeClient[] = [];
  try {
    for (let i = 0; i < replicas; i++) {
      const cluster =
        nats === null ? [] : ["--cluster-nats", nats.url, "--cluster-replica-id", `r${i}`];
      serves.push(
        await startServeChild({
          command: [BINARY],
          args: ["--workers", workers, "--log-level", "info", "--warmup-routes", "0", ...cluster],
        }),
      );
    }
    for (const serve of serves) clients.push(await KvedgeClient.connect(serve.url));
    await traffic(clients, 500, "warm"); // JIT and steady state, not counted
    const before = serves.map((serve) => threadCpuOf(serve.pid).total);
    const natsBefore = nats === null ? 0 : threadCpuOf(nats.pid).total;
    const bytesBefore = await published(serves);
    await traffic(clients, REQUESTS, "bench");
    await Bun.sleep(200); // the last batches and heartbeats go out
    const cpu = serves.reduce(
      (sum, serve, i) => sum + threadCpuOf(serve.pid).total - before[i]!,
      0,
    );
    const natsCpu = nats === null ? 0 : threadCpuOf(nats.pid).total - natsBefore;
    return {
      replicaCpuUs: (cpu * 1e6) / REQUESTS,
      natsCpuUs: (natsCpu * 1e6) / REQUESTS,
      bytesPublished: ((await published(serves)) - bytesBefore) / REQUESTS,
    };
  } finally {
    for (const client of clients) client.close();
    await Promise.all(serves.map((serve) => serve.stop()));
    await nats?.close();
  }
}

/** `count` requests round robin over the clients, IN_FLIGHT at a time, each finished after its answer. */
async function traffic(clients: KvedgeClient[], count: number, prefix: string): Promise<void> {
  let next = 0;
  const lane = async () => {
    for (let n = next++; n < count; n = next++) {
      const client = clients[n % clients.length]!;
      const id = `${prefix}-${n}`;
      await client.route(prompts[n % prompts.length]!, id);
      client.lifecycle("prefill_done", id);
      client.lifecycle("done", id);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane));
  for (const client of clients) await client.settle();
}

async function published(serves: readonly ServeChild[]): Promise<number> {
  let sum = 0;
  for (const serve of serves) {
    const text = await (await fetch(`${serve.url}/metrics`)).text();
    const line = text
      .split("\n")
      .find((l) => l.startsWith('kvedge_cluster_bytes_total{direction="sent"}'));
    sum += line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

const rows = [];
for (const replicas of REPLICAS) {
  const synced: Run[] = [];
  const alone: Run[] = [];
  for (let i = 0; i < RUNS; i++) {
    alone.push(await run(replicas, false));
    synced.push(await run(replicas, true));
  }
  const m = (runs: Run[], key: keyof Run) => median(runs.map((r) => r[key]));
  rows.push({
    replicas,
    replica_cpu_us_unsynced: m(alone, "replicaCpuUs"),
    replica_cpu_us_synced: m(synced, "replicaCpuUs"),
    bus_cpu_us: m(synced, "replicaCpuUs") - m(alone, "replicaCpuUs"),
    nats_cpu_us: m(synced, "natsCpuUs"),
    bytes_published: m(synced, "bytesPublished"),
    raw: { synced, alone },
  });
}
if (flags.json === true) {
  process.stdout.write(
    `${JSON.stringify({ bench: "cluster", requests: REQUESTS, provenance: provenance(), rows })}\n`,
  );
} else {
  console.log(
    "replicas | CPU µs per routed request (all replicas): alone → synced (bus) | nats-server µs | bytes published",
  );
  for (const r of rows) {
    const cpu = `${r.replica_cpu_us_unsynced.toFixed(1)} → ${r.replica_cpu_us_synced.toFixed(1)} (+${r.bus_cpu_us.toFixed(1)})`;
    console.log(
      `${String(r.replicas).padStart(8)} | ${cpu.padEnd(58)} | ${r.nats_cpu_us.toFixed(1)} | ${r.bytes_published.toFixed(0)}`,
    );
  }
}
