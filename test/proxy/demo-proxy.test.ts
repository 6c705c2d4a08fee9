// Goal: `kvedge demo --proxy` (the compiled binary) runs kv_aware through `kvedge
// serve --proxy` and the mock engines' OpenAI API: every request reaches exactly one
// engine (prompt tokens conserved), none fails, every lifecycle ends, the hits the
// answers report equal the ones kvedge predicted, and it still reuses more cache
// than round robin.
import { expect, test } from "bun:test";
import { runKvedge } from "../support/kvedge";

type Json = Record<string, any>;

// The engines hold 2^20 blocks each, more than the 800 requests ever store: nothing is
// evicted, so an engine holds at least every block it has announced, and what kvedge
// predicted at routing is a lower bound of what the engine serves, however late (a
// loaded machine) the request reaches it. (With evictions, a late request may find a
// predicted block gone: how often depends on the machine's speed, not on kvedge.)
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
    "--capacity-blocks",
    String(2 ** 20),
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
  expect(kv.evicted_blocks).toBe(0);
  const proxy = demo.proxy;
  expect(proxy).toMatchObject({
    requests: 800,
    failed: 0,
    failovers: 0,
    active_at_end: 0,
    suspect_workers: 0,
  });
  expect(proxy.observed_hit_rate).toBeCloseTo(kv.hit_rate, 6);
  // Every predicted block was there (no evictions); more may have been stored meanwhile.
  expect(proxy.observed_hit_rate).toBeGreaterThanOrEqual(proxy.predicted_hit_rate);
  expect(proxy.predicted_hit_rate).toBeGreaterThan(0.1);
  expect(proxy.ttfb_p99_ms).toBeGreaterThanOrEqual(proxy.ttfb_p50_ms);
}, 60_000);
