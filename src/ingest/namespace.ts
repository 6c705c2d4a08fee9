/**
 * Cache-namespace (salt) memory per (dp rank, external block hash), for one event
 * stream (reference §1.4 step 6). vLLM writes the salt only into the first block of
 * a chain, so a child store learns its namespace from its parent's entry.
 *
 * Entries exist only for salted blocks, and go away when the block is removed
 * (unless ambiguous) or its rank is cleared; the table shrinks as it empties. The
 * table (src/util/tables.ts) maps a block to a number for its namespace; the few
 * distinct namespace strings are kept once each, counted by the entries naming them,
 * and forgotten with the last one.
 */
import { TripleTable } from "../util/tables";

/** Recorded when one hash was stored under two different namespaces. */
export const AMBIGUOUS = "\u0000ambiguous";
/** AMBIGUOUS's number (never counted or freed). */
const AMBIGUOUS_ID = 0;

export class NamespaceTable {
  private readonly table = new TripleTable();
  /** Per number: its namespace ("" when free) and how many entries name it. */
  private names: string[] = [AMBIGUOUS];
  private uses: number[] = [0];
  private readonly idOf = new Map<string, number>();
  private freeIds: number[] = [];
  /** Records refused because the table was at `entriesMax`. */
  refused = 0;

  constructor(readonly entriesMax: number) {
    if (entriesMax < 1) throw new RangeError("entriesMax must be positive");
  }

  get size(): number {
    return this.table.size;
  }

  /** The namespace recorded for a block (AMBIGUOUS possibly), or undefined. */
  get(rank: number, hi: number, lo: number): string | undefined {
    if (this.table.size === 0) return undefined;
    const id = this.table.get(rank, hi, lo);
    return id < 0 ? undefined : this.names[id];
  }

  /** Records `namespace` for a block; a different earlier one makes it AMBIGUOUS. */
  record(rank: number, hi: number, lo: number, namespace: string): void {
    const known = this.table.get(rank, hi, lo);
    if (known >= 0) {
      if (this.names[known] !== namespace && known !== AMBIGUOUS_ID) {
        this.release(known);
        this.table.set(rank, hi, lo, AMBIGUOUS_ID);
      }
      return;
    }
    if (this.table.size >= this.entriesMax) {
      this.refused++;
      return;
    }
    this.table.set(rank, hi, lo, this.acquire(namespace));
  }

  /** An unsalted store of a block: one recorded under a namespace becomes AMBIGUOUS. */
  markUnsalted(rank: number, hi: number, lo: number): void {
    const known = this.table.get(rank, hi, lo);
    if (known <= AMBIGUOUS_ID) return;
    this.release(known);
    this.table.set(rank, hi, lo, AMBIGUOUS_ID);
  }

  /** Forgets a removed block, unless it is ambiguous (then it stays until its rank is cleared). */
  forget(rank: number, hi: number, lo: number): void {
    if (this.table.size === 0) return;
    const id = this.table.get(rank, hi, lo);
    if (id <= AMBIGUOUS_ID) return;
    this.table.delete(rank, hi, lo);
    this.release(id);
  }

  /** Forgets every block of a rank (AllBlocksCleared). */
  forgetRank(rank: number): void {
    if (this.table.size === 0) return;
    this.table.retain((owner, _hi, _lo, id) => {
      if (owner !== rank) return true;
      if (id !== AMBIGUOUS_ID) this.release(id);
      return false;
    });
  }

  clear(): void {
    this.table.clear();
    this.names = [AMBIGUOUS];
    this.uses = [0];
    this.idOf.clear();
    this.freeIds = [];
  }

  /** Bytes held by the table and the namespace list (the strings are shared with the decoder). */
  get bytes(): number {
    return this.table.bytes + this.names.length * 16;
  }

  /** The number for `namespace`, counting one more entry naming it. */
  private acquire(namespace: string): number {
    let id = this.idOf.get(namespace);
    if (id === undefined) {
      id = this.freeIds.pop() ?? this.names.length;
      this.names[id] = namespace;
      this.uses[id] = 0;
      this.idOf.set(namespace, id);
    }
    this.uses[id]!++;
    return id;
  }

  /** One entry fewer names number `id`; the last one forgets the namespace. */
  private release(id: number): void {
    if (--this.uses[id]! > 0) return;
    this.idOf.delete(this.names[id]!);
    this.names[id] = "";
    if (id === this.names.length - 1) {
      this.names.pop();
      this.uses.pop();
      // Free numbers at the end go too, so the list is as long as its highest live one.
      while (this.names.length > 1 && this.names[this.names.length - 1] === "") {
        this.names.pop();
        this.uses.pop();
      }
      this.freeIds = this.freeIds.filter((free) => free < this.names.length);
    } else {
      this.freeIds.push(id);
    }
  }
}
