/** Runs test files again in a child `bun test` with some environment changed. */
import { expect } from "bun:test";

/** `bun test <args>` with `env` added to this process's; expects some passes and no failure. */
export function expectChildSuitePasses(args: readonly string[], env: Record<string, string>): void {
  const run = Bun.spawnSync([process.execPath, "test", ...args], {
    env: { ...process.env, ...env },
    stdout: "pipe",
    stderr: "pipe",
  });
  const report = run.stderr.toString();
  expect(report).toMatch(/\n\s*[1-9]\d* pass\n/);
  expect(report).toMatch(/\n\s*0 fail\n/);
  expect(run.exitCode).toBe(0);
}
