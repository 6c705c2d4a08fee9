// Goal: the native token readers (native/kvedge.c: JSON and msgpack) are memory-safe and
// exact on input they were not written for. native/fuzz-scan.c drives them with random
// arrays and compares each with a byte-by-byte reader; built here with AddressSanitizer
// and UBSan, so a read or write outside the input or the output bound fails the test,
// on both the AVX2 and the scalar conversion.
import { expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const compiler = [process.env.CC ?? "cc", "gcc", "clang"].find((name) => Bun.which(name) !== null);

test.skipIf(compiler === undefined || process.arch !== "x64")(
  "the native token reader under AddressSanitizer: random arrays, both conversions",
  () => {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-fuzz-"));
    try {
      const binary = join(dir, "fuzz-scan");
      const source = join(import.meta.dir, "..", "native", "fuzz-scan.c");
      const build = Bun.spawnSync(
        [
          compiler!,
          "-O1",
          "-g",
          "-fsanitize=address,undefined",
          "-fno-sanitize-recover=all",
          "-fno-omit-frame-pointer",
          source,
          "-o",
          binary,
        ],
        { stderr: "pipe" },
      );
      expect(build.stderr.toString()).toBe("");
      expect(build.exitCode).toBe(0);
      for (const [avx2, seed] of [
        ["1", "1"],
        ["0", "2"],
      ]) {
        const run = Bun.spawnSync([binary, "150000", seed!], {
          env: { ...process.env, KVEDGE_NATIVE_AVX2: avx2 },
          stdout: "pipe",
          stderr: "pipe",
        });
        expect(run.stderr.toString()).toBe("");
        expect(run.stdout.toString()).toMatch(
          /^ok: 150000 inputs, \d+ read, [1-9]\d* by the block path\nok: 150000 msgpack inputs, [1-9]\d* values read\n$/,
        );
        expect(run.exitCode).toBe(0);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
  60_000,
);
