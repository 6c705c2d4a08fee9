/**
 * Mooncake indexer replay with Dynamo's method (lib/bench/kv_router, INDEXER_BENCH.md):
 * a deadline-driven open-loop replay of engine KV events and routing queries into
 * one index, timed from the first deadline to the last completion (drain included).
 *
 * Untimed (./indexer-replay-corpus.ts): trace -> transforms -> a mock vLLM-like
 * engine per worker -> msgpack batches and queries, sorted by (deadline, queries
 * first, worker). Then a warm-up on a throwaway index (the whole corpus by default),
 * a collection, a quiet pause.
 *
 * Timed, on one thread (`--route-threads 0`): at each turn every op whose deadline
 * has passed is accepted (stamped) into its queue; an accepted query is served
 * before the next batch (queries wait at most one batch, as in `kvedge serve`,
 * whose event loop takes requests between socket reads). A batch goes through the
 * path `kvedge serve` uses: Sequencer -> KvEventNormalizer (decode, filters, local
 * hashes) -> the index as its writer; a query through the routes' matching path: the
 * prompt's tokens hashed (PromptHasher) and `findMatches`. `lookup.service` is the
 * `findMatches` call (Dynamo's "the lookup itself", on hashes); the hashing is in
 * `sched_to_finish`. With `--query-hashes pre` (Dynamo's method: its queries are block
 * hashes) every query is hashed before the clock and the timed query is the lookup
 * alone, in both modes. Sleep to the next deadline, then spin.
 *
 * Valid: every op accepted within 1.01 x the window, every batch applied in order
 * (per-worker sequence numbers contiguous), nothing dropped, rejected or unknown,
 * the drain finished, and at the end the index holds exactly each engine's cached
 * block count. Kept up: done within 1.10 x the window.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { DEFAULT_SEED } from "../src/hash";
import { createIndex, MatchResult, type KvIndex } from "../src/index";
import type { CrtcIndex } from "../src/index/crtc/crtc";
import { createSharedIndex } from "../src/index/crtc/shared";
import { KvEventNormalizer } from "../src/ingest/normalize";
import { Sequencer } from "../src/ingest/sequencer";
import { PromptHasher } from "../src/route";
import { parseTrace, transformTrace } from "../src/sim/trace";
import { benchFlags, provenance } from "./lib";
import {
  buildCorpus,
  hashQueries,
  OP_BATCH,
  OP_QUERY,
  type Cadence,
  type Corpus,
  type QueryHashes,
} from "./indexer-replay-corpus";
import { ownCoreModel, replayLanes } from "./indexer-replay-lanes";

const usage = `bun bench/indexer-replay.ts [--trace FILE] [--length-factor F] [--duplication K]
  [--workers N] [--engine-blocks B] [--block-size S] [--cadence vllm|sglang] [--prefill-chunk T]
  [--window-ms MS] [--seed N] [--requests N] [--warmup-ops N] [--quiescence-ms MS] [--spin-us US]
  [--max-drain-s S] [--query-hashes tokens|pre]
  [--route-threads N [--index-budget-mb MB] [--pin-threads]]
  [--sweep [--sweep-min-ms MS --sweep-max-ms MS --sweep-steps N]] [--json]`;

const flags = benchFlags(usage, {
  trace: { type: "string" },
  "length-factor": { type: "string" },
  duplication: { type: "string" },
  workers: { type: "string" },
  "engine-blocks": { type: "string" },
  "block-size": { type: "string" },
  cadence: { type: "string" },
  "prefill-chunk": { type: "string" },
  "window-ms": { type: "string" },
  seed: { type: "string" },
  requests: { type: "string" },
  "warmup-ops": { type: "string" },
  "quiescence-ms": { type: "string" },
  "spin-us": { type: "string" },
  "max-drain-s": { type: "string" },
  "route-threads": { type: "string" },
  sweep: { type: "boolean" },
  "sweep-min-ms": { type: "string" },
  "sweep-max-ms": { type: "string" },
  "sweep-steps": { type: "string" },
  json: { type: "boolean" },
  "index-budget-mb": { type: "string" },
  "pin-threads": { type: "boolean" },
  "query-hashes": { type: "string" },
});

function intFlag(name: string, value: string | undefined, fallback: number, min = 1): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < min) {
    console.error(`--${name} must be an integer >= ${min}, got ${value}`);
    process.exit(2);
  }
  return n;
}

const routeThreads = intFlag("route-threads", flags["route-threads"], 0, 0);
const blockSize = intFlag("block-size", flags["block-size"], 16);
const cadenceFlag = flags.cadence ?? (blockSize === 1 ? "sglang" : "vllm");
if (cadenceFlag !== "vllm" && cadenceFlag !== "sglang") {
  console.error(`--cadence must be vllm or sglang, got ${cadenceFlag}`);
  process.exit(2);
}
const queryHashes = flags["query-hashes"] ?? "tokens";
if (queryHashes !== "tokens" && queryHashes !== "pre") {
  console.error(`--query-hashes must be tokens or pre, got ${queryHashes}`);
  process.exit(2);
}
const config = {
  trace: flags.trace ?? join(import.meta.dir, "..", "data", "traces", "conversation_trace.jsonl"),
  lengthFactor: intFlag("length-factor", flags["length-factor"], 1),
  duplication: intFlag("duplication", flags.duplication, 1),
  workers: intFlag("workers", flags.workers, 128),
  // Dynamo's 16,384 blocks; below block size 16 the same tokens (16,384 x 16) per engine.
  engineBlocks: intFlag(
    "engine-blocks",
    flags["engine-blocks"],
    Math.max(16_384, Math.ceil(262_144 / blockSize)),
  ),
  blockSize,
  cadence: cadenceFlag as Cadence,
  prefillChunk: intFlag("prefill-chunk", flags["prefill-chunk"], 2048),
  windowMs: intFlag("window-ms", flags["window-ms"], 750),
  seed: intFlag("seed", flags.seed, 42, 0),
  requests: flags.requests === undefined ? undefined : intFlag("requests", flags.requests, 1),
  // Default: the whole corpus, on a throwaway index. With the first 20,000 ops the JIT
  // was still compiling the eviction and split paths after the clock (bench/JOURNAL.md,
  // "Compiles under the clock").
  warmupOps:
    flags["warmup-ops"] === undefined
      ? ("all" as const)
      : intFlag("warmup-ops", flags["warmup-ops"], 0, 0),
  quiescenceMs: intFlag("quiescence-ms", flags["quiescence-ms"], 1000, 0),
  spinUs: intFlag("spin-us", flags["spin-us"], 100, 0),
  maxDrainS: intFlag("max-drain-s", flags["max-drain-s"], 300),
  routeThreads,
  // tokens: a query carries its prompt and is hashed on the clock; pre: hashed before it.
  queryHashes: queryHashes as "tokens" | "pre",
  // --route-threads N: the shared index's budget (regions reserved, touched as used), pinning.
  indexBudgetMb: intFlag("index-budget-mb", flags["index-budget-mb"], 4096),
  pinThreads: flags["pin-threads"] === true,
};

if (flags.sweep === true) await sweep();
else await single();

async function single(): Promise<void> {
  const text = readFileSync(config.trace);
  const traceSha = createHash("sha256").update(text).digest("hex");
  const trace = transformTrace(parseTrace(text.toString("utf8")), {
    lengthFactor: config.lengthFactor,
    duplicationFactor: config.duplication,
    ...(config.requests === undefined ? {} : { requests: config.requests }),
  });
  const prepStart = performance.now();
  const corpus = buildCorpus(trace, config);
  const hashed = config.queryHashes === "pre" ? hashQueries(corpus, config.blockSize) : null;
  const prepS = (performance.now() - prepStart) / 1000;
  const run =
    config.routeThreads === 0 ? warmedReplay(corpus, hashed) : await replayOnLanes(corpus, hashed);
  const report = summarize(corpus, run, traceSha, prepS);
  if (flags.json === true) console.log(JSON.stringify(report));
  else printReport(report);
}

// ---- The path under test ----

/** One index and, per worker, what `kvedge serve` keeps for an engine stream. */
class Pipeline {
  readonly index: CrtcIndex | KvIndex;
  readonly sequencers: Sequencer[] = [];
  readonly normalizers: KvEventNormalizer[] = [];
  readonly matches = new MatchResult(256);
  readonly hasher = new PromptHasher();
  private readonly nextSeq: Uint32Array;

