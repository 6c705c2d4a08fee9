// Goal: the core's route calls with route.pacing on (transport-free): decided on
// arrival (the request counts as its worker's load at once), answered at once while its
// worker has fewer than two sent requests still prefilling, else held and answered with
// the decision made on arrival when prefill_done, done or the longest hold frees a
// place; a client gone while held ends its request (the load comes back); a held
// request whose worker was removed is routed afresh; shutting down answers every held
// call; with admission on too, a call admission releases may be paced. Nothing stays held.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteCall, type RouteInput } from "../../src/core/core";
import { KvedgeError } from "../../src/domain/errors";
import { silentLogger } from "../../src/util/log";
import { routeInput } from "../support/route-input";

let prompts = 0;
/** A prompt of its own: nothing of it is cached or pending anywhere. */
const input = (requestId: string, length: number): RouteInput => {
  const base = ++prompts * 100_000;
  return routeInput(
    Uint32Array.from({ length }, (_, i) => base + i),
    requestId,
  );
};

function setup(env: Record<string, string> = {}, workers = [1n]) {
  const config = loadConfig({
    env: { KVEDGE_PACING: "on", KVEDGE_PACING_PER_WORKER: "2", ...env },
  }).config;
  let now = 0;
  const core = new KvedgeCore({
    config,
    log: silentLogger,
    random: () => 0.5,
    admissionClock: () => now,
  });
  for (const id of workers) core.workerTable.acquire(id, 0);
  const answers: string[] = [];
  const call = (id: string, length = 64, max = 0): RouteCall => ({
    input: input(id, length),
    candidatesMax: max,
    answer: (outcome) =>
      answers.push(
        `${outcome.decision.requestId}@${outcome.decision.workerId}` +
          (max > 0 ? `[${outcome.decision.candidates.toArray().length}]` : ""),
      ),
    fail: (error) =>
      answers.push(`${id}:${error instanceof KvedgeError ? error.code : String(error)}`),
  });
  const advance = (ms: number) => {
    now += ms;
  };
  return { core, answers, call, advance };
}

describe("KvedgeCore pacing", () => {
  test("two prefilling per worker; the third is decided at once but answered when a place frees", () => {
    const { core, answers, call } = setup();
    expect(core.submitRoute(call("a"))).toBe(-1);
    expect(core.submitRoute(call("b"))).toBe(-1);
    expect(core.submitRoute(call("c", 64, 2))).toBeGreaterThanOrEqual(0);
    expect(core.submitRoute(call("d"))).toBeGreaterThanOrEqual(0);
    expect(answers).toEqual(["a@1", "b@1"]);
    // Held, but already the worker's load: a duplicate is refused, the load counts it.
    expect(() => core.submitRoute(call("c"))).toThrow("already active");
    expect(core.activeRequestCount).toBe(4);
    expect(core.pacing.held).toBe(2);
    // Another route and a match in between must not change the held decision's candidates.
    expect(core.prefillDone("a")).toBe("ok");
    expect(answers).toEqual(["a@1", "b@1", "c@1[1]"]);
    expect(core.done("b")).toBe("ok");
    expect(answers).toEqual(["a@1", "b@1", "c@1[1]", "d@1"]);
    expect(core.pacing.held).toBe(0);
    expect(core.pacing.counts).toEqual({
      immediate: 2,
      paced: 2,
      released: 2,
      overdue: 0,
      dropped: 0,
    });
  });

  test("a client gone while held: never answered, its request ends and its load comes back", () => {
    const { core, answers, call } = setup();
    core.submitRoute(call("a"));
    core.submitRoute(call("b"));
    const gone = call("gone");
    const handle = core.submitRoute(gone);
    expect(core.activeRequestCount).toBe(3);
    expect(core.dropHeld(handle, gone)).toBe(true);
    expect(core.dropHeld(handle, gone)).toBe(false);
    expect(core.activeRequestCount).toBe(2);
    expect(core.pacing.held).toBe(0);
    core.prefillDone("a");
    expect(answers).toEqual(["a@1", "b@1"]);
    expect(core.submitRoute(call("gone"))).toBe(-1); // its id is free again
  });

  test("the longest hold sends a request whose predecessors never report prefill_done", async () => {
    const { core, answers, call, advance } = setup({ KVEDGE_PACING_MAX_HOLD_MS: "50" });
    core.submitRoute(call("a"));
    core.submitRoute(call("b"));
    core.submitRoute(call("c"));
    expect(core.pacing.nextDueMs()).toBe(50);
    advance(50);
    // The hold poll looks at held calls by itself (a timer of at most 100 ms).
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(answers).toEqual(["a@1", "b@1", "c@1"]);
    expect(core.pacing.counts.overdue).toBe(1);
    await core.stop();
  });

  test("a held request whose worker was removed is routed afresh to a live one", async () => {
    const { core, answers, call } = setup({}, [1n, 2n]);
    // Both workers full: two each (ties go to... either; fill until one holds).
    for (const id of ["a", "b", "c", "d"]) core.submitRoute(call(id));
    expect(core.submitRoute(call("e"))).toBeGreaterThanOrEqual(0);
    const heldOn = core.pacing.backlog[0]! > 0 ? 1n : 2n;
    await core.removeWorker(heldOn);
    const other = heldOn === 1n ? 2n : 1n;
    // The removal ended its requests: e's place question is asked again on the live worker.
    for (const id of ["a", "b", "c", "d"]) core.prefillDone(id);
    expect(answers.at(-1)).toBe(`e@${other}`);
    expect(core.pacing.held).toBe(0);
  });

  test("stopping answers every held call with shutting_down", async () => {
    const { core, answers, call } = setup();
    for (const id of ["a", "b", "c", "d"]) core.submitRoute(call(id));
    await core.stop();
    expect(answers).toEqual(["a@1", "b@1", "c:shutting_down", "d:shutting_down"]);
    expect(core.pacing.held).toBe(0);
  });

  test("with admission on, a call admission lets through is paced too, and a drop finds it", () => {
    const { core, answers, call } = setup({ KVEDGE_ADMISSION: "hold" });
    core.submitRoute(call("a"));
    core.submitRoute(call("b"));
    const paced = call("c");
    const handle = core.submitRoute(paced);
    expect(handle).toBeGreaterThanOrEqual(0);
    expect(core.admission.held + core.pacing.held).toBe(1);
    expect(core.dropHeld(handle, paced)).toBe(true);
    expect(core.activeRequestCount).toBe(2);
    core.prefillDone("a");
    expect(answers).toEqual(["a@1", "b@1"]);
  });
});
