// Goal: the lower tiers reach routing exactly as docs/decisions.md#lower-tiers says. A
// worker whose prompt blocks sit in host memory right after its device match is
// credited for them (dynamo: 0.75 of a device block each) or charged their copy back
// instead of a prefill (ttft: reload_ms); /v1/match's scores and route answers show
// each tier; route.lower_tiers = false routes on the device tier alone. Method: a real
// core (index + router), its index written through the same slot methods ingest uses.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteInput } from "../../src/core/core";
import { TIER_HOST } from "../../src/index/types";
import { silentLogger } from "../../src/util/log";
import { routeInput } from "../support/route-input";

const TOKENS = Uint32Array.from({ length: 16 * 40 }, (_, i) => i + 1);

const input: RouteInput = routeInput(TOKENS);

/** A core with workers 1 and 2; worker 1 holds the prompt's first 8 blocks on the device and the next 24 in host memory. */
function setUp(env: Record<string, string> = {}) {
  const { config } = loadConfig({ env });
  const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
  const slots = [core.workerTable.acquire(1n, 0), core.workerTable.acquire(2n, 0)];
  const prompt = core.hash(TOKENS, null, null);
  const external = new Uint32Array(prompt.local.length);
  for (let i = 0; i < prompt.blockCount; i++) external[2 * i + 1] = 1000 + i;
  const slot = core.workerTable.acquire(1n, 0);
  core.index.storeAt(slot, false, 0, 0, external, prompt.local, 8, 0);
  core.index.storeTierAt(TIER_HOST, slot, true, 0, 1007, external, prompt.local, 24, 8);
  return { core, slots };
}

describe("lower tiers in routing", () => {
  test("/v1/match shows each worker's host blocks after its device match", () => {
    const { core } = setUp();
    const prompt = core.hash(TOKENS, null, null);
    expect(core.match(prompt.local, prompt.blockCount, prompt.chain)).toEqual([
      {
        workerId: 1n,
        dpRank: 0,
        blocks: 8,
        kind: "exact",
        hostBlocks: 24,
        diskBlocks: 0,
        externalBlocks: 0,
      },
    ]);
  });

  test("dynamo: host blocks are credited at 0.75 of a device block each", () => {
    const { core, slots } = setUp({ KVEDGE_ROUTE_POLICY: "dynamo" });
    const { decision } = core.route(input, 2);
    expect(decision.slot).toBe(slots[0]);
    expect([decision.overlapBlocks, decision.hostBlocks]).toEqual([8, 24]);
    const costs = decision.candidates.toArray().map((candidate) => candidate.cost);
    // Both idle: raw prefill 40 blocks, plus 40 new decode blocks; worker 1 minus 8 + 0.75 × 24.
    expect(costs).toEqual([40 - 8 - 18 + 40, 40 + 40]);
  });

  test("ttft: a host block costs its copy back, not a prefill", () => {
    const { core, slots } = setUp();
    const { decision } = core.route(input, 2);
    expect(decision.slot).toBe(slots[0]);
    const [held, cold] = decision.candidates.toArray();
    // 24 blocks of 16 tokens at 2,600 ms per million tokens; 8 blocks computed (the prompt's last 8).
    expect(held!.reloadMs).toBeCloseTo((24 * 16 * 2600) / 1e6, 9);
    expect(held!.prefillMs).toBeCloseTo((8 * 16) / 15, 9);
    expect(cold!.reloadMs).toBe(0);
    expect(cold!.prefillMs).toBeCloseTo((40 * 16) / 15, 9);
    for (const candidate of [held!, cold!]) {
      const parts =
        candidate.queueMs + candidate.reloadMs + candidate.prefillMs + candidate.stepsMs;
      expect(candidate.predictedTtftMs).toBeCloseTo(parts, 9);
    }
  });

  test("route.lower_tiers = false: the device tier only", () => {
    const { core } = setUp({ KVEDGE_ROUTE_POLICY: "dynamo", KVEDGE_LOWER_TIERS: "false" });
    const prompt = core.hash(TOKENS, null, null);
    expect(core.match(prompt.local, prompt.blockCount, prompt.chain)).toEqual([
      {
        workerId: 1n,
        dpRank: 0,
        blocks: 8,
        kind: "exact",
        hostBlocks: 0,
        diskBlocks: 0,
        externalBlocks: 0,
      },
    ]);
    const { decision } = core.route(input, 2);
    expect([decision.overlapBlocks, decision.hostBlocks]).toEqual([8, 0]);
    expect(decision.candidates.toArray().map((candidate) => candidate.cost)).toEqual([
      40 - 8 + 40,
      40 + 40,
    ]);
  });
});