  constructor(
    workers: number,
    firstWorkerId: number,
    index: KvIndex = createIndex("crtc", config.blockSize),
  ) {
    // The index is the normalizer's writer, as in `kvedge serve` (src/core/core.ts).
    this.index = index;
    for (let w = 0; w < workers; w++) {
      const normalizer = new KvEventNormalizer({
        workerId: BigInt(firstWorkerId + w),
        dpRank: 0,
        blockSize: config.blockSize,
        sink: index,
      });
      this.normalizers.push(normalizer);
      this.sequencers.push(
        new Sequencer({
          apply: (_seq, payload) => normalizer.ingest(payload),
          reset: () => {
            throw new Error("sequence went backwards in the replay");
          },
        }),
      );
      this.sequencers[w]!.connected();
    }
    this.nextSeq = new Uint32Array(workers);
  }

  batch(worker: number, payload: Uint8Array): void {
    this.sequencers[worker]!.live(this.nextSeq[worker]!++, payload);
  }

  /** Hashes the prompt; returns the block count (findMatches is timed by the caller). */
  hash(tokens: Uint32Array): { local: Uint32Array; chain: Uint32Array; count: number } {
    const hashes = this.hasher.hash(tokens, config.blockSize, DEFAULT_SEED);
    return { local: hashes.local, chain: hashes.chain, count: hashes.blockCount };
  }
}

