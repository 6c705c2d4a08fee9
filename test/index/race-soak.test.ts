// Goal: lookups on other threads never see a state of the shared crtc that did not
// exist. Method: a writer Worker applies seeded streams (the differential harness's:
// stores with splits, removals with holes, clears, remove_worker; many streams at once
// on disjoint workers sharing block contents, in waves that grow the tree and its link
// table and then remove every worker, so ids are freed, reused and the pools shrink)
// while reader Workers look up continuously, each lookup recording the writer's
// applied-event count before and after. The reference model then replays the events:
// every recorded answer must equal the model's answer at some event boundary in its
// [before, after] range, and at quiescence every answer must equal the model's.
// KVEDGE_RACE_WAVES / KVEDGE_RACE_SEED make it longer or different.
import { describe, expect, test } from "bun:test";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { MatchResult } from "../../src/index/types";
import { applyHarnessOp, generateStream, type HarnessOp, pairs } from "../harness/streams";
import { answerOf, type LookupRecord } from "./race-soak-worker";

const WAVES = Number(process.env.KVEDGE_RACE_WAVES ?? 6);
const SEED = Number(process.env.KVEDGE_RACE_SEED ?? 2026);
const STREAMS_PER_WAVE = 16;
const STEPS = 400;
const READERS = 2;
/** Every 3rd lookup is recorded, at most this many per reader (bounded memory and check time). */
const STRIDE = 3;
const RECORDS_MAX = 40_000;

/** Worker ids of stream s moved apart so streams never share a worker. */
function remap(op: HarnessOp, offset: bigint): HarnessOp {
  return { ...op, worker: op.worker + offset } as HarnessOp;
}

function buildOps(): { ops: HarnessOp[]; queries: bigint[][] } {
  const ops: HarnessOp[] = [];
  const queries: bigint[][] = [];
  for (let wave = 0; wave < WAVES; wave++) {
    const streams = [];
    for (let s = 0; s < STREAMS_PER_WAVE; s++) {
      const seed = SEED * 1000 + wave * STREAMS_PER_WAVE + s;
      const stream = generateStream(seed, { steps: STEPS, manyWorkers: s % 2 === 0 });
      const offset = BigInt(s * 1000);
      streams.push(stream.ops.map((op) => remap(op, offset)));
      if (wave === 0) queries.push(...stream.queries.slice(0, 12));
    }
    // Round-robin: the streams' events interleave on one tree.
    for (let step = 0; step < STEPS; step++) for (const stream of streams) ops.push(stream[step]!);
    const workers = new Set<bigint>();
    for (const stream of streams) for (const op of stream) workers.add(op.worker);
    for (const worker of workers) ops.push({ kind: "remove_worker", worker });
  }
  return { ops, queries };
}

interface WriterDone {
  applied: number;
  ms: number;
  stats: { nodes: number; blocks: number; bytes: number };
  counters: Record<string, number>;
}

interface ReaderDone {
  records: LookupRecord[];
  lookups: number;
  stats: Record<string, number>;
  final: string[];
}

function spawn(): Worker {
  return new Worker(new URL("./race-soak-worker.ts", import.meta.url).href);
}

function next<T>(worker: Worker, key: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (event: MessageEvent) => {
      if (!(key in event.data)) return;
      worker.removeEventListener("message", onMessage);
      resolve(event.data as T);
    };
    worker.addEventListener("message", onMessage);
    worker.addEventListener("error", (event) => {
      reject(new Error(`worker failed: ${event.message}`));
    });
  });
}

async function runRace(
  ops: HarnessOp[],
  queries: bigint[][],
): Promise<{ writer: WriterDone; readers: ReaderDone[] }> {
  const writer = spawn();
  const readers = Array.from({ length: READERS }, spawn);
  try {
    const described = next<{ descriptor: unknown }>(writer, "descriptor");
    writer.postMessage({ role: "writer", ops, budgetBytes: 64 * 2 ** 20, maxReaders: READERS });
    const { descriptor } = await described;
    const ready = readers.map((reader) => next(reader, "ready"));
    for (const reader of readers) {
      const start = { role: "reader", descriptor, queries, stride: STRIDE, limit: RECORDS_MAX };
      reader.postMessage(start);
    }
    await Promise.all(ready);
    const writerDone = next<WriterDone>(writer, "done");
    const readersDone = readers.map((reader) => next<ReaderDone>(reader, "records"));
    for (const worker of [...readers, writer]) worker.postMessage({ go: true });
    const done = await writerDone;
    for (const reader of readers) reader.postMessage({ stop: true });
    return { writer: done, readers: await Promise.all(readersDone) };
  } finally {
    for (const worker of [writer, ...readers]) worker.terminate();
  }
}

/**
 * Replays the model over the events; each record must match the model at some state
 * k in [before, after] (k = events applied). Returns the records that matched none.
 */
function unexplained(ops: HarnessOp[], queries: bigint[][], records: LookupRecord[]): string[] {
  const model = new ReferenceIndex(1, {});
  const out = new MatchResult();
  const sorted = [...records].sort((a, b) => a.before - b.before);
  const failures: string[] = [];
  let active: LookupRecord[] = [];
  let nextRecord = 0;
  for (let k = 0; k <= ops.length; k++) {
    while (nextRecord < sorted.length && sorted[nextRecord]!.before === k) {
      active.push(sorted[nextRecord++]!);
    }
    if (active.length > 0) {
      const answers = new Map<number, string>();
      active = active.filter((record) => {
        let want = answers.get(record.query);
        if (want === undefined) {
          model.findMatches(pairs(queries[record.query]!), queries[record.query]!.length, out);
          want = answerOf(model, out);
          answers.set(record.query, want);
        }
        if (want === record.answer) return false;
        if (record.after > k) return true;
        const range = `[${record.before}, ${record.after}]`;
        failures.push(`query ${record.query} in ${range}: got [${record.answer}]`);
        return false;
      });
    }
    if (k < ops.length) applyHarnessOp(model, ops[k]!);
  }
  return failures;
}

describe("shared crtc race soak", () => {
  test("every lookup answer existed at an event boundary during the lookup", async () => {
    const { ops, queries } = buildOps();
    const { writer, readers } = await runRace(ops, queries);
    expect(writer.applied).toBe(ops.length);
    const records = readers.flatMap((reader) => reader.records);
    const overlapped = records.filter((record) => record.after > record.before).length;
    const during = records.filter((record) => record.before < ops.length).length;
    const failures = unexplained(ops, queries, records);
    const summary = {
      events: ops.length,
      writerMs: Math.round(writer.ms),
      lookups: readers.map((r) => r.lookups),
      recorded: records.length,
      during,
      overlapped,
      readerStats: readers.map((r) => r.stats),
      writer: writer.counters,
    };
    console.log(`race soak: ${JSON.stringify(summary)}`);
    expect(failures.slice(0, 5)).toEqual([]);
    // The readers ran while the writer did: some lookups spanned events.
    expect(overlapped).toBeGreaterThan(0);

    // Quiescence: the writer is done; every answer is the model's final one.
    const model = new ReferenceIndex(1, {});
    for (const op of ops) applyHarnessOp(model, op);
    const out = new MatchResult();
    const want = queries.map((query) => {
      model.findMatches(pairs(query), query.length, out);
      return answerOf(model, out);
    });
    for (const reader of readers) expect(reader.final).toEqual(want);
    // Every wave ends with every worker removed: the index is empty and gave its memory back.
    expect(writer.stats.nodes).toBe(0);
    expect(writer.stats.blocks).toBe(0);
  }, 60_000);
});
