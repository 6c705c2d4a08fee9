// Goal: `kvedge replay` drives a real `kvedge serve` with the trace: against two
// `kvedge mock-engine` subprocesses (requests forwarded, lifecycle calls at the engines'
// first token and finish) and without engines (modeled durations); every decision is
// counted, kvedge's load tracking ends empty, and bad usage is refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type MockEngineChild, runKvedge, spawnMockEngine } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

type Json = Record<string, any>;
const engines: MockEngineChild[] = [];
let serve: ServeProcess | null = null;

async function mockEngine(): Promise<MockEngineChild> {
  return spawnMockEngine([
    "--endpoint",
    "tcp://127.0.0.1:0",
    "--replay-endpoint",
    "tcp://127.0.0.1:0",
    "--capacity-blocks",
    "8192",
    "--speedup",
    "200",
  ]);
}

const activeRequests = async (): Promise<number> => {
  const workers = ((await (await fetch(`${serve!.url}/v1/workers`)).json()) as Json)
    .workers as Json[];
  return workers.reduce((sum, view) => sum + view.active_requests, 0);
};

beforeAll(async () => {
  engines.push(await mockEngine(), await mockEngine());
  const workers = engines
    .map(({ info }, w) => `${w + 1}=${info.endpoint};replay=${info.replay_endpoint}`)
    .join(",");
  serve = await startServe(["--workers", workers]);
  await until(async () => (await fetch(`${serve!.url}/readyz`)).status === 200, "readyz");
});

afterAll(async () => {
  await serve?.stop();
  for (const { proc } of engines) proc.kill("SIGKILL");
});

describe("kvedge replay", () => {
  test("with --engine mappings: requests reach the chosen engines, lifecycle follows them", async () => {
    const result = await runKvedge([
      "replay",
      "--target",
      serve!.url,
      "--engine",
      `1=${engines[0]!.info.http}`,
      "--engine",
      `2=${engines[1]!.info.http}`,
      "--requests",
      "40",
      "--speedup",
      "200",
      "--json",
    ]);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    const { targets, config } = JSON.parse(result.stdout) as Json;
    expect(config.requests).toBe(40);
    expect(targets).toHaveLength(1);
    const report = targets[0];
    expect(report).toMatchObject({
      target: serve!.url,
      requests: 40,
      decisions: 40,
      route_failures: 0,
      lifecycle_errors: 0,
      unmapped_workers: 0,
    });
    expect(report.lifecycle_calls).toBe(80);
    expect(
      Object.values(report.requests_per_worker as Record<string, number>).reduce(
        (a, b) => a + b,
        0,
      ),
    ).toBe(40);
    expect(report.engines.completed).toBe(40);
    expect(report.engines.failed).toBe(0);
    expect(report.engines.ttft_p99_ms).toBeGreaterThanOrEqual(report.engines.ttft_p50_ms);
    expect(report.predicted_hit_rate).toBeGreaterThanOrEqual(0);
    expect(report.predicted_hit_rate).toBeLessThanOrEqual(1);
    // What the engines served matches what they report.
    let served = 0;
    for (const { info } of engines)
      served += ((await (await fetch(`${info.http}/v1/stats`)).json()) as Json).requests.completed;
    expect(served).toBe(40);
    await until(async () => (await activeRequests()) === 0, "kvedge's load to drain");
  });

  test("without engines, twice (two targets): modeled lifecycle, load drains", async () => {
    const result = await runKvedge([
      "replay",
      "--target",
      serve!.url,
      "--target",
      `${serve!.url}/`,
      "--requests",
      "30",
      "--speedup",
      "500",
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("30/30 routed");
    expect(result.stdout.match(/30\/30 routed/g)).toHaveLength(2);
    expect(result.stdout).toContain("predicted hit rate");
    await until(async () => (await activeRequests()) === 0, "kvedge's load to drain");
  });

  test("bad usage is refused with one line", async () => {
    for (const args of [
      ["replay"],
      ["replay", "--target", "localhost:1"],
      ["replay", "--target", serve!.url, "--engine", "x=http://a:1"],
    ]) {
      const result = await runKvedge(args);
      expect(result.code).toBe(2);
      expect(result.stderr.trim().split("\n")).toHaveLength(1);
    }
  });
});