/** How many of `count` ops the warm-up replays (--warmup-ops; all by default). */
function warmupLimit(count: number): number {
  return config.warmupOps === "all" ? count : Math.min(config.warmupOps, count);
}

/** JIT warm-up of the same code on a throwaway index and other worker ids. */
function warmUp(corpus: Corpus, index?: KvIndex): void {
  const pipeline = new Pipeline(config.workers, 1_000_000, index);
  const limit = warmupLimit(corpus.count);
  for (let i = 0; i < limit; i++) {
    if (corpus.kind[i] === OP_QUERY) {
      const { local, chain, count } = pipeline.hash(corpus.tokens(i));
      pipeline.index.findMatches(local, count, pipeline.matches, chain);
    } else pipeline.batch(corpus.worker[i]!, corpus.payload(i));
  }
}

// ---- The timed replay ----

function warmedReplay(corpus: Corpus, hashed: QueryHashes[] | null): Run {
  warmUp(corpus);
  Bun.gc(true);
  if (config.quiescenceMs > 0) Bun.sleepSync(config.quiescenceMs);
  return replay(corpus, hashed);
}

/** --route-threads N: this thread writes a shared index, N lanes look up (indexer-replay-lanes.ts). */
async function replayOnLanes(corpus: Corpus, hashed: QueryHashes[] | null): Promise<Run> {
  const options = { budgetBytes: config.indexBudgetMb * 2 ** 20, maxReaders: config.routeThreads };
  const warm = createSharedIndex(config.blockSize, options);
  warmUp(corpus, warm.index);
  const shared = createSharedIndex(config.blockSize, options);
  const pipeline = new Pipeline(config.workers, 1, shared.index);
  Bun.gc(true);
  if (config.quiescenceMs > 0) Bun.sleepSync(config.quiescenceMs);
  const batch = (worker: number, payload: Uint8Array) => pipeline.batch(worker, payload);
  const lanes = await replayLanes(corpus, hashed, batch, warm.descriptor, shared.descriptor, {
    lanes: config.routeThreads,
    blockSize: config.blockSize,
    spinNs: config.spinUs * 1000,
    maxNs: config.windowMs * 1e6 + config.maxDrainS * 1e9,
    warmLookups: Math.min(warmupLimit(corpus.count), 5000),
    pin: config.pinThreads,
  });
  // Scheduled -> finished modeled for 1..64 lanes on cores of their own, from measured
  // costs; also over the queries that share no deadline (as sched_to_finish_outside_bursts).
  const { shared: inBurst } = sharedDeadlines(corpus);
  const modeled = (costs: Float64Array, outsideBursts = false) => {
    return Object.fromEntries(
      [1, 2, 4, 8, 16, 64].map((n) => {
        const ns = ownCoreModel(corpus, costs, n).filter((value, i) => {
          return !Number.isNaN(value) && !(outsideBursts && inBurst[i] === 1);
        });
        return [n, distribution(ns)];
      }),
    );
  };
  const writeBlocks = corpus.totals.storedBlocks + corpus.totals.removedBlocks;
  const threads = {
    writer_cpu_s: lanes.writerCpuS,
    writer_runqueue_wait_s: lanes.writerRunqueueWaitS,
    lanes: lanes.lanes,
    writer: { ...shared.counters },
    // Write capacity: the writer thread's own CPU (compare config.write_blocks_per_cpu_s at 0).
    write_blocks_per_writer_cpu_s: Math.round(writeBlocks / lanes.writerCpuS),
    own_core_sched_to_finish_by_lanes: modeled(lanes.queryCosts),
    own_core_lookup_only_by_lanes: modeled(lanes.lookupCosts),
    own_core_sched_to_finish_outside_bursts_by_lanes: modeled(lanes.queryCosts, true),
  };
  return { ...lanes, pipeline, threads };
}

