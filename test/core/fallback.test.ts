// Goal: with route.degraded_fallback = predictions, an exact worker that becomes degraded
// is predicted from kvedge's own decisions from that moment on, routed on the larger of
// those predictions and its discounted indexed overlap (match and route answers show the
// larger of the two undiscounted, always of kind `degraded`, never `exact`; a discounted
// half block still counts), and its predictions go when it
// is trusted again; a worker removed takes its predictions with it (exact counts); with
// `discount`, nothing is predicted and the discounted overlap is all that counts.
// Method: KvedgeCore in-process, the index written as a source would, the worker
// degraded and trusted again through the observed-hit check (recordAnswer), the real
// path of an engine whose answers disagree with its events.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteInput } from "../../src/core/core";
import { DEFAULT_SEED } from "../../src/hash";
import { promptHashes } from "../../src/route";
import { silentLogger } from "../../src/util/log";

const BS = 4;
const WINDOW = 4;

function coreWith(fallback: "predictions" | "discount"): KvedgeCore {
  const { config } = loadConfig({
    env: {
      KVEDGE_BLOCK_SIZE: String(BS),
      KVEDGE_DEGRADED_FALLBACK: fallback,
      KVEDGE_OBSERVED_WINDOW: String(WINDOW),
      KVEDGE_PREDICTED_CAPACITY_BLOCKS: "1000",
    },
  });
  return new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
}

const input = (tokens: Uint32Array, requestId: string): RouteInput => ({
  tokens,
  requestId,
  loraName: null,
  cacheSalt: null,
  expectedOutputTokens: null,
  overlapScoreCredit: null,
  prefillLoadScale: null,
  temperature: null,
});

/** Tokens 1..n: prompts that share their first blocks. */
const prompt = (n: number) => Uint32Array.from({ length: n }, (_, i) => i + 1);
/** Tokens of another family: nothing in common with `prompt`. */
const other = (n: number) => Uint32Array.from({ length: n }, (_, i) => 1000 + i);

/** Stores the first `blocks` blocks of `tokens` on `slot`, as the worker's events would. */
function indexed(core: KvedgeCore, slot: number, tokens: Uint32Array, blocks: number): void {
  const p = promptHashes(tokens, BS, DEFAULT_SEED);
  core.index.storeAt(slot, false, 0, 0, p.chain, p.local, blocks, 0);
}

/** Answers for worker 1 that served `observed` of `predicted` tokens, until its flag is `suspect`. */
function answers(core: KvedgeCore, predicted: number, observed: number): void {
  for (let i = 0; i < 4 * WINDOW; i++)
    core.recordAnswer(`answer-${i}-${observed}`, 1n, 0, 100, predicted, observed);
}

function scores(core: KvedgeCore, tokens: Uint32Array) {
  const p = promptHashes(tokens, BS, DEFAULT_SEED);
  return core.match(p.local, p.blockCount, p.chain).map((s) => [s.workerId, s.blocks, s.kind]);
}

describe("a degraded exact worker routed on predictions", () => {
  test("is predicted from when it degrades, never exact, and trusted again without them", () => {
    const core = coreWith("predictions");
    const slot = core.workerTable.acquire(1n, 0);
    indexed(core, slot, prompt(41), 10);
    indexed(core, slot, other(5), 1);
    expect(scores(core, prompt(41))).toEqual([[1n, 10, "exact"]]);

    answers(core, 40, 0); // its answers serve nothing of what its events say
    expect(core.router.load.degraded[slot]).toBe(1);
    expect(core.fallback!.isOn(slot)).toBe(true);
    expect(core.router.load.fallback[slot]).toBe(1);
    // Nothing predicted yet: its index's 10 blocks, credited discounted (0.5).
    expect(scores(core, prompt(41))).toEqual([[1n, 10, "degraded"]]);
    const routed = core.route(input(prompt(81), "a"), 1);
    expect([routed.decision.overlapBlocks, routed.decision.creditedBlocks]).toEqual([10, 5]);
    expect(routed.decision.candidates.at(0).overlapKind).toBe("degraded");
    expect(core.prefillDone("a")).toBe("ok"); // its 20 blocks are predicted now
    expect(core.workers()[0]!.predicted).toEqual({ blocks: 20, capacityBlocks: 1000 });
    expect(scores(core, prompt(81))).toEqual([[1n, 20, "degraded"]]);
    const again = core.route(input(prompt(81), "b"), 1);
    expect([again.decision.overlapBlocks, again.decision.creditedBlocks]).toEqual([20, 20]);
    expect(again.decision.candidates.at(0).overlapKind).toBe("degraded");

    // A prefix only indexed, by one block: half a block of credit, not none.
    const short = core.route(input(other(5), "c"), 1);
    expect([short.decision.overlapBlocks, short.decision.creditedBlocks]).toEqual([1, 0.5]);
    core.done("c");

    answers(core, 40, 40); // its answers agree again: trusted
    expect(core.router.load.degraded[slot]).toBe(0);
    expect(core.fallback!.isOn(slot)).toBe(false);
    expect(core.fallback!.predictions.blocks.size).toBe(0);
    expect(core.fallback!.index.workers().reduce((s, w) => s + w.blocks, 0)).toBe(0);
    expect(core.workers()[0]!.predicted).toBe(null);
    expect(scores(core, prompt(81))).toEqual([[1n, 10, "exact"]]);
  });

  test("a removed worker takes its predictions with it", async () => {
    const core = coreWith("predictions");
    const slot = core.workerTable.acquire(1n, 0);
    core.workerTable.acquire(2n, 0);
    indexed(core, slot, prompt(41), 10);
    answers(core, 40, 0);
    core.route(input(prompt(41), "a"), 0);
    core.prefillDone("a");
    expect(core.fallback!.predictions.blocks.size).toBeGreaterThan(0);
    await core.removeWorker(1n);
    expect(core.fallback!.active).toBe(false);
    expect(core.fallback!.predictions.blocks.size).toBe(0);
    expect(core.fallback!.index.workers()).toEqual([]);
    core.fallback!.predictions.blocks.verify();
  });

  test("with discount nothing is predicted: the discounted overlap is all that counts", () => {
    const core = coreWith("discount");
    const slot = core.workerTable.acquire(1n, 0);
    indexed(core, slot, prompt(41), 10);
    answers(core, 40, 0);
    expect(core.fallback).toBe(null);
    expect(core.router.load.degraded[slot]).toBe(1);
    expect(scores(core, prompt(81))).toEqual([[1n, 10, "degraded"]]);
    const routed = core.route(input(prompt(81), "a"), 1);
    expect([routed.decision.overlapBlocks, routed.decision.creditedBlocks]).toEqual([10, 5]);
    core.prefillDone("a");
    expect(core.workers()[0]!.predicted).toBe(null);
    expect(scores(core, prompt(81))).toEqual([[1n, 10, "degraded"]]);
  });
});
