// Goal: the core moves an active request's load from one worker to another (the
// proxy's failover) exactly: the first worker is left with nothing, the second has
// what a route to it would have given, and the request's lifecycle goes on there.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteInput } from "../../src/core/core";
import { silentLogger } from "../../src/util/log";

const input: RouteInput = {
  tokens: Uint32Array.from({ length: 100 }, (_, i) => i + 1),
  requestId: null,
  loraName: null,
  cacheSalt: "tenant",
  expectedOutputTokens: 64,
  overlapScoreCredit: null,
  prefillLoadScale: null,
  temperature: null,
};

function loadOf(core: KvedgeCore, slot: number) {
  const load = core.router.load;
  return [load.activeRequests[slot], load.activePrefillTokens[slot], load.activeDecodeBlocks[slot]];
}

describe("KvedgeCore.moveRequest", () => {
  test("the load leaves the first worker whole and lands on the second", () => {
    const { config } = loadConfig({ env: { KVEDGE_TRACK_OUTPUT_BLOCKS: "true" } });
    const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
    const slots = [core.workerTable.acquire(1n, 0), core.workerTable.acquire(2n, 0)];
    const { decision } = core.route(input, 2);
    const to = slots.find((slot) => slot !== decision.slot)!;
    const routed = loadOf(core, decision.slot);
    expect(routed[0]).toBe(1);
    expect(loadOf(core, to)).toEqual([0, 0, 0]);

    core.moveRequest(decision.requestId, input, to, 2);
    core.router.load.verify();
    expect(loadOf(core, decision.slot)).toEqual([0, 0, 0]);
    // Two of its blocks are cached on the target: 2 x block size fewer tokens to prefill.
    const [requests, prefill, decode] = loadOf(core, to);
    expect(requests).toBe(1);
    expect(prefill).toBe(routed[1]! - 2 * core.blockSize);
    expect(decode).toBe(routed[2]);
    expect(core.router.load.activeRequestCount).toBe(1);

    expect(core.prefillDone(decision.requestId)).toBe("ok");
    expect(loadOf(core, to)[1]).toBe(0);
    expect(core.done(decision.requestId)).toBe("ok");
    expect(loadOf(core, to)).toEqual([0, 0, 0]);
    expect(core.router.load.activeRequestCount).toBe(0);
  });
});