interface Run {
  readonly pipeline: Pipeline;
  /** Per op, ns relative to the run start: accepted, started, finished; service for queries. */
  readonly accepted: Float64Array;
  readonly started: Float64Array;
  readonly finished: Float64Array;
  readonly service: Float64Array;
  /** Per query: the longest prefix any worker holds, read after the timer (one thread only). */
  readonly matched?: Float64Array;
  readonly lastAccepted: number;
  readonly lastFinished: number;
  readonly completed: number;
  readonly busyWriteNs: number;
  /** CPU seconds (user + system) the process used during the replay. */
  readonly cpuS: number;
  /** --route-threads N: writer and lane CPU, reader and writer protocol counters. */
  readonly threads?: unknown;
}

function replay(corpus: Corpus, hashed: QueryHashes[] | null): Run {
  const n = corpus.count;
  const pipeline = new Pipeline(config.workers, 1);
  const accepted = new Float64Array(n);
  const started = new Float64Array(n);
  const finished = new Float64Array(n);
  const service = new Float64Array(n);
  const matched = new Float64Array(n);
  const queries = new Int32Array(n);
  const batches = new Int32Array(n);
  let qHead = 0,
    qTail = 0,
    bHead = 0,
    bTail = 0,
    next = 0,
    completed = 0,
    busyWriteNs = 0;
  const { deadline, kind, worker } = corpus;
  const { index, matches } = pipeline;
  const spinNs = config.spinUs * 1000;
  const maxNs = config.windowMs * 1e6 + config.maxDrainS * 1e9;
  const cpuBefore = process.cpuUsage();
  const origin = Bun.nanoseconds() + 20e6;
  let now = 0;
  while (completed < n) {
    now = Bun.nanoseconds() - origin;
    while (next < n && deadline[next]! <= now) {
      accepted[next] = now;
      if (kind[next] === OP_QUERY) queries[qTail++] = next;
      else batches[bTail++] = next;
      next++;
    }
    if (qHead < qTail) {
      const i = queries[qHead++]!;
      started[i] = now;
      const { local, chain, count } = hashed?.[i] ?? pipeline.hash(corpus.tokens(i));
      const before = Bun.nanoseconds();
      index.findMatches(local, count, matches, chain);
      const after = Bun.nanoseconds();
      service[i] = after - before;
      finished[i] = after - origin;
      matched[i] = longestMatch(matches);
      completed++;
    } else if (bHead < bTail) {
      const i = batches[bHead++]!;
      started[i] = now;
      pipeline.batch(worker[i]!, corpus.payload(i));
      finished[i] = Bun.nanoseconds() - origin;
      busyWriteNs += finished[i]! - now;
      completed++;
    } else if (next < n) {
      const wait = deadline[next]! - now;
      if (wait > spinNs) Bun.sleepSync((wait - spinNs) / 1e6);
      while (Bun.nanoseconds() - origin < deadline[next]!) {
        /* spin to the deadline */
      }
    }
    if (now > maxNs) break;
  }
  const cpu = process.cpuUsage(cpuBefore);
  let lastFinished = 0;
  for (let i = 0; i < n; i++) if (finished[i]! > lastFinished) lastFinished = finished[i]!;
  return {
    pipeline,
    accepted,
    started,
    finished,
    service,
    matched,
    completed,
    busyWriteNs,
    lastFinished,
    cpuS: (cpu.user + cpu.system) / 1e6,
    lastAccepted: next === 0 ? 0 : accepted[next - 1]!,
  };
}

