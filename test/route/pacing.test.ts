// Goal: pacing sends a worker at most `perWorker` requests still prefilling, keeps the
// rest in arrival order per worker, sends the next as a place frees (prefill done, end,
// expiry: whatever the load tracker says), never holds longer than the longest hold or
// more than the most held, forgets a dropped call, is inert when off, and gives its
// memory back. Fake clock, fake port: the order and the answers are exact. Then the
// router's spill: a request whose cheapest worker has a long backlog is costed at half
// the recompute weight, exactly as a router configured with that weight costs it.
import { describe, expect, test } from "bun:test";
import { Pacing, type PacingSettings, SPILL_BACKLOG } from "../../src/route/pacing";
import { Router } from "../../src/route/router";
import { WorkerTable } from "../../src/domain/worker-table";
import { createRng, randomInt } from "../../src/sim/random";

function rig(settings: Partial<PacingSettings> = {}) {
  let now = 0;
  const prefilling = new Set<string>();
  const sent: string[] = [];
  const pacing = new Pacing<string>(
    { mode: "on", perWorker: 2, maxHoldMs: 1_000, maxHeld: 8, stepTokens: 8192, ...settings },
    { prefillTokens: (id) => (prefilling.has(id) ? 100 : 0), send: (call) => sent.push(call) },
    () => now,
  );
  /** Routes `id` to `slot` as the owner does: admitted (prefilling), then submitted. */
  const route = (id: string, slot: number): boolean => {
    prefilling.add(id);
    const now = pacing.submit(id, id, slot);
    if (now) sent.push(id);
    return now;
  };
  const firstToken = (id: string) => {
    prefilling.delete(id);
    pacing.release();
  };
  return {
    pacing,
    sent,
    route,
    firstToken,
    prefilling,
    advance: (ms: number) => {
      now += ms;
    },
    setNow: (ms: number) => {
      now = ms;
    },
  };
}

