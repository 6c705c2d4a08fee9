/**
 * Copies of held blocks beyond the first, per slot: vLLM keeps several physical copies
 * of one block and announces each one's store and eviction
 * (docs/decisions.md#copies-counted). A slot gets a table (external hash -> copies
 * beyond the first; the external lookup's table) only while one of its blocks has two
 * copies, so the common single copy costs nothing; the table goes with its last extra
 * copy. The device tier's slots (workers.ts) and each lower tier's (tiers.ts) keep one.
 */
import { assert } from "./assert";
import { ExternalLookup } from "./lookup";

const NO_COPIES = new Uint32Array(0);

export class CopyCounts {
  /** Per slot: the copies table, or null when each of its blocks has one copy. */
  private readonly tables: (ExternalLookup | null)[] = [];
  /** Copies beyond the first over every slot. */
  extra = 0;

  /** The slot's table, or null (also for slot -1). */
  of(slot: number): ExternalLookup | null {
    return slot < 0 ? null : (this.tables[slot] ?? null);
  }

  /** One more copy of the block `slot` holds under external hash (hi, lo). */
  add(slot: number, hi: number, lo: number): void {
    let table = this.tables[slot] ?? null;
    if (table === null) {
      table = new ExternalLookup();
      this.tables[slot] = table;
    }
    const extra = table.find(hi, lo);
    if (extra === 0) table.insertAtProbe(hi, lo, 1);
    else table.table[table.probeSlot * 3 + 2] = extra + 1;
    this.extra++;
  }

  /**
   * A removal of hashes first..first+count for a slot with a table: each hash whose
   * block has another copy takes one copy off; the others (whose last copy goes, or
   * unknown) are written to `out` in order. Returns how many went to `out`.
   */
  take(
    slot: number,
    external: Uint32Array,
    first: number,
    count: number,
    out: Uint32Array,
  ): number {
    const table = this.tables[slot]!;
    let kept = 0;
    for (let i = first; i < first + count; i++) {
      const hi = external[2 * i]!;
      const lo = external[2 * i + 1]!;
      const extra = table.find(hi, lo);
      if (extra === 0) {
        out[2 * kept] = hi;
        out[2 * kept + 1] = lo;
        kept++;
        continue;
      }
      if (extra === 1) table.removeAtProbe();
      else table.table[table.probeSlot * 3 + 2] = extra - 1;
      this.extra--;
    }
    if (table.count === 0) this.tables[slot] = null;
    return kept;
  }

  /** One copy off the block named (hi, lo) if it has several; false if it has one. */
  takeOne(slot: number, hi: number, lo: number): boolean {
    const table = this.of(slot);
    if (table === null) return false;
    const extra = table.find(hi, lo);
    if (extra === 0) return false;
    if (extra === 1) table.removeAtProbe();
    else table.table[table.probeSlot * 3 + 2] = extra - 1;
    this.extra--;
    if (table.count === 0) this.tables[slot] = null;
    return true;
  }

  /** Extra copies of the block named (hi, lo). */
  count(slot: number, hi: number, lo: number): number {
    return this.of(slot)?.find(hi, lo) ?? 0;
  }

  /** The slot holds nothing any more: its extra copies go too. */
  drop(slot: number): void {
    const table = this.tables[slot] ?? null;
    if (table === null) return;
    for (let at = 2; at < table.table.length; at += 3) this.extra -= table.table[at]!;
    this.tables[slot] = null;
  }

  /** Forgets the per-slot array once no slot is live (memory back to a fresh index's). */
  reset(): void {
    assert(this.extra === 0, "copies reset while some are counted");
    this.tables.length = 0;
  }

  bytes(): number {
    let total = 0;
    for (const table of this.tables) total += table?.bytes() ?? 0;
    return total;
  }

  /** The slot's copies as (key, extra) pairs, each key found through its block lookup. */
  byKey(slot: number, lookup: ExternalLookup): Uint32Array {
    const table = this.tables[slot] ?? null;
    if (table === null) return NO_COPIES;
    const out = new Uint32Array(2 * table.count);
    let n = 0;
    for (let at = 0; at < table.table.length; at += 3) {
      if (table.table[at + 2] === 0) continue;
      out[n++] = lookup.find(table.table[at]!, table.table[at + 1]!);
      out[n++] = table.table[at + 2]!;
    }
    return out;
  }

  /** verify(): copies name held blocks only (`lookupOf`), each at least one extra, and add up. */
  verify(lookupOf: (slot: number) => ExternalLookup | null): void {
    let total = 0;
    for (let slot = 0; slot < this.tables.length; slot++) {
      const table = this.tables[slot];
      if (!table) continue;
      const lookup = lookupOf(slot);
      assert(lookup !== null, "verify: copies of a slot without blocks");
      assert(table.count > 0, "verify: an empty copies table is kept");
      for (let at = 0; at < table.table.length; at += 3) {
        if (table.table[at + 2] === 0) continue;
        const held = lookup.find(table.table[at]!, table.table[at + 1]!) !== 0;
        assert(held, "verify: copies of a block not held");
        total += table.table[at + 2]!;
      }
    }
    assert(total === this.extra, "verify: extra copies do not add up");
  }
}
