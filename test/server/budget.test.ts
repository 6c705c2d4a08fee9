// Goal: the index memory budget. Past it, new stores are refused and counted, the
// worker is degraded (it holds more than the index says), routing goes on, and a
// clear from the engine makes the worker exact again; the index's bytes stay within
// one growth step of the budget. And an exception while applying a batch is caught,
// counted as a lost batch, the worker degraded, and the stream goes on.
// Real engine (PUB/ROUTER) on loopback, real core.
import { afterEach, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { KvedgeCore } from "../../src/core/core";
import { silentLogger } from "../../src/util/log";
import { cleared, stored, TestEngine } from "../support/engine";
import { eventually } from "../support/wait";
import { routeInput } from "../support/route-input";

const BS = 4;
const BUDGET = 1 << 20;
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const until = (condition: () => boolean, what: string, timeoutMs = 15_000) =>
  eventually(() => condition() || undefined, timeoutMs, what);

async function coreWithEngine(env: Record<string, string>) {
  const engine = await new TestEngine().start();
  cleanups.push(() => engine.stop());
  const config = loadConfig({ env: { KVEDGE_BLOCK_SIZE: String(BS), ...env } }).config;
  const core = new KvedgeCore({ config, log: silentLogger, random: () => 0.5 });
  cleanups.push(() => core.stop());
  await core.addWorker({
    worker_id: 1n,
    dp_rank: 0,
    endpoint: engine.endpoint,
    replay_endpoint: null,
    topic: "",
  });
  await engine.waitForSubscriber();
  return { engine, core };
}

/** One batch of `chains` unique 32-block chains. */
function uniqueBatch(engine: TestEngine, base: number, chains: number): void {
  const events = [];
  for (let c = 0; c < chains; c++) {
    const first = base + c * 32;
    const hashes = Array.from({ length: 32 }, (_, i) => BigInt(first + i + 1));
    const tokens = Array.from({ length: 32 * BS }, (_, i) => (first * BS + i) % 1_000_003);
    events.push(stored(hashes, tokens, BS));
  }
  engine.publish(events);
}

test("past the budget, stores are refused and counted, the worker degraded; a clear makes it exact again", async () => {
  const { engine, core } = await coreWithEngine({
    KVEDGE_INDEX_MEMORY_BUDGET_BYTES: String(BUDGET),
  });
  expect(core.budget.budgetBytes).toBe(BUDGET);
  let sent = 0;
  for (let batch = 0; core.budget.refusedEvents === 0; batch++) {
    if (batch >= 400) throw new Error("the budget never refused a store");
    uniqueBatch(engine, sent, 16);
    sent += 16 * 32;
    await until(
      () => engine.seq === BigInt(batch + 1) && core.engineSources[0]!.sequencer.lastSeq === batch,
      "the batch applied",
    );
  }
  const bytes = core.index.stats().bytes;
  expect(bytes).toBeGreaterThanOrEqual(BUDGET);
  expect(bytes).toBeLessThan(2 * BUDGET); // at most one growth step over
  expect(core.budget.full).toBe(true);
  const view = core.workers()[0]!;
  expect(view.degraded).toBe(true);
  expect(view.degradedReason).toStartWith("index memory budget reached: stores refused");
  expect(view.state).toBe("connected");
  expect(core.budget.refusedBlocks).toBe(32 * core.budget.refusedEvents);
  expect(view.blocks + core.budget.refusedBlocks).toBe(sent);
  // Still routing.
  const route = core.route(routeInput(new Uint32Array([1, 2, 3, 4])), 4);
  expect(route.decision.slot).toBeGreaterThanOrEqual(0);
  // The engine clears its cache: the index holds what the engine holds, exactly.
  engine.publish([cleared]);
  await until(() => core.workers()[0]!.blocks === 0, "the clear");
  await until(() => !core.workers()[0]!.degraded, "exact again");
});

test("an exception while applying a batch is counted as a lost batch, the worker degraded; the stream goes on", async () => {
  const { engine, core } = await coreWithEngine({});
  const index = core.index;
  // An allocation failing inside the index, as a RangeError from a typed array would.
  const storeAt = index.storeAt.bind(index);
  let failNext = true;
  index.storeAt = (...args: Parameters<typeof storeAt>) => {
    if (failNext) {
      failNext = false;
      throw new RangeError("Out of memory");
    }
    return storeAt(...args);
  };
  const source = core.engineSources[0]!;
  engine.publish([stored([1n], [1, 2, 3, 4], BS)]);
  await until(() => source.stream.counters.applyErrors === 1, "the failed apply");
  expect(source.sequencer.counters.lost).toBe(1);
  expect(core.workers()[0]!.degraded).toBe(true);
  expect(core.workers()[0]!.degradedReason).toBe("1 batch lost: malformed batch");
  engine.publish([stored([2n], [5, 6, 7, 8], BS)]);
  await until(() => core.workers()[0]!.blocks === 1, "the next batch");
  expect(source.socketCounters.sub.callbackErrors).toBe(0);
});
