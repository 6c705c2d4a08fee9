/**
 * Routing decisions per second at 8, 64 and 256 workers, in steady state.
 *
 * Workload (seeded, identical in every process): block size 16; 16 shared prefixes
 * ("system prompts") of 32-128 blocks; each request is one prefix plus a unique tail
 * of 8-64 blocks and a ragged end. The index's answer is simulated: each prefix is
 * fully cached on 1/8 of the workers (at least one) and partly on two more. Every
 * worker carries about 16 active requests: each iteration routes one request, marks
 * the prefill of a request routed W*8 iterations earlier as done, and finishes the one
 * routed W*16 iterations earlier.
 *
 * Timed region: one iteration = `Router.route` (cost of every worker, shared-depth
 * lookup, admission with a copy of the chain) + `prefillDone` + `done`.
 * Outside it: token generation and hashing (the server hashes for the index anyway),
 * building the overlap lists.
 *
 * With `--sync` (needs `--cpu`): the router reports its own facts as a replica of a
 * cluster does (src/cluster's outbox: encoded, batched and paced on the event loop as a
 * replica's, published to a real nats-server on loopback through the connection a
 * replica makes, `connectNats`), so the rate is that of a replica with sync on.
 * Both modes yield to the event loop every 256 iterations (NATS writes its socket then).
 * The nats-server runs on the CPUs this process is not pinned to, if there are any (in a
 * deployment the bus is another process on another core; on the bench's own CPU its
 * wake-up at every publish took a few points of the bench's rate, bench/JOURNAL.md);
 * `--bus-on-own-cpu` keeps it on the bench's CPUs.
 *
 *   bun bench/route.bench.ts [--policy dynamo|ttft] [--cpu N [--sync [--bus-on-own-cpu]]] [--json]
 */
import { readFileSync } from "node:fs";
import { bench, do_not_optimize, group, run } from "mitata";
import type { NatsConnection } from "@nats-io/transport-node";
import { Outbox, onTheLoop } from "../src/cluster/outbox";
import { connectNats } from "../src/cluster/transport";
import { NatsServer } from "../src/sim/nats-server";
import { DEFAULT_SEED } from "../src/hash";
import {
  type Overlaps,
  promptHashes,
  type RoutePolicy,
  type RouteRequest,
  Router,
} from "../src/route";
import { benchFlags, formatRate, prng, provenance } from "./lib";

const BLOCK_SIZE = 16;
const WORKER_COUNTS = [8, 64, 256];
const POOL = 8192;
const ACTIVE_PER_WORKER = 16;
const flags = benchFlags(
  "bun bench/route.bench.ts [--policy dynamo|ttft] [--cpu N [--sync [--bus-on-own-cpu]]] [--json]",
  {
    json: { type: "boolean" },
    policy: { type: "string" },
    cpu: { type: "string" },
    sync: { type: "boolean" },
    "bus-on-own-cpu": { type: "boolean" },
  },
);
const json = flags.json === true;
// The router's own default (dynamo) unless asked: the rows stay comparable with older
// builds (a literal list, not ROUTE_POLICIES, so this file runs in builds before it).
const policy = (flags.policy ?? "dynamo") as RoutePolicy;
if (!["dynamo", "ttft"].includes(policy)) throw new Error(`unknown policy '${policy}'`);
// --cpu N: N timed iterations per worker count, rated per CPU-second of this process
// (user + system) instead of mitata's wall-clock p50: for a VM shared with other jobs.
const cpuIterations = flags.cpu === undefined ? 0 : Number(flags.cpu);
if (!(Number.isInteger(cpuIterations) && cpuIterations >= 0)) {
  throw new Error("--cpu takes an iteration count");
}
const sync = flags.sync === true;
if (sync && cpuIterations === 0) throw new Error("--sync needs --cpu N");
/** The CPUs the bench's nats-server runs on ("shared": the bench's own). */
let busCpus = "shared";
/** With --sync: a nats-server on 127.0.0.1 and a connection to it, as a replica has. */
const bus: { server: NatsServer; nc: NatsConnection } | null = sync
  ? await (async () => {
      const server = await NatsServer.start();
      if (flags["bus-on-own-cpu"] !== true) busCpus = moveOffOwnCpus(server.pid);
      return { server, nc: await connectNats({ servers: server.url, noEcho: true }) };
    })()
  : null;

/** Moves process `pid` (every thread) to the online CPUs this one may not run on; their list, or "shared". */
function moveOffOwnCpus(pid: number): string {
  const own = cpuList(
    /Cpus_allowed_list:\s*(\S+)/.exec(readFileSync("/proc/self/status", "utf8"))![1]!,
  );
  const online = cpuList(readFileSync("/sys/devices/system/cpu/online", "utf8").trim());
  const others = online.filter((cpu) => !own.includes(cpu)).join(",");
  if (others === "") return "shared";
  const moved = Bun.spawnSync(["taskset", "-a", "-p", "-c", others, String(pid)], {
    stdout: "ignore",
  });
  if (moved.exitCode !== 0) throw new Error(`taskset could not move nats-server to CPUs ${others}`);
  return others;
}

/** "0-2,5" as [0, 1, 2, 5]. */
function cpuList(text: string): number[] {
  return text.split(",").flatMap((range) => {
    const [low, high = low] = range.split("-").map(Number);
    return Array.from({ length: high! - low! + 1 }, (_, i) => low! + i);
  });
}
const YIELD_EVERY = 256;

