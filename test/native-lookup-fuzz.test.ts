// Goal: the native lookup calls and the store's repeat check (native/kvedge.c) are
// memory-safe and exact on random events. native/fuzz-lookup.c drives them against a
// model through growth into the large regime (past 2^21 slots, the double-multiply
// home), back to small, with held and repeated keys stopping runs; built here with
// AddressSanitizer and UBSan, so a read or write outside the table, an event's keys or
// the repeat set fails the test, as does any answer or table that differs from the model.
import { expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const compiler = [process.env.CC ?? "cc", "gcc", "clang"].find((name) => Bun.which(name) !== null);
const flags = [
  "-O1",
  "-g",
  "-fsanitize=address,undefined",
  "-fno-sanitize-recover=all",
  "-fno-omit-frame-pointer",
];
const expected = new RegExp(
  "^ok: 3000 lookup events, largest table \\d+ slots, [1-9]\\d* events above 2\\^21\n" +
    "ok: 15000 repeat checks, [1-9]\\d* with a repeat\n$",
);

const name = "native lookup calls under AddressSanitizer: events vs a model";
test.skipIf(compiler === undefined)(
  name,
  () => {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-fuzz-"));
    try {
      const binary = join(dir, "fuzz-lookup");
      const source = join(import.meta.dir, "..", "native", "fuzz-lookup.c");
      const build = Bun.spawnSync([compiler!, ...flags, source, "-o", binary], { stderr: "pipe" });
      expect(build.stderr.toString()).toBe("");
      expect(build.exitCode).toBe(0);
      for (const seed of ["1", "2"]) {
        // A broken probe can loop for ever: the run is bounded, far above its ~6 s alone
        // (a loaded machine stretched one to 50 s).
        const options = { stdout: "pipe", stderr: "pipe", timeout: 180_000 } as const;
        const run = Bun.spawnSync([binary, "3000", seed], options);
        expect(run.stderr.toString()).toBe("");
        expect(run.stdout.toString()).toMatch(expected);
        expect(run.exitCode).toBe(0);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
  400_000,
);
