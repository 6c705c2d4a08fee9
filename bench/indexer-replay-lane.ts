/**
 * One route lane of `bench/indexer-replay.ts --route-threads N` (a Worker): attaches to
 * the shared index by descriptor and issues its share of the queries at their
 * deadlines, as the one-thread replay does (sleep to the deadline, then spin; accept
 * every query whose deadline passed, serve them in order): the prompt hashed
 * (PromptHasher), then `findMatches` on the shared index (timed as the service); with
 * queries hashed beforehand (`--query-hashes pre`), `findMatches` alone.
 * Times are ns from the run's origin on this thread's clock; the main thread gives the
 * origin in its clock and the two clocks' offset (their time origins). Imported by
 * nothing: it is a Worker's entry (its message handler would keep a main thread alive).
 */
import { attach, type SharedIndexReader } from "../src/index/crtc/shared";
import { DEFAULT_SEED } from "../src/hash";
import { MatchResult } from "../src/index/types";
import { type QueryHashes, queryHashesOf } from "./indexer-replay-corpus";
import { PromptHasher } from "../src/route";
import { pinThread } from "../src/runtime/affinity";
import { type LaneResult, type LaneStart, threadId, threadSchedNs } from "./indexer-replay-lanes";

/** What findMatches takes of a query. */
type Query = Pick<QueryHashes, "local" | "chain" | "count">;

declare const self: Worker;

let go: (origin: number) => void = () => {};
const started = new Promise<number>((resolve) => (go = resolve));

self.onmessage = (event: MessageEvent) => {
  const message = event.data as { start?: LaneStart; origin?: number; mainTimeOrigin?: number };
  if (message.start !== undefined) prepare(message.start);
  else if (message.origin !== undefined) {
    // Main's clock to this thread's: both count from their time origins.
    go(message.origin - (performance.timeOrigin - message.mainTimeOrigin!) * 1e6);
  }
};

function prepare(start: LaneStart): void {
  if (start.cpu >= 0) pinThread([start.cpu]);
  const hasher = new PromptHasher();
  const out = new MatchResult(256);
  const hashed = start.queries.hashed ? hashedQueries(start) : null;
  // JIT warm-up on a throwaway index, then the real one.
  const warm = attach(start.warm);
  const n = start.queries.deadlines.length;
  for (let i = 0; i < Math.min(start.warmLookups, n); i++) {
    const { local, chain, count } = hashed?.[i] ?? hash(start, hasher, i);
    warm.findMatches(local, count, out, chain);
  }
  warm.close();
  const reader = attach(start.index);
  // As the one-thread replay does before its clock: no collection left due from the warm-up
  // (one at the start stopped the lane for 2-14 ms while the t=0 burst waited).
  Bun.gc(true);
  postMessage({ ready: threadId() });
  void started.then((origin) => {
    const result = run(start, reader, hasher, hashed, out, origin);
    postMessage({ result });
    reader.close();
  });
}

/** Query i's prompt hashed (views of the hasher's buffers, valid until its next call). */
function hash(start: LaneStart, hasher: PromptHasher, i: number): Query {
  const { words, offsets } = start.queries;
  const prompt = words.subarray(offsets[i]!, offsets[i + 1]!);
  const hashes = hasher.hash(prompt, start.blockSize, DEFAULT_SEED);
  return { local: hashes.local, chain: hashes.chain, count: hashes.blockCount };
}

/** Pre-hashed queries: a view of each one's hashes, made before the clock. */
function hashedQueries(start: LaneStart): QueryHashes[] {
  const { words, offsets, deadlines } = start.queries;
  return Array.from(deadlines, (_, i) => {
    return queryHashesOf(words.subarray(offsets[i]!, offsets[i + 1]!));
  });
}

function run(
  start: LaneStart,
  reader: SharedIndexReader,
  hasher: PromptHasher,
  hashed: QueryHashes[] | null,
  out: MatchResult,
  origin: number,
): LaneResult {
  const { deadlines } = start.queries;
  const n = deadlines.length;
  const accepted = new Float64Array(n);
  const began = new Float64Array(n);
  const finished = new Float64Array(n);
  const service = new Float64Array(n);
  const { spinNs, maxNs } = start;
  const schedBefore = threadSchedNs();
  const begin = Bun.nanoseconds();
  let sleptNs = 0;
  let head = 0;
  let next = 0;
  let completed = 0;
  // Bounded: every query is served once, and the loop gives up past maxNs.
  while (completed < n) {
    const now = Bun.nanoseconds() - origin;
    while (next < n && deadlines[next]! <= now) accepted[next++] = now;
    if (head < next) {
      const i = head++;
      began[i] = now;
      const { local, chain, count } = hashed === null ? hash(start, hasher, i) : hashed[i]!;
      const before = Bun.nanoseconds();
      reader.findMatches(local, count, out, chain);
      const after = Bun.nanoseconds();
      service[i] = after - before;
      finished[i] = after - origin;
      completed++;
    } else if (next < n) {
      const wait = deadlines[next]! - now;
      if (wait > spinNs) {
        Bun.sleepSync((wait - spinNs) / 1e6);
        sleptNs += wait - spinNs;
      }
      while (Bun.nanoseconds() - origin < deadlines[next]!) {
        /* spin to the deadline */
      }
    }
    if (now > maxNs) break;
  }
  // The lane is runnable from here to its end except while it sleeps (it spins).
  const neededS = (Bun.nanoseconds() - begin - sleptNs) / 1e9;
  const sched = threadSchedNs();
  return {
    lane: start.lane,
    accepted,
    started: began,
    finished,
    service,
    completed,
    cpuS: (sched.runNs - schedBefore.runNs) / 1e9,
    neededS,
    runqueueWaitS: (sched.waitNs - schedBefore.waitNs) / 1e9,
    stats: { ...reader.stats },
  };
}
