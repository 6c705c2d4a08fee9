/**
 * How low TTFT can go on the agentic workload (src/sim/workloads.ts) for a router that
 * keeps the ideal hit rate, in model ms.
 *
 *   bun bench/agentic-bound.ts [--requests 2000] [--time-scale 1] [--under 252] [--json]
 *
 * At the ideal hit rate (an unbounded cache: a request computes only the blocks no
 * earlier request had) every block is computed once, so a context lives on one worker
 * and the sub-agents of a fan-out, which share it, all run there, under vLLM V1's loop as
 * the mock engine runs it (src/sim/engine.ts): a step takes the queue FCFS up to
 * max_batched_tokens when it starts, a request that arrives meanwhile waits for the next
 * step, and the requests a step completes get their first token at its end. Two models,
 * no decode and no KV reads in either, the mock engine's constants (src/sim/time-model.ts):
 * - alone: every turn, and every fan-out, alone on an engine idle when it arrives;
 * - bound: a turn as alone; a sub-agent no sooner than its own tokens and, FCFS, those of
 *   every sibling that arrived before it could be computed from the first one's arrival
 *   (an engine busy with other work can gather siblings into one step, quicker than
 *   alone for all but the first: alone is no bound). Every request's TTFT at the ideal
 *   hit rate is at least this, whatever the router, so at most the count printed can be
 *   under --under ms.
 * Prints the ideal hit rate and, per model, TTFT p50 / p99 and the requests under --under
 * ms (a p50 is under it only if half of them are). Deterministic. See
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

/**
 * First-token times of one fan-out alone on an engine whose first step with it starts as
 * its member `first` arrives (0: an idle engine), into `out` (vLLM V1's loop, the
 * simulator's order: members arrive one by one, a step ending at an arrival's instant
 * starts the next before it).
 */
function fanOutRun(
  members: readonly number[],
  own: Float64Array,
  first: number,
  out: Float64Array,
): void {
  const left = new Map(members.map((m) => [m, own[m]!]));
  const queue = members.slice(0, first + 1);
  let now = trace.arrivalMs[members[first]!]!;
  let next = first + 1;
  while (left.size > 0) {
    while (next < members.length && trace.arrivalMs[members[next]!]! < now)
      queue.push(members[next++]!);
    if (queue.length === 0) {
      // Idle: the next arrival starts a step at once, alone.
      now = trace.arrivalMs[members[next]!]!;
      queue.push(members[next++]!);
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
      out[m] = now - trace.arrivalMs[m]!;
      queue.splice(queue.indexOf(m), 1);
      left.delete(m);
    }
  }
}

/**
 * A floor under each sub-agent's first-token time on any engine, whatever else it runs:
 * its own tokens are computed after it arrives, and (FCFS) the tokens of every sibling
 * that arrived before it by then, none before the first arrived.
 */
function fanOutFloor(members: readonly number[], own: Float64Array, floor: Float64Array): void {
  const firstMs = trace.arrivalMs[members[0]!]!;
  let tokens = 0;
  for (const m of members) {
    tokens += own[m]!;
    const arrivedMs = trace.arrivalMs[m]!;
    floor[m] = stepBaseMs + Math.max(own[m]! / perMs, firstMs + tokens / perMs - arrivedMs);
  }
}

const own = idealOwnTokens(trace);
const alone = new Float64Array(trace.count);
const bound = new Float64Array(trace.count);
const fanOuts = new Map<string, number[]>();
let promptTokens = 0;
let computed = 0;
for (let i = 0; i < trace.count; i++) {
  promptTokens += trace.inputLength[i]!;
  computed += own[i]!;
  const fanOut = fanOutOf(trace.sessions?.[i] ?? null);
  if (fanOut === null) {
    alone[i] = Math.ceil(own[i]! / maxBatchedTokens) * stepBaseMs + own[i]! / perMs;
    bound[i] = alone[i]!;
  } else {
    const members = fanOuts.get(fanOut) ?? [];
    members.push(i);
    fanOuts.set(fanOut, members);
  }
}
for (const members of fanOuts.values()) {
  fanOutRun(members, own, 0, alone);
  fanOutFloor(members, own, bound);
}

/** TTFT p50 / p99 and the requests under `under` ms. */
function summary(ttft: Float64Array) {
  const sorted = Float64Array.from(ttft).sort();
  let fast = 0;
  for (const ms of ttft) if (ms < under) fast++;
  return {
    ttft_p50_ms: percentile(sorted, 0.5),
    ttft_p99_ms: percentile(sorted, 0.99),
    requests_under: fast,
  };
}

const result = {
  requests: trace.count,
  fan_outs: fanOuts.size,
  ideal_hit_rate: 1 - computed / promptTokens,
  under_ms: under,
  alone: summary(alone),
  bound: summary(bound),
};
if (values.json) console.log(JSON.stringify({ ...result, provenance: provenance() }, null, 2));
else {
  console.log(
    `agentic, ${trace.count} requests (${fanOuts.size} fan-outs), time scale ${values["time-scale"]}, ideal hit rate ${(100 * result.ideal_hit_rate).toFixed(2)}%:`,
  );
  for (const model of ["alone", "bound"] as const) {
    const r = result[model];
    console.log(
      `  ${model}: TTFT p50 ${r.ttft_p50_ms.toFixed(0)} ms, p99 ${r.ttft_p99_ms.toFixed(0)} ms, ${r.requests_under} of ${trace.count} under ${under} ms`,
    );
  }
}
