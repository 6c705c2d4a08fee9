/**
 * Shared bench helpers: provenance for every result (so a number can be traced to a
 * commit, runtime and machine), a seeded PRNG, and the median.
 */
import { readFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";

export interface Provenance {
  readonly date: string;
  readonly git: string;
  readonly bun: string;
  readonly cpu: string;
  readonly cores: number;
}

export function provenance(): Provenance {
  const git = Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"], { cwd: join(import.meta.dir, "..") });
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
