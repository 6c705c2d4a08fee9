/**
 * The differential harness: replays a stream into a backend and into the reference
 * model side by side and stops at the first difference in anything observable —
 * each event's outcome, every counter, stats (workers, held blocks, copies, lookup entries,
 * rejections), findMatches for the stream's queries (a rotating few after every step,
 * all at the end) — plus, at the end: dump() restores an equal index (checked through
 * a fresh reference and a fresh instance of the backend), and after every worker is
 * removed the index holds exactly nothing (nodes, lookup entries, bytes back to a
 * fresh index's). A failing stream is shrunk to a minimal list of events.
 *
 * Knobs (environment): KVEDGE_SEED (run one seed), KVEDGE_SEEDS (how many seeds),
 * KVEDGE_STEPS (events per stream), KVEDGE_TRACE=1 (print every event and check),
 * KVEDGE_VERIFY=1 (O(N) verify after every mutation, all seeds), KVEDGE_SOAK=1
 * (heavier defaults).
 */
import { chainHashes } from "../../src/hash";
import { applyOp } from "../../src/index/apply";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { type IndexOptions, type KvIndex, MatchResult, TierMatches } from "../../src/index/types";
import {
  applyHarnessOp,
  applyLine,
  generateStream,
  type HarnessOp,
  matchLine,
  pairs,
  type Stream,
  type StreamOptions,
} from "./streams";

/** A backend under test: one line registers it (see test/index/differential.test.ts). */
export interface HarnessBackend {
  readonly name: string;
  create(options: IndexOptions): KvIndex;
  /** Share of KVEDGE_SEEDS it runs (default 1): a variant of a backend tested in full. */
  readonly seedShare?: number;
}

export interface ReplayOptions {
  verify?: boolean;
  trace?: boolean;
  maxWorkers?: number;
  /** Queries checked after each step (they rotate through the stream's queries). */
  queriesPerStep?: number;
  /** Run the end-of-stream checks (dump/restore, teardown). */
  finalChecks?: boolean;
}

export interface Divergence {
  readonly step: number;
  readonly message: string;
}

const env = process.env;
export const knobs = {
  seed: env.KVEDGE_SEED === undefined ? null : Number(env.KVEDGE_SEED),
  seeds: Number(env.KVEDGE_SEEDS ?? (env.KVEDGE_SOAK === "1" ? 20_000 : 2_000)),
  steps: Number(env.KVEDGE_STEPS ?? (env.KVEDGE_SOAK === "1" ? 400 : 120)),
  trace: env.KVEDGE_TRACE === "1",
  verifyAll: env.KVEDGE_VERIFY === "1",
};

const tierOut = new TierMatches();

const chains = new WeakMap<readonly bigint[], Uint32Array>();

/** The query's sequence hashes (cached per query: streams replay many times). */
function chainOf(query: readonly bigint[]): Uint32Array {
  let chain = chains.get(query);
  if (chain === undefined) {
    chain = new Uint32Array(2 * query.length);
    chainHashes(pairs(query), query.length, chain);
    chains.set(query, chain);
  }
  return chain;
}

/**
 * The device scores and, with `tiers`, each worker's lower-tier hits after them.
 * `sequence`: pass the query's sequence hashes, as a route does (else the index makes them).
 */
function matches(
  index: KvIndex,
  query: readonly bigint[],
  out: MatchResult,
  sequence = false,
  tiers = false,
): string {
  const local = pairs(query);
  if (sequence) index.findMatches(local, query.length, out, chainOf(query));
  else index.findMatches(local, query.length, out);
  const name = (handle: number) => `${index.workerIdOf(handle)}/${index.dpRankOf(handle)}`;
  const scores: string[] = [];
  for (let i = 0; i < out.count; i++) scores.push(`${name(out.workers[i]!)}=${out.blocks[i]}`);
  if (!tiers) return scores.sort().join(" ");
  index.tierMatches(chainOf(query), query.length, out, tierOut);
  // Lower-tier handles are worker table slots (a shared reader names only its own answer's).
  const table = index.workerTable;
  for (let i = 0; i < tierOut.count; i++) {
    const slot = tierOut.workers[i]!;
    const hits = `${tierOut.host[i]},${tierOut.disk[i]},${tierOut.external[i]}`;
    scores.push(`${table.workerIdOf(slot)}/${table.dpRankOf(slot)}+${hits}`);
  }
  return scores.sort().join(" ");
}

