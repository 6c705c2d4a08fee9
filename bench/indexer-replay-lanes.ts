/**
 * `bench/indexer-replay.ts --route-threads N`: this thread is the writer (it applies the
 * batches at their deadlines through the same sequencer -> normalizer -> index path,
 * into a crtc in shared memory); N route-lane Workers (./indexer-replay-lane.ts) take
 * the queries, round-robin in deadline order, and look up on the shared index without
 * waiting for the writer. Same clock and the same per-op stamps as the one-thread
 * replay, so the report is the same JSON.
 */
import { readFileSync, readlinkSync } from "node:fs";
import type { SharedIndexDescriptor } from "../src/index/crtc/shared";
import { pinProcess } from "../src/runtime/affinity";
import { OP_QUERY, type Corpus, type QueryHashes } from "./indexer-replay-corpus";

export interface LaneQueries {
  /**
   * Every query back to back, query q at words[offsets[q], offsets[q + 1]): its prompt's
   * tokens, or (`hashed`) its local block hashes as (hi, lo) pairs, computed beforehand.
   */
  readonly words: Uint32Array;
  readonly offsets: Uint32Array;
  readonly hashed: boolean;
  /** ns from the origin, ascending. */
  readonly deadlines: Float64Array;
}

export interface LaneStart {
  readonly lane: number;
  readonly blockSize: number;
  readonly spinNs: number;
  readonly maxNs: number;
  readonly warmLookups: number;
  readonly warm: SharedIndexDescriptor;
  readonly index: SharedIndexDescriptor;
  readonly queries: LaneQueries;
  /** Pin this thread to this CPU, or -1. */
  readonly cpu: number;
}

export interface LaneResult {
  readonly lane: number;
  readonly accepted: Float64Array;
  readonly started: Float64Array;
  readonly finished: Float64Array;
  readonly service: Float64Array;
  readonly completed: number;
  /** Seconds on a CPU, and runnable but waiting for one (the scheduler's accounting). */
  readonly cpuS: number;
  readonly runqueueWaitS: number;
  /** Seconds the lane wanted a CPU: its run, less its sleeps (it spins otherwise). */
  readonly neededS: number;
  readonly stats: Record<string, number>;
}

/** This thread's ns on a CPU and ns runnable but waiting for one (/proc schedstat). */
export function threadSchedNs(): { runNs: number; waitNs: number } {
  const [run, wait] = readFileSync("/proc/thread-self/schedstat", "utf8").split(" ");
  return { runNs: Number(run), waitNs: Number(wait) };
}

/** The calling thread's Linux thread id. */
export function threadId(): number {
  return Number(readlinkSync("/proc/thread-self").split("/").at(-1));
}

export interface LanesOptions {
  readonly lanes: number;
  readonly blockSize: number;
  readonly spinNs: number;
  readonly maxNs: number;
  readonly warmLookups: number;
  /**
   * Lane i on CPU 1 + i (mod the CPUs); the writer and every other thread of the process
   * (the runtime's JIT, GC and allocator threads) on CPU 0, so a lane's core is its own.
   */
  readonly pin: boolean;
}

export interface LaneSummary {
  readonly cpuS: number;
  readonly runqueueWaitS: number;
  readonly neededS: number;
  readonly queries: number;
  readonly stats: Record<string, number>;
}

export interface LanesRun {
  readonly accepted: Float64Array;
  readonly started: Float64Array;
  readonly finished: Float64Array;
  readonly service: Float64Array;
  readonly lastAccepted: number;
  readonly lastFinished: number;
  readonly completed: number;
  readonly busyWriteNs: number;
  /** CPU seconds of the whole process (every thread), origin to the last lane's result. */
  readonly cpuS: number;
  /** CPU seconds of the writer thread alone, and its seconds waiting for a CPU. */
  readonly writerCpuS: number;
  readonly writerRunqueueWaitS: number;
  readonly lanes: LaneSummary[];
  /**
   * Per query (NaN for batches): its measured cost, hash + lookup (started -> finished),
   * clipped at the p90, which drops time a shared host held the lane off the CPU
   * mid-query (the p90 still has some). The input of `ownCoreModel`.
   */
  readonly queryCosts: Float64Array;
  /** The same with the lookup alone (queries hashed beforehand, as Dynamo's are). */
  readonly lookupCosts: Float64Array;
}

