// Goal: work that only makes decisions cheaper (what is computed for whom, scratch reuse)
// never changes a decision: the pick, its cost and predicted TTFT, and every listed
// candidate with its explanation parts are bit-for-bit those of the build that pinned
// them (both policies, with and without candidates, T = 0 and T > 0, through churn).
// Method: seeded runs over real sequence hashes and the real load tracker; each run's
// decisions are serialized (floats by their exact bits) and hashed; the digests were
// recorded from the build before the route-speed work (commit f0b5423) and are pinned
// here (runs with pending credit, route.pending_credit, from the build that added it).
// A change that alters any decision changes a digest.
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { DEFAULT_SEED } from "../../src/hash";
import { CandidateList, promptHashes, type RoutePolicy, Router } from "../../src/route";
import { xorshift32 as prng } from "../../src/util/random";

const BS = 16;

interface Run {
  readonly policy: RoutePolicy;
  readonly workers: number;
  readonly candidates: number;
  readonly temperature: number;
  /** Active requests' blocks credited as cached (the digests before it existed are without). */
  readonly pending?: boolean;
}

/** Every decision of one seeded run, as one digest. */
function digestOf(run: Run): string {
  const next = prng(9 + run.workers);
  const random = prng(31);
  const router = new Router({
    blockSize: BS,
    now: () => 0,
    policy: run.policy,
    random: () => random() / 2 ** 32,
    weights: { temperature: run.temperature, degradedOverlapWeight: 0.5 },
    trackOutputBlocks: true,
    pendingCredit: run.pending === true,
  });
  for (let w = 0; w < run.workers; w++) router.load.table.acquire(BigInt(500 + w), w % 2);
  const prefixes = Array.from({ length: 6 }, (_, f) =>
    Uint32Array.from({ length: (4 + 6 * f) * BS }, () => next()),
  );
  const hash = createHash("sha256");
  const bits = new Float64Array(1);
  const bytes = new Uint8Array(bits.buffer);
  const put = (value: number): void => {
    bits[0] = value;
    hash.update(bytes);
  };
  const list = new CandidateList();
  const active: string[] = [];
  for (let step = 0; step < 600; step++) {
    if (step % 37 === 5) router.load.setDegraded(next() % run.workers, step % 2 === 1);
    const prefix = prefixes[next() % prefixes.length]!;
    const tokens = new Uint32Array(prefix.length + (next() % 40) * BS + (next() % BS));
    tokens.set(prefix);
    for (let t = prefix.length; t < tokens.length; t++) tokens[t] = next();
    const p = promptHashes(tokens, BS, DEFAULT_SEED);
    const count = 1 + (next() % Math.min(4, run.workers));
    const slots = Array.from({ length: count }, () => next() % run.workers);
    const blocks = slots.map(() => next() % (p.blockCount + 2));
    const decision = router.route(
      {
        chain: p.chain,
        blockCount: p.blockCount,
        tokenCount: tokens.length,
        candidatesMax: run.candidates,
        expectedOutputTokens: next() % 3 === 0 ? next() % 512 : 0,
      },
      { count, slots, blocks },
      list,
    );
    put(decision.slot);
    put(decision.cost);
    put(decision.predictedTtftMs);
    put(decision.overlapBlocks);
    const c = decision.candidates;
    for (let i = 0; i < c.count; i++) {
      const values = [
        c.slots[i]!,
        c.costs[i]!,
        c.predictedTtftMs[i]!,
        c.queueMs[i]!,
        c.prefillMs[i]!,
        c.stepsMs[i]!,
        c.overlapBlocks[i]!,
        c.activePrefillTokens[i]!,
        c.activeDecodeBlocks[i]!,
      ];
      for (const value of values) put(value);
    }
    active.push(decision.requestId);
    if (next() % 2 === 0 && active.length > 0) {
      router.load.prefillDone(active[next() % active.length]!);
    }
    if (active.length > 8 * run.workers || next() % 4 === 0) {
      router.load.done(active.splice(next() % active.length, 1)[0]!);
    }
  }
  return hash.digest("hex").slice(0, 16);
}

const PINNED: Record<string, string> = {
  "ttft W=3 k=0 T=0": "d241e3863c7d64c7",
  "ttft W=3 k=4 T=0": "a936774e7670c149",
  "ttft W=16 k=0 T=0": "6911def71962de5b",
  "ttft W=16 k=4 T=0": "1fb8b7e2d4fd8736",
  "ttft W=64 k=0 T=0": "6136f1736b00e951",
  "ttft W=64 k=4 T=0": "13e96ff37852c4ab",
  "ttft W=16 k=4 T=0.5": "ff44dce9acd65862",
  "dynamo W=3 k=0 T=0": "aaf83386a7fdbda8",
  "dynamo W=3 k=4 T=0": "4f30187b8a09418a",
  "dynamo W=16 k=0 T=0": "789a3abe1f28dc94",
  "dynamo W=16 k=4 T=0": "8dca86fc67a39054",
  "dynamo W=64 k=0 T=0": "64c02bea9ef8508b",
  "dynamo W=64 k=4 T=0": "5b8092cbf96a771d",
  "dynamo W=16 k=4 T=0.5": "c83a0dc85a9a9a03",
  // Pending credit (route.pending_credit), pinned when it was added.
  "ttft W=16 k=4 T=0 pending": "7dae702ada499c71",
  "dynamo W=16 k=4 T=0 pending": "fddde1fe45f0484d",
};

const RUNS: Run[] = [];
for (const policy of ["ttft", "dynamo"] as const) {
  for (const workers of [3, 16, 64]) {
    for (const candidates of [0, 4]) RUNS.push({ policy, workers, candidates, temperature: 0 });
  }
  RUNS.push({ policy, workers: 16, candidates: 4, temperature: 0.5 });
  RUNS.push({ policy, workers: 16, candidates: 4, temperature: 0, pending: true });
}
const nameOf = (run: Run) =>
  `${run.policy} W=${run.workers} k=${run.candidates} T=${run.temperature}${run.pending ? " pending" : ""}`;

describe("decisions are pinned", () => {
  if (process.env.KVEDGE_PRINT_PINNED === "1") {
    for (const run of RUNS) console.log(`  "${nameOf(run)}": "${digestOf(run)}",`);
  }
  for (const run of RUNS) {
    test(nameOf(run), () => {
      expect(digestOf(run)).toBe(PINNED[nameOf(run)]!);
    });
  }
});
