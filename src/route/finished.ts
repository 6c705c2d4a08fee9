/**
 * Recently finished request ids and how each ended, so a repeated done or
 * prefill_done is answered as such. Oldest first, in a ring of typed arrays; `byKey`
 * maps an id's key (53 bits of its hash) to its index in the ring (an id finished again
 * later points to its newer index), the ring holds the other 11 bits as a check.
 * Numbers only, in typed arrays: the collector has nothing to rescan, and the table
 * never stalls to rebuild itself under churn as a Map does (src/util/tables.ts; see
 * docs/decisions.md#typed-array-records).
 */
import { KeyTable } from "../util/tables";

/** Finished requests remembered so a repeated done/prefill_done is answered as such. */
export const FINISHED_REMEMBERED_MAX = 65_536;

export type Ending = "already_done" | "expired" | "worker_removed" | "evicted";
/** Endings as stored in the ring (a byte per entry). */
const ENDINGS: readonly Ending[] = ["already_done", "expired", "worker_removed", "evicted"];

export class FinishedRing {
  private readonly byKey = new KeyTable();
  private readonly keys = new Float64Array(FINISHED_REMEMBERED_MAX);
  private readonly checks = new Uint16Array(FINISHED_REMEMBERED_MAX);
  private readonly endings = new Uint8Array(FINISHED_REMEMBERED_MAX);
  private readonly atMs = new Float64Array(FINISHED_REMEMBERED_MAX);
  private head = 0; // position of the oldest entry (a running count, not wrapped)
  private tail = 0;

  /** Ids remembered. */
  get size(): number {
    return this.byKey.size;
  }

  /** How the id of (key, check) ended, or null if it is not remembered. */
  endingOf(key: number, check: number): Ending | null {
    const at = this.find(key, check);
    return at < 0 ? null : ENDINGS[this.endings[at]!]!;
  }

  /** Forgets the id of (key, check) (it is active again). */
  forget(key: number, check: number): void {
    if (this.find(key, check) >= 0) this.byKey.delete(key);
  }

  remember(key: number, check: number, ending: Ending, nowMs: number): void {
    if (this.tail - this.head === FINISHED_REMEMBERED_MAX) this.forgetOldest();
    const at = this.tail++ % FINISHED_REMEMBERED_MAX;
    this.keys[at] = key;
    this.checks[at] = check;
    this.endings[at] = ENDINGS.indexOf(ending);
    this.atMs[at] = nowMs;
    // The table holds ring indices: the entry at `at` is forgotten before `at` is
    // reused, so an index found there is never a later entry's.
    this.byKey.set(key, at);
  }

  /** Forgets ids remembered `ttlMs` or longer before `nowMs`, oldest first, at most `max`. */
  forgetOlderThan(nowMs: number, ttlMs: number, max: number): void {
    for (let forgotten = 0; forgotten < max && this.head < this.tail; forgotten++) {
      if (nowMs - this.atMs[this.head % FINISHED_REMEMBERED_MAX]! < ttlMs) break;
      this.forgetOldest();
    }
  }

  private find(key: number, check: number): number {
    const at = this.byKey.get(key);
    return at >= 0 && this.checks[at] === check ? at : -1;
  }

  private forgetOldest(): void {
    const at = this.head++ % FINISHED_REMEMBERED_MAX;
    const key = this.keys[at]!;
    if (this.byKey.get(key) === at) this.byKey.delete(key);
  }
}