/** Splits the corpus's queries over the lanes: round-robin in deadline order. */
function laneQueries(
  corpus: Corpus,
  hashed: QueryHashes[] | null,
  lanes: number,
): { ops: number[][]; starts: LaneStart["queries"][] } {
  const wordsOf = (i: number) => (hashed === null ? corpus.tokens(i) : hashed[i]!.words);
  const ops: number[][] = Array.from({ length: lanes }, () => []);
  let q = 0;
  for (let i = 0; i < corpus.count; i++) if (corpus.kind[i] === OP_QUERY) ops[q++ % lanes]!.push(i);
  const starts = ops.map((list) => {
    let total = 0;
    for (const i of list) total += wordsOf(i).length;
    const words = new Uint32Array(total);
    const offsets = new Uint32Array(list.length + 1);
    const deadlines = new Float64Array(list.length);
    let at = 0;
    list.forEach((i, k) => {
      const query = wordsOf(i);
      words.set(query, at);
      offsets[k] = at;
      at += query.length;
      offsets[k + 1] = at;
      deadlines[k] = corpus.deadline[i]!;
    });
    return { words, offsets, deadlines, hashed: hashed !== null };
  });
  return { ops, starts };
}

function message<T>(worker: Worker, key: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (event: MessageEvent) => {
      if (!(key in event.data)) return;
      worker.removeEventListener("message", onMessage);
      resolve(event.data[key] as T);
    };
    worker.addEventListener("message", onMessage);
    worker.addEventListener("error", (event) => {
      reject(new Error(`route lane failed: ${event.message}`));
    });
  });
}

export async function replayLanes(
  corpus: Corpus,
  hashed: QueryHashes[] | null,
  batch: (worker: number, payload: Uint8Array) => void,
  warm: SharedIndexDescriptor,
  index: SharedIndexDescriptor,
  options: LanesOptions,
): Promise<LanesRun> {
  const cpus = navigator.hardwareConcurrency;
  const { ops, starts } = laneQueries(corpus, hashed, options.lanes);
  const script = new URL("./indexer-replay-lane.ts", import.meta.url).href;
  // Threads started from here on inherit CPU 0; the lanes move themselves.
  if (options.pin) pinProcess([0]);
  const workers = starts.map(() => new Worker(script));
  try {
    const ready = workers.map((worker) => message<number>(worker, "ready"));
    starts.forEach((queries, lane) => {
      const start: LaneStart = {
        lane,
        queries,
        warm,
        index,
        blockSize: options.blockSize,
        spinNs: options.spinNs,
        maxNs: options.maxNs,
        warmLookups: options.warmLookups,
        cpu: options.pin ? (1 + lane) % cpus : -1,
      };
      workers[lane]!.postMessage({ start });
    });
    const laneThreads = await Promise.all(ready);
    // Threads the lanes' runtime started after they moved: back to CPU 0.
    if (options.pin) pinProcess([0], laneThreads);
    const results = workers.map((worker) => message<LaneResult>(worker, "result"));
    const cpuBefore = process.cpuUsage();
    const origin = Bun.nanoseconds() + 20e6;
    const mainTimeOrigin = performance.timeOrigin;
    for (const worker of workers) worker.postMessage({ origin, mainTimeOrigin });
    const writer = writeAtDeadlines(corpus, batch, origin, options);
    const lanes = await Promise.all(results);
    const cpu = process.cpuUsage(cpuBefore);
    return merge(corpus, writer, lanes, ops, (cpu.user + cpu.system) / 1e6);
  } finally {
    for (const worker of workers) worker.terminate();
  }
}

interface WriterRun {
  accepted: Float64Array;
  started: Float64Array;
  finished: Float64Array;
  lastAccepted: number;
  busyWriteNs: number;
  writerCpuS: number;
  writerRunqueueWaitS: number;
}

