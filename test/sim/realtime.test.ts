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
      index: w,
      capacityBlocks: CAPACITY,
      hashSeed: seeds[w]!,
      endpoint: "tcp://127.0.0.1:0",
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
        workers: WORKERS,
        blockSize: 16,
        seed,
        probe: (worker, query) =>
          engines[worker]!.engine.cache.visiblePrefixBlocks(query.tokens, query.promptLength),
      });
      const live = await replayRealtime(policy, {
        trace,
        engines,
        router: policyClient(routing),
        speedup: 600,
        blockSize: 16,
        vocabSize: DEFAULT_VOCAB_SIZE,
        verify: true,
      });
      const virtual = simulate(trace, {
        policy,
        workers: WORKERS,
        capacityBlocks: CAPACITY,
        seed,
        time: DEFAULT_TIME_MODEL,
      });
      expect(live.report).toEqual(virtual);
      expect(live.report.completed + live.report.rejected).toBe(trace.count);
      // The engines published their steps' events while running.
      expect(engines.reduce((sum, engine) => sum + engine.counters.batches, 0)).toBeGreaterThan(
        trace.count,
      );
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
      trace: short,
      engines,
      router: slow,
      speedup: 1000,
      blockSize: 16,
      vocabSize: DEFAULT_VOCAB_SIZE,
    });
    const virtual = simulate(short, {
      policy: "round_robin",
      workers: WORKERS,
      capacityBlocks: CAPACITY,
      seed,
    });
    expect(live.report).toEqual(virtual);
  });

  test("answerWaitMs: routes held until a worker frees go in when answered; refusals count", async () => {
    const seed = 5;
    const engines = await fleet(seed);
    const short = transformTrace(trace, { requests: 60 });
    const rr = createPolicy("round_robin", { workers: WORKERS, blockSize: 16, seed });
    const client = policyClient(rr);
    // Every 4th route is held until the next prefill_done (as admission holds it); 9 is refused.
    const waiting: (() => void)[] = [];
    let late = 0;
    const holding = {
      ...client,
      route: (...args: Parameters<typeof client.route>): Promise<number> | number => {
        const [query] = args;
        if (query.id === 9) return -1;
        if (query.id % 4 !== 3) return client.route(...args);
        return new Promise<number>((resolve) =>
          waiting.push(() => {
            late++;
            resolve(client.route(...args) as number);
          }),
        );
      },
      prefillDone: (...args: Parameters<typeof client.prefillDone>) => {
        client.prefillDone(...args);
        for (const release of waiting.splice(0)) release();
      },
    };
    const live = await replayRealtime("held", {
      trace: short,
      engines,
      router: holding,
      speedup: 200,
      blockSize: 16,
      vocabSize: DEFAULT_VOCAB_SIZE,
      verify: true,
      answerWaitMs: 2,
    });
    expect(late).toBe(15);
    // The refusal, on top of what the engines reject themselves (prompts larger than a cache).
    const options = {
      policy: "round_robin" as const,
      workers: WORKERS,
      capacityBlocks: CAPACITY,
      seed,
    };
    expect(live.report.rejected).toBe(simulate(short, options).rejected + 1);
    expect(live.report.completed + live.report.rejected).toBe(60);
  });
});
