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
import { STATUS_OF } from "../../src/server/http";
import { bufferBudget } from "../../src/util/buffer-budget";
import { silentLogger } from "../../src/util/log";
import { until } from "../support/wait";

const input = (requestId: string, length: number): RouteInput => ({
  tokens: Uint32Array.from({ length }, (_, i) => i + 1),
  requestId,
  loraName: null,
  cacheSalt: null,
  expectedOutputTokens: null,
  overlapScoreCredit: null,
  prefillLoadScale: null,
  temperature: null,
});

function core(env: Record<string, string> = {}) {
  const config = loadConfig({
    env: { KVEDGE_ADMISSION: "hold", KVEDGE_ADMISSION_BOUND_MS: "200", ...env },
  }).config;
  const service = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
  service.router.load.addWorker(1n, 0);
  const answers: string[] = [];
  const call = (id: string, length: number): RouteCall => ({
    input: input(id, length),
    candidatesMax: 0,
    answer: (outcome) => answers.push(`${outcome.decision.requestId}:ok`),
    fail: (error) =>
      answers.push(`${id}:${error instanceof KvedgeError ? error.code : String(error)}`),
  });
  return { service, answers, call };
}

describe("KvedgeCore admission", () => {
  test("held behind a long prefill; prefill_done of the one ahead releases it", () => {
    const { service, answers, call } = core();
    expect(service.submitRoute(call("ahead", 6000))).toBe(-1);
    expect(answers).toEqual(["ahead:ok"]);
    const held = call("held", 8);
    const before = bufferBudget.held;
    expect(service.submitRoute(held)).toBeGreaterThanOrEqual(0);
    expect(service.admission.held).toBe(1);
    expect(bufferBudget.held).toBe(before + 32); // its 8 tokens count in the process-wide budget while held
    expect(() => service.submitRoute(call("ahead", 8))).toThrow("already active");
    expect(service.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "held:ok"]);
    expect(service.admission.held).toBe(0);
    expect(bufferBudget.held).toBe(before);
  });

  test("a held call's id is refused at submit; it is free again once the first is answered", () => {
    const { service, answers, call } = core();
    service.submitRoute(call("ahead", 6000));
    const first = call("twin", 8);
    expect(service.submitRoute(first)).toBeGreaterThanOrEqual(0);
    let refused: unknown;
    try {
      service.submitRoute(call("twin", 16));
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(KvedgeError);
    expect((refused as KvedgeError).code).toBe("duplicate_held_request");
    expect(STATUS_OF.duplicate_held_request).toBe(409);
    expect(service.admission.held).toBe(1);
    expect(service.submitRoute(call("other", 8))).toBeGreaterThanOrEqual(0);
    expect(service.admission.held).toBe(2);
    expect(service.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "twin:ok", "other:ok"]);
    // Answered, "twin" is active now: the router's own check refuses it.
    expect(() => service.submitRoute(call("twin", 8))).toThrow("already active");
    expect(service.done("twin")).toBe("ok");
    expect(service.done("other")).toBe("ok");
    expect(service.submitRoute(call("twin", 8))).toBe(-1);
    expect(answers.at(-1)).toBe("twin:ok");
  });

  test("a dropped held call frees its id", () => {
    const { service, answers, call } = core();
    service.submitRoute(call("ahead", 6000));
    const gone = call("gone", 8);
    service.dropHeld(service.submitRoute(gone), gone);
    expect(service.admission.held).toBe(0);
    const again = call("gone", 8);
    expect(service.submitRoute(again)).toBeGreaterThanOrEqual(0);
    expect(service.prefillDone("ahead")).toBe("ok");
    expect(answers).toEqual(["ahead:ok", "gone:ok"]);
  });

  test("a held call over the process-wide buffer budget is refused with 429", () => {
    const { service, answers, call } = core();
    service.submitRoute(call("ahead", 6000));
    const limit = bufferBudget.limitBytes;
    bufferBudget.limitBytes = bufferBudget.held + 16;
    try {
      expect(() => service.submitRoute(call("big", 8))).toThrow("bytes of unfinished requests");
    } finally {
      bufferBudget.limitBytes = limit;
    }
    expect(service.admission.held).toBe(0);
    expect(answers).toEqual(["ahead:ok"]);
  });

  test("the expiry of the request ahead releases a held call at the next poll", async () => {
    const { service, answers, call } = core({ KVEDGE_REQUEST_TTL_SECS: "0.05" });
    service.submitRoute(call("ahead", 6000));
    service.submitRoute(call("held", 8));
    expect(answers).toEqual(["ahead:ok"]);
    await until(() => answers.length === 2, "the held call's answer");
    expect(answers).toEqual(["ahead:ok", "held:ok"]);
    expect(service.router.load.counters.expired).toBeGreaterThanOrEqual(1);
    await service.stop();
  });

  test("stopping answers every held call with shutting_down", async () => {
    const { service, answers, call } = core();
    const before = bufferBudget.held;
    service.submitRoute(call("ahead", 6000));
    service.submitRoute(call("a", 8));
    service.submitRoute(call("b", 16));
    await service.stop();
    expect(answers).toEqual(["ahead:ok", "a:shutting_down", "b:shutting_down"]);
    expect(bufferBudget.held).toBe(before);
    expect(service.admission.held).toBe(0);
    expect(service.admission.capacity).toBe(0);
  });
});