describe("Pacing", () => {
  test("off sends everything at once and keeps nothing", () => {
    const { pacing, route, sent } = rig({ mode: "off" });
    for (let i = 0; i < 5; i++) expect(route(`r${i}`, 0)).toBe(true);
    expect(sent).toEqual(["r0", "r1", "r2", "r3", "r4"]);
    expect(pacing.held).toBe(0);
    expect(pacing.trackedSlots).toBe(0);
    expect(pacing.counts.immediate).toBe(0);
  });

  test("two prefilling per worker; the rest wait in arrival order and go as places free", () => {
    const { pacing, route, sent, firstToken } = rig();
    expect([route("a", 0), route("b", 0), route("c", 0), route("d", 0)]).toEqual([
      true,
      true,
      false,
      false,
    ]);
    expect(route("x", 1)).toBe(true); // another worker has its own places
    expect(pacing.held).toBe(2);
    expect(pacing.backlog[0]).toBe(2);
    firstToken("b");
    expect(sent).toEqual(["a", "b", "x", "c"]);
    firstToken("x"); // another worker's place frees nothing here
    expect(sent).toEqual(["a", "b", "x", "c"]);
    firstToken("a");
    expect(sent).toEqual(["a", "b", "x", "c", "d"]);
    expect(pacing.held).toBe(0);
    expect(pacing.backlog[0]).toBe(0);
    expect(pacing.counts).toEqual({
      immediate: 3,
      paced: 2,
      released: 2,
      overdue: 0,
      dropped: 0,
    });
  });

  test("when those sent have a full step or more left to prefill, a newcomer goes at once", () => {
    const left = new Map<string, number>();
    const sent: string[] = [];
    const pacing = new Pacing<string>(
      { mode: "on", perWorker: 2, maxHoldMs: 1_000, maxHeld: 8, stepTokens: 8192 },
      { prefillTokens: (id) => left.get(id) ?? 0, send: (call) => sent.push(call) },
      () => 0,
    );
    const route = (id: string, tokens: number) => {
      left.set(id, tokens);
      if (pacing.submit(id, id, 0)) sent.push(id);
    };
    route("long", 6000);
    route("short", 900);
    route("next", 2500); // 6,900 ahead: it would share their steps, so it waits
    expect(sent).toEqual(["long", "short"]);
    left.set("short", 0);
    pacing.release();
    expect(sent).toEqual(["long", "short", "next"]);
    route("longer", 5000); // two prefilling, but 8,500 ahead: a full step, it goes
    expect(sent).toEqual(["long", "short", "next", "longer"]);
    expect(pacing.counts.paced).toBe(1);
  });

  test("a newcomer waits behind those already waiting, even when a place is free", () => {
    const { pacing, route, sent, prefilling } = rig();
    route("a", 0);
    route("b", 0);
    route("c", 0);
    prefilling.delete("a"); // a place frees, but nobody has told pacing yet
    expect(route("d", 0)).toBe(false);
    pacing.release();
    expect(sent).toEqual(["a", "b", "c"]);
  });

  test("a request that ended, expired or lost its worker frees its place (the tracker's word)", () => {
    const { pacing, route, sent, prefilling } = rig();
    route("a", 0);
    route("b", 0);
    route("c", 0);
    prefilling.delete("a"); // say it expired: no lifecycle call came
    prefilling.delete("b");
    pacing.release();
    expect(sent).toEqual(["a", "b", "c"]);
  });

  test("a request with nothing to prefill takes no place", () => {
    const { pacing, sent } = rig();
    // Submitted without being prefilling (fully cached): it goes, and others go too.
    expect(pacing.submit("cached", "cached", 0)).toBe(true);
    sent.push("cached");
    expect(pacing.trackedSlots).toBe(0);
  });

  test("nothing waits past the longest hold (a client that never reports prefill_done)", () => {
    const { pacing, route, sent, advance } = rig({ maxHoldMs: 500 });
    route("a", 0);
    route("b", 0);
    advance(100);
    route("c", 0);
    advance(200);
    route("d", 0);
    expect(pacing.nextDueMs()).toBe(600);
    advance(299);
    pacing.release();
    expect(sent).toEqual(["a", "b"]);
    advance(1);
    pacing.release();
    expect(sent).toEqual(["a", "b", "c"]);
    expect(pacing.nextDueMs()).toBe(800);
    advance(200);
    pacing.release();
    expect(sent).toEqual(["a", "b", "c", "d"]);
    expect(pacing.counts.overdue).toBe(2);
    expect(pacing.nextDueMs()).toBe(Infinity);
  });

  test("a release at the time nextDueMs reports sends the request, whatever the rounding", () => {
    const { pacing, route, sent, setNow } = rig({ maxHoldMs: 2_000, perWorker: 1 });
    route("a", 0);
    setNow(0.1); // 0.1 + 2000 - 2000 is not 0.1 in binary floating point
    route("b", 0);
    setNow(pacing.nextDueMs()); // as the simulator advances to it
    pacing.release();
    expect(sent).toEqual(["a", "b"]);
  });

  test("past the most held, requests go at once", () => {
    const { pacing, route } = rig({ maxHeld: 2, perWorker: 1 });
    route("a", 0);
    expect(route("b", 0)).toBe(false);
    expect(route("c", 0)).toBe(false);
    expect(route("d", 0)).toBe(true);
    expect(pacing.held).toBe(2);
  });

  test("a dropped call is never sent, and a drop of one not waiting is refused", () => {
    const { pacing, route, sent, firstToken } = rig();
    route("a", 0);
    route("b", 0);
    route("c", 0);
    route("d", 0);
    expect(pacing.drop("c")).toBe(true);
    expect(pacing.drop("c")).toBe(false);
    expect(pacing.drop("a")).toBe(false);
    firstToken("a");
    firstToken("b");
    expect(sent).toEqual(["a", "b", "d"]);
    expect(pacing.counts.dropped).toBe(1);
  });

  test("a send that ends a request (re-entering release) neither loses nor repeats a call", () => {
    const prefilling = new Set<string>();
    const sent: string[] = [];
    const pacing: Pacing<string> = new Pacing<string>(
      { mode: "on", perWorker: 1, maxHoldMs: 1_000, maxHeld: 8, stepTokens: 8192 },
      {
        prefillTokens: (id) => (prefilling.has(id) ? 100 : 0),
        send: (call) => {
          sent.push(call);
          prefilling.delete(call); // answered from cache at once: its place frees
          pacing.release();
        },
      },
      () => 0,
    );
    for (const id of ["a", "b", "c", "d"]) {
      prefilling.add(id);
      if (pacing.submit(id, id, 0)) sent.push(id);
    }
    prefilling.delete("a");
    pacing.release();
    expect(sent).toEqual(["a", "b", "c", "d"]);
    expect(pacing.held).toBe(0);
  });

  test("takeAll hands back every waiting call and forgets everything", () => {
    const { pacing, route } = rig();
    for (const id of ["a", "b", "c", "d"]) route(id, 0);
    route("e", 3);
    route("f", 3);
    route("g", 3);
    expect(pacing.takeAll().sort()).toEqual(["c", "d", "g"]);
    expect(pacing.held).toBe(0);
    expect(pacing.trackedSlots).toBe(0);
    expect([...pacing.backlog]).toEqual([0, 0, 0, 0]);
  });

  test("randomized churn: the limit always holds, order per worker is arrival order, memory comes back", () => {
    const rng = createRng(7);
    // No longest hold and room for all: the limit must hold at every step.
    const { pacing, route, sent, firstToken, prefilling, advance } = rig({
      maxHeld: 10_000,
      maxHoldMs: 1e9,
    });
    const slotOf = new Map<string, number>();
    const arrivals: string[][] = [[], [], [], []];
    const onEngine = (id: string) => prefilling.has(id) && sent.includes(id);
    for (let i = 0; i < 2_000; i++) {
      const roll = randomInt(rng, 10);
      if (roll < 5) {
        const id = `r${i}`;
        const slot = randomInt(rng, 4);
        slotOf.set(id, slot);
        arrivals[slot]!.push(id);
        route(id, slot);
      } else if (roll < 9) {
        const live = [...prefilling].filter(onEngine);
        if (live.length > 0) firstToken(live[randomInt(rng, live.length)]!);
      } else {
        advance(randomInt(rng, 301));
        pacing.release();
      }
      const perSlot = [0, 0, 0, 0];
      for (const id of prefilling) if (onEngine(id)) perSlot[slotOf.get(id)!]!++;
      expect(Math.max(...perSlot)).toBeLessThanOrEqual(2);
    }
    // The churn did hold and release many (a test that cannot fail proves nothing).
    expect(pacing.counts.paced).toBeGreaterThan(100);
    expect(pacing.counts.released).toBeGreaterThan(100);
    for (let slot = 0; slot < 4; slot++) {
      const order = sent.filter((id) => slotOf.get(id) === slot);
      expect(order).toEqual(arrivals[slot]!.filter((id) => sent.includes(id)));
    }
    while (prefilling.size > 0) for (const id of [...prefilling]) firstToken(id);
    pacing.sweep();
    expect(pacing.held).toBe(0);
    expect(pacing.trackedSlots).toBe(0);
    expect(sent.length).toBe(slotOf.size);
  });
});

