// Goal: the ttft route policy predicts each worker's time to first token as documented
// (queued prefill, own uncached prefill, per-step overhead), charges the recompute of
// a held prefix, keeps a conversation on its holder until the holder's queue outweighs
// that charge, and cannot be pulled onto a busy worker by a small shared prefix.
// Calibration learns a worker's prefill speed from route -> prefill_done timings on a
// fake clock, ignores outliers, and starts over when a slot gets a new worker.
// Method: a Router with real sequence hashes, a fake clock and hand-worked numbers.
import { describe, expect, test } from "bun:test";
import { DEFAULT_SEED } from "../../src/hash";
import {
  type Overlaps,
  promptHashes,
  type RouteRequest,
  Router,
  type RouterOptions,
} from "../../src/route";
import { removeWorker } from "../support/workers";

const BS = 4;
// Round numbers: 1 token per ms, 10 ms per step, no KV-read cost, 100 tokens per step.
const TTFT = {
  prefillTokensPerSecond: 1000,
  stepBaseMs: 10,
  kvReadMsPerMillionTokens: 0,
  maxBatchedTokens: 100,
  recomputeWeight: 1,
};

let nextToken = 1;
/** A prompt of `tokens` fresh tokens (no prefix shared with earlier prompts) or extending `prefix`. */
function prompt(tokens: number, prefix: readonly number[] = []): number[] {
  return [...prefix, ...Array.from({ length: tokens - prefix.length }, () => nextToken++)];
}

function request(tokens: readonly number[], extra: Partial<RouteRequest> = {}): RouteRequest {
  const p = promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
  return {
    chain: p.chain,
    blockCount: p.blockCount,
    tokenCount: tokens.length,
    candidatesMax: 8,
    ...extra,
  };
}

const overlaps = (entries: [slot: number, blocks: number][]): Overlaps => ({
  count: entries.length,
  slots: entries.map((e) => e[0]),
  blocks: entries.map((e) => e[1]),
});

function router(workers: number, options: Partial<RouterOptions> = {}): Router {
  const r = new Router({
    blockSize: BS,
    now: () => 0,
    policy: "ttft",
    ttft: TTFT,
    random: () => 0.5,
    ...options,
  });
  for (let i = 0; i < workers; i++) r.load.table.acquire(BigInt(i), 0);
  return r;
}

const bySlot = (decision: ReturnType<Router["route"]>) =>
  Object.fromEntries(decision.candidates.toArray().map((c) => [c.slot, c]));

describe("predicted TTFT", () => {
  test("hand-worked parts: queue, own prefill, steps; cost adds the recompute charge", () => {
    const r = router(2);
    r.route(request(prompt(160)), overlaps([])); // ties broken by random 0.5: some worker now queues 160 tokens
    const busy = r.load.activePrefillTokens[0]! > 0 ? 0 : 1;
    const idle = 1 - busy;
    // 200 tokens, 40 of them (10 blocks) cached on the busy worker.
    const decision = r.route(request(prompt(200)), overlaps([[busy, 10]]));
    const c = bySlot(decision);
    // Busy: ahead 160, own 160, 1 active request -> budget 99, steps ceil(320/99) = 4.
    expect(c[busy]!.queueMs).toBe(160);
    expect(c[busy]!.prefillMs).toBe(160);
    expect(c[busy]!.stepsMs).toBe(40);
    expect(c[busy]!.predictedTtftMs).toBe(360);
    expect(c[busy]!.cost).toBe(360 + 160);
    // Idle: own 200, steps 2.
    expect(c[idle]!.predictedTtftMs).toBe(200 + 20);
    expect(c[idle]!.cost).toBe(220 + 200);
    expect(decision.slot).toBe(idle);
    expect(decision.predictedTtftMs).toBe(220);
  });

  test("the holder of a prefix keeps it until its queue outweighs what its cache saves", () => {
    const shared = prompt(400);
    for (const [ahead, expected] of [
      [0, "holder"],
      [200, "holder"],
      [900, "other"],
    ] as const) {
      const r = router(1); // slot 0 alone takes the queued work, then slot 1 joins
      if (ahead > 0) r.route(request(prompt(ahead)), overlaps([]));
      expect(r.load.table.acquire(1n, 0)).toBe(1);
      expect(r.load.activePrefillTokens[0]).toBe(ahead);
      // 440 tokens, 400 (100 blocks) held by slot 0. Other: 440 + 5 steps = 490, + 440 recompute = 930.
      // Holder: 0 ahead: 40 + 10 + 40 = 90; 200 ahead: 240 + 30 + 40 = 310; 900 ahead: 940 + 100 + 40 = 1,080.
      const decision = r.route(request(prompt(440, shared)), overlaps([[0, 100]]));
      expect(decision.slot === 0 ? "holder" : "other").toBe(expected);
    }
  });

  test("a small shared prefix does not pull requests onto a busy worker", () => {
    const system = prompt(32); // a shared 32-token system prompt, cached on slot 0
    const r = router(4);
    const placed = new Int32Array(4);
    for (let i = 0; i < 40; i++) {
      // Only slot 0 holds the prefix; nothing ever finishes, so load keeps growing.
      placed[r.route(request(prompt(400, system)), overlaps([[0, 8]])).slot]!++;
    }
    expect(Math.max(...placed)).toBeLessThanOrEqual(11);
    expect(Math.min(...placed)).toBeGreaterThanOrEqual(9);
  });

  test("dynamo keeps Dynamo's cost but reports the same predicted TTFT", () => {
    const r = router(1, { policy: "dynamo" });
    const decision = r.route(request(prompt(200)), overlaps([]));
    // Dynamo: 200/4 prefill blocks + 50 new decode blocks.
    expect(decision.cost).toBe(100);
    expect(decision.predictedTtftMs).toBe(200 + 20);
  });
});