const random = prng(42);
const between = (low: number, high: number) => low + (random() % (high - low + 1));
const prefixes = Array.from({ length: 16 }, () =>
  Uint32Array.from({ length: between(32, 128) * BLOCK_SIZE }, random),
);
const requests: { request: RouteRequest; family: number }[] = [];
for (let i = 0; i < POOL; i++) {
  const family = random() % prefixes.length;
  const prefix = prefixes[family]!;
  const tokens = new Uint32Array(
    prefix.length + between(8, 64) * BLOCK_SIZE + (random() % BLOCK_SIZE),
  );
  tokens.set(prefix);
  for (let t = prefix.length; t < tokens.length; t++) tokens[t] = random();
  const hashes = promptHashes(tokens, BLOCK_SIZE, DEFAULT_SEED);
  requests.push({
    request: { chain: hashes.chain, blockCount: hashes.blockCount, tokenCount: tokens.length },
    family,
  });
}

function scenario(workers: number): () => void {
  const router = new Router({ blockSize: BLOCK_SIZE, policy, random: () => random() / 2 ** 32 });
  for (let w = 0; w < workers; w++) router.load.table.acquire(BigInt(1_000_000 + w), 0);
  if (bus !== null) {
    const nc = bus.nc;
    router.load.facts = new Outbox({
      replicaId: "bench",
      epoch: 1,
      workers: router.load.table,
      publish: (message) => {
        if (nc.isClosed()) return false;
        nc.publish("bench.facts", message);
        return true;
      },
      schedule: onTheLoop,
    });
  }
  // Per family: the workers holding its prefix, and how deep.
  const holders = prefixes.map((prefix) => {
    const full = Math.max(1, workers >> 3);
    const slots = new Int32Array(full + 2);
    const blocks = new Float64Array(full + 2);
    const start = random() % workers;
    for (let k = 0; k < full + 2; k++) {
      slots[k] = (start + k * 7) % workers;
      blocks[k] = k < full ? prefix.length / BLOCK_SIZE : between(1, prefix.length / BLOCK_SIZE);
    }
    return { count: Math.min(workers, full + 2), slots, blocks } satisfies Overlaps;
  });
  const window = workers * ACTIVE_PER_WORKER;
  const ids: string[] = new Array(window);
  let next = 0;
  const cycle = () => {
    const { request, family } = requests[next % POOL]!;
    const decision = router.route(request, holders[family]!);
    const at = next % window;
    const half = (next + (window >> 1)) % window;
    if (ids[half] !== undefined) router.load.prefillDone(ids[half]!);
    if (ids[at] !== undefined) router.load.done(ids[at]!);
    ids[at] = decision.requestId;
    next++;
  };
  for (let i = 0; i < window * 2; i++) cycle(); // reach steady state
  return cycle;
}

/**
 * Decisions per CPU-second over `iterations` cycles, after as many untimed ones; the
 * event loop gets a turn every YIELD_EVERY cycles (the NATS client writes then).
 */
async function cpuRate(cycle: () => void, iterations: number): Promise<number> {
  const cycles = async () => {
    for (let i = 0; i < iterations; i++) {
      cycle();
      if (i % YIELD_EVERY === YIELD_EVERY - 1) await new Promise((done) => setImmediate(done));
    }
    await bus?.nc.flush();
  };
  await cycles();
  const before = process.cpuUsage();
  await cycles();
  const used = process.cpuUsage(before);
  return iterations / ((used.user + used.system) / 1e6);
}

let rows: { workers: number; decisions_per_sec: number; p50_ns: number; p99_ns: number }[];
if (cpuIterations > 0) {
  rows = [];
  for (const workers of WORKER_COUNTS) {
    const rate = await cpuRate(scenario(workers), cpuIterations);
    rows.push({ workers, decisions_per_sec: rate, p50_ns: Number.NaN, p99_ns: Number.NaN });
  }
  if (bus !== null) {
    await bus.nc.close();
    await bus.server.close();
  }
} else {
  for (const workers of WORKER_COUNTS) {
    const cycle = scenario(workers);
    group(`${workers} workers`, () => {
      bench(`route W=${workers}`, () => do_not_optimize(cycle()));
    });
  }
  const result = await run({ format: json ? "quiet" : "mitata" });
  rows = WORKER_COUNTS.map((workers) => {
    const runs = result.benchmarks.flatMap((trial) => trial.runs);
    const stats = runs.find((entry) => entry.name === `route W=${workers}`)!.stats!;
    return { workers, decisions_per_sec: 1e9 / stats.p50, p50_ns: stats.p50, p99_ns: stats.p99 };
  });
}

if (json) {
  const clock = cpuIterations > 0 ? "cpu" : "wall";
  const bus_cpus = sync ? busCpus : undefined;
  const document = {
    bench: "route",
    policy,
    clock,
    sync,
    bus_cpus,
    provenance: provenance(),
    rows,
  };
  process.stdout.write(`${JSON.stringify(document)}\n`);
} else {
  console.log("\nworkers | decisions/s (route + prefill_done + done) | p50     | p99");
  for (const row of rows) {
    console.log(
      `${String(row.workers).padStart(7)} | ${formatRate(row.decisions_per_sec).padEnd(41)} | ` +
        `${(row.p50_ns / 1000).toFixed(2)} µs | ${(row.p99_ns / 1000).toFixed(2)} µs`,
    );
  }
}
