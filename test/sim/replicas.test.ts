// Goal: kvedge's router as replicas in virtual time behaves as the server's replicas do:
// synced, every replica's load view equals the others' once the delay has passed (and
// not before: facts arrive `syncDelayMs` late); unsynced, each sees only its own;
// with turns, a replica other than the first answers a contested route k × staggerMs
// late and a clear one at once; a whole replay of a slice ends with nothing active on
// any replica, and synced replicas beat unsynced ones on TTFT.
// Method: the real Router (KvAwareModel) and the real cluster code (outbox, codec, peer
// set) on the in-memory bus, on the simulator's clock.
import { describe, expect, test } from "bun:test";
import { blockCount, chainHashes, DEFAULT_SEED, hashBlocks } from "../../src/hash";
import { loadConversationTrace } from "../../src/sim/embedded-trace";
import { createPolicy, type KvAwareModel, type RouteQuery } from "../../src/sim/policies";
import { ReplicatedKvAware } from "../../src/sim/replicas";
import { simulate } from "../../src/sim/simulator";
import { transformTrace } from "../../src/sim/trace";

const BS = 16;

function query(id: number, first: number, length: number): RouteQuery {
  const tokens = Uint32Array.from({ length }, (_, i) => first + i);
  const blocks = blockCount(length, BS);
  const path = new Uint32Array(2 * blocks);
  hashBlocks(tokens, BS, DEFAULT_SEED, path);
  chainHashes(path, blocks, path);
  return { id, promptLength: length, path, promptBlocks: blocks, tokens };
}

function replicas(count: number, options: { syncDelayMs: number | null; staggerMs?: number }) {
  const cached = new Map<number, number>(); // worker -> blocks cached of every query
  const models = Array.from(
    { length: count },
    (_, i) =>
      createPolicy("kv_aware_model", {
        workers: 4,
        blockSize: BS,
        seed: 7 + i,
        probe: (worker) => cached.get(worker) ?? 0,
      }) as KvAwareModel,
  );
  return { policy: new ReplicatedKvAware(models, options), models, cached };
}

const view = (model: KvAwareModel) =>
  model.router.load
    .workers()
    .map(
      (w) => `${w.workerId}: ${w.activeRequests} ${w.activePrefillTokens} ${w.activeDecodeBlocks}`,
    );

describe("replicas in virtual time", () => {
  test("synced: one view once the delay has passed, not before", () => {
    const { policy, models } = replicas(3, { syncDelayMs: 2 });
    for (let id = 0; id < 9; id++)
      expect(policy.route(query(id, id * 1000, 200), 10)).toBeGreaterThanOrEqual(0);
    expect(models[0]!.router.load.peerRequestCount).toBe(0);
    expect(policy.nextDueMs()).toBe(12);
    policy.advance(12);
    for (const model of models) expect(view(model)).toEqual(view(models[0]!));
    expect(
      models[0]!.router.load.activeRequestCount + models[0]!.router.load.peerRequestCount,
    ).toBe(9);
    policy.prefillDone(4, 20);
    policy.finished(5, 20);
    policy.advance(22);
    for (const model of models) {
      expect(view(model)).toEqual(view(models[0]!));
      model.router.load.verify();
    }
    for (let id = 0; id < 9; id++) if (id !== 5) policy.finished(id, 30);
    policy.advance(32);
    for (const model of models)
      expect(view(model).every((line) => line.endsWith(" 0 0 0"))).toBe(true);
  });

  test("unsynced: each replica sees its own requests only", () => {
    const { policy, models } = replicas(2, { syncDelayMs: null });
    for (let id = 0; id < 4; id++) policy.route(query(id, id * 1000, 200), 10);
    policy.advance(1000);
    for (const model of models) {
      expect(model.router.load.peerRequestCount).toBe(0);
      expect(model.router.load.activeRequestCount).toBe(2);
    }
  });

  test("turns: a contested route waits rank × stagger, a clear one does not", () => {
    const { policy, cached } = replicas(3, { syncDelayMs: 1, staggerMs: 5 });
    // Replica 0 (ids ≡ 0) never waits; replica 2 (ids ≡ 2) waits 10 ms on a near-tie.
    expect(policy.route(query(0, 0, 200), 100)).toBeGreaterThanOrEqual(0);
    expect(policy.route(query(2, 5000, 200), 100)).toBe(-1);
    expect(policy.nextDueMs()).toBe(101); // the facts of the first, due 1 ms later
    policy.advance(101);
    expect(policy.takeAnswers()).toEqual([]);
    expect(policy.nextDueMs()).toBe(110);
    policy.advance(110);
    const answers = policy.takeAnswers();
    expect(answers.map((a) => a.query.id)).toEqual([2]);
    // Worker 3 holds the prompt: the decision is clear, replica 1 answers at once.
    cached.set(3, 12);
    expect(policy.route(query(1, 9000, 200), 120)).toBe(3);
  });

  test("a replayed slice: nothing left active anywhere; synced beat unsynced", async () => {
    const trace = transformTrace(await loadConversationTrace(), {
      start: 0,
      requests: 400,
      timeScale: 0.5,
    });
    const run = (syncDelayMs: number | null) => {
      let finished: ReplicatedKvAware | null = null;
      const report = simulate(trace, {
        policy: "kv_aware_model",
        workers: 8,
        capacityBlocks: 32_768,
        seed: 42,
        kvAware: { policy: "ttft", replicas: 3, syncDelayMs, staggerMs: syncDelayMs ?? 0 },
        onFinish: (p) => {
          finished = p as ReplicatedKvAware;
        },
      });
      return { report, policy: finished! as ReplicatedKvAware };
    };
    const synced = run(2);
    const alone = run(null);
    for (const model of synced.policy.replicas) {
      expect(model.router.load.activeRequestCount + model.router.load.peerRequestCount).toBe(0);
      model.router.load.verify();
    }
    expect(synced.policy.busCounters!.messages).toBeGreaterThan(0);
    expect(synced.report.ttft_p50_ms).toBeLessThan(alone.report.ttft_p50_ms);
  });
});
