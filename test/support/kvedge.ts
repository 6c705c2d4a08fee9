/**
 * Runs the compiled dist/kvedge (what users run) as a subprocess. `npm test` builds it
 * first; a bare `bun test` after editing src/ fails loudly instead of testing a stale
 * binary.
 */
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";

export const ROOT = join(import.meta.dir, "..", "..");
export const KVEDGE_BIN = join(ROOT, "dist", "kvedge");

function newestSource(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs);
  }
  return newest;
}

let checked = false;

/** Path of a dist/kvedge at least as new as src/ and native/. */
export function kvedgeBinary(): string {
  if (!checked) {
    let built = 0;
    try {
      built = statSync(KVEDGE_BIN).mtimeMs;
    } catch {
      throw new Error(`${KVEDGE_BIN} is missing: run 'npm test' (or 'bun build.ts --host') first`);
    }
    const sources = Math.max(
      newestSource(join(ROOT, "src")),
      statSync(join(ROOT, "native", "kvedge.c")).mtimeMs,
    );
    if (sources > built)
      throw new Error(
        `${KVEDGE_BIN} is older than src/: run 'npm test' (or 'bun build.ts --host')`,
      );
    checked = true;
  }
  return KVEDGE_BIN;
}

/**
 * This process's environment without the test harness's knobs (KVEDGE_SEED, KVEDGE_SEEDS:
 * `npm run test:unit` sets them), which kvedge itself would warn about as unknown settings.
 */
export function productEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (value !== undefined && name !== "KVEDGE_SEED" && name !== "KVEDGE_SEEDS") env[name] = value;
  }
  return env;
}

export interface RunResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface RunOptions {
  readonly stdin?: string;
  readonly cwd?: string;
  readonly env?: Record<string, string>;
  readonly binary?: string;
}

/** Runs `kvedge ...args` to completion. */
export async function runKvedge(
  args: readonly string[],
  options: RunOptions = {},
): Promise<RunResult> {
  const child = Bun.spawn([options.binary ?? kvedgeBinary(), ...args], {
    cwd: options.cwd ?? ROOT,
    env: options.env ?? { ...process.env, KVEDGE_NATIVE: "" },
    stdin: options.stdin === undefined ? "ignore" : new TextEncoder().encode(options.stdin),
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
    child.exited,
  ]);
  return { code, stdout, stderr };
}

export interface MockEngineChild {
  readonly proc: Subprocess<"ignore", "pipe", "pipe">;
  /** The JSON line it prints once listening (endpoint, replay_endpoint, http, ...). */
  readonly info: Record<string, any>;
}

/**
 * Starts `kvedge mock-engine <args>` and waits (at most 10 s) for its address line. Its
 * stderr is drained, so the engine never blocks on its logs, and quoted if it exits early.
 */
export async function spawnMockEngine(
  args: readonly string[],
  env?: Record<string, string>,
): Promise<MockEngineChild> {
  const proc = Bun.spawn([kvedgeBinary(), "mock-engine", ...args], {
    env: env ?? process.env,
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const logs = new Response(proc.stderr).text();
  const reader = proc.stdout.getReader();
  let text = "";
  const deadline = performance.now() + 10_000;
  while (!text.includes("\n")) {
    if (performance.now() > deadline) throw new Error("mock engine did not print its addresses");
    const { value, done } = await reader.read();
    if (done) {
      const code = await proc.exited;
      throw new Error(`mock engine exited before listening (code ${code}): ${await logs}`);
    }
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return { proc, info: JSON.parse(text.slice(0, text.indexOf("\n"))) };
}
