// Goal: a real-time replay (paced engines, sockets, an in-process router) reproduces
// the virtual-time simulator exactly, whatever the wall clock does: engines are held
// at the next unrouted arrival, so jitter only stretches wall time. This is why the
// demo may run its in-process baselines in virtual time.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { createPolicy, type PolicyName } from "../../src/sim/policies";
import { policyClient, replayRealtime } from "../../src/sim/realtime";
import { engineSeeds, simulate } from "../../src/sim/simulator";
import { DEFAULT_TIME_MODEL } from "../../src/sim/time-model";
import { DEFAULT_VOCAB_SIZE } from "../../src/sim/tokens";
import { transformTrace, type Trace } from "../../src/sim/trace";

const WORKERS = 3;
const CAPACITY = 4096;
let trace: Trace;
const open: NetworkedEngine[] = [];

beforeAll(async () => {
  trace = transformTrace(await loadConversationTrace(), { requests: 120, timeScale: 0.25 });
});

afterAll(async () => {
  await Promise.all(open.map((engine) => engine.close()));
});

async function fleet(seed: number): Promise<NetworkedEngine[]> {
  const seeds = engineSeeds(seed, WORKERS);
  const engines: NetworkedEngine[] = [];
  for (let w = 0; w < WORKERS; w++) {
    const engine = await new NetworkedEngine({
      index: w, capacityBlocks: CAPACITY, hashSeed: seeds[w]!, endpoint: "tcp://127.0.0.1:0",
    }).start();
    engines.push(engine);
    open.push(engine);
  }
  return engines;
}

describe("replayRealtime", () => {
  for (const policy of ["least_loaded", "approx_prefix", "kv_aware_model"] as PolicyName[]) {
    test(`${policy}: the real-time replay equals the virtual-time one`, async () => {
      const seed = 7;
      const engines = await fleet(seed);
      const routing = createPolicy(policy, {
        workers: WORKERS, blockSize: 16, seed,
        probe: (worker, query) => engines[worker]!.engine.cache.cachedPrefixBlocks(query.tokens, query.promptLength),
      });
      const live = await replayRealtime(policy, {
        trace, engines, router: policyClient(routing), speedup: 600, blockSize: 16, vocabSize: DEFAULT_VOCAB_SIZE,
        verify: true,
      });
      const virtual = simulate(trace, { policy, workers: WORKERS, capacityBlocks: CAPACITY, seed, time: DEFAULT_TIME_MODEL });
      expect(live.report).toEqual(virtual);
      expect(live.report.completed + live.report.rejected).toBe(trace.count);
      // The engines published their steps' events while running.
      expect(engines.reduce((sum, engine) => sum + engine.counters.batches, 0)).toBeGreaterThan(trace.count);
    });
  }

  test("a slow router stretches wall time, not modeled latency", async () => {
    const seed = 3;
    const engines = await fleet(seed);
    const short = transformTrace(trace, { requests: 40 });
    const routing = createPolicy("round_robin", { workers: WORKERS, blockSize: 16, seed });
    const client = policyClient(routing);
    const slow = {
      ...client,
      route: async (...args: Parameters<typeof client.route>) => {
        // The slowness under test (not a wait): ≈ 3 s of model time at this speed-up.
        await Bun.sleep(3);
        return client.route(...args);
      },
    };
    const live = await replayRealtime("round_robin", {
      trace: short, engines, router: slow, speedup: 1000, blockSize: 16, vocabSize: DEFAULT_VOCAB_SIZE,
    });
    const virtual = simulate(short, { policy: "round_robin", workers: WORKERS, capacityBlocks: CAPACITY, seed });
    expect(live.report).toEqual(virtual);
  });
});