describe("the router's spill", () => {
  const request = (id: string, seed: number) => ({
    chain: Uint32Array.from({ length: 2 * 512 }, (_, i) => seed * 10_000 + i + 1),
    blockCount: 512,
    tokenCount: 512 * 16,
    requestId: id,
  });
  /**
   * Worker 0 with ~5 s of prefill queued (nine uncached 8,192-token prompts, routed while
   * it was the only worker), then worker 1, idle; `paced` gives the router a backlog.
   */
  function loaded(weight: number, paced: Uint32Array | null) {
    const table = new WorkerTable();
    const router = new Router({
      blockSize: 16,
      workers: table,
      policy: "ttft",
      random: () => 0.5,
      ttft: { recomputeWeight: weight },
    });
    if (paced !== null) router.paced = { backlog: paced };
    table.acquire(0n, 0);
    const alone = { count: 1, slots: Int32Array.of(0), blocks: Float64Array.of(0) };
    for (let i = 0; i < 9; i++) router.route(request(`load-${i}`, i + 1), alone);
    table.acquire(1n, 0);
    return router;
  }
  // The request's context is cached on worker 0 only.
  const overlaps = { count: 2, slots: Int32Array.of(0, 1), blocks: Float64Array.of(500, 0) };

  test("the full weight keeps the request behind the queue; half the weight moves it", () => {
    expect(loaded(12, null).route(request("x", 0), overlaps).slot).toBe(0);
    expect(loaded(6, null).route(request("x", 0), overlaps).slot).toBe(1);
  });

  test("under the backlog it is costed at the full weight, at it at half", () => {
    for (const backlog of [SPILL_BACKLOG - 1, SPILL_BACKLOG]) {
      const paced = Uint32Array.of(backlog, 0);
      const decision = loaded(12, paced).route(request("x", 0), overlaps);
      const reference = loaded(backlog < SPILL_BACKLOG ? 12 : 6, null).route(
        request("x", 0),
        overlaps,
      );
      expect(decision.slot).toBe(reference.slot);
      expect(decision.cost).toBe(reference.cost);
    }
  });
});
