// Goal: CPU lists parse like taskset/sysfs, bad lists are refused with the reason,
// and pinning really changes the affinity of every thread — checked in a child
// process so the test runner itself stays unpinned.
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { getAffinity, numaNodeCpus, parseCpuList } from "../../src/runtime/affinity";

const affinityModule = join(import.meta.dir, "../../src/runtime/affinity.ts");

describe("CPU lists", () => {
  test.each([
    ["0", [0]],
    ["0-3", [0, 1, 2, 3]],
    ["0-1,4,6-7", [0, 1, 4, 6, 7]],
    [" 3 , 1 ", [1, 3]],
    ["2,2,1-2", [1, 2]],
  ])("%p → %p", (text, cpus) => {
    expect(parseCpuList(text)).toEqual(cpus);
  });

  test.each([
    ["", "''"],
    ["a", "'a'"],
    ["3-1", "backwards"],
    ["0-5000", "above 1023"],
    ["1,,2", "''"],
  ])("%p is refused (%p)", (text, why) => {
    expect(() => parseCpuList(text)).toThrow(why);
  });

  test("NUMA node CPUs come from sysfs; a missing node is a clear error", () => {
    const sysfs = mkdtempSync(join(tmpdir(), "kvedge-sysfs-"));
    mkdirSync(join(sysfs, "node1"));
    writeFileSync(join(sysfs, "node1", "cpulist"), "4-7,12\n");
    expect(numaNodeCpus(1, sysfs)).toEqual([4, 5, 6, 7, 12]);
    expect(() => numaNodeCpus(3, sysfs)).toThrow("NUMA node 3 does not exist");
  });
});

describe("pinning", () => {
  test("pinProcess pins every thread of a process", async () => {
    const available = getAffinity();
    const target = available[available.length - 1]!;
    const script = `
      import { pinProcess, getAffinity } from ${JSON.stringify(affinityModule)};
      import { readdirSync } from "node:fs";
      const pinned = pinProcess([${target}]);
      const threads = readdirSync("/proc/self/task").map(Number);
      const masks = threads.map((t) => getAffinity(t));
      console.log(JSON.stringify({ pinned, threads: threads.length, masks }));
    `;
    const child = Bun.spawn([process.execPath, "-e", script], { stdout: "pipe", stderr: "pipe" });
    const out = await new Response(child.stdout).text();
    expect(await child.exited).toBe(0);
    const result = JSON.parse(out);
    expect(result.threads).toBeGreaterThan(1);
    expect(result.pinned).toBe(result.threads);
    for (const mask of result.masks) expect(mask).toEqual([target]);
  });
});
