/**
 * One route lane of `bench/indexer-replay.ts --route-threads N` (a Worker): attaches to
 * the shared index by descriptor and issues its share of the queries at their
 * deadlines, as the one-thread replay does (sleep to the deadline, then spin; accept
 * every query whose deadline passed, serve them in order): the prompt hashed
 * (PromptHasher), then `findMatches` on the shared index (timed as the service).
 * Times are ns from the run's origin on this thread's clock; the main thread gives the
 * origin in its clock and the two clocks' offset (their time origins). Imported by
 * nothing: it is a Worker's entry (its message handler would keep a main thread alive).
 */
import { attach, type SharedIndexReader } from "../src/index/crtc/shared";
import { DEFAULT_SEED } from "../src/hash";
import { MatchResult } from "../src/index/types";
import { PromptHasher } from "../src/route";
import { type LaneResult, type LaneStart, pinThisThread, threadCpuS } from "./indexer-replay-lanes";

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
  if (start.cpu >= 0) pinThisThread(start.cpu);
  const { tokens, offsets } = start.queries;
  const hasher = new PromptHasher();
  const out = new MatchResult(256);
  // JIT warm-up on a throwaway index, then the real one.
  const warm = attach(start.warm);
  const n = start.queries.deadlines.length;
  for (let i = 0; i < Math.min(start.warmLookups, n); i++) {
    const prompt = tokens.subarray(offsets[i]!, offsets[i + 1]!);
    const hashes = hasher.hash(prompt, start.blockSize, DEFAULT_SEED);
    warm.findMatches(hashes.local, hashes.blockCount, out);
  }
  warm.close();
  const reader = attach(start.index);
  postMessage({ ready: start.lane });
  void started.then((origin) => {
    const result = run(start, reader, hasher, out, origin);
    postMessage({ result });
    reader.close();
  });
}

function run(
  start: LaneStart, reader: SharedIndexReader, hasher: PromptHasher, out: MatchResult,
  origin: number,
): LaneResult {
  const { tokens, offsets, deadlines } = start.queries;
  const n = deadlines.length;
  const accepted = new Float64Array(n);
  const began = new Float64Array(n);
  const finished = new Float64Array(n);
  const service = new Float64Array(n);
  const { spinNs, maxNs, blockSize } = start;
  const cpuBefore = threadCpuS();
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
      const prompt = tokens.subarray(offsets[i]!, offsets[i + 1]!);
      const hashes = hasher.hash(prompt, blockSize, DEFAULT_SEED);
      const before = Bun.nanoseconds();
      reader.findMatches(hashes.local, hashes.blockCount, out);
      const after = Bun.nanoseconds();
      service[i] = after - before;
      finished[i] = after - origin;
      completed++;
    } else if (next < n) {
      const wait = deadlines[next]! - now;
      if (wait > spinNs) Bun.sleepSync((wait - spinNs) / 1e6);
      while (Bun.nanoseconds() - origin < deadlines[next]!) { /* spin to the deadline */ }
    }
    if (now > maxNs) break;
  }
  return {
    lane: start.lane, accepted, started: began, finished, service, completed,
    cpuS: threadCpuS() - cpuBefore, stats: { ...reader.stats },
  };
}