/** The one-thread replay's loop with the queries taken out: batches at their deadlines. */
function writeAtDeadlines(
  corpus: Corpus,
  batch: (worker: number, payload: Uint8Array) => void,
  origin: number,
  options: LanesOptions,
): WriterRun {
  const n = corpus.count;
  const accepted = new Float64Array(n);
  const started = new Float64Array(n);
  const finished = new Float64Array(n);
  const { deadline, kind, worker } = corpus;
  const queue = new Int32Array(n);
  let head = 0,
    tail = 0,
    next = 0,
    busyWriteNs = 0,
    lastAccepted = 0;
  let remaining = 0;
  for (let i = 0; i < n; i++) if (kind[i] !== OP_QUERY) remaining++;
  const before = threadSchedNs();
  // Bounded: every batch is applied once, and the loop gives up past maxNs.
  while (remaining > 0) {
    const now = Bun.nanoseconds() - origin;
    while (next < n && deadline[next]! <= now) {
      if (kind[next] !== OP_QUERY) {
        accepted[next] = lastAccepted = now;
        queue[tail++] = next;
      }
      next++;
    }
    if (head < tail) {
      const i = queue[head++]!;
      started[i] = now;
      batch(worker[i]!, corpus.payload(i));
      finished[i] = Bun.nanoseconds() - origin;
      busyWriteNs += finished[i]! - now;
      remaining--;
    } else if (next < n) {
      const wait = deadline[next]! - now;
      if (wait > options.spinNs) Bun.sleepSync((wait - options.spinNs) / 1e6);
      while (Bun.nanoseconds() - origin < deadline[next]!) {
        /* spin to the deadline */
      }
    }
    if (now > options.maxNs) break;
  }
  const after = threadSchedNs();
  const writerCpuS = (after.runNs - before.runNs) / 1e9;
  const writerRunqueueWaitS = (after.waitNs - before.waitNs) / 1e9;
  return {
    accepted,
    started,
    finished,
    lastAccepted,
    busyWriteNs,
    writerCpuS,
    writerRunqueueWaitS,
  };
}

/** Per query (by op index; NaN for batches): its measured cost, clipped at the p90. */
function clippedCosts(
  corpus: Corpus,
  lanes: LaneResult[],
  ops: number[][],
  costsOf: (lane: LaneResult) => Float64Array,
): Float64Array {
  const costs = new Float64Array(corpus.count).fill(NaN);
  for (const lane of lanes) {
    const measured = costsOf(lane);
    // The time a shared host held the thread off the CPU mid-query is not a lane's cost.
    const cap = measured.slice().sort()[Math.floor(0.9 * (measured.length - 1))] ?? 0;
    ops[lane.lane]!.forEach((i, k) => {
      costs[i] = Math.min(measured[k]!, cap);
    });
  }
  return costs;
}

/**
 * Scheduled -> finished per query (NaN for batches) if `lanes` lanes, each on a core of
 * its own, took the queries round-robin in deadline order and served them in order
 * at those costs.
 */
export function ownCoreModel(corpus: Corpus, costs: Float64Array, lanes: number): Float64Array {
  const modeled = new Float64Array(corpus.count).fill(NaN);
  const free = new Float64Array(lanes);
  let q = 0;
  for (let i = 0; i < corpus.count; i++) {
    if (corpus.kind[i] !== OP_QUERY) continue;
    const lane = q++ % lanes;
    free[lane] = Math.max(free[lane]!, corpus.deadline[i]!) + costs[i]!;
    modeled[i] = free[lane]! - corpus.deadline[i]!;
  }
  return modeled;
}

function merge(
  corpus: Corpus,
  writer: WriterRun,
  lanes: LaneResult[],
  ops: number[][],
  cpuS: number,
): LanesRun {
  const { accepted, started, finished } = writer;
  const service = new Float64Array(corpus.count);
  let completed = 0;
  let lastAccepted = writer.lastAccepted;
  for (let i = 0; i < corpus.count; i++) {
    if (corpus.kind[i] !== OP_QUERY && finished[i]! > 0) completed++;
  }
  for (const lane of lanes) {
    const list = ops[lane.lane]!;
    list.forEach((i, k) => {
      accepted[i] = lane.accepted[k]!;
      started[i] = lane.started[k]!;
      finished[i] = lane.finished[k]!;
      service[i] = lane.service[k]!;
      if (lane.accepted[k]! > lastAccepted) lastAccepted = lane.accepted[k]!;
    });
    completed += lane.completed;
  }
  let lastFinished = 0;
  for (let i = 0; i < corpus.count; i++) lastFinished = Math.max(lastFinished, finished[i]!);
  const queryCosts = clippedCosts(corpus, lanes, ops, (lane) => {
    return lane.finished.map((end, k) => end - lane.started[k]!);
  });
  const lookupCosts = clippedCosts(corpus, lanes, ops, (lane) => lane.service);
  return {
    accepted,
    started,
    finished,
    service,
    lastAccepted,
    lastFinished,
    completed,
    queryCosts,
    lookupCosts,
    busyWriteNs: writer.busyWriteNs,
    cpuS,
    writerCpuS: writer.writerCpuS,
    writerRunqueueWaitS: writer.writerRunqueueWaitS,
    lanes: lanes.map((lane) => ({
      cpuS: Number(lane.cpuS.toFixed(3)),
      runqueueWaitS: Number(lane.runqueueWaitS.toFixed(3)),
      neededS: Number(lane.neededS.toFixed(3)),
      queries: lane.accepted.length,
      stats: lane.stats,
    })),
  };
}
