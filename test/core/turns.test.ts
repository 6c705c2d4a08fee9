// Goal: with replicas taking turns (cluster.stagger_ms), a replica ranked k holds a
// contested route (its two cheapest workers within CONTESTED_MARGIN) k × stagger ms and
// decides it then, on the load of that moment; a clear decision (a cached prefix far
// ahead) and the first replica's routes are decided at once; a held call counts in the
// buffer budget, its id is refused twice, its client can drop it, and shutting down
// answers it; after its turn it goes through admission like any other call.
// Method: the transport-free core; waits on conditions (until), never on timings.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore, type RouteCall, type RouteInput } from "../../src/core/core";
import { KvedgeError } from "../../src/domain/errors";
import { bufferBudget } from "../../src/util/buffer-budget";
import { silentLogger } from "../../src/util/log";
import { until } from "../support/wait";
import { routeInput } from "../support/route-input";

const input = (requestId: string, tokens: Uint32Array): RouteInput => routeInput(tokens, requestId);

const prompt = (first: number, length = 64) => Uint32Array.from({ length }, (_, i) => first + i);

function setup(rank: number, env: Record<string, string> = {}) {
  const config = loadConfig({
    env: {
      KVEDGE_CLUSTER_NATS: "nats://127.0.0.1:1",
      KVEDGE_CLUSTER_STAGGER_MS: "5",
      KVEDGE_BLOCK_SIZE: "16",
      ...env,
    },
  }).config;
  const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
  core.workerTable.acquire(1n, 0);
  core.workerTable.acquire(2n, 0);
  core.replicaRank = () => rank;
  const answers: string[] = [];
  const call = (id: string, tokens: Uint32Array): RouteCall => ({
    input: input(id, tokens),
    candidatesMax: 0,
    answer: (outcome) => answers.push(`${outcome.decision.requestId}:${outcome.decision.workerId}`),
    fail: (error) =>
      answers.push(`${id}:${error instanceof KvedgeError ? error.code : String(error)}`),
  });
  return { core, answers, call };
}

describe("replicas taking turns", () => {
  test("a contested route waits for the turn and is decided on the load then", async () => {
    const { core, answers, call } = setup(2);
    expect(core.mayHold).toBe(true);
    const before = bufferBudget.held;
    const handle = core.submitRoute(call("a", prompt(1)));
    expect(handle).toBeGreaterThanOrEqual(2 ** 31);
    expect(answers).toEqual([]);
    expect(bufferBudget.held).toBe(before + 64 * 4);
    expect(() => core.submitRoute(call("a", prompt(1)))).toThrow("already held");
    // A peer's decision lands meanwhile (its facts): worker 1 gets a long prefill.
    const origin = core.router.load.openOrigin();
    const slot = core.workerTable.find(1n, 0);
    core.router.load.peerRouted(origin, "peer", slot, new Uint32Array(0), 0, 50_000, 0);
    await until(() => answers.length === 1, "the turn to come");
    expect(answers).toEqual(["a:2"]); // decided then: away from the loaded worker
    expect(bufferBudget.held).toBe(before);
  });

  test("the first replica, and a clear decision, are not held", () => {
    const first = setup(0);
    expect(first.core.submitRoute(first.call("x", prompt(1)))).toBe(-1);
    expect(first.answers).toEqual(["x:1"]);
    const { core, answers, call } = setup(1);
    // Worker 1 is far behind: the decision is clear, nothing to wait for.
    const origin = core.router.load.openOrigin();
    const slot = core.workerTable.find(1n, 0);
    core.router.load.peerRouted(origin, "peer", slot, new Uint32Array(0), 0, 50_000, 0);
    expect(core.submitRoute(call("y", prompt(1)))).toBe(-1);
    expect(answers).toEqual(["y:2"]);
  });

  test("a client that goes away is dropped; shutting down answers the rest", async () => {
    const { core, answers, call } = setup(1, { KVEDGE_CLUSTER_STAGGER_MS: "1000" });
    const before = bufferBudget.held;
    const gone = call("gone", prompt(1));
    const handle = core.submitRoute(gone);
    expect(core.dropHeld(handle, gone)).toBe(true);
    expect(core.dropHeld(handle, gone)).toBe(false);
    core.submitRoute(call("left", prompt(100)));
    await core.stop();
    expect(answers).toEqual(["left:shutting_down"]);
    expect(bufferBudget.held).toBe(before);
  });

  test("after its turn a call goes through admission, which may hold it", async () => {
    const { core, answers, call } = setup(1, {
      KVEDGE_ADMISSION: "hold",
      KVEDGE_ADMISSION_BOUND_MS: "200",
    });
    // Both workers busy past the bound: the call waits its turn, then admission holds it.
    const load = core.router.load;
    const origin = load.openOrigin();
    for (const id of [1n, 2n])
      load.peerRouted(origin, `busy${id}`, load.table.find(id, 0), new Uint32Array(0), 0, 6000, 0);
    const held = call("h", prompt(1));
    const handle = core.submitRoute(held);
    await until(() => core.admission.held === 1, "admission to hold the call after its turn");
    expect(answers).toEqual([]);
    expect(core.dropHeld(handle, held)).toBe(true); // its turn handle still finds it
    expect(core.admission.held).toBe(0);
    await core.stop();
    expect(answers).toEqual([]);
  });
});
