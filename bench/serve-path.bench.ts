/**
 * The serve hot path in one process, without sockets: what one route request costs
 * `kvedge serve` once the bytes have arrived, on the fleet of bench/http.ts (64
 * workers, ≥ 1M (block, worker) pairs applied straight to the index).
 *
 * Timed per request, steady state (about 4,096 active requests: each iteration also
 * finishes the request routed 4,096 iterations earlier, as the TTL would):
 * - `parse`: the JSON body of 1,024 or 4,096 tokens into a request object;
 * - `route`: routeOp (hash, index match, cost of 64 workers, admission, answer object)
 *   + `done` of an old request;
 * - `answer`: the answer's JSON text;
 * - `all`: the three, as /v1/route runs them (plus the metrics observation).
 *
 *   bun bench/serve-path.bench.ts [--json]
 */
import { bench, do_not_optimize, run } from "mitata";
import { loadConfig } from "../src/config";
import { blockSeed, hashBlocks } from "../src/hash";
import { routeOp } from "../src/server/api";
import { toJson } from "../src/server/http";
import { createMetricsRegistry, ServerMetrics } from "../src/server/metrics";
import { defaultTokenScanner, parseRequestJson } from "../src/server/request-json";
import { KvRouterService } from "../src/server/service";
import { silentLogger } from "../src/util/log";
import { BLOCK_SIZE, blockTokens, buildFleet, buildPrompt, externalHash, KIND_DOCUMENT, KIND_SYSTEM, KIND_TAIL } from "./http-workload";
import { prng, provenance, rssBytes } from "./lib";

const json = process.argv.includes("--json");
const SEED = 20_261_129;
const WORKERS = 64;
const ACTIVE = 4096;
const POOL = 2048;

const fleet = buildFleet(SEED, WORKERS, 1_050_000);
const service = new KvRouterService({ config: loadConfig({ env: {} }).config, log: silentLogger });
const seed = blockSeed(null, null);
for (let w = 0; w < WORKERS; w++) {
  const workerId = BigInt(w + 1);
  service.router.load.addWorker(workerId, 0);
  const systems = new Set<number>();
  for (const sequence of fleet.sequences[w]!) {
    const system = fleet.documentSystem[sequence.document]!;
    const blocks: [number, number, number][] = [];
    let parent: bigint | null = null;
    if (systems.has(system)) parent = externalHash(w, KIND_SYSTEM, system, fleet.systemBlocks[system]! - 1);
    else {
      systems.add(system);
      for (let i = 0; i < fleet.systemBlocks[system]!; i++) blocks.push([KIND_SYSTEM, system, i]);
    }
    for (let i = 0; i < fleet.documentBlocks[sequence.document]!; i++) blocks.push([KIND_DOCUMENT, sequence.document, i]);
    for (let i = 0; i < sequence.tailBlocks; i++) blocks.push([KIND_TAIL, sequence.tail, i]);
    const tokens = new Uint32Array(blocks.length * BLOCK_SIZE);
    const external = new Uint32Array(2 * blocks.length);
    blocks.forEach(([kind, id, position], b) => {
      blockTokens(kind, id, position, tokens, b * BLOCK_SIZE);
      const hash = externalHash(w, kind, id, position);
      external[2 * b] = Number(hash >> 32n);
      external[2 * b + 1] = Number(hash & 0xffff_ffffn);
    });
    const local = new Uint32Array(2 * blocks.length);
    hashBlocks(tokens, BLOCK_SIZE, seed, local);
    const parentHi = parent === null ? 0 : Number(parent >> 32n);
    const parentLo = parent === null ? 0 : Number(parent & 0xffff_ffffn);
    service.index.applyStored(workerId, 0, parent !== null, parentHi, parentLo, external, local, blocks.length);
  }
}
const pairs = service.index.stats().blocks;
if (pairs !== fleet.pairs) throw new Error(`indexed ${pairs} pairs, expected ${fleet.pairs}`);

const metrics = new ServerMetrics(createMetricsRegistry());
const random = prng(SEED);
const results: Record<string, { p50Ns: number; p99Ns: number }> = {};
for (const promptTokens of [1024, 4096]) {
  const bodies = Array.from({ length: POOL }, (_, i) => {
    const { tokens } = buildPrompt(fleet, random, promptTokens / BLOCK_SIZE, 1_000_000 * promptTokens + i);
    return `{"candidates":4,"token_ids":[${tokens.join(",")}]}`;
  });
  const parsed = bodies.map((body) => parseRequestJson(body));
  const routed: string[] = [];
  let next = 0;
  const routeOne = (body: unknown) => {
    const answer = routeOp(service, body);
    routed.push(answer.request_id);
    if (routed.length > ACTIVE) service.done(routed.shift()!);
    return answer;
  };
  for (let i = 0; i < ACTIVE; i++) routeOne(parsed[i % POOL]);
  const sample = routeOne(parsed[0]);
  // As the server parses: token arrays are views its next parse reuses (no copy each).
  bench(`parse ${promptTokens}`, () => do_not_optimize(parseRequestJson(bodies[next++ % POOL]!, defaultTokenScanner, true)));
  bench(`route ${promptTokens}`, () => do_not_optimize(routeOne(parsed[next++ % POOL])));
  bench(`answer ${promptTokens}`, () => do_not_optimize(toJson(sample)));
  bench(`all ${promptTokens}`, () => {
    const started = performance.now();
    const answer = routeOne(parseRequestJson(bodies[next++ % POOL]!, defaultTokenScanner, true));
    metrics.observeRouteDecision((performance.now() - started) / 1000);
    const text = toJson(answer);
    metrics.observeHttp("/v1/route", 200, (performance.now() - started) / 1000);
    return do_not_optimize(text);
  });
  const result = await run({ format: json ? "quiet" : "mitata" });
  for (const entry of result.benchmarks.flatMap((trial) => trial.runs)) {
    if (entry.name.endsWith(` ${promptTokens}`) && results[entry.name] === undefined) {
      results[entry.name] = { p50Ns: entry.stats!.p50, p99Ns: entry.stats!.p99 };
    }
  }
}
if (json) console.log(JSON.stringify({ bench: "serve-path", provenance: provenance(), pairs, rssBytes: rssBytes(), results }));
else for (const [name, r] of Object.entries(results)) console.log(`${name.padEnd(12)} p50 ${(r.p50Ns / 1000).toFixed(1)} µs  p99 ${(r.p99Ns / 1000).toFixed(1)} µs`);