function longestMatch(matches: MatchResult): number {
  let longest = 0;
  for (let k = 0; k < matches.count; k++) longest = Math.max(longest, matches.blocks[k]!);
  return longest;
}

// ---- Report ----

interface Distribution {
  p50_ns: number;
  p99_ns: number;
  p999_ns: number;
  max_ns: number;
}
interface Quantiles {
  p50: number;
  p99: number;
  p999: number;
  max: number;
}

function quantiles(values: Float64Array): Quantiles {
  const sorted = values.slice().sort();
  const at = (q: number) =>
    sorted.length === 0
      ? 0
      : Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!);
  return {
    p50: at(0.5),
    p99: at(0.99),
    p999: at(0.999),
    max: sorted.length === 0 ? 0 : Math.round(sorted[sorted.length - 1]!),
  };
}

function distribution(values: Float64Array): Distribution {
  const q = quantiles(values);
  return { p50_ns: q.p50, p99_ns: q.p99, p999_ns: q.p999, max_ns: q.max };
}

/**
 * A lookup walks the matched prefix, so its service time grows with the longest match
 * (page size 16 makes a prompt 8x the blocks of Dynamo's 128-token blocks).
 */
function matchDepth(corpus: Corpus, run: Run, matched: Float64Array) {
  const deep = select(corpus, OP_QUERY, (i) => matched[i]!);
  const perBlock = select(corpus, OP_QUERY, (i) => run.service[i]! / matched[i]!);
  return {
    matched_blocks: quantiles(deep),
    service_ns_per_matched_block: distribution(perBlock.filter((_, k) => deep[k]! >= 16)),
  };
}

/**
 * A diagnostic, never the headline: every worker's timeline starts at 0 (and ends at
 * the window), so about one query per worker falls due at once and is served behind
 * the others. The same distribution over the queries whose deadline no other query has.
 */
interface DeadlineBursts {
  /** Per op, 1 if a query shares its deadline with another query (a same-deadline burst). */
  readonly shared: Uint8Array;
  /** Queries in bursts, and the largest burst. */
  readonly inBursts: number;
  readonly largest: number;
}

function sharedDeadlines(corpus: Corpus): DeadlineBursts {
  const { deadline, kind } = corpus;
  const shared = new Uint8Array(corpus.count);
  let largest = 0;
  let inBursts = 0;
  for (let i = 0; i < corpus.count; ) {
    let end = i;
    let queries = 0;
    for (; end < corpus.count && deadline[end] === deadline[i]; end++) {
      if (kind[end] === OP_QUERY) queries++;
    }
    if (queries > 1) {
      shared.fill(1, i, end);
      inBursts += queries;
      largest = Math.max(largest, queries);
    }
    i = end;
  }
  return { shared, inBursts, largest };
}

