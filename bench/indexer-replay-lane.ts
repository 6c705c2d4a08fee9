/**
 * One route lane of `bench/indexer-replay.ts --route-threads N` (a Worker): attaches to
 * the shared index by descriptor and issues its share of the queries at their
 * deadlines, as the one-thread replay does (sleep to the deadline, then spin; accept
 * every query whose deadline passed, serve them in order): the prompt hashed
 * (PromptHasher), then `findMatches` on the shared index (timed as the service).
 * Times are ns from the run's origin on this thread's clock; the main thread gives the
 * origin in its clock and the two clocks' offset (their time origins).
 */
import {
  attach, type SharedIndexDescriptor, type SharedIndexReader,
} from "../src/index/crtc/shared";
import { DEFAULT_SEED } from "../src/hash";
import { MatchResult } from "../src/index/types";
import { PromptHasher } from "../src/route";

declare const self: Worker;

export interface LaneQueries {
  /** Every query's tokens, back to back; query q is tokens[offsets[q], offsets[q + 1]). */
  readonly tokens: Uint32Array;
  readonly offsets: Uint32Array;
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
  /** Pin this thread to this CPU (taskset), or -1. */
  readonly cpu: number;
}

export interface LaneResult {
  readonly lane: number;
  readonly accepted: Float64Array;
  readonly started: Float64Array;
  readonly finished: Float64Array;
  readonly service: Float64Array;
  readonly completed: number;
  readonly cpuS: number;
  readonly stats: Record<string, number>;
}

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

/** CPU seconds of this thread (user + system), from /proc (clock ticks of 10 ms). */
export function threadCpuS(): number {
  const stat = require("node:fs").readFileSync("/proc/thread-self/stat", "utf8") as string;
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** Pins the calling thread (Linux: its tid from /proc/thread-self). */
export function pinThisThread(cpu: number): void {
  const tid = require("node:fs").readlinkSync("/proc/thread-self").split("/").at(-1)!;
  const command = ["taskset", "-pc", String(cpu), tid];
  const result = Bun.spawnSync(command, { stdout: "ignore", stderr: "pipe" });
  if (result.exitCode !== 0) throw new Error(`${command.join(" ")}: ${result.stderr.toString()}`);
}

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
