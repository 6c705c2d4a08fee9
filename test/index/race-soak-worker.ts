/**
 * The threads of test/index/race-soak.test.ts. As the writer: builds the shared index,
 * sends its descriptor, then applies the ops it is given as fast as it can. As a
 * reader: attaches by descriptor and looks up continuously until told to stop,
 * recording (query, applied before, applied after, answer) for a sample of lookups.
 */
import { attach, createSharedIndex, type SharedIndexReader } from "../../src/index/crtc/shared";
import { MatchResult } from "../../src/index/types";
import { applyHarnessOp, type HarnessOp, pairs } from "../harness/streams";

declare const self: Worker;

export type ToWorker =
  | { role: "writer"; ops: HarnessOp[]; budgetBytes: number; maxReaders: number }
  | { role: "reader"; descriptor: unknown; queries: bigint[][]; stride: number; limit: number }
  | { go: true }
  | { stop: true };

export interface LookupRecord {
  query: number;
  before: number;
  after: number;
  answer: string;
}

/** One lookup's answer as the harness writes it: "worker/rank=blocks", sorted. */
export function answerOf(
  index: { workerIdOf(h: number): bigint; dpRankOf(h: number): number },
  out: MatchResult,
): string {
  const scores: string[] = [];
  for (let i = 0; i < out.count; i++) {
    const slot = out.workers[i]!;
    scores.push(`${index.workerIdOf(slot)}/${index.dpRankOf(slot)}=${out.blocks[i]}`);
  }
  return scores.sort().join(" ");
}

let started: Promise<void> | null = null;
let release: () => void = () => {};
let stopped = false;

self.onmessage = (event: MessageEvent<ToWorker>) => {
  const message = event.data;
  if ("go" in message) release();
  else if ("stop" in message) stopped = true;
  else if (message.role === "writer") void runWriter(message);
  else void runReader(message);
};

function waitForGo(): Promise<void> {
  started ??= new Promise((resolve) => (release = resolve));
  return started;
}

async function runWriter(message: Extract<ToWorker, { role: "writer" }>): Promise<void> {
  const { budgetBytes, maxReaders } = message;
  const shared = createSharedIndex(1, { budgetBytes, maxReaders });
  // The (hi, lo) arrays are built (and cached) before the clock: the race is the index's.
  for (const op of message.ops) {
    if ("external" in op) pairs(op.external);
    if (op.kind === "stored") pairs(op.local);
  }
  postMessage({ descriptor: shared.descriptor });
  await waitForGo();
  const began = performance.now();
  for (const op of message.ops) applyHarnessOp(shared.index, op);
  const ms = performance.now() - began;
  shared.settle();
  shared.index.verify();
  const stats = shared.index.stats();
  postMessage({ done: true, applied: message.ops.length, ms, stats, counters: shared.counters });
}

async function runReader(message: Extract<ToWorker, { role: "reader" }>): Promise<void> {
  const reader = attach(message.descriptor as Parameters<typeof attach>[0], { identities: true });
  const queries = message.queries.map((query) => pairs(query));
  const lengths = message.queries.map((query) => query.length);
  postMessage({ ready: true });
  await waitForGo();
  const records: LookupRecord[] = [];
  const out = new MatchResult();
  let lookups = 0;
  // Bounded by the writer: the test stops every reader once the writer is done.
  while (!stopped) {
    for (let i = 0; i < 256; i++) {
      const query = lookups % queries.length;
      const before = reader.applied();
      reader.findMatches(queries[query]!, lengths[query]!, out);
      const after = reader.applied();
      if (lookups % message.stride === 0 && records.length < message.limit) {
        records.push({ query, before, after, answer: answerOf(reader, out) });
      }
      lookups++;
    }
    await Bun.sleep(0); // take the stop message
  }
  const final = finalAnswers(reader, queries, lengths);
  postMessage({ records, lookups, stats: reader.stats, final });
  reader.close();
}

/** Every query once more, with the writer quiet: the quiescent state. */
function finalAnswers(
  reader: SharedIndexReader,
  queries: Uint32Array[],
  lengths: number[],
): string[] {
  const out = new MatchResult();
  return queries.map((query, i) => {
    reader.findMatches(query, lengths[i]!, out);
    return answerOf(reader, out);
  });
}
