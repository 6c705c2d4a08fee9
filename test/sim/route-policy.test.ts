// Goal: in virtual time, kvedge's default route policy (ttft, through the real Router)
// beats every baseline on the conversation trace: hit rate no more than 0.2 points
// below the best, lower TTFT p50 and p99 than each; and the trace slice (--start)
// skips requests and rebases arrivals.
// Method: deterministic simulations (seed 42) of one slice at 2x the trace's rate.
import { describe, expect, test } from "bun:test";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { simulate } from "../../src/sim/simulator";
import { transformTrace } from "../../src/sim/trace";

describe("route policy ttft in virtual time", () => {
  test("slice from request 4,000 at 2x: best TTFT p50 and p99, hit rate within 0.2 points", async () => {
    const trace = transformTrace(await loadConversationTrace(), {
      start: 4000,
      requests: 2000,
      timeScale: 0.5,
    });
    const run = (policy: Parameters<typeof simulate>[1]["policy"]) =>
      simulate(trace, { policy, workers: 8, capacityBlocks: 32_768, seed: 42 });
    const kv = run("kv_aware_model");
    for (const baseline of ["round_robin", "random", "least_loaded", "approx_prefix"] as const) {
      const other = run(baseline);
      expect(kv.hit_rate).toBeGreaterThanOrEqual(other.hit_rate - 0.002);
      expect(kv.ttft_p50_ms).toBeLessThan(other.ttft_p50_ms);
      expect(kv.ttft_p99_ms).toBeLessThan(other.ttft_p99_ms);
    }
    // Deterministic: the same run decides the same.
    expect(run("kv_aware_model").worker_requests).toEqual(kv.worker_requests);
  }, 60_000);

  test("start skips requests and the slice's first arrival keeps the trace's first offset", async () => {
    const full = await loadConversationTrace();
    const slice = transformTrace(full, { start: 10, requests: 5, timeScale: 0.5 });
    expect(slice.count).toBe(5);
    for (let i = 0; i < 5; i++) {
      expect(slice.inputLength[i]).toBe(full.inputLength[10 + i]!);
      expect(slice.arrivalMs[i]).toBeCloseTo(
        (full.arrivalMs[10 + i]! - full.arrivalMs[10]! + full.arrivalMs[0]!) * 0.5,
        9,
      );
    }
    expect(() => transformTrace(full, { start: full.count })).toThrow("start must be");
  });
});