function deadlineBursts(corpus: Corpus, run: Run) {
  const { deadline, kind } = corpus;
  const { shared, inBursts, largest } = sharedDeadlines(corpus);
  const alone: number[] = [];
  for (let i = 0; i < corpus.count; i++) {
    if (kind[i] === OP_QUERY && shared[i] === 0) alone.push(run.finished[i]! - deadline[i]!);
  }
  return {
    deadline_bursts: { queries: inBursts, largest },
    sched_to_finish_outside_bursts: distribution(Float64Array.from(alone)),
  };
}

function hashNs(run: Run, i: number): number {
  return run.finished[i]! - run.started[i]! - run.service[i]!;
}

function select(corpus: Corpus, wanted: number, value: (i: number) => number): Float64Array {
  const out: number[] = [];
  for (let i = 0; i < corpus.count; i++)
    if ((corpus.kind[i] === OP_QUERY) === (wanted === OP_QUERY)) out.push(value(i));
  return Float64Array.from(out);
}

function failures(corpus: Corpus, run: Run): string[] {
  const reasons: string[] = [];
  const windowNs = config.windowMs * 1e6;
  if (run.completed !== corpus.count)
    reasons.push(
      `drain unfinished: ${corpus.count - run.completed} ops left after ${config.maxDrainS} s`,
    );
  if (run.lastAccepted > 1.01 * windowNs)
    reasons.push(`ops accepted late: last at ${(run.lastAccepted / 1e6).toFixed(1)} ms`);
  const { pipeline } = run;
  const blocksOf = new Map<bigint, number>();
  for (const info of pipeline.index.workers()) blocksOf.set(info.workerId, info.blocks);
  let dropped = 0,
    rejected = 0,
    unknown = 0,
    lost = 0,
    wrong = 0;
  for (let w = 0; w < config.workers; w++) {
    const counters = pipeline.normalizers[w]!.counters;
    dropped += counters.batchesDropped;
    for (const count of Object.values(counters.rejectedEvents)) rejected += count;
    const sequencer = pipeline.sequencers[w]!;
    // A worker that never published stays unknown (degraded) in `kvedge serve` too.
    lost +=
      sequencer.counters.lost + (sequencer.isDegraded && corpus.workerBatches[w]! > 0 ? 1 : 0);
    if (run.completed === corpus.count && sequencer.lastSeq !== corpus.workerBatches[w]! - 1)
      lost++;
    if (
      run.completed === corpus.count &&
      (blocksOf.get(BigInt(w + 1)) ?? 0) !== corpus.engineBlocks[w]
    )
      wrong++;
  }
  const counters = pipeline.index.counters;
  rejected += pipeline.index.stats().rejected.total + counters.hashConflicts;
  unknown += counters.blocksUnknown;
  if (dropped > 0) reasons.push(`${dropped} batches dropped by the decoder`);
  if (rejected > 0) reasons.push(`${rejected} events or blocks rejected`);
  if (unknown > 0) reasons.push(`${unknown} removals of unknown blocks`);
  if (lost > 0) reasons.push(`${lost} workers with batches lost, out of order or degraded`);
  if (wrong > 0)
    reasons.push(`${wrong} workers whose index blocks differ from their engine's cache`);
  return reasons;
}

