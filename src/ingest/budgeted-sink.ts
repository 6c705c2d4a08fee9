/**
 * The index as engine streams write to it, with the memory budget in front of stores:
 * a refused store leaves the worker holding more than the index says (the owner marks
 * it degraded) until its cache is cleared. Removals and clears always go through.
 * The core uses it on the main thread, the writer thread (src/runtime/writer.ts) on its.
 */
import type { IndexBudget } from "../index/budget";
import type { KvEventSink } from "./normalize";
import type { WorkerTable } from "../domain/worker-table";

/** Why a worker whose stores the memory budget refused is degraded (the status page says it). */
export const BUDGET_REFUSAL =
  "index memory budget reached: stores refused until the engine clears its cache or restarts";

export interface BudgetEvents {
  /** Stores of `blocks` blocks for `slot` were refused at the budget. */
  refused(slot: number, blocks: number): void;
  /** The slot was cleared: it holds nothing, exactly. */
  cleared(slot: number): void;
}

/** Where the writes go: the index, or the write pause in front of it. */
export interface IndexWrites {
  storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): unknown;
  removeAt(slot: number, external: Uint32Array, count: number, first: number): unknown;
  clearAt(slot: number): void;
  storeTierAt(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): unknown;
  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first: number,
  ): unknown;
}

export function budgetedSink(
  index: IndexWrites,
  budget: IndexBudget,
  workerTable: WorkerTable,
  events: BudgetEvents,
): KvEventSink {
  return {
    workerTable,
    storeAt: (slot, hasParent, parentHi, parentLo, external, local, count, first) => {
      // A slot of -1 (the table is full) is the index's to refuse and count.
      if (slot >= 0 && !budget.admits()) events.refused(slot, count);
      else index.storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first);
    },
    removeAt: (slot, external, count, first) => index.removeAt(slot, external, count, first),
    storeTierAt: (tier, slot, hasParent, parentHi, parentLo, external, local, count, first) => {
      if (slot >= 0 && !budget.admits()) events.refused(slot, count);
      else
        index.storeTierAt(tier, slot, hasParent, parentHi, parentLo, external, local, count, first);
    },
    removeTierAt: (tier, slot, external, count, first) =>
      index.removeTierAt(tier, slot, external, count, first),
    clearAt: (slot) => {
      index.clearAt(slot);
      events.cleared(slot);
    },
  };
}