describe("calibration", () => {
  /** Routes `n` lone requests of `tokens` to one worker and answers prefill_done after `ttft(tokens)` ms. */
  function drive(
    r: Router,
    clock: { now: number },
    n: number,
    tokens: number,
    ttft: (i: number) => number,
  ): void {
    for (let i = 0; i < n; i++) {
      const d = r.route(request(prompt(tokens)), overlaps([]));
      clock.now += ttft(i);
      expect(r.load.prefillDone(d.requestId)).toBe("ok");
      expect(r.load.done(d.requestId)).toBe("ok");
    }
  }

  test("starting 2x off, the learned prefill speed converges to the engine's; outliers barely move it", () => {
    const clock = { now: 0 };
    // The router is told 500 tokens/s; the engine does 1,000 (1 token/ms) with 10 ms steps.
    const r = router(1, {
      now: () => clock.now,
      calibrate: true,
      ttft: { ...TTFT, prefillTokensPerSecond: 500 },
    });
    expect(r.learnedTimes(0)).toEqual({ prefillTokensPerSecond: 500, stepBaseMs: 10, samples: 0 });
    // 1,000 tokens alone: 10 steps of 100 -> 1,000 ms prefill + 100 ms steps; every 10th waits 5 s more.
    drive(r, clock, 200, 1000, (i) => 1100 + (i % 10 === 9 ? 5000 : 0));
    const learned = r.learnedTimes(0)!;
    expect(learned.samples).toBe(200);
    expect(learned.prefillTokensPerSecond).toBeGreaterThan(950);
    expect(learned.prefillTokensPerSecond).toBeLessThan(1050);
    // Its predictions now use what it learned.
    const d = r.route(request(prompt(1000)), overlaps([]));
    expect(d.predictedTtftMs).toBeCloseTo(1_000_000 / learned.prefillTokensPerSecond + 100, 6);
  });

  test("without calibration nothing is learned; a slot given to a new worker starts over", () => {
    const clock = { now: 0 };
    const plain = router(1, { now: () => clock.now });
    drive(plain, clock, 5, 1000, () => 600);
    expect(plain.learnedTimes(0)).toBeNull();

    const r = router(1, { now: () => clock.now, calibrate: true });
    drive(r, clock, 50, 1000, () => 600); // twice as fast as configured
    expect(r.learnedTimes(0)!.prefillTokensPerSecond).toBeGreaterThan(1500);
    const fleet = r.learnedTimes(0)!.prefillTokensPerSecond;
    removeWorker(r.load, 0n, 0);
    expect(r.load.table.acquire(7n, 0)).toBe(0);
    // A new worker starts from the fleet's values, with no samples of its own.
    const fresh = { prefillTokensPerSecond: fleet, stepBaseMs: 10, samples: 0 };
    expect(r.learnedTimes(0)).toEqual(fresh);
  });

  /** Routes `n` requests to `slot` (holding all but 800 of 4,000 tokens), answered in `ttft` ms. */
  function driveOn(r: Router, clock: { now: number }, slot: number, n: number, ttft: number): void {
    for (let i = 0; i < n; i++) {
      const tokens = prompt(4000);
      const d = r.route(request(tokens), overlaps([[slot, 3200 / BS]]));
      expect(d.slot).toBe(slot);
      clock.now += ttft;
      r.load.prefillDone(d.requestId);
      r.load.done(d.requestId);
    }
  }

  const sticky = { ...TTFT, recomputeWeight: 1000 };

  test("one fleet value, moved by every worker; a worker's own factor past the dead band", () => {
    const clock = { now: 0 };
    const r = router(3, { now: () => clock.now, calibrate: true, ttft: sticky });
    // 800 uncached tokens in 8 steps: 800 ms prefill + 80 ms; worker 0 is 2x slower on prefill.
    driveOn(r, clock, 0, 40, 1680);
    const fleet = r.learnedTimes(1)!;
    expect(fleet.samples).toBe(0);
    // Slot 1 never answered, yet its predictions use what the fleet learned (not 1,000).
    expect(fleet.prefillTokensPerSecond).toBeLessThan(600);
    expect(r.learnedTimes(0)!.prefillTokensPerSecond).toBe(fleet.prefillTokensPerSecond);
    // Workers 1 and 2 run at the configured speed and answer from now on: the fleet value
    // follows the majority; worker 0, > 25% off it with enough samples, keeps its own factor.
    for (let round = 0; round < 60; round++) {
      driveOn(r, clock, 1, 1, 880);
      driveOn(r, clock, 2, 1, 880);
      driveOn(r, clock, 0, 1, 1680);
    }
    const slow = r.learnedTimes(0)!.prefillTokensPerSecond;
    const fast = r.learnedTimes(1)!.prefillTokensPerSecond;
    expect(r.learnedTimes(2)!.prefillTokensPerSecond).toBe(fast);
    expect(fast).toBeGreaterThan(800);
    expect(fast).toBeLessThan(1250);
    expect(slow / fast).toBeGreaterThan(0.4);
    expect(slow / fast).toBeLessThan(0.6);
  });

  test("a worker's own factor needs samples: a few odd answers move only the fleet value", () => {
    const clock = { now: 0 };
    const r = router(2, { now: () => clock.now, calibrate: true, ttft: sticky });
    driveOn(r, clock, 0, 20, 1680); // 20 < the 32 own samples a factor needs
    const speed = (slot: number) => r.learnedTimes(slot)!.prefillTokensPerSecond;
    expect(speed(0)).toBe(speed(1));
  });
});
