// Goal: the core moves an active request's load from one worker to another (the
// proxy's failover) exactly: the first worker is left with nothing, the second has
// what a route to it would have given, and the request's lifecycle goes on there; a
// target that left meanwhile is named by identity, so its reused slot gets nothing.
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
    const toId = core.workerTable.workerIdOf(to);
    const routed = loadOf(core, decision.slot);
    expect(routed[0]).toBe(1);
    expect(loadOf(core, to)).toEqual([0, 0, 0]);

    expect(core.moveRequest(decision.requestId, input, toId, 0, 2)).toBe(true);
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

  test("a target removed meanwhile, its slot another worker's: nothing moves", async () => {
    const { config } = loadConfig({ env: {} });
    const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
    core.workerTable.acquire(1n, 0);
    core.workerTable.acquire(2n, 0);
    const { decision } = core.route(input, 2);
    const other = decision.workerId === 1n ? 2n : 1n;
    const otherSlot = core.workerTable.find(other, 0);
    // The proxy held `other` as a candidate across an await; it left, a new worker came.
    await core.removeWorker(other);
    const newcomer = core.workerTable.acquire(3n, 0);
    expect(newcomer).toBe(otherSlot);
    expect(core.moveRequest(decision.requestId, input, other, 0, 2)).toBe(false);
    core.router.load.verify();
    expect(loadOf(core, newcomer)).toEqual([0, 0, 0]);
    expect(loadOf(core, decision.slot)[0]).toBe(1);
    expect(core.done(decision.requestId)).toBe("ok");
    expect(core.router.load.activeRequestCount).toBe(0);
  });
});
