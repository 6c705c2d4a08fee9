/**
 * The index memory budget: past it, new stores are refused and counted instead of
 * growing the index into an out-of-memory. Removals, clears and worker removals always
 * go through (they give memory back). What is measured is the bytes of the index's
 * arrays (`stats().bytes`), re-read every CHECK_EVERY stores so the check costs nothing
 * per event; arrays grow in steps (x1.25 to x2), so the last growth before refusal
 * starts can take the index past the budget by one step of one array.
 * The reference backend reports 0 bytes: it is a test oracle, not for production.
 */
import { readFileSync } from "node:fs";
import { totalmem } from "node:os";
import type { KvIndex } from "./types";

const CHECK_EVERY = 64;

export class IndexBudget {
  /** Stored events and their blocks refused because the index was at the budget. */
  refusedEvents = 0;
  refusedBlocks = 0;
  private countdown = 0;
  private over = false;

  constructor(
    private readonly index: KvIndex,
    readonly budgetBytes: number,
  ) {}

  /** Whether a store may go in now. */
  admits(): boolean {
    if (--this.countdown <= 0) {
      this.countdown = CHECK_EVERY;
      this.over = this.index.stats().bytes >= this.budgetBytes;
    }
    return !this.over;
  }

  refuse(blocks: number): void {
    this.refusedEvents++;
    this.refusedBlocks += blocks;
  }

  /** Whether stores are being refused now. */
  get full(): boolean {
    return this.over;
  }
}

/**
 * The budget when none is set: half of the memory this process may use, the machine's
 * or its cgroup's limit, whichever is lower (the rest is for the process itself,
 * buffers, and the growth step above the budget).
 */
export function defaultIndexBudgetBytes(): number {
  return Math.floor(Math.min(totalmem(), cgroupMemoryLimit()) / 2);
}

function cgroupMemoryLimit(): number {
  for (const path of ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]) {
    try {
      const limit = Number(readFileSync(path, "utf8").trim());
      if (Number.isSafeInteger(limit) && limit > 0) return limit;
    } catch {
      // Not in a cgroup with a limit here.
    }
  }
  return Infinity;
}
