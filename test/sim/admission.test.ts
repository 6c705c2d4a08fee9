// Goal: in virtual time at ~3x the conversation trace's rate (saturated), kvedge's
// router with admission hold answers every request, ends with nothing held, and has a
// lower TTFT p50 and p99 (counted from arrival, time held included) than every
// baseline; reject mode refuses instead of routing past the longest hold, and every
// request is either completed or refused.
// Method: deterministic simulations (seed 42) of one slice, the real Router and
// Admission on the simulator's clock.
import { describe, expect, test } from "bun:test";
import { DEFAULT_ADMISSION } from "../../src/route/admission";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { DEFAULT_KV_AWARE, type KvAwareModel, type PolicyName } from "../../src/sim/policies";
import { simulate } from "../../src/sim/simulator";
import { transformTrace } from "../../src/sim/trace";

describe("admission in virtual time", () => {
  test("slice from request 6,000 at ~3x: hold beats every baseline's TTFT p50 and p99", async () => {
    const trace = transformTrace(await loadConversationTrace(), {
      start: 6000,
      requests: 2000,
      timeScale: 0.35,
    });
    let model: KvAwareModel | null = null;
    const run = (policy: PolicyName, admission = DEFAULT_ADMISSION) =>
      simulate(trace, {
        policy,
        workers: 8,
        capacityBlocks: 32_768,
        seed: 42,
        kvAware: { ...DEFAULT_KV_AWARE, admission: { ...admission, mode: "hold" } },
        onFinish: (p) => {
          if (policy === "kv_aware_model") model = p as KvAwareModel;
        },
      });
    const held = run("kv_aware_model");
    expect(held.rejected).toBe(0);
    const admission = (model as KvAwareModel | null)!.admission!;
    expect(admission.counts.held).toBeGreaterThan(0);
    expect(admission.held).toBe(0);
    expect(admission.capacity).toBe(0);
    expect(model!.router.load.activeRequestCount).toBe(0);
    for (const baseline of ["round_robin", "random", "least_loaded", "approx_prefix"] as const) {
      const other = run(baseline);
      expect(held.ttft_p50_ms).toBeLessThan(other.ttft_p50_ms);
      expect(held.ttft_p99_ms).toBeLessThan(other.ttft_p99_ms);
    }
    expect(run("kv_aware_model").worker_requests).toEqual(held.worker_requests);
  }, 60_000);

  test("reject mode: requests held past the longest hold are refused, the rest complete", async () => {
    const trace = transformTrace(await loadConversationTrace(), {
      start: 0,
      requests: 600,
      timeScale: 0.35,
    });
    const result = simulate(trace, {
      policy: "kv_aware_model",
      workers: 8,
      capacityBlocks: 32_768,
      seed: 42,
      kvAware: { ...DEFAULT_KV_AWARE, admission: { mode: "reject", boundMs: 200, maxHoldMs: 500 } },
    });
    expect(result.rejected).toBeGreaterThan(0);
    expect(result.rejected).toBeLessThan(600);
  }, 60_000);
});
