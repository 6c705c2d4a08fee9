import { describe, expect, test } from "bun:test";
import { TurnBatch } from "../../src/server/turn";
import { createLogger } from "../../src/util/log";

function batchWithLog() {
  const lines: string[] = [];
  const log = createLogger({
    level: "debug",
    format: "json",
    write: (line: string) => lines.push(line),
  });
  return { batch: new TurnBatch(log), lines };
}

/** Resolves once `batch` has run everything posted before it. */
function settled(batch: TurnBatch): Promise<void> {
  return new Promise((resolve) => batch.post(resolve));
}

describe("TurnBatch", () => {
  test("work queued in one turn runs after it, together, in arrival order", async () => {
    const { batch } = batchWithLog();
    const order: string[] = [];
    batch.post(() => order.push("a"));
    batch.post(() => order.push("b"));
    batch.post(() => order.push("c"));
    order.push("sync");
    expect(batch.pending).toBe(3);
    await settled(batch);
    expect(order).toEqual(["sync", "a", "b", "c"]);
    expect(batch.pending).toBe(0);
  });

  test("a failing item is logged and does not stop the others", async () => {
    const { batch, lines } = batchWithLog();
    let before = false;
    let after = false;
    batch.post(() => (before = true));
    batch.post(() => {
      throw new Error("posted boom");
    });
    batch.post(() => (after = true));
    await settled(batch);
    expect(before).toBe(true);
    expect(after).toBe(true);
    expect(lines.filter((line) => line.includes("posted boom"))).toHaveLength(1);
  });

  test("drain runs what is queued now, and the scheduled flush then finds nothing", async () => {
    const { batch } = batchWithLog();
    const order: number[] = [];
    batch.post(() => order.push(1));
    batch.post(() => order.push(2));
    batch.drain();
    order.push(3);
    batch.post(() => order.push(4));
    batch.post(() => order.push(5));
    await settled(batch);
    expect(order).toEqual([1, 2, 3, 4, 5]);
  });

  test("a large batch yields to I/O between slices of 256, work queued meanwhile runs after it", async () => {
    const { batch } = batchWithLog();
    const ran: number[] = [];
    let immediatesBetween = 0;
    for (let i = 0; i < 600; i++) batch.post(() => ran.push(i));
    // Queued after the first slice started: an immediate of another component.
    setImmediate(() => {
      immediatesBetween = ran.length;
      batch.post(() => ran.push(600));
    });
    batch.post(() => ran.push(601));
    await settled(batch);
    await new Promise((resolve) => setImmediate(resolve));
    expect(ran.slice(0, 600)).toEqual(Array.from({ length: 600 }, (_, i) => i));
    expect(ran.slice(600)).toEqual([601, 600]);
    expect(immediatesBetween).toBeGreaterThan(0);
    expect(immediatesBetween).toBeLessThan(601);
  });
});
