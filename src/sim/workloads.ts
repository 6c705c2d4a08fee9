/**
 * Synthetic Mooncake-format traces from documented generators with fixed seeds, for the
 * shapes the conversation trace lacks (`kvedge demo --workload NAME`, `bench/burst.ts`):
 *
 * - `burst`: fan-out bursts (agents spawning sub-tasks, parallel sampling, RL rollouts).
 *   Every `intervalMs`, `requestsPerBurst` requests share a fresh prefix of
 *   `prefixBlocks` Mooncake blocks (8 × 512 = 4,096 tokens by default) and arrive
 *   within `windowMs` of each other; each adds a suffix of its own.
 * - `agentic`: tool-using agent sessions. A few agent types, each with its own system
 *   prompt and tool list, shared by every session of that type; a session's every turn
 *   sends its whole context so far (the previous prompt is a prefix of the next one),
 *   grown by the previous answer and a tool result; some turns fan out to parallel
 *   sub-agents that share the context and arrive within 50 ms.
 *
 * Lines are Mooncake's (`timestamp` ms, `input_length`, `output_length`, `hash_ids`
 * of 512-token blocks, `session_id`), so `parseTrace` reads them like any trace and
 * `kvedge demo --trace FILE` takes them written out. A context that grows inside its
 * last, partial block keeps that block's id: token j of an id is a pure function of
 * (id, j) (./tokens.ts), so the shorter prompt's tokens are a prefix of the longer's.
 */
import { MOONCAKE_BLOCK_TOKENS } from "./trace";
import { createRng, type Rng } from "./random";

export const WORKLOADS = ["burst", "agentic"] as const;
export type Workload = (typeof WORKLOADS)[number];

export function isWorkload(name: string): name is Workload {
  return (WORKLOADS as readonly string[]).includes(name);
}

export interface BurstOptions {
  readonly bursts: number;
  readonly requestsPerBurst: number;
  /** The burst's requests arrive uniformly within this many ms of its start. */
  readonly windowMs: number;
  /** Time between the starts of consecutive bursts. */
  readonly intervalMs: number;
  /** Shared prefix, in 512-token Mooncake blocks. */
  readonly prefixBlocks: number;
  /** Each request's own suffix, tokens, uniform in [min, max]. */
  readonly suffixTokens: readonly [number, number];
  readonly outputTokens: readonly [number, number];
  readonly seed: number;
}

/** 64 requests sharing a 4,096-token prefix within 50 ms, a fresh prefix every 2.5 s. */
export const DEFAULT_BURST: BurstOptions = {
  bursts: 40,
  requestsPerBurst: 64,
  windowMs: 50,
  intervalMs: 2_500,
  prefixBlocks: 8,
  suffixTokens: [100, 500],
  outputTokens: [50, 300],
  seed: 7,
};

export interface AgenticOptions {
  /** Sessions started; they arrive as a Poisson process at `sessionsPerSecond`. */
  readonly sessions: number;
  readonly sessionsPerSecond: number;
  readonly agentTypes: number;
  /** System prompt and tool list of each agent type, in 512-token blocks, uniform in [min, max]. */
  readonly systemBlocks: readonly [number, number];
  /** The user's task opening a session, tokens. */
  readonly taskTokens: readonly [number, number];
  /** Turns per session: 2 + a geometric number with this mean, at most `turnsMax`. */
  readonly extraTurnsMean: number;
  readonly turnsMax: number;
  /** An answer (mostly a tool call), tokens. */
  readonly outputTokens: readonly [number, number];
  /** A tool's result appended to the context, tokens (log-uniform). */
  readonly toolTokens: readonly [number, number];
  /** Tool latency between an answer and the next turn, ms (log-uniform). */
  readonly toolMs: readonly [number, number];
  /** Modeled answer time before a tool runs: base + per output token, ms. */
  readonly answerBaseMs: number;
  readonly answerMsPerToken: number;
  /** Chance that a turn (past the first) fans out to sub-agents instead of one call. */
  readonly fanOutChance: number;
  readonly fanOut: readonly [number, number];
  /** A sub-agent's own task appended to the shared context, tokens. */
  readonly subTaskTokens: readonly [number, number];
  readonly seed: number;
}

export const DEFAULT_AGENTIC: AgenticOptions = {
  sessions: 420,
  sessionsPerSecond: 0.7,
  agentTypes: 8,
  systemBlocks: [2, 8],
  taskTokens: [200, 2_000],
  extraTurnsMean: 4,
  turnsMax: 24,
  outputTokens: [30, 400],
  toolTokens: [100, 4_000],
  toolMs: [200, 8_000],
  answerBaseMs: 1_000,
  answerMsPerToken: 20,
  fanOutChance: 0.15,
  fanOut: [4, 16],
  subTaskTokens: [300, 1_500],
  seed: 7,
};

interface Line {
  readonly timestamp: number;
  readonly input_length: number;
  readonly output_length: number;
  readonly hash_ids: number[];
  readonly session_id: string;
}

const BLOCK = MOONCAKE_BLOCK_TOKENS;

/** An integer uniform in [min, max]. */
function uniform(rng: Rng, [min, max]: readonly [number, number]): number {
  return min + Math.floor(rng() * (max - min + 1));
}

/** An integer log-uniform in [min, max] (min ≥ 1). */
function logUniform(rng: Rng, [min, max]: readonly [number, number]): number {
  return Math.round(Math.exp(Math.log(min) + rng() * (Math.log(max) - Math.log(min))));
}