/** Whether a stream has lower-tier events (only then are tier matches compared: they cost). */
function hasTiers(ops: readonly HarnessOp[]): boolean {
  return ops.some((op) => op.kind === "tier_stored" || op.kind === "tier_removed");
}

function workerIds(ops: readonly HarnessOp[]): bigint[] {
  return [...new Set(ops.map((op) => op.worker))];
}

/** Replays `stream` into the reference and `backend`; the first difference, or null. */
export function replay(
  stream: Pick<Stream, "ops" | "queries">,
  backend: HarnessBackend,
  options: ReplayOptions = {},
): Divergence | null {
  const indexOptions: IndexOptions = {
    verify: options.verify ?? false,
    maxWorkers: options.maxWorkers ?? 65_536,
  };
  const oracle = new ReferenceIndex(1, indexOptions);
  let subject: KvIndex;
  try {
    subject = backend.create(indexOptions);
  } catch (error) {
    return { step: -1, message: `create failed: ${String(error)}` };
  }
  const out = new MatchResult();
  const perStep = options.queriesPerStep ?? 3;
  const queries = stream.queries;
  const tiers = hasTiers(stream.ops);
  const compareQuery = (step: number, query: readonly bigint[]): Divergence | null => {
    const want = matches(oracle, query, out, false, tiers);
    const got = matches(subject, query, out, false, tiers);
    const given = matches(subject, query, out, true, tiers);
    if (options.trace) process.stderr.write(`  match ${query.join(",")}: ${got}\n`);
    const named = `findMatches(${query.join(",")})`;
    if (want !== got) return { step, message: `${named}: want [${want}] got [${got}]` };
    if (want === given) return null;
    return { step, message: `${named} given its chain: want [${want}] got [${given}]` };
  };
  let step = 0;
  try {
    for (; step < stream.ops.length; step++) {
      const op = stream.ops[step]!;
      if (options.trace) process.stderr.write(`step ${step}: ${applyLine(op)}\n`);
      const want = applyHarnessOp(oracle, op);
      const got = applyHarnessOp(subject, op);
      if (want !== got) return { step, message: `outcome of ${op.kind}: want ${want} got ${got}` };
      const counters = JSON.stringify(subject.counters);
      if (counters !== JSON.stringify(oracle.counters)) {
        return {
          step,
          message: `counters: want ${JSON.stringify(oracle.counters)} got ${counters}`,
        };
      }
      const a = oracle.stats();
      const b = subject.stats();
      const same =
        a.workers === b.workers &&
        a.blocks === b.blocks &&
        a.copies === b.copies &&
        JSON.stringify(a.lowerTiers) === JSON.stringify(b.lowerTiers) &&
        a.lookupEntries === b.lookupEntries;
      if (!same) {
        return { step, message: `stats: want ${JSON.stringify(a)} got ${JSON.stringify(b)}` };
      }
      for (let k = 0; k < perStep && queries.length > 0; k++) {
        const divergence = compareQuery(step, queries[(step * perStep + k) % queries.length]!);
        if (divergence !== null) return divergence;
      }
    }
    for (const query of queries) {
      const divergence = compareQuery(step, query);
      if (divergence !== null) return divergence;
    }
    if (options.finalChecks ?? true)
      return finalChecks(stream, backend, oracle, subject, indexOptions);
  } catch (error) {
    const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    const where = step < stream.ops.length ? "" : " (end-of-stream checks)";
    return { step, message: `threw ${message}${where}` };
  }
  return null;
}