function summarize(corpus: Corpus, run: Run, traceSha: string, prepS: number) {
  const t = corpus.totals;
  const spanS = run.lastFinished / 1e9;
  const reasons = failures(corpus, run);
  const stats = run.pipeline.index.stats();
  const writeBlocks = t.storedBlocks + t.removedBlocks;
  const hwm = /VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
  return {
    achieved_block_ops_per_s: Math.round(corpus.totalBlockOps / spanS),
    offered_block_ops_per_s: Math.round(corpus.totalBlockOps / (config.windowMs / 1000)),
    kept_up: reasons.length === 0 && run.lastFinished <= 1.1 * config.windowMs * 1e6,
    valid: reasons.length === 0,
    drain_s: Math.max(0, run.lastFinished - run.lastAccepted) / 1e9,
    lookup: {
      service: distribution(select(corpus, OP_QUERY, (i) => run.service[i]!)),
      queue_wait: distribution(select(corpus, OP_QUERY, (i) => run.started[i]! - run.accepted[i]!)),
      sched_to_finish: distribution(
        select(corpus, OP_QUERY, (i) => run.finished[i]! - corpus.deadline[i]!),
      ),
      // Started -> finished minus the lookup: hashing the prompt (and the clock reads).
      hash: distribution(select(corpus, OP_QUERY, (i) => hashNs(run, i))),
      ...deadlineBursts(corpus, run),
      ...(run.matched === undefined ? {} : matchDepth(corpus, run, run.matched)),
    },
    update: {
      accepted_to_finished: distribution(
        select(corpus, OP_BATCH, (i) => run.finished[i]! - run.accepted[i]!),
      ),
      sched_to_finish: distribution(
        select(corpus, OP_BATCH, (i) => run.finished[i]! - corpus.deadline[i]!),
      ),
      write_blocks_per_s: Math.round(writeBlocks / spanS),
      write_blocks_per_busy_s: Math.round(writeBlocks / (run.busyWriteNs / 1e9)),
      batches: t.batches,
      stored_events: t.storedEvents,
      removed_events: t.removedEvents,
      stored_blocks: t.storedBlocks,
      removed_blocks: t.removedBlocks,
    },
    peak_rss_mb: hwm === null ? 0 : Math.round(Number(hwm[1]) / 1024),
    ...(run.threads === undefined ? {} : { threads: run.threads }),
    bytes_per_pair: stats.blocks === 0 ? 0 : Number((stats.bytes / stats.blocks).toFixed(1)),
    config: {
      ...config,
      requests: t.requests,
      requests_skipped: t.requestsSkipped,
      query_blocks: t.queryBlocks,
      total_block_ops: corpus.totalBlockOps,
      ops: corpus.count,
      span_s: spanS,
      replay_cpu_s: Number(run.cpuS.toFixed(3)),
      // On a shared machine the wall clock also counts time the process was not running.
      block_ops_per_cpu_s: Math.round(corpus.totalBlockOps / run.cpuS),
      write_blocks_per_cpu_s: Math.round(writeBlocks / run.cpuS),
      prep_s: Number(prepS.toFixed(1)),
      payload_mb: Math.round(t.payloadBytes / 2 ** 20),
      query_token_mb: Math.round(t.queryTokenBytes / 2 ** 20),
      index: { blocks: stats.blocks, nodes: stats.nodes, bytes: stats.bytes },
      failure_reasons: reasons,
      provenance: {
        ...provenance(),
        trace_sha256: traceSha,
        command: process.argv.slice(2).join(" "),
      },
    },
  };
}

type Report = ReturnType<typeof summarize>;

