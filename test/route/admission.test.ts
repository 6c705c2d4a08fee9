// Goal: admission at saturation holds a call while every worker's predicted wait is
// past the bound, releases held calls in order (shortest prefill first, with aging),
// never holds longer than the longest hold or more than the most held, answers a
// rejection with Retry-After, forgets a dropped call, and gives its memory back.
// Fake clock, fake port: the order and the answers are exact.
import { describe, expect, test } from "bun:test";
import { Admission, type AdmissionSettings } from "../../src/route/admission";
import { createRng, randomInt } from "../../src/sim/random";

interface Call {
  readonly name: string;
  /** What the port reports as this call's shortest wait; tests move it. */
  wait: number;
}

function rig(settings: Partial<AdmissionSettings>) {
  let now = 0;
  const routed: string[] = [];
  const rejected: { name: string; retryAfter: number; reason: string }[] = [];
  const admission = new Admission<Call>(
    { mode: "hold", boundMs: 100, maxHoldMs: 10_000, maxHeld: 8, prefillWeight: 4, ...settings },
    {
      waitMs: (call) => call.wait,
      route: (call) => routed.push(call.name),
      reject: (call, retryAfter, reason) => rejected.push({ name: call.name, retryAfter, reason }),
    },
    () => now,
  );
  return {
    admission,
    routed,
    rejected,
    advance: (ms: number) => {
      now += ms;
    },
    at: () => now,
  };
}

