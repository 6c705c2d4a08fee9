// Goal: `kvedge demo --proxy` (the compiled binary) runs kv_aware through `kvedge
// serve --proxy` and the mock engines' OpenAI API: every request reaches exactly one
// engine (prompt tokens conserved), none fails, every lifecycle ends, the hits the
// answers report equal the ones kvedge predicted, and it still reuses more cache
// than round robin.
import { expect, test } from "bun:test";
import { runKvedge } from "../support/kvedge";

type Json = Record<string, any>;

// Speedup 40: fast enough for a test, slow enough that an idle machine keeps up. Past
// what it keeps up with (speedup 150, or 40 on a busy shared VM), requests reach the
// engines late in model time, the engines evict what kvedge predicted, and the
// observed-hit check rightly flags some workers.
test("demo --proxy: kv_aware through the OpenAI proxy, checked against round robin", async () => {
  const result = await runKvedge([
    "demo",
    "--proxy",
    "--requests",
    "800",
    "--workers",
    "8",
    "--time-scale",
    "1",
    "--speedup",
    "40",
    "--policies",
    "kv_aware,round_robin",
    "--no-pin",
    "--json",
  ]);
  expect(result.code).toBe(0);
  const demo = JSON.parse(result.stdout.trim()) as Json;
  const kv = demo.policies.kv_aware;
  expect(kv.mode).toBe("kvedge");
  expect(kv.completed + kv.rejected).toBe(800);
  expect(kv.cached_tokens + kv.prefill_tokens).toBe(kv.prompt_tokens);
  expect(kv.hit_rate).toBeGreaterThan(demo.policies.round_robin.hit_rate);
  const proxy = demo.proxy;
  expect(proxy).toMatchObject({ requests: 800, failed: 0, failovers: 0, active_at_end: 0 });
  // Not asserted: suspect_workers. When this machine is loaded past what the replay
  // keeps up with, engines queue, evict what was predicted, and a worker may be flagged.
  expect(proxy.observed_hit_rate).toBeCloseTo(kv.hit_rate, 6);
  // Between routing and admission an engine may evict a little; never more hits than predicted by much.
  expect(Math.abs(proxy.observed_hit_rate - proxy.predicted_hit_rate)).toBeLessThan(0.02);
  expect(proxy.ttfb_p99_ms).toBeGreaterThanOrEqual(proxy.ttfb_p50_ms);
}, 60_000);
