/**
 * Registers the differential suite for one backend (one line per backend in
 * test/index/differential.test.ts). Seeds run in batches so each bun test stays well
 * under its timeout; every batch reports each diverging seed with its shrunk repro.
 *
 *   KVEDGE_SEED=17 bun test test/index/differential.test.ts      one seed, verify on
 *   KVEDGE_SEED=17 KVEDGE_TRACE=1 bun test ...                   ... and trace it
 *   KVEDGE_SEEDS=20000 KVEDGE_STEPS=400 bun test ...             a longer run
 *   KVEDGE_SOAK=1 bun test test/index/differential.test.ts       soak defaults
 */
import { describe, expect, test } from "bun:test";
import { MatchResult } from "../../src/index/types";
import { checkSeed, type HarnessBackend, knobs, replay, type ReplayOptions } from "./differential";
import { applyHarnessOp, type HarnessOp, pairs, type StreamOptions } from "./streams";

const BATCH = 150;

interface Variant {
  readonly name: string;
  /** Share of KVEDGE_SEEDS this variant runs. */
  readonly share: number;
  /** Offset so variants draw different seeds. */
  readonly seedBase: number;
  readonly stream: Omit<StreamOptions, "steps">;
  readonly replay: ReplayOptions;
  /** Seeds per test (default BATCH): slower streams take fewer, to stay well inside a test's time. */
  readonly batch?: number;
}

const VARIANTS: readonly Variant[] = [
  { name: "event streams", share: 1, seedBase: 0, stream: {}, replay: {} },
  {
    name: "streams that break the engine-hash invariant",
    share: 0.25,
    seedBase: 1_000_000,
    stream: { conflicts: true },
    replay: {},
  },
  {
    name: "three worker slots (capacity rejects)",
    share: 0.2,
    seedBase: 2_000_000,
    stream: { maxWorkers: 3 },
    replay: {},
  },
  {
    name: "8 to 40 workers (long owner lists)",
    share: 0.2,
    seedBase: 4_000_000,
    stream: { manyWorkers: true },
    replay: {},
  },
  {
    name: "lower tiers (host, disk, external; unknown-medium removals)",
    share: 0.3,
    seedBase: 5_000_000,
    stream: { tiers: true },
    replay: {},
    batch: 60,
  },
  {
    name: "lower tiers, verify() after every event",
    share: 0.05,
    seedBase: 6_000_000,
    stream: { tiers: true, conflicts: true },
    replay: { verify: true },
    batch: 60,
  },
  {
    name: "verify() after every event",
    share: 0.1,
    seedBase: 3_000_000,
    stream: { conflicts: true },
    replay: { verify: true },
  },
];

function runSeeds(backend: HarnessBackend, variant: Variant, from: number, to: number): void {
  const reports: string[] = [];
  for (let seed = from; seed < to; seed++) {
    const report = checkSeed(
      seed,
      backend,
      { ...variant.stream, steps: knobs.steps },
      {
        ...variant.replay,
        verify: variant.replay.verify || knobs.verifyAll,
      },
    );
    if (report !== null) reports.push(report);
    if (reports.length >= 3) break;
  }
  expect(reports.join("\n\n")).toBe("");
}

const W = 7n;
const stored = (parent: bigint | null, external: bigint[], local: bigint[]): HarnessOp => ({
  kind: "stored",
  worker: W,
  rank: 0,
  parent,
  external,
  local,
});
const removed = (external: bigint[]): HarnessOp => ({
  kind: "removed",
  worker: W,
  rank: 0,
  external,
});

/**
 * Hand-written streams with the score each must end with (worker 7 on query 1, 2, 3):
 * vLLM's duplicate copies (docs/decisions.md#copies-counted). Each is also replayed
 * against the reference, so the backend must agree on every step, not only the end.
 */
const FIXED: readonly { name: string; ops: HarnessOp[]; blocks: number }[] = [
  {
    name: "store x2, remove x1: still held",
    ops: [
      stored(null, [11n, 12n, 13n], [1n, 2n, 3n]),
      stored(null, [11n, 12n, 13n], [1n, 2n, 3n]),
      removed([13n, 12n, 11n]),
    ],
    blocks: 3,
  },
  {
    name: "store x2, remove x2: gone",
    ops: [
      stored(null, [11n, 12n, 13n], [1n, 2n, 3n]),
      stored(null, [11n, 12n, 13n], [1n, 2n, 3n]),
      removed([13n]),
      removed([13n, 12n]),
    ],
    blocks: 2,
  },
  {
    name: "a second copy of a suffix only (a request that hit the first block)",
    ops: [
      stored(null, [11n, 12n, 13n], [1n, 2n, 3n]),
      stored(11n, [12n, 13n], [2n, 3n]),
      removed([11n, 12n, 13n]),
    ],
    blocks: 0,
  },
  {
    name: "one hash twice in a removal takes two copies",
    ops: [
      stored(null, [11n], [1n]),
      stored(null, [11n], [1n]),
      stored(null, [11n], [1n]),
      removed([11n, 11n]),
    ],
    blocks: 1,
  },
];

export function differentialSuite(backend: HarnessBackend): void {
  describe(`${backend.name} against the reference`, () => {
    for (const fixed of FIXED) {
      test(`copies: ${fixed.name}`, () => {
        const query = [1n, 2n, 3n];
        const divergence = replay({ ops: fixed.ops, queries: [query] }, backend, { verify: true });
        expect(divergence).toBeNull();
        const index = backend.create({ verify: true });
        for (const op of fixed.ops) applyHarnessOp(index, op);
        const out = new MatchResult();
        index.findMatches(pairs(query), query.length, out);
        expect(out.count === 0 ? 0 : out.blocks[0]).toBe(fixed.blocks);
      });
    }
    if (knobs.seed !== null) {
      const seed = knobs.seed;
      test(`seed ${seed}`, () => {
        for (const variant of VARIANTS) {
          const report = checkSeed(
            seed,
            backend,
            { ...variant.stream, steps: knobs.steps },
            {
              ...variant.replay,
              verify: true,
              trace: knobs.trace,
            },
          );
          expect(report ?? "").toBe("");
        }
      });
      return;
    }
    for (const variant of VARIANTS) {
      const seeds = Math.max(1, Math.round(knobs.seeds * variant.share * (backend.seedShare ?? 1)));
      const batch = variant.batch ?? BATCH;
      for (let from = 0; from < seeds; from += batch) {
        const to = Math.min(seeds, from + batch);
        test(`${variant.name}: seeds ${variant.seedBase + from}..${variant.seedBase + to - 1}`, () => {
          runSeeds(backend, variant, variant.seedBase + from, variant.seedBase + to);
        });
      }
    }
  });
}
