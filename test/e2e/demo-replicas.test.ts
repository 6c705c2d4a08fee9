// Goal: `kvedge demo --replicas N` (the compiled binary) runs kvedge as N real replicas
// on a local nats-server and again without it, one row per setup, with what the bus
// carried; `--virtual --replicas N` models the same in virtual time; bad combinations of
// the flags are refused with a usage error.
// Method: short runs of the real demo (its own nats-server, bound to 127.0.0.1, and its
// own `kvedge serve` children); shapes and invariants, not the routing quality (measured
// in bench/RESULTS.md).
import { describe, expect, test } from "bun:test";
import { runKvedge } from "../support/kvedge";

type Json = Record<string, any>;

describe("kvedge demo --replicas", () => {
  test("real replicas over NATS and without it: one row each, the bus's numbers", async () => {
    const result = await runKvedge([
      "demo",
      "--replicas",
      "2",
      "--requests",
      "60",
      "--speedup",
      "50",
      "--policies",
      "kv_aware,kv_aware_unsynced",
      "--no-pin",
      "--json",
    ]);
    expect(result.code).toBe(0);
    const demo = JSON.parse(result.stdout) as Json;
    expect(Object.keys(demo.policies)).toEqual(["kv_aware", "kv_aware_unsynced"]);
    expect(demo.policies.kv_aware.mode).toBe("kvedge");
    expect(demo.policies.kv_aware_unsynced.mode).toBe("kvedge");
    const router = demo.router as Json;
    expect(router.decisions).toBe(60);
    expect(router.lifecycle_errors).toBe(0);
    expect(router.index_matches_engines).toBe(true);
    expect(router.cluster.replicas).toBe(2);
    expect(router.cluster.synced).toBe(true);
    // Every request is routed, prefilled and done: three facts each, each applied by the peer.
    expect(router.cluster.facts_sent).toBe(180);
    expect(router.cluster.facts_received).toBe(180);
    expect(router.cluster.gaps).toBe(0);
    expect(router.cluster.bytes_per_route).toBeGreaterThan(0);
    expect(demo.gains.kv_aware_unsynced).toBeDefined();
    expect(demo.config.replicas).toBe(2);
  }, 120_000);

  test("--virtual --replicas: synced and unsynced rows in virtual time", async () => {
    const result = await runKvedge([
      "demo",
      "--virtual",
      "--replicas",
      "3",
      "--sync-delay-ms",
      "2",
      "--requests",
      "120",
      "--policies",
      "kv_aware,kv_aware_unsynced",
      "--json",
    ]);
    expect(result.code).toBe(0);
    const demo = JSON.parse(result.stdout) as Json;
    expect(Object.keys(demo.policies)).toEqual(["kv_aware", "kv_aware_unsynced"]);
    expect(demo.config.sync_delay_ms).toBe(2);
    expect(demo.config.stagger_ms).toBe(2);
    const text = await runKvedge(["demo", "--virtual", "--replicas", "3", "--requests", "60"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain("kv_aware ×3 ");
    expect(text.stdout).toContain("kv_aware_unsynced ×3 ");
  }, 60_000);

  test("usage errors", async () => {
    for (const [args, message] of [
      [["--no-sync"], "--no-sync needs --replicas 2 or more"],
      [["--replicas", "2", "--sync-delay-ms", "2"], "--sync-delay-ms needs --virtual"],
      [["--policies", "kv_aware_unsynced"], "needs --replicas 2 or more"],
      [["--replicas", "2", "--proxy"], "--replicas does not go with --proxy"],
      [["--replicas", "0"], "--replicas"],
    ] as const) {
      const result = await runKvedge(["demo", ...args]);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain(message);
    }
  });
});