function printReport(r: Report): void {
  const us = (ns: number) => (ns / 1000).toFixed(2);
  const d = (x: Distribution) =>
    `p50 ${us(x.p50_ns)} / p99 ${us(x.p99_ns)} / p999 ${us(x.p999_ns)} / max ${us(x.max_ns)} us`;
  console.log(
    `indexer replay: ${r.config.requests} requests, ${r.config.workers} workers, block size ${r.config.blockSize}, ${r.config.cadence} cadence, window ${r.config.windowMs} ms`,
  );
  console.log(
    `  block ops ${r.config.total_block_ops} (queries ${r.config.query_blocks}, stored ${r.update.stored_blocks}, removed ${r.update.removed_blocks}); prep ${r.config.prep_s} s`,
  );
  console.log(
    `  achieved ${(r.achieved_block_ops_per_s / 1e6).toFixed(2)} M block ops/s, offered ${(r.offered_block_ops_per_s / 1e6).toFixed(2)} M/s; span ${r.config.span_s.toFixed(3)} s (CPU ${r.config.replay_cpu_s} s), drain ${r.drain_s.toFixed(3)} s`,
  );
  console.log(
    `  per CPU second of the replay: ${(r.config.block_ops_per_cpu_s / 1e6).toFixed(2)} M block ops, ${(r.config.write_blocks_per_cpu_s / 1e6).toFixed(2)} M writes`,
  );
  console.log(
    `  writes ${(r.update.write_blocks_per_s / 1e6).toFixed(2)} M blocks/s (${(r.update.write_blocks_per_busy_s / 1e6).toFixed(2)} M per busy second)`,
  );
  console.log(`  lookup service ${d(r.lookup.service)}`);
  console.log(`  lookup queue wait ${d(r.lookup.queue_wait)}`);
  console.log(`  lookup scheduled->finished ${d(r.lookup.sched_to_finish)}`);
  const bursts = r.lookup.deadline_bursts;
  const outside = d(r.lookup.sched_to_finish_outside_bursts);
  const inBursts = `${bursts.queries} queries in them, largest ${bursts.largest}`;
  console.log(`    outside same-deadline bursts (${inBursts}; a diagnostic): ${outside}`);
  const m = r.lookup.matched_blocks;
  const per = r.lookup.service_ns_per_matched_block;
  if (m !== undefined && per !== undefined) {
    console.log(`  longest match per lookup: p50 ${m.p50} / p99 ${m.p99} / max ${m.max} blocks`);
    console.log(
      `  lookup service per matched block (16+): p50 ${per.p50_ns} / p99 ${per.p99_ns} ns`,
    );
  }
  console.log(`  update accepted->finished ${d(r.update.accepted_to_finished)}`);
  console.log(
    `  valid ${r.valid}, kept up ${r.kept_up}${r.config.failure_reasons.length > 0 ? `: ${r.config.failure_reasons.join("; ")}` : ""}`,
  );
  console.log(
    `  index ${r.config.index.blocks} pairs, ${r.bytes_per_pair} bytes/pair; peak RSS ${r.peak_rss_mb} MB`,
  );
}

// ---- Sweep: one fresh process per window ----

async function sweep(): Promise<void> {
  const min = intFlag("sweep-min-ms", flags["sweep-min-ms"], 750);
  const max = intFlag("sweep-max-ms", flags["sweep-max-ms"], 24_000);
  const steps = intFlag("sweep-steps", flags["sweep-steps"], 6, 2);
  const passThrough = process.argv.slice(2).filter((arg, i, all) => {
    const flag = arg.startsWith("--") ? arg : all[i - 1];
    return !/^--(sweep|sweep-min-ms|sweep-max-ms|sweep-steps|window-ms|json)$/.test(flag ?? "");
  });
  const cells: { window_ms: number; report: Report }[] = [];
  for (let s = 0; s < steps; s++) {
    const windowMs = Math.round(min * (max / min) ** (s / (steps - 1)));
    const child = Bun.spawnSync(
      [
        process.execPath,
        import.meta.path,
        ...passThrough,
        "--window-ms",
        String(windowMs),
        "--json",
      ],
      {
        stdout: "pipe",
        stderr: "inherit",
      },
    );
    if (child.exitCode !== 0) throw new Error(`sweep cell ${windowMs} ms exited ${child.exitCode}`);
    const report = JSON.parse(child.stdout.toString().trim().split("\n").at(-1)!) as Report;
    cells.push({ window_ms: windowMs, report });
    if (flags.json !== true) {
      console.log(
        `window ${windowMs} ms: achieved ${(report.achieved_block_ops_per_s / 1e6).toFixed(2)} M/s, kept up ${report.kept_up}, valid ${report.valid}, service p50 ${report.lookup.service.p50_ns} ns p99 ${report.lookup.service.p99_ns} ns`,
      );
    }
  }
  const keepUp = cells.find((cell) => cell.report.kept_up) ?? null;
  const result = {
    keep_up_window_ms: keepUp?.window_ms ?? null,
    keep_up: keepUp?.report ?? null,
    cells,
  };
  if (flags.json === true) console.log(JSON.stringify(result));
  else
    console.log(
      keepUp === null
        ? "no window kept up"
        : `shortest window that kept up: ${keepUp.window_ms} ms`,
    );
}
