// Runs before every test file: the native library must exist for src/native/library.ts
// to import (build.ts writes an empty placeholder when there is no C compiler).
import { existsSync } from "node:fs";
import { join } from "node:path";

const library = join(import.meta.dir, "..", "native", "build", "libkvedge.so");
if (!existsSync(library)) {
  const result = Bun.spawnSync(
    [process.execPath, join(import.meta.dir, "..", "build.ts"), "--native"],
    {
      stdout: "inherit",
      stderr: "inherit",
    },
  );
  if (result.exitCode !== 0) throw new Error("building the native library failed");
}
