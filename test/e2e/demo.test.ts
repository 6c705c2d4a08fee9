// Goal: a short `kvedge demo` run (the compiled binary, which starts its own
// `kvedge serve` child) prints one JSON object of the documented shape, kvedge's index
// equals the engines' caches at the end, and KV-aware routing reuses more cache than
// round robin on the conversation trace: shown on the deterministic in-process model of
// kvedge's routing, since the real run races KV events against routes in real time.
// Plus the text table and usage errors.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { ROOT, runKvedge } from "../support/kvedge";

type Json = Record<string, any>;
const POLICIES = ["kv_aware", "round_robin", "random", "least_loaded", "approx_prefix"];

describe("kvedge demo", () => {
  test("--json: the shape and the router's numbers", async () => {
    // 800 requests over 8 engines: early in the trace, where fewer requests or engines
    // leave so little reuse that the comparison would hinge on tie-breaks.
    const result = await runKvedge([
      "demo",
      "--requests",
      "800",
      "--workers",
      "8",
      "--time-scale",
      "1",
      "--speedup",
      "150",
      "--no-pin",
      "--json",
    ]);
    expect(result.code).toBe(0);
    const lines = result.stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    const demo = JSON.parse(lines[0]!) as Json;
    expect(Object.keys(demo.policies)).toEqual(POLICIES);
    for (const name of POLICIES) {
      const policy = demo.policies[name];
      for (const field of [
        "hit_rate",
        "prefill_tokens",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "load_spread",
      ]) {
        expect(typeof policy[field]).toBe("number");
        expect(Number.isFinite(policy[field])).toBe(true);
      }
      expect(policy.hit_rate).toBeGreaterThanOrEqual(0);
      expect(policy.hit_rate).toBeLessThanOrEqual(1);
      expect(policy.ttft_p99_ms).toBeGreaterThanOrEqual(policy.ttft_p50_ms);
      expect(policy.completed + policy.rejected).toBe(800);
      expect(policy.cached_tokens + policy.prefill_tokens).toBe(policy.prompt_tokens);
      expect(policy.worker_requests).toHaveLength(8);
    }
    // Every policy saw the same requests.
    expect(
      new Set(
        POLICIES.map((name) => demo.policies[name].prompt_tokens + demo.policies[name].rejected),
      ).size,
    ).toBe(1);
    expect(demo.policies.kv_aware.mode).toBe("kvedge");
    // How much kvedge reuses depends on how KV events and routes interleave in real
    // time; that it reuses at all does not.
    expect(demo.policies.kv_aware.hit_rate).toBeGreaterThan(0);
    const router = demo.router;
    expect(router.decisions).toBe(800);
    expect(router.index_matches_engines).toBe(true);
    expect(router.batches_lost).toBe(0);
    expect(router.batches_applied + router.batches_replayed).toBe(router.batches_published);
    expect(router.lifecycle_errors).toBe(0);
    expect(router.route_latency_p99_ms).toBeGreaterThanOrEqual(router.route_latency_p50_ms);
    expect(Object.keys(demo.gains)).toEqual(POLICIES.slice(1));
    expect(typeof demo.gains.round_robin.prefill_tokens_saved_pct).toBe("number");
    expect(demo.config).toMatchObject({
      requests: 800,
      workers: 8,
      capacity_blocks: 32_768,
      block_size: 16,
    });
  });

  test("KV-aware routing beats round robin on hit rate and prefill (deterministic model)", async () => {
    // 800 requests over 8 engines: early in the trace, where fewer requests or engines
    // leave so little reuse that the comparison would hinge on tie-breaks.
    const result = await runKvedge([
      "demo",
      "--requests",
      "800",
      "--workers",
      "8",
      "--time-scale",
      "1",
      "--policies",
      "kv_aware_model,round_robin",
      "--json",
    ]);
    expect(result.code).toBe(0);
    const { policies } = JSON.parse(result.stdout) as Json;
    expect(policies.kv_aware_model.hit_rate).toBeGreaterThan(policies.round_robin.hit_rate);
    const { kv_aware_model: kvAware, round_robin: roundRobin } = policies;
    expect(kvAware.prefill_tokens).toBeLessThan(roundRobin.prefill_tokens);
  });

  test("from source under Bun, the demo starts kvedge serve from source too", async () => {
    const child = Bun.spawn(
      [
        process.execPath,
        join(ROOT, "src", "cli", "main.ts"),
        "demo",
        "--requests",
        "60",
        "--workers",
        "2",
        "--policies",
        "kv_aware",
        "--speedup",
        "200",
        "--no-pin",
        "--json",
      ],
      { cwd: ROOT, stdout: "pipe", stderr: "pipe" },
    );
    const [stdout, stderr, code] = await Promise.all([
      new Response(child.stdout).text(),
      new Response(child.stderr).text(),
      child.exited,
    ]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    const demo = JSON.parse(stdout) as Json;
    expect(demo.router.decisions).toBe(60);
    expect(demo.router.index_matches_engines).toBe(true);
  });

  test("the text table (in-process policies only: no serve needed)", async () => {
    const result = await runKvedge([
      "demo",
      "--requests",
      "200",
      "--workers",
      "4",
      "--policies",
      "kv_aware_model,round_robin",
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("policy");
    expect(result.stdout).toMatch(/kv_aware_model +\d+\.\d%/);
    expect(result.stdout).toContain("Gains of kv_aware_model:");
    expect(result.stdout).toContain("vs round_robin");
    expect(result.stdout).not.toContain("\x1b"); // no progress bar without a terminal
  });

  test("--virtual: kv_aware is kvedge's router in-process, deterministic, the demo's JSON shape", async () => {
    const args = [
      "demo",
      "--virtual",
      "--trace",
      join(ROOT, "data", "traces", "conversation_trace.jsonl"),
      "--start",
      "100",
      "--requests",
      "150",
      "--workers",
      "4",
      "--time-scale",
      "0.5",
      "--json",
    ];
    const first = await runKvedge(args);
    expect(first.code).toBe(0);
    const demo = JSON.parse(first.stdout) as Json;
    expect(demo.router).toBeNull();
    expect(demo.config.start).toBe(100);
    expect(demo.config.requests).toBe(150);
    for (const name of ["kv_aware", "round_robin", "random", "least_loaded", "approx_prefix"]) {
      const policy = demo.policies[name];
      expect(policy.mode).toBe("in-process, virtual time");
      for (const field of ["hit_rate", "prefill_tokens", "ttft_p50_ms", "ttft_p99_ms"])
        expect(Number.isFinite(policy[field])).toBe(true);
    }
    const again = JSON.parse((await runKvedge(args)).stdout) as Json;
    expect(again.policies.kv_aware.worker_requests).toEqual(demo.policies.kv_aware.worker_requests);
    expect(again.policies.kv_aware.ttft_p99_ms).toBe(demo.policies.kv_aware.ttft_p99_ms);
  });

  test("--admission hold in real time: routes held at ~3x, the summary counts them", async () => {
    const result = await runKvedge([
      "demo",
      "--requests",
      "200",
      "--workers",
      "8",
      "--time-scale",
      "0.35",
      "--speedup",
      "20",
      "--policies",
      "kv_aware",
      "--admission",
      "hold",
      "--no-pin",
      "--json",
    ]);
    expect(result.code).toBe(0);
    const demo = JSON.parse(result.stdout) as Json;
    const admission = demo.admission as Json;
    expect(admission.mode).toBe("hold");
    // Every call answered once: at once, or held, then released or routed at the longest hold.
    expect(admission.immediate + admission.held).toBe(200);
    const ended = admission.released + admission.overdue + admission.dropped + admission.rejected;
    expect(ended).toBe(admission.held);
    expect(admission.held).toBeGreaterThan(0);
    expect(admission.rejected).toBe(0);
    const kv = demo.policies.kv_aware;
    expect(kv.completed + kv.rejected).toBe(200);
    expect(demo.router.decisions).toBe(200);
    expect(demo.router.lifecycle_errors).toBe(0);
    expect(demo.router.index_matches_engines).toBe(true);
    const text = await runKvedge([
      "demo",
      "--requests",
      "60",
      "--time-scale",
      "0.35",
      "--speedup",
      "20",
      "--policies",
      "kv_aware",
      "--admission",
      "reject",
      "--no-pin",
    ]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/Admission \(reject\): [\d,]+ of 60 route calls held/);
  });

  test("--virtual --admission: counts from kvedge's router in-process, deterministic", async () => {
    const args = [
      "demo",
      "--virtual",
      "--requests",
      "300",
      "--time-scale",
      "0.35",
      "--policies",
      "kv_aware",
      "--admission",
      "hold",
      "--json",
    ];
    const demo = JSON.parse((await runKvedge(args)).stdout) as Json;
    expect(demo.admission.immediate + demo.admission.held).toBe(300);
    expect(demo.admission.held).toBeGreaterThan(0);
    expect(demo.admission.released + demo.admission.overdue).toBe(demo.admission.held);
    expect(JSON.parse((await runKvedge(args)).stdout).admission).toEqual(demo.admission);
    const plain = ["demo", "--virtual", "--requests", "20", "--policies", "kv_aware", "--json"];
    const off = JSON.parse((await runKvedge(plain)).stdout) as Json;
    expect(off.admission).toBeNull();
  });

  test("--events none in real time: no engine publishes, kvedge predicts every cache", async () => {
    const result = await runKvedge([
      "demo",
      ...["--events", "none", "--requests", "300", "--workers", "4", "--time-scale", "1"],
      ...["--speedup", "150", "--no-pin", "--policies", "kv_aware,round_robin", "--json"],
    ]);
    expect(result.code).toBe(0);
    const demo = JSON.parse(result.stdout) as Json;
    expect([demo.config.events, demo.config.approximate_workers]).toEqual(["none", [0, 1, 2, 3]]);
    expect(demo.router.batches_published).toBe(0);
    const predicted = demo.router.predicted;
    expect(predicted.workers).toBe(4);
    expect(predicted.blocks).toBeGreaterThan(0);
    // Most predicted blocks are really in the engines' caches.
    expect(predicted.held / predicted.blocks).toBeGreaterThan(0.8);
    expect(demo.policies.kv_aware.hit_rate).toBeGreaterThan(demo.policies.round_robin.hit_rate);
    expect(demo.router.lifecycle_errors).toBe(0);
  });

  test("--virtual --events none|mixed and --workload: deterministic, the approximate workers named", async () => {
    const args = (events: string, workload: string) => [
      "demo",
      ...["--virtual", "--events", events, "--workload", workload, "--requests", "300"],
      ...["--workers", "4", "--policies", "kv_aware", "--json"],
    ];
    for (const [events, workload, approximate] of [
      ["none", "agentic", [0, 1, 2, 3]],
      ["mixed", "burst", [1, 3]],
    ] as const) {
      const first = JSON.parse((await runKvedge(args(events, workload))).stdout) as Json;
      expect(first.config.approximate_workers).toEqual(approximate);
      expect(first.config.trace).toContain(workload);
      expect(first.policies.kv_aware.hit_rate).toBeGreaterThan(0.3);
      const again = JSON.parse((await runKvedge(args(events, workload))).stdout) as Json;
      expect(again.policies.kv_aware).toEqual({
        ...first.policies.kv_aware,
        wall_s: again.policies.kv_aware.wall_s,
      });
    }
    const table = await runKvedge([...args("none", "agentic").slice(0, -1)]);
    expect(table.stdout).toContain("Approximate workers (--events none): every engine");
  });

  test("--cpu-capacity-blocks with --twins: both tiers and every copy exact, the tier table (virtual and real time)", async () => {
    // Small engines and a small CPU tier so blocks spill, come back, and leave it; twins
    // prefilling side by side (a long-prefill cap) leave duplicate copies on the engines.
    const common = ["--requests", "400", "--workers", "4", "--capacity-blocks", "1024"];
    const twins = ["--twins", "0.1", "--long-prefill-tokens", "1024"];
    const tiered = [...common, "--cpu-capacity-blocks", "16384", ...twins];
    const virtual = await runKvedge([
      "demo",
      "--virtual",
      ...tiered,
      "--policies",
      "kv_aware",
      "--json",
    ]);
    expect(virtual.code).toBe(0);
    const v = JSON.parse(virtual.stdout) as Json;
    expect(v.index.index_matches_engines).toBe(true);
    expect(v.index.index_host_blocks).toBe(v.index.engine_host_blocks);
    expect(v.index.index_host_blocks).toBeGreaterThan(0);
    // Duplicate copies were computed, and those still held at the end are indexed one for one.
    expect(v.index.engine_duplicates_computed).toBeGreaterThan(0);
    expect(v.index.engine_extra_copies).toBeGreaterThan(0);
    expect(v.index.index_extra_copies).toBe(v.index.engine_extra_copies);
    expect(v.tiers.cpu_capacity_blocks).toBe(16_384);
    // Seeing the CPU tier, routing loads more back from it than device-only routing does.
    expect(v.tiers.tier_aware.host_hit_rate).toBeGreaterThan(v.tiers.device_only.host_hit_rate);
    expect(v.tiers.tier_aware.hit_rate).toBeGreaterThan(v.tiers.device_only.hit_rate);
    const real = await runKvedge([
      "demo",
      ...tiered,
      "--policies",
      "kv_aware",
      "--speedup",
      "40",
      "--no-pin",
    ]);
    expect(real.code).toBe(0);
    expect(real.stdout).toMatch(
      /index vs engines at the end: identical \([\d,]+ blocks indexed, [\d,]+ cached; duplicate copies: [1-9][\d,]* computed in the run, ([\d,]+) indexed and \1 held at the end; CPU tier ([\d,]+) indexed, \2 held\)/i,
    );
    expect(real.stdout).toMatch(/kv_aware routing on +hit rate +of it CPU tier/);
    expect(real.stdout).toMatch(/device and CPU tiers +[\d.]+%/);
    expect(real.stdout).toMatch(/device tier only +[\d.]+%/);
  });

  test("usage errors are one line, exit 2", async () => {
    for (const args of [
      ["--events", "some"],
      ["--workload", "chat"],
      ["--workload", "burst", "--trace", "/tmp/x.jsonl"],
      ["--predicted-capacity-blocks", "0"],
      ["--policies", "fastest"],
      ["--route-policy", "fastest"],
      ["--virtual", "--start", "99999999"],
      ["--workers", "0"],
      ["--trace", "/no/such/file"],
      ["--speedup", "fast"],
      ["extra"],
      ["--proxy", "--admission", "hold"],
      ["--virtual", "--admission", "sometimes"],
    ]) {
      const result = await runKvedge(["demo", ...args]);
      expect(result.code).toBe(2);
      expect(result.stderr.trim().split("\n")).toHaveLength(1);
    }
  });
});
