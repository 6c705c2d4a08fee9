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
import { routeOp } from "../src/server/api";
import { toJson } from "../src/http/http";
import { ServerMetrics } from "../src/server/metrics";
import { createMetricsRegistry } from "../src/util/metrics";
import { defaultTokenScanner, parseRequestJson } from "../src/http/request-json";
import { BLOCK_SIZE, buildPrompt } from "./http-workload";
import { benchFlags, prng, provenance, rssBytes } from "./lib";
import { FLEET_SEED as SEED, fleetCore } from "./serve-fleet";

const json =
  benchFlags("bun bench/serve-path.bench.ts [--json]", { json: { type: "boolean" } }).json === true;
const ACTIVE = 4096;
const POOL = 2048;

const { core, fleet } = fleetCore();
const pairs = core.index.stats().blocks;

const metrics = new ServerMetrics(createMetricsRegistry());
const random = prng(SEED);
const results: Record<string, { p50Ns: number; p99Ns: number }> = {};
for (const promptTokens of [1024, 4096]) {
  const bodies = Array.from({ length: POOL }, (_, i) => {
    const { tokens } = buildPrompt(
      fleet,
      random,
      promptTokens / BLOCK_SIZE,
      1_000_000 * promptTokens + i,
    );
    return `{"candidates":4,"token_ids":[${tokens.join(",")}]}`;
  });
  const parsed = bodies.map((body) => parseRequestJson(body));
  const routed: string[] = [];
  let next = 0;
  const routeOne = (body: unknown) => {
    const answer = routeOp(core, body);
    routed.push(answer.request_id);
    if (routed.length > ACTIVE) core.done(routed.shift()!);
    return answer;
  };
  for (let i = 0; i < ACTIVE; i++) routeOne(parsed[i % POOL]);
  const sample = routeOne(parsed[0]);
  // As the server parses: token arrays are views its next parse reuses (no copy each).
  bench(`parse ${promptTokens}`, () =>
    do_not_optimize(parseRequestJson(bodies[next++ % POOL]!, defaultTokenScanner, true)),
  );
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
if (json)
  console.log(
    JSON.stringify({
      bench: "serve-path",
      provenance: provenance(),
      pairs,
      rssBytes: rssBytes(),
      results,
    }),
  );
else
  for (const [name, r] of Object.entries(results))
    console.log(
      `${name.padEnd(12)} p50 ${(r.p50Ns / 1000).toFixed(1)} µs  p99 ${(r.p99Ns / 1000).toFixed(1)} µs`,
    );