function finalChecks(
  stream: Pick<Stream, "ops" | "queries">,
  backend: HarnessBackend,
  oracle: ReferenceIndex,
  subject: KvIndex,
  indexOptions: IndexOptions,
): Divergence | null {
  const end = stream.ops.length;
  subject.verify();
  // dump -> a fresh reference: the same workers holding the same blocks under the same hashes.
  const dump = subject.dump();
  const restored = new ReferenceIndex(1, indexOptions);
  for (const event of dump) applyOp(restored, JSON.parse(JSON.stringify(event)));
  const want = oracle.canonical().join("\n");
  if (restored.canonical().join("\n") !== want) {
    return {
      step: end,
      message: `dump does not restore the index:\n${dump.map((e) => JSON.stringify(e)).join("\n")}`,
    };
  }
  // ... and into a fresh instance of the backend itself.
  const again = backend.create(indexOptions);
  for (const event of dump) applyOp(again, event);
  const out = new MatchResult();
  const tiers = hasTiers(stream.ops);
  for (const query of stream.queries) {
    if (matches(again, query, out, false, tiers) !== matches(oracle, query, out, false, tiers)) {
      return { step: end, message: `restored ${backend.name} differs on query ${query.join(",")}` };
    }
  }
  const [restoredStats, oracleStats] = [again.stats(), oracle.stats()];
  const held = (stats: typeof restoredStats) =>
    JSON.stringify([stats.blocks, stats.copies, stats.lowerTiers]);
  if (held(restoredStats) !== held(oracleStats))
    return { step: end, message: "restored index holds other blocks or copies" };
  // Removing every worker leaves nothing behind, down to the bytes of a fresh index.
  const fresh = backend.create(indexOptions).stats().bytes;
  for (const workerId of workerIds(stream.ops)) subject.removeWorker(workerId);
  subject.verify();
  const stats = subject.stats();
  if (
    stats.workers !== 0 ||
    stats.blocks !== 0 ||
    stats.copies !== 0 ||
    JSON.stringify(stats.lowerTiers) !==
      JSON.stringify({ host_pinned: 0, disk: 0, external: 0, copies: 0 }) ||
    stats.nodes !== 0 ||
    stats.lookupEntries !== 0 ||
    stats.edgeWords !== 0
  ) {
    return {
      step: end,
      message: `not empty after removing every worker: ${JSON.stringify(stats)}`,
    };
  }
  if (stats.bytes !== fresh)
    return {
      step: end,
      message: `bytes after removing every worker: ${stats.bytes}, fresh: ${fresh}`,
    };
  return null;
}

/**
 * Shrinks a failing op list (delta debugging: drop chunks, then single ops, while it
 * still fails); `budget` bounds the replays.
 */
export function shrink(
  stream: Pick<Stream, "ops" | "queries">,
  fails: (ops: HarnessOp[]) => boolean,
  budget = 3000,
): HarnessOp[] {
  let ops = stream.ops;
  let chunk = Math.max(1, ops.length >> 1);
  while (budget > 0) {
    let removedAny = false;
    for (let start = 0; start < ops.length && budget > 0; ) {
      const candidate = [...ops.slice(0, start), ...ops.slice(start + chunk)];
      budget--;
      if (candidate.length < ops.length && fails(candidate)) {
        ops = candidate;
        removedAny = true;
      } else {
        start += chunk;
      }
    }
    if (!removedAny) {
      if (chunk === 1) break;
      chunk = Math.max(1, chunk >> 1);
    }
  }
  return ops;
}

/** Generates, replays and (on failure) shrinks one seed; returns a report or null. */
export function checkSeed(
  seed: number,
  backend: HarnessBackend,
  streamOptions: StreamOptions,
  replayOptions: ReplayOptions = {},
): string | null {
  const stream = generateStream(seed, streamOptions);
  const options = { ...replayOptions, maxWorkers: streamOptions.maxWorkers };
  const divergence = replay(stream, backend, options);
  if (divergence === null) return null;
  const small = shrink(
    stream,
    (ops) => replay({ ops, queries: stream.queries }, backend, options) !== null,
  );
  const last = replay({ ops: small, queries: stream.queries }, backend, options);
  const lines = [
    `${backend.name} diverges from the reference on seed ${seed} (KVEDGE_SEED=${seed} to rerun, KVEDGE_TRACE=1 to trace)`,
    `at step ${divergence.step}: ${divergence.message}`,
    `shrunk to ${small.length} of ${stream.ops.length} events${last === null ? "" : ` (step ${last.step}: ${last.message})`}:`,
    ...small.map(applyLine),
    ...stream.queries.map(matchLine),
  ];
  return lines.join("\n");
}