describe("Admission", () => {
  test("off routes every call at once, whatever the wait", () => {
    const { admission, routed } = rig({ mode: "off" });
    expect(admission.submit({ name: "a", wait: 1e9 }, 50, 10)).toBe(-1);
    expect(routed).toEqual(["a"]);
    expect(admission.held).toBe(0);
  });

  test("a call under the bound goes at once; over it, it waits until a worker frees", () => {
    const { admission, routed } = rig({});
    admission.submit({ name: "fast", wait: 99 }, 99, 10);
    const slow = { name: "slow", wait: 500 };
    expect(admission.submit(slow, 500, 10)).toBeGreaterThanOrEqual(0);
    expect(routed).toEqual(["fast"]);
    admission.release();
    expect(routed).toEqual(["fast"]);
    slow.wait = 100; // a done freed a worker
    admission.release();
    expect(routed).toEqual(["fast", "slow"]);
    expect(admission.counts).toMatchObject({ immediate: 1, held: 1, released: 1 });
  });

  test("while calls are held, a new one under the bound queues behind them", () => {
    const { admission, routed } = rig({});
    const first = { name: "first", wait: 500 };
    admission.submit(first, 500, 10);
    admission.submit({ name: "second", wait: 0 }, 0, 10);
    expect(routed).toEqual([]);
    first.wait = 0;
    admission.release();
    expect(routed).toEqual(["first", "second"]);
  });

  test("shortest predicted prefill first; aging lets an old long call overtake", () => {
    const { admission, routed, advance } = rig({ prefillWeight: 4 });
    const calls = [
      { name: "long", wait: 500, prefill: 1000 }, // key 0 + 4000
      { name: "short", wait: 500, prefill: 10 }, // key 0 + 40
      { name: "middle", wait: 500, prefill: 300 }, // key 0 + 1200
    ];
    for (const call of calls) admission.submit(call, call.wait, call.prefill);
    advance(3990);
    const late = { name: "late-short", wait: 500 }; // key 3990 + 40 = 4030: after "long"
    admission.submit(late, 500, 10);
    for (const call of [...calls, late]) call.wait = 0;
    admission.release();
    expect(routed).toEqual(["short", "middle", "long", "late-short"]);
  });

  test("prefill weight 0 is arrival order", () => {
    const { admission, routed, advance } = rig({ prefillWeight: 0 });
    const calls = ["a", "b", "c"].map((name) => ({ name, wait: 500 }));
    calls.forEach((call, i) => {
      admission.submit(call, 500, 1000 - 100 * i);
      advance(1);
    });
    for (const call of calls) call.wait = 0;
    admission.release();
    expect(routed).toEqual(["a", "b", "c"]);
  });

  test("release stops at a head still over the bound (no overtaking it)", () => {
    const { admission, routed } = rig({});
    const head = { name: "head", wait: 500 };
    const next = { name: "next", wait: 0 };
    admission.submit(head, 500, 1);
    admission.submit(next, 500, 50);
    admission.release();
    expect(routed).toEqual([]);
  });

  test("hold mode: past the longest hold the call is routed anyway", () => {
    const { admission, routed, advance } = rig({ maxHoldMs: 1000 });
    admission.submit({ name: "a", wait: 500 }, 500, 10);
    advance(400);
    admission.submit({ name: "b", wait: 500 }, 500, 10);
    expect(admission.nextDueMs()).toBe(1000);
    advance(599);
    admission.release();
    expect(routed).toEqual([]);
    advance(1);
    admission.release();
    expect(routed).toEqual(["a"]);
    expect(admission.nextDueMs()).toBe(1400);
    advance(400);
    admission.release();
    expect(routed).toEqual(["a", "b"]);
    expect(admission.counts.overdue).toBe(2);
    expect(admission.nextDueMs()).toBe(Infinity);
  });

  test("reject mode: past the longest hold the call is rejected with Retry-After", () => {
    const { admission, routed, rejected, advance } = rig({ mode: "reject", maxHoldMs: 1000 });
    const call = { name: "a", wait: 3500 };
    admission.submit(call, 3500, 10);
    advance(1000);
    admission.release();
    expect(routed).toEqual([]);
    expect(rejected).toEqual([
      { name: "a", retryAfter: 4, reason: "held 1000 ms without a worker under the wait bound" },
    ]);
  });

  test("reject mode with no hold rejects at once; hold mode with no hold routes at once", () => {
    const reject = rig({ mode: "reject", maxHoldMs: 0 });
    reject.admission.submit({ name: "a", wait: 150 }, 150, 10);
    expect(reject.rejected).toEqual([
      { name: "a", retryAfter: 1, reason: "every worker is past the wait bound" },
    ]);
    const hold = rig({ mode: "hold", maxHoldMs: 0 });
    hold.admission.submit({ name: "a", wait: 150 }, 150, 10);
    expect(hold.routed).toEqual(["a"]);
  });

  test("over the most held, a call is rejected", () => {
    const { admission, rejected } = rig({ maxHeld: 2 });
    for (const name of ["a", "b", "c"]) admission.submit({ name, wait: 2100 }, 2100, 10);
    expect(admission.held).toBe(2);
    expect(rejected).toEqual([{ name: "c", retryAfter: 2, reason: "2 calls are held already" }]);
  });

  test("a dropped call is never answered; dropping an answered one is refused", () => {
    const { admission, routed } = rig({});
    const a = { name: "a", wait: 500 };
    const b = { name: "b", wait: 500 };
    const handleA = admission.submit(a, 500, 10);
    const handleB = admission.submit(b, 500, 20);
    expect(admission.drop(handleA, a)).toBe(true);
    expect(admission.drop(handleA, a)).toBe(false);
    a.wait = b.wait = 0;
    admission.release();
    expect(routed).toEqual(["b"]);
    expect(admission.drop(handleB, b)).toBe(false);
    expect(admission.counts.dropped).toBe(1);
  });

  test("memory goes back to 0 once nothing is held", () => {
    const { admission } = rig({ maxHeld: 1000 });
    const calls = Array.from({ length: 700 }, (_, i) => ({ name: String(i), wait: 500 }));
    const handles = calls.map((call, i) => admission.submit(call, 500, i));
    expect(admission.held).toBe(700);
    expect(admission.capacity).toBe(700);
    handles.forEach((handle, i) => {
      admission.drop(handle, calls[i]!);
    });
    expect(admission.held).toBe(0);
    expect(admission.capacity).toBe(0);
  });

  test("randomized: holds, drops and releases answer in key order, each call once", () => {
    const rng = createRng(7);
    const { admission, routed, advance, at } = rig({
      maxHeld: 64,
      prefillWeight: 2,
      maxHoldMs: 1e9,
    });
    const keyOf = new Map<string, number>();
    const handleOf = new Map<string, number>();
    const heldCalls = new Map<string, Call>();
    let next = 0;
    for (let round = 0; round < 3000; round++) {
      const op = randomInt(rng, 10);
      if (op < 6 && admission.held < 64) {
        const name = String(next++);
        const prefill = randomInt(rng, 1000);
        const call = { name, wait: 500 };
        keyOf.set(name, at() + 2 * prefill);
        heldCalls.set(name, call);
        handleOf.set(name, admission.submit(call, 500, prefill));
      } else if (op < 8 && heldCalls.size > 0) {
        const names = [...heldCalls.keys()];
        const name = names[randomInt(rng, names.length)]!;
        expect(admission.drop(handleOf.get(name)!, heldCalls.get(name)!)).toBe(true);
        heldCalls.delete(name);
      } else if (heldCalls.size > 0) {
        // Free enough for the k first calls in key order, exactly.
        const order = [...heldCalls.keys()].sort(
          (x, y) => keyOf.get(x)! - keyOf.get(y)! || Number(x) - Number(y),
        );
        const k = 1 + randomInt(rng, order.length);
        routed.length = 0;
        for (const name of order.slice(0, k)) heldCalls.get(name)!.wait = 0;
        admission.release();
        expect(routed).toEqual(order.slice(0, k));
        for (const name of routed) heldCalls.delete(name);
      }
      advance(randomInt(rng, 5));
      expect(admission.held).toBe(heldCalls.size);
    }
  });
});
