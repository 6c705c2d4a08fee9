/**
 * How low TTFT can go on the agentic workload (src/sim/workloads.ts) for a router that
 * keeps the ideal hit rate: a lower bound, in model ms, for every policy at once.
 *
 *   bun bench/agentic-bound.ts [--requests 2000] [--time-scale 1] [--under 252] [--json]
 *
 * At the ideal hit rate (an unbounded cache: a request computes only the blocks no
 * earlier request had) every block is computed once, so a context lives on one worker
 * and the sub-agents of a fan-out, which share it, all run there. Each request's TTFT is
 * then at least:
 * - a turn: its own new tokens on an idle engine (step base per step + tokens / prefill
 *   speed);
 * - a sub-agent: its fan-out alone on one idle engine, under vLLM V1's loop as the mock
 *   engine runs it (src/sim/engine.ts): a step takes the queue FCFS up to
 *   max_batched_tokens when it starts, and a request that arrives meanwhile waits for
 *   the next step; no decode, no KV reads, nothing else on the engine.
 * The engine's constants are the mock engine's (src/sim/time-model.ts). Prints the ideal
 * hit rate, the bound's TTFT p50 and p99, and how many requests could be under --under
 * ms (a policy's p50 is under it only if half of them are). Deterministic. See
 * docs/decisions.md#agentic-bound.
 */
import { parseArgs } from "node:util";
import { provenance } from "./lib";
import { DEFAULT_BLOCK_SIZE } from "../src/sim/engine-cache";
import { percentile, requestTokens, routeQuery } from "../src/sim/simulator";
import { DEFAULT_TIME_MODEL } from "../src/sim/time-model";
import { DEFAULT_VOCAB_SIZE } from "../src/sim/tokens";
import { parseTrace, transformTrace, type Trace } from "../src/sim/trace";
import { agenticTrace } from "../src/sim/workloads";

const { values } = parseArgs({
  options: {
    requests: { type: "string", default: "2000" },
    "time-scale": { type: "string", default: "1" },
    under: { type: "string", default: "252" },
    json: { type: "boolean", default: false },
  },
  strict: true,
});

const trace = transformTrace(parseTrace(agenticTrace()), {
  requests: Number(values.requests),
  timeScale: Number(values["time-scale"]),
});
const { prefillTokensPerSecond, stepBaseMs, maxBatchedTokens } = DEFAULT_TIME_MODEL;
const perMs = prefillTokensPerSecond / 1000;
const under = Number(values.under);

/** Tokens each request computes with an unbounded prefix cache (vLLM computes >= 1). */
function idealOwnTokens(t: Trace): Float64Array {
  const seen = new Set<string>();
  const own = new Float64Array(t.count);
  for (let i = 0; i < t.count; i++) {
    const length = t.inputLength[i]!;
    const tokens = requestTokens(t, i, DEFAULT_VOCAB_SIZE);
    const { path, promptBlocks } = routeQuery(i, tokens, length, DEFAULT_BLOCK_SIZE);
    const reusable = Math.floor((length - 1) / DEFAULT_BLOCK_SIZE);
    let cached = 0;
    while (cached < reusable && seen.has(`${path[2 * cached]}:${path[2 * cached + 1]}`)) cached++;
    for (let b = 0; b < promptBlocks; b++) seen.add(`${path[2 * b]}:${path[2 * b + 1]}`);
    own[i] = length - cached * DEFAULT_BLOCK_SIZE;
  }
  return own;
}

/** The fan-out a sub-agent belongs to (the generator names it `agent-S/sub-T-K`), else null. */
function fanOutOf(session: string | null): string | null {
  const match = session === null ? null : /^(.*\/sub-\d+)-\d+$/.exec(session);
  return match === null ? null : match[1]!;
}

/** First-token times of one fan-out's requests alone on an idle engine (vLLM V1's loop). */
function fanOutTtft(members: readonly number[], own: Float64Array, ttft: Float64Array): void {
  const left = new Map(members.map((m) => [m, own[m]!]));
  const queue: number[] = [];
  let now = trace.arrivalMs[members[0]!]!;
  let next = 0;
  while (left.size > 0) {
    while (next < members.length && trace.arrivalMs[members[next]!]! <= now)
      queue.push(members[next++]!);
    if (queue.length === 0) {
      now = trace.arrivalMs[members[next]!]!;
      continue;
    }
    let budget = maxBatchedTokens;
    const done: number[] = [];
    for (const m of queue) {
      if (budget === 0) break;
      const take = Math.min(budget, left.get(m)!);
      budget -= take;
      left.set(m, left.get(m)! - take);
      if (left.get(m) === 0) done.push(m);
    }
    now += stepBaseMs + (maxBatchedTokens - budget) / perMs;
    for (const m of done) {
      ttft[m] = now - trace.arrivalMs[m]!;
      queue.splice(queue.indexOf(m), 1);
      left.delete(m);
    }
  }
}

const own = idealOwnTokens(trace);
const ttft = new Float64Array(trace.count);
const fanOuts = new Map<string, number[]>();
let promptTokens = 0;
let computed = 0;
for (let i = 0; i < trace.count; i++) {
  promptTokens += trace.inputLength[i]!;
  computed += own[i]!;
  const fanOut = fanOutOf(trace.sessions?.[i] ?? null);
  if (fanOut === null) {
    ttft[i] = Math.ceil(own[i]! / maxBatchedTokens) * stepBaseMs + own[i]! / perMs;
  } else {
    const members = fanOuts.get(fanOut) ?? [];
    members.push(i);
    fanOuts.set(fanOut, members);
  }
}
for (const members of fanOuts.values()) fanOutTtft(members, own, ttft);

const sorted = Float64Array.from(ttft).sort();
let fast = 0;
for (const ms of ttft) if (ms < under) fast++;
const result = {
  requests: trace.count,
  fan_outs: fanOuts.size,
  ideal_hit_rate: 1 - computed / promptTokens,
  ttft_p50_ms_at_least: percentile(sorted, 0.5),
  ttft_p99_ms_at_least: percentile(sorted, 0.99),
  under_ms: under,
  requests_under_at_most: fast,
};
if (values.json) console.log(JSON.stringify({ ...result, provenance: provenance() }, null, 2));
else {
  console.log(
    `agentic, ${trace.count} requests (${fanOuts.size} fan-outs), time scale ${values["time-scale"]}:`,
  );
  console.log(`  ideal hit rate ${(100 * result.ideal_hit_rate).toFixed(2)}%`);
  console.log(
    `  TTFT p50 >= ${result.ttft_p50_ms_at_least.toFixed(0)} ms, p99 >= ${result.ttft_p99_ms_at_least.toFixed(0)} ms`,
  );
  console.log(`  at most ${fast} of ${trace.count} requests under ${under} ms`);
}
