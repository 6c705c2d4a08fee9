/**
 * Per-slot state of the typed-array backends over the shared worker numbering
 * (src/domain/worker-table.ts): each slot that stores gets its own external-hash lookup,
 * and, only once it holds a block in more than one copy, a copies table (external hash
 * -> copies beyond the first; vLLM keeps several physical copies of one block and
 * announces each, docs/decisions.md#copies-counted). A slot whose blocks all have one
 * copy has no table: the common case costs nothing.
 * A slot's lookup is dropped only by `release`, which callers invoke after every
 * coverage entry naming the slot is gone (remove_worker clears first), so a slot taken
 * again inherits nothing. An index built without a table owns one and frees the slot
 * there too; an index given the core's table leaves that to the core.
 * Match results name slots (the table's) only until the next mutating call.
 */
import { SLOT_LIMIT, type WorkerTable } from "../domain/worker-table";
import { assert } from "./assert";
import type { DumpSource } from "./pack";
import { CopyCounts } from "./copies";
import { ExternalLookup } from "./lookup";
import type { WorkerInfo } from "./types";

export { SLOT_LIMIT };

export class WorkerSlots {
  /** Slots holding a lookup. */
  live = 0;
  readonly lookup: (ExternalLookup | null)[] = [];
  /** Per slot: copies beyond the first of the blocks it holds (sparse: ./copies.ts). */
  readonly copies = new CopyCounts();

  /** `ownsTable`: free a slot in the table too when its lookup goes. */
  constructor(
    readonly table: WorkerTable,
    private readonly ownsTable: boolean,
  ) {}

  /** Slots handed out so far by the table; per-slot arrays are sized to this. */
  get highWater(): number {
    return this.table.highWater;
  }

  /** The slot's lookup, or null when it holds no state here (or is -1: no slot). */
  lookupOf(slot: number): ExternalLookup | null {
    return slot < 0 ? null : (this.lookup[slot] ?? null);
  }

  /** A lookup for a live table slot that has none. */
  attach(slot: number): ExternalLookup {
    assert(this.table.isLive(slot) && !this.lookup[slot], "attach to a free slot or twice");
    const lookup = new ExternalLookup();
    this.lookup[slot] = lookup;
    this.live++;
    return lookup;
  }

  /** Every slot of `workerId` this index holds state for. */
  slotsOf(workerId: bigint): number[] {
    return this.table.slotsOf(workerId).filter((slot) => this.lookup[slot]);
  }

  /** Drops a slot whose state is already gone (its lookup must be empty). */
  release(slot: number): void {
    const lookup = this.lookup[slot];
    assert(lookup !== null && lookup !== undefined, "release of a free slot");
    assert(lookup.count === 0, "release of a slot that still holds blocks");
    assert(this.copies.of(slot) === null, "release of a slot that still counts copies");
    this.lookup[slot] = null;
    this.live--;
    if (this.ownsTable) this.table.release(slot);
    if (this.live === 0) {
      this.lookup.length = 0;
      this.copies.reset();
    }
  }

  isLive(slot: number): boolean {
    return slot < this.highWater && this.lookup[slot] !== null && this.lookup[slot] !== undefined;
  }

  workerIdOf(slot: number): bigint {
    assert(this.isLive(slot), "worker handle is not live");
    return this.table.workerIdOf(slot);
  }

  dpRankOf(slot: number): number {
    assert(this.isLive(slot), "worker handle is not live");
    return this.table.dpRankOf(slot);
  }

  /** Total entries over every slot's lookup. */
  lookupEntries(): number {
    let total = 0;
    for (let slot = 0; slot < this.lookup.length; slot++) total += this.lookup[slot]?.count ?? 0;
    return total;
  }

  /** Bytes of the lookups and copies tables (and of the worker table when this index owns it). */
  bytes(): number {
    let total = this.ownsTable ? this.table.bytes() : 0;
    for (let slot = 0; slot < this.lookup.length; slot++) total += this.lookup[slot]?.bytes() ?? 0;
    return total + this.copies.bytes();
  }

  /** Every slot holding state, with its block count. */
  workers(): WorkerInfo[] {
    const list: WorkerInfo[] = [];
    for (let slot = 0; slot < this.lookup.length; slot++) {
      const lookup = this.lookup[slot];
      if (lookup)
        list.push({
          workerId: this.table.workerIdOf(slot),
          dpRank: this.table.dpRankOf(slot),
          blocks: lookup.count,
        });
    }
    return list;
  }

  /** The dump's worker walk: each slot's (external hash, block key) pairs and its copies. */
  readonly forEachWorker: DumpSource["forEachWorker"] = (visit) => {
    for (const { workerId, dpRank, table, count, copies } of this.presentLookups()) {
      const held = heldOf(table, count);
      visit(workerId, dpRank, held.external, held.keys, held.count, copies);
    }
  };

  /**
   * Every present slot's lookup table (the live one: a freeze copies it), block count
   * and extra copies (read now: copies are few).
   */
  presentLookups(): PresentLookup[] {
    const present: PresentLookup[] = [];
    for (let slot = 0; slot < this.lookup.length; slot++) {
      const lookup = this.lookup[slot];
      if (!lookup) continue;
      present.push({
        workerId: this.table.workerIdOf(slot),
        dpRank: this.table.dpRankOf(slot),
        table: lookup.table,
        count: lookup.count,
        copies: this.copies.byKey(slot, lookup),
      });
    }
    return present;
  }
}

export interface PresentLookup {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly table: Uint32Array;
  readonly count: number;
  /** (block key, copies beyond the first) pairs. */
  readonly copies: Uint32Array;
}

/** A lookup table's (external hash, block key) pairs. */
function heldOf(
  table: Uint32Array,
  count: number,
): { external: Uint32Array; keys: Uint32Array; count: number } {
  const external = new Uint32Array(2 * count);
  const keys = new Uint32Array(count);
  let n = 0;
  for (let at = 0; at < table.length; at += 3) {
    if (table[at + 2] === 0) continue;
    external[2 * n] = table[at]!;
    external[2 * n + 1] = table[at + 1]!;
    keys[n++] = table[at + 2]!;
  }
  return { external, keys, count: n };
}
