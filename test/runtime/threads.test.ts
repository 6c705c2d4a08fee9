// Goal: the thread plan follows the settings, and their defaults follow the CPU set
// (single-threaded below 4 CPUs, at most 3 lanes, no writer thread until serve has
// one); dedicated threads get CPUs of their own from the end
// of the set; a started thread really runs on a Worker, pinned to the CPUs it was given.
import { describe, expect, test } from "bun:test";
import { getAffinity } from "../../src/runtime/affinity";
import { planThreads, startThread } from "../../src/runtime/threads";

const auto = { cpus: null, numa_node: null, index_threads: null, route_threads: null };

describe("thread plan", () => {
  test.each([
    [1, 0, 0],
    [2, 0, 0],
    [3, 0, 0],
    [4, 0, 2],
    [5, 0, 3],
    [8, 0, 3],
    [72, 0, 3],
  ])("%p CPUs by default: %p writer, %p lanes", (count, writers, lanes) => {
    const cpus = Array.from({ length: count }, (_, i) => i);
    const plan = planThreads(auto, cpus);
    expect([plan.indexThreads, plan.routeThreads]).toEqual([writers, lanes]);
    expect(plan.shared).toBe(false);
  });

  test("dedicated threads take CPUs from the end of the pinned set, the writer first", () => {
    const plan = planThreads({ ...auto, index_threads: 1, route_threads: 2 }, [4, 5, 6, 7]);
    expect(plan.writerCpus).toEqual([7]);
    expect(plan.laneCpus).toEqual([[6], [5]]);
    expect(plan.shared).toBe(false);
  });

  test("more threads than CPUs share them, and say so", () => {
    const plan = planThreads({ ...auto, index_threads: 1, route_threads: 3 }, [0, 1]);
    expect(plan.writerCpus).toEqual([1]);
    expect(plan.laneCpus).toEqual([[0], [1], [0]]);
    expect(plan.shared).toBe(true);
  });

  test("unpinned: defaults from the CPUs the process may use, threads not pinned", () => {
    const threads = { ...auto, index_threads: 1, route_threads: 1 };
    const plan = planThreads(threads, null, [0, 1, 2, 3, 4]);
    expect(plan.writerCpus).toBeNull();
    expect(plan.laneCpus).toEqual([null]);
    expect(planThreads(auto, null, [0, 1, 2, 3]).routeThreads).toBe(2);
  });
});

describe("threads", () => {
  test("a probe thread runs on a Worker, pinned to its CPU, and answers", async () => {
    const cpu = getAffinity().at(-1)!;
    const thread = await startThread({ role: "probe", cpus: [cpu], data: null });
    try {
      expect(thread.ready).toEqual({ role: "probe", cpus: [cpu] });
      const answer = new Promise((resolve) => {
        thread.onMessage = resolve;
      });
      thread.post({ hello: 1 });
      expect(await answer).toEqual({ hello: 1 });
      // The main thread is not pinned by it.
      expect(getAffinity().length).toBeGreaterThanOrEqual(1);
    } finally {
      await thread.stop();
    }
  });

  test("a thread that cannot pin fails to start, with the reason", async () => {
    const started = startThread({ role: "probe", cpus: [1023], data: null });
    await expect(started).rejects.toThrow("cannot pin");
  });

  test("an unknown role fails to start", async () => {
    const started = startThread({ role: "nonesuch" as "probe", cpus: null, data: null });
    await expect(started).rejects.toThrow("no such thread role");
  });
});