/** Mooncake JSONL, sorted by arrival (ties keep generation order). */
function render(lines: Line[]): string {
  const order = lines.map((_, i) => i);
  order.sort((a, b) => lines[a]!.timestamp - lines[b]!.timestamp || a - b);
  return `${order.map((i) => JSON.stringify(lines[i])).join("\n")}\n`;
}

/** The `burst` workload as Mooncake JSONL. */
export function burstTrace(options: Partial<BurstOptions> = {}): string {
  const o = { ...DEFAULT_BURST, ...options };
  const rng = createRng(o.seed);
  const lines: Line[] = [];
  let nextId = 0;
  for (let b = 0; b < o.bursts; b++) {
    const prefix = Array.from({ length: o.prefixBlocks }, () => nextId++);
    const start = b * o.intervalMs;
    for (let r = 0; r < o.requestsPerBurst; r++) {
      const suffix = uniform(rng, o.suffixTokens);
      const ids = [...prefix];
      for (let t = 0; t < suffix; t += BLOCK) ids.push(nextId++);
      lines.push({
        timestamp: Math.round(start + rng() * o.windowMs),
        input_length: o.prefixBlocks * BLOCK + suffix,
        output_length: uniform(rng, o.outputTokens),
        hash_ids: ids,
        session_id: `burst-${b}`,
      });
    }
  }
  return render(lines);
}

/** A growing token sequence named by Mooncake block ids. */
class Context {
  ids: number[];
  length: number;

  constructor(
    ids: number[],
    length: number,
    private readonly newId: () => number,
  ) {
    this.ids = ids;
    this.length = length;
  }

  /** Appends `tokens` new tokens: the partial last block keeps its id, new blocks get new ids. */
  grow(tokens: number): void {
    this.length += tokens;
    while (this.ids.length * BLOCK < this.length) this.ids.push(this.newId());
  }

  /** The context's full blocks, then `tokens` of content of its own (a sibling's branch). */
  branch(tokens: number): { ids: number[]; length: number } {
    const full = Math.floor(this.length / BLOCK);
    const ids = this.ids.slice(0, full);
    for (let t = 0; t < tokens; t += BLOCK) ids.push(this.newId());
    return { ids, length: full * BLOCK + tokens };
  }
}

/** The `agentic` workload as Mooncake JSONL. */
export function agenticTrace(options: Partial<AgenticOptions> = {}): string {
  const o = { ...DEFAULT_AGENTIC, ...options };
  const rng = createRng(o.seed);
  let nextId = 0;
  const newId = () => nextId++;
  const systems = Array.from({ length: o.agentTypes }, () =>
    Array.from({ length: uniform(rng, o.systemBlocks) }, newId),
  );
  const lines: Line[] = [];
  let arrival = 0;
  for (let s = 0; s < o.sessions; s++) {
    arrival += (-Math.log(1 - rng()) / o.sessionsPerSecond) * 1000;
    // Agent types by popularity: type k with weight 1 / (k + 1).
    const system = systems[zipfIndex(rng, o.agentTypes)]!;
    const context = new Context([...system], system.length * BLOCK, newId);
    context.grow(uniform(rng, o.taskTokens));
    const turns = Math.min(o.turnsMax, 2 + geometric(rng, o.extraTurnsMean));
    agentSession(o, rng, context, `agent-${s}`, arrival, turns, lines);
  }
  return render(lines);
}

function agentSession(
  o: AgenticOptions,
  rng: Rng,
  context: Context,
  session: string,
  start: number,
  turns: number,
  lines: Line[],
): void {
  let at = start;
  for (let turn = 0; turn < turns; turn++) {
    let answerTokens: number;
    if (turn > 0 && rng() < o.fanOutChance) {
      // Sub-agents share the context so far and arrive within 50 ms; their results come
      // back as one tool result once the slowest is done.
      const fan = uniform(rng, o.fanOut);
      answerTokens = 0;
      for (let k = 0; k < fan; k++) {
        const branch = context.branch(uniform(rng, o.subTaskTokens));
        const output = uniform(rng, o.outputTokens);
        answerTokens = Math.max(answerTokens, output);
        lines.push({
          timestamp: Math.round(at + rng() * 50),
          input_length: branch.length,
          output_length: output,
          hash_ids: branch.ids,
          session_id: `${session}/sub-${turn}-${k}`,
        });
      }
    } else {
      answerTokens = uniform(rng, o.outputTokens);
      lines.push({
        timestamp: Math.round(at),
        input_length: context.length,
        output_length: answerTokens,
        hash_ids: [...context.ids],
        session_id: session,
      });
      context.grow(answerTokens);
    }
    context.grow(logUniform(rng, o.toolTokens));
    at += o.answerBaseMs + answerTokens * o.answerMsPerToken + logUniform(rng, o.toolMs);
  }
}

/** 0..n-1 with weight 1/(k+1). */
function zipfIndex(rng: Rng, n: number): number {
  let total = 0;
  for (let k = 0; k < n; k++) total += 1 / (k + 1);
  let u = rng() * total;
  for (let k = 0; k < n; k++) {
    u -= 1 / (k + 1);
    if (u < 0) return k;
  }
  return n - 1;
}

/** A geometric count (0, 1, 2, …) with the given mean. */
function geometric(rng: Rng, mean: number): number {
  const p = 1 / (1 + mean);
  return Math.floor(Math.log(1 - rng()) / Math.log(1 - p));
}

/** A workload's JSONL with its defaults and `seed`. */
export function workloadTrace(name: Workload, seed?: number): string {
  const options = seed === undefined ? {} : { seed };
  return name === "burst" ? burstTrace(options) : agenticTrace(options);
}
