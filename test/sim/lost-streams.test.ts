// Goal: the virtual-time model of a cut event stream (src/sim/lost-streams.ts) answers
// what kvedge's real index answers when it is fed an engine's batches but those of the
// cut: at every checkpoint, for every prompt of the run; the
// cut really loses something (that index no longer equals the engine's cache, the uncut
// engines' still do); the worker is degraded from the cut on, and exact again after a
// clear that arrives past it.
// Method: a seeded replay records every engine's batches; a crtc index fed through
// kvedge's ingest (src/sim/index-check.ts EventIndex) minus the cut's batches is the
// reference; prompts hashed with kvedge's hash, matched on both sides.
import { beforeAll, describe, expect, test } from "bun:test";
import { DEFAULT_SEED, hashBlocks } from "../../src/hash";
import { MatchResult } from "../../src/index";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import type { MockEngine } from "../../src/sim/engine";
import type { KvEventBatch } from "../../src/sim/engine-cache";
import { EventIndex } from "../../src/sim/index-check";
import { LostStreams } from "../../src/sim/lost-streams";
import { requestTokens, simulate } from "../../src/sim/simulator";
import { DEFAULT_VOCAB_SIZE } from "../../src/sim/tokens";
import { type Trace, transformTrace } from "../../src/sim/trace";

const BS = 16;
const WORKERS = 4;
const CUT = [0, 1];

let trace: Trace;
beforeAll(async () => {
  trace = transformTrace(await loadConversationTrace(), { requests: 300 });
});

describe("a cut event stream", () => {
  test("is what kvedge's index holds when it loses the cut's batches", () => {
    const batches: [number, KvEventBatch][] = [];
    let engines: readonly MockEngine[] = [];
    simulate(trace, {
      policy: "round_robin",
      workers: WORKERS,
      capacityBlocks: 2048,
      onBatch: (worker, batch) => batches.push([worker, batch]),
      onEngines: (all) => {
        engines = all;
      },
    });
    const first = batches[0]![1].ts * 1000;
    const span = batches[batches.length - 1]![1].ts * 1000 - first;
    const cut = { workers: CUT, fromMs: first + 0.3 * span, toMs: first + 0.45 * span };
    const lost = new LostStreams(cut, WORKERS);
    const reference = new EventIndex(WORKERS, BS);
    const matches = new MatchResult(8);
    // Every other prompt of the run, at every 97th batch.
    const prompts = Array.from({ length: trace.count >> 1 }, (_, i) => 2 * i);
    let compared = 0;
    let nonzero = 0;
    batches.forEach(([worker, batch], n) => {
      const ms = batch.ts * 1000;
      lost.batch(worker, ms, batch.events);
      const inCut = CUT.includes(worker) && ms >= cut.fromMs && ms < cut.toMs;
      if (!inCut) reference.apply(worker, batch);
      expect(lost.isDegraded(0, ms)).toBe(ms >= cut.fromMs);
      if (n % 97 !== 0) return;
      for (const i of prompts) {
        const tokens = requestTokens(trace, i, DEFAULT_VOCAB_SIZE);
        const length = trace.inputLength[i]!;
        const count = Math.floor(length / BS);
        const local = new Uint32Array(2 * count);
        hashBlocks(tokens.subarray(0, length), BS, DEFAULT_SEED, local);
        reference.index.findMatches(local, count, matches);
        for (const w of CUT) {
          let indexed = 0;
          for (let k = 0; k < matches.count; k++)
            if (reference.index.workerIdOf(matches.workers[k]!) === BigInt(w))
              indexed = matches.blocks[k]!;
          const reusable = Math.floor((length - 1) / BS);
          const held = lost.prefixBlocks(engines[w]!.cache, w, tokens, length);
          expect(held).toBe(Math.min(indexed, reusable));
          compared++;
          if (held > 0) nonzero++;
        }
      }
    });
    expect(compared).toBeGreaterThan(1000);
    expect(nonzero).toBeGreaterThan(100);
    const caches = engines.map((engine) => engine.cache);
    expect(reference.check(caches, CUT).index_matches_engines).toBe(false);
    expect(reference.check(caches, [2, 3]).index_matches_engines).toBe(true);
  }, 60_000);

  test("a clear after the cut makes the worker exact again; one during it is lost", () => {
    const lost = new LostStreams({ workers: [1], fromMs: 100, toMs: 200 }, 2);
    expect([lost.isCut(0), lost.isCut(1)]).toEqual([false, true]);
    expect(lost.isDegraded(1, 99)).toBe(false);
    lost.batch(1, 150, [{ type: "AllBlocksCleared" }]);
    expect(lost.isDegraded(1, 250)).toBe(true);
    lost.batch(1, 250, [{ type: "AllBlocksCleared" }]);
    expect(lost.isDegraded(1, 250)).toBe(false);
    expect(() => new LostStreams({ workers: [2], fromMs: 0, toMs: 1 }, 2)).toThrow(RangeError);
    expect(() => new LostStreams({ workers: [0], fromMs: 2, toMs: 1 }, 2)).toThrow(RangeError);
  });
});
