/**
 * Shared bench helpers: provenance for every result (so a number can be traced to a
 * commit, runtime and machine), a seeded PRNG, the median, strict flag parsing, and
 * helper processes that do not outlive the bench.
 *
 * See docs/decisions.md#bench-hygiene.
 */
import { readFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import type { Subprocess } from "bun";

export interface Provenance {
  readonly date: string;
  readonly git: string;
  readonly bun: string;
  readonly cpu: string;
  readonly cores: number;
}

export function provenance(): Provenance {
  const git = Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"], {
    cwd: join(import.meta.dir, ".."),
  });
  const dirty = Bun.spawnSync(["git", "status", "--porcelain", "--untracked-files=no"], {
    cwd: join(import.meta.dir, ".."),
  });
  const sha = git.exitCode === 0 ? git.stdout.toString().trim() : "unknown";
  return {
    date: new Date().toISOString(),
    git: dirty.stdout.toString().trim() === "" ? sha : `${sha}+dirty`,
    bun: Bun.version,
    cpu: cpus()[0]?.model ?? "unknown",
    cores: cpus().length,
  };
}

/** xorshift32: the same data in every process for a given seed. */
export { xorshift32 as prng } from "../src/util/random";

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** Resident set size in bytes, from /proc/self/status (VmRSS). */
export function rssBytes(): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
  return match === null ? 0 : Number(match[1]) * 1024;
}

export function formatRate(perSecond: number): string {
  if (perSecond >= 1e9) return `${(perSecond / 1e9).toFixed(2)} G/s`;
  if (perSecond >= 1e6) return `${(perSecond / 1e6).toFixed(2)} M/s`;
  if (perSecond >= 1e3) return `${(perSecond / 1e3).toFixed(2)} k/s`;
  return `${perSecond.toFixed(0)} /s`;
}

type FlagSpec = { readonly type: "string" | "boolean"; readonly multiple?: boolean };

/**
 * A bench's flags, parsed strictly: `--help` prints `usage` and exits; an unknown flag
 * or a flag without its value exits 2 naming it, instead of running a long bench on
 * its defaults.
 */
export function benchFlags<const O extends Record<string, FlagSpec>>(
  usage: string,
  options: O,
  allowPositionals = false,
) {
  const config = {
    args: process.argv.slice(2),
    options: { ...options, help: { type: "boolean" } } as const,
    strict: true,
    allowPositionals,
  } as const;
  let parsed: ReturnType<typeof parseArgs<typeof config>>;
  try {
    parsed = parseArgs(config);
  } catch (error) {
    console.error(`${(error as Error).message}\nusage: ${usage}`);
    process.exit(2);
  }
  if ((parsed.values as { help?: boolean }).help === true) {
    console.log(`usage: ${usage}`);
    process.exit(0);
  }
  return { ...parsed.values, positionals: parsed.positionals };
}

const children = new Set<Subprocess>();

/**
 * Registers a bench's helper process (server, fleet, load generator) to be killed when
 * the bench is interrupted or killed, instead of left running and loading the machine
 * for whatever is measured next: `const server = killWithBench(Bun.spawn(...))`.
 */
export function killWithBench<P extends Subprocess>(child: P): P {
  if (!handlersInstalled) installHandlers();
  children.add(child);
  void child.exited.then(() => children.delete(child));
  return child;
}

let handlersInstalled = false;
function installHandlers(): void {
  handlersInstalled = true;
  for (const [signal, code] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["SIGHUP", 129],
  ] as const) {
    process.on(signal, () => {
      for (const child of children) child.kill("SIGTERM");
      process.exit(code);
    });
  }
}
