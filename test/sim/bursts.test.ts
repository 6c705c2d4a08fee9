// Goal: in virtual time, where engines publish a step's blocks after it ran (vLLM), a
// burst sharing a fresh prefix scatters over every worker without pending credit, and
// with it (route.pending_credit) is computed on a few: fewer prefill tokens, and each
// sibling on the prefix's worker really reuses it (the engine's own counts).
import { describe, expect, test } from "bun:test";
import { simulate } from "../../src/sim/simulator";
import { parseTrace, requestIds } from "../../src/sim/trace";
import { burstTrace } from "../../src/sim/workloads";

describe("bursts before the first event", () => {
  const trace = parseTrace(burstTrace({ bursts: 6, requestsPerBurst: 32, intervalMs: 1500 }));
  const run = (pendingCredit: boolean) => {
    const workersOf = new Map<number, Set<number>>();
    // A burst is named by its prefix's first block id.
    const burstOf = (request: number) => requestIds(trace, request)[0]!;
    const report = simulate(trace, {
      policy: "kv_aware_model",
      workers: 8,
      capacityBlocks: 32_768,
      kvAware: { policy: "ttft", pendingCredit },
      onRouted: (request, worker) => {
        const burst = burstOf(request);
        if (!workersOf.has(burst)) workersOf.set(burst, new Set());
        workersOf.get(burst)!.add(worker);
      },
    });
    const spread = [...workersOf.values()].map((set) => set.size);
    expect(spread).toHaveLength(6);
    return { report, mean: spread.reduce((a, b) => a + b, 0) / spread.length };
  };

  test("pending credit computes each prefix on far fewer workers, and the siblings hit it", () => {
    const without = run(false);
    const withCredit = run(true);
    expect(without.mean).toBeGreaterThanOrEqual(7);
    expect(withCredit.mean).toBeLessThanOrEqual(3);
    expect(withCredit.report.prefill_tokens).toBeLessThan(0.75 * without.report.prefill_tokens);
    expect(withCredit.report.hit_rate).toBeGreaterThan(without.report.hit_rate);
  });
});
