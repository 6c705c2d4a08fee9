// Goal: the core's route calls through admission (transport-free): routed at once
// under the bound, held over it and released by prefill_done, by done, or by the
// expiry of the request ahead (the hold poll); a duplicate id (of an active request or
// of a held call) is refused at once;
// a held call's tokens count in the process-wide buffer budget until it is answered
// (over it: 429); shutting down answers every held call; nothing stays held.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteCall, type RouteInput } from "../../src/core/core";
import { KvedgeError } from "../../src/domain/errors";
import { STATUS_OF } from "../../src/http/errors";
import { bufferBudget } from "../../src/util/buffer-budget";
import { silentLogger } from "../../src/util/log";
import { until } from "../support/wait";
import { routeInput } from "../support/route-input";

const input = (requestId: string, length: number): RouteInput =>
  routeInput(
    Uint32Array.from({ length }, (_, i) => i + 1),
    requestId,
  );

function setup(env: Record<string, string> = {}) {
  const config = loadConfig({
    env: { KVEDGE_ADMISSION: "hold", KVEDGE_ADMISSION_BOUND_MS: "200", ...env },
  }).config;
  // Admission's clock stands still: its order does not depend on how long the machine
  // took between two calls (a call's key is its arrival plus its weighted prefill).
  const core = new KvedgeCore({
    config,
    log: silentLogger,
    random: () => 0.5,
    admissionClock: () => 0,
  });
  core.workerTable.acquire(1n, 0);
  const answers: string[] = [];
  const call = (id: string, length: number): RouteCall => ({
    input: input(id, length),
    candidatesMax: 0,
    answer: (outcome) => answers.push(`${outcome.decision.requestId}:ok`),
    fail: (error) =>
      answers.push(`${id}:${error instanceof KvedgeError ? error.code : String(error)}`),
  });
  return { core, answers, call };
}

describe("KvedgeCore admission", () => {
  test("held behind a long prefill; prefill_done of the one ahead releases it", () => {
    const { core, answers, call } = setup();
    expect(core.submitRoute(call("ahead", 6000))).toBe(-1);
    expect(answers).toEqual(["ahead:ok"]);
    const held = call("held", 8);
    const before = bufferBudget.held;
    expect(core.submitRoute(held)).toBeGreaterThanOrEqual(0);
    expect(core.admission.held).toBe(1);
    expect(bufferBudget.held).toBe(before + 32); // its 8 tokens count in the process-wide budget while held
    expect(() => core.submitRoute(call("ahead", 8))).toThrow("already active");
    expect(core.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "held:ok"]);
    expect(core.admission.held).toBe(0);
    expect(bufferBudget.held).toBe(before);
  });

  test("a held call's id is refused at submit; it is free again once the first is answered", () => {
    const { core, answers, call } = setup();
    core.submitRoute(call("ahead", 6000));
    const first = call("twin", 8);
    expect(core.submitRoute(first)).toBeGreaterThanOrEqual(0);
    let refused: unknown;
    try {
      core.submitRoute(call("twin", 16));
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(KvedgeError);
    expect((refused as KvedgeError).code).toBe("duplicate_held_request");
    expect(STATUS_OF.duplicate_held_request).toBe(409);
    expect(core.admission.held).toBe(1);
    expect(core.submitRoute(call("other", 8))).toBeGreaterThanOrEqual(0);
    expect(core.admission.held).toBe(2);
    expect(core.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "twin:ok", "other:ok"]);
    // Answered, "twin" is active now: the router's own check refuses it.
    expect(() => core.submitRoute(call("twin", 8))).toThrow("already active");
    expect(core.done("twin")).toBe("ok");
    expect(core.done("other")).toBe("ok");
    expect(core.submitRoute(call("twin", 8))).toBe(-1);
    expect(answers.at(-1)).toBe("twin:ok");
  });

  test("a dropped held call frees its id", () => {
    const { core, answers, call } = setup();
    core.submitRoute(call("ahead", 6000));
    const gone = call("gone", 8);
    core.dropHeld(core.submitRoute(gone), gone);
    expect(core.admission.held).toBe(0);
    const again = call("gone", 8);
    expect(core.submitRoute(again)).toBeGreaterThanOrEqual(0);
    expect(core.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "gone:ok"]);
  });

  test("a held call over the process-wide buffer budget is refused with 429", () => {
    const { core, answers, call } = setup();
    core.submitRoute(call("ahead", 6000));
    const limit = bufferBudget.limitBytes;
    bufferBudget.limitBytes = bufferBudget.held + 16;
    try {
      expect(() => core.submitRoute(call("big", 8))).toThrow("bytes of unfinished requests");
    } finally {
      bufferBudget.limitBytes = limit;
    }
    expect(core.admission.held).toBe(0);
    expect(answers).toEqual(["ahead:ok"]);
  });

  test("the expiry of the request ahead releases a held call at the next poll", async () => {
    const { core, answers, call } = setup({ KVEDGE_REQUEST_TTL_SECS: "0.05" });
    core.submitRoute(call("ahead", 6000));
    core.submitRoute(call("held", 8));
    expect(answers).toEqual(["ahead:ok"]);
    await until(() => answers.length === 2, "the held call's answer");
    expect(answers).toEqual(["ahead:ok", "held:ok"]);
    expect(core.router.load.counters.expired).toBeGreaterThanOrEqual(1);
    await core.stop();
  });

  test("stopping answers every held call with shutting_down", async () => {
    const { core, answers, call } = setup();
    const before = bufferBudget.held;
    core.submitRoute(call("ahead", 6000));
    core.submitRoute(call("a", 8));
    core.submitRoute(call("b", 16));
    await core.stop();
    // In admission's order: b's one block is ahead's first (pending on the worker), so
    // its predicted prefill is 1 token, a's 8.
    expect(answers).toEqual(["ahead:ok", "b:shutting_down", "a:shutting_down"]);
    expect(bufferBudget.held).toBe(before);
    expect(core.admission.held).toBe(0);
    expect(core.admission.capacity).toBe(0);
  });
});
