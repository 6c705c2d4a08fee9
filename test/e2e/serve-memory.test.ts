// Goal: under a real address-space limit (RLIMIT_AS 3 GiB, as an operator's container
// might set), an engine streaming unique blocks cannot take kvedge down: past the index
// memory budget stores are refused and counted, the worker is degraded, /healthz still
// answers, and SIGTERM still stops it with exit 0.
import { afterEach, expect, test } from "bun:test";
import { kvedgeBinary } from "../support/kvedge";
import { eventually } from "../support/wait";
import { stored, TestEngine } from "../support/engine";

const BS = 4;
const BUDGET = 32 * 1024 * 1024;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

test("RLIMIT_AS 3 GiB, one engine streaming unique blocks: refused at the budget, still serving, SIGTERM exits 0", async () => {
  const engine = await new TestEngine().start();
  cleanups.push(() => engine.stop());
  const proc = Bun.spawn(
    [
      "sh",
      "-c",
      'ulimit -v 3145728 && exec "$0" "$@"',
      kvedgeBinary(),
      "serve",
      "--port",
      "0",
      "--log-format",
      "json",
      "--block-size",
      String(BS),
      "--index-memory-budget-bytes",
      String(BUDGET),
      "--workers",
      `1=${engine.endpoint}`,
    ],
    { stdin: "ignore", stdout: "ignore", stderr: "pipe", env: { PATH: process.env.PATH ?? "" } },
  );
  cleanups.push(() => proc.kill("SIGKILL"));
  let logs = "";
  void (async () => {
    for await (const chunk of proc.stderr) logs += new TextDecoder().decode(chunk);
  })();
  const url = await eventually(
    () => /"msg":"listening".*?"url":"([^"]+)"/.exec(logs)?.[1],
    15_000,
    "kvedge listening",
  );
  await engine.waitForSubscriber();

  const metric = async (name: string): Promise<number> => {
    const text = await (await fetch(`${url}/metrics`)).text();
    return Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  };
  let next = 0;
  for (let batch = 0; ; batch++) {
    if (batch >= 2000) throw new Error("the budget never refused a store");
    const events = [];
    for (let c = 0; c < 32; c++) {
      const hashes = Array.from({ length: 32 }, () => BigInt(++next));
      events.push(
        stored(
          hashes,
          Array.from({ length: 32 * BS }, (_, i) => (next * BS + i) % 1_000_003),
          BS,
        ),
      );
    }
    engine.publish(events);
    if (batch % 20 === 19) {
      await Bun.sleep(5);
      if ((await metric('kvedge_index_budget_refused_total{what="events"}')) > 0) break;
    }
  }
  expect(await metric("kvedge_index_bytes")).toBeLessThan(2 * BUDGET);
  expect((await fetch(`${url}/healthz`)).status).toBe(200);
  const workers = (await (await fetch(`${url}/v1/workers`)).json()) as {
    workers: { degraded: boolean; state: string }[];
  };
  expect(workers.workers[0]).toMatchObject({ degraded: true, state: "connected" });
  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
});
