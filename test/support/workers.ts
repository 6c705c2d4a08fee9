/**
 * A worker's life in a bare load tracker (no core), as the core runs it: a slot from the
 * tracker's table, and at the end its load dropped, then its slot freed.
 */
import type { LoadTracker } from "../../src/route";

/** Ends (workerId, dpRank)'s life: its requests and load dropped, its slot freed. False if unknown. */
export function removeWorker(load: LoadTracker, workerId: bigint, dpRank: number): boolean {
  const slot = load.table.find(workerId, dpRank);
  if (slot < 0) return false;
  load.dropSlot(slot);
  load.table.release(slot);
  return true;
}
