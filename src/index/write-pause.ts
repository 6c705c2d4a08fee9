/**
 * Pausing the index's writes while it is copied in slices (GET /v1/dump, the periodic
 * snapshot): between the copy's first slice and its last, every store, removal and
 * clear is held here, in order, as words, and applied when the last pause ends.
 * Routing keeps reading the index meanwhile (it is only not updated).
 *
 * Why the copy is then one instant's state: a KvIndex changes only through the calls
 * that come here (ingest writes storeAt / removeAt / clearAt through the core, which
 * routes them through `storeAt`..., and every other change, such as removing a worker,
 * calls `settle()` first). So from `hold()` to the release, no slice of the copy can
 * see a change the other slices did not see.
 *
 * Bounded: past `maxBytes` of held writes (or on `settle()`), every holder finishes its
 * copy at once (one stall, the old cost) and the held writes are applied: memory never
 * grows with the length of a copy.
 */
import { type FreezeJob, IndexPacker } from "./pack";
import type { KvIndex } from "./types";

const STORE = 1;
const REMOVE = 2;
const CLEAR = 3;
const TIER_STORE = 4;
const TIER_REMOVE = 5;

export class WritePause {
  /** Held writes: kind, slot, then per kind (see `storeAt` and `removeAt`). */
  private log = new Uint32Array(1024);
  private at = 0;
  /** Each holder's way to finish its copy at once. */
  private readonly holders = new Set<() => void>();
  /** Writes held and applied since the start, and times a copy was finished at once. */
  readonly counters = { held: 0, settled: 0 };

  constructor(
    private readonly index: KvIndex,
    private readonly maxBytes: number,
  ) {}

  get paused(): boolean {
    return this.holders.size > 0;
  }

  /**
   * Pauses writes until the returned release is called. `finishNow` must complete the
   * holder's copy synchronously and then call the release (for `settle`).
   */
  hold(finishNow: () => void): () => void {
    this.holders.add(finishNow);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.holders.delete(finishNow);
      if (this.holders.size === 0) this.apply();
    };
  }

  /** Ends every pause now: each copy in progress completes at once, then the held writes apply. */
  settle(): void {
    if (!this.paused) return;
    this.counters.settled++;
    for (const finishNow of [...this.holders]) finishNow();
    this.holders.clear();
    this.apply();
  }

  storeAt(
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): void {
    if (!this.paused) {
      this.index.storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first);
      return;
    }
    const at = this.reserve(6 + 4 * count);
    const log = this.log;
    log[at] = STORE;
    log[at + 1] = slot;
    log[at + 2] = hasParent ? 1 : 0;
    log[at + 3] = parentHi;
    log[at + 4] = parentLo;
    log[at + 5] = count;
    log.set(external.subarray(2 * first, 2 * (first + count)), at + 6);
    log.set(local.subarray(2 * first, 2 * (first + count)), at + 6 + 2 * count);
    this.held();
  }

  removeAt(slot: number, external: Uint32Array, count: number, first: number): void {
    if (!this.paused) {
      this.index.removeAt(slot, external, count, first);
      return;
    }
    const at = this.reserve(3 + 2 * count);
    this.log[at] = REMOVE;
    this.log[at + 1] = slot;
    this.log[at + 2] = count;
    this.log.set(external.subarray(2 * first, 2 * (first + count)), at + 3);
    this.held();
  }

  /** A lower tier's store: held as a store with its tier in the kind word. */
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
  ): void {
    if (!this.paused) {
      this.index.storeTierAt(
        tier,
        slot,
        hasParent,
        parentHi,
        parentLo,
        external,
        local,
        count,
        first,
      );
      return;
    }
    const at = this.at;
    this.storeAt(slot, hasParent, parentHi, parentLo, external, local, count, first);
    this.log[at] = TIER_STORE | (tier << 8);
  }

  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first: number,
  ): void {
    if (!this.paused) {
      this.index.removeTierAt(tier, slot, external, count, first);
      return;
    }
    const at = this.at;
    this.removeAt(slot, external, count, first);
    this.log[at] = TIER_REMOVE | (tier << 8);
  }

  clearAt(slot: number): void {
    if (!this.paused) {
      this.index.clearAt(slot);
      return;
    }
    const at = this.reserve(2);
    this.log[at] = CLEAR;
    this.log[at + 1] = slot;
    this.held();
  }

  private held(): void {
    this.counters.held++;
    if (4 * this.at > this.maxBytes) this.settle();
  }

  /** Room for `words` more; returns where they go. */
  private reserve(words: number): number {
    const at = this.at;
    if (at + words > this.log.length) {
      const grown = new Uint32Array(Math.max(2 * this.log.length, at + words));
      grown.set(this.log.subarray(0, at));
      this.log = grown;
    }
    this.at = at + words;
    return at;
  }

  /** Applies the held writes in order and lets go of their memory. */
  private apply(): void {
    const { log, index } = this;
    const end = this.at;
    this.at = 0;
    for (let at = 0; at < end; ) {
      const kind = log[at]! & 0xff;
      const tier = log[at]! >>> 8;
      const slot = log[at + 1]! | 0; // -1 (no slot) survives the round trip
      if (kind === STORE || kind === TIER_STORE) {
        const count = log[at + 5]!;
        const external = log.subarray(at + 6, at + 6 + 2 * count);
        const local = log.subarray(at + 6 + 2 * count, at + 6 + 4 * count);
        const hasParent = log[at + 2] === 1;
        const [hi, lo] = [log[at + 3]!, log[at + 4]!];
        if (kind === STORE) index.storeAt(slot, hasParent, hi, lo, external, local, count, 0);
        else index.storeTierAt(tier, slot, hasParent, hi, lo, external, local, count, 0);
        at += 6 + 4 * count;
      } else if (kind === REMOVE || kind === TIER_REMOVE) {
        const count = log[at + 2]!;
        const external = log.subarray(at + 3, at + 3 + 2 * count);
        if (kind === REMOVE) index.removeAt(slot, external, count, 0);
        else index.removeTierAt(tier, slot, external, count, 0);
        at += 3 + 2 * count;
      } else {
        index.clearAt(slot);
        at += 2;
      }
    }
    if (this.log.length > 1024) this.log = new Uint32Array(1024);
  }
}

/**
 * Gives the event loop a turn with a timer rather than setImmediate: the loop then
 * polls I/O (routes waiting get served) and may idle, where back-to-back immediates
 * kept the process busy and a route's p50 at one slice or more on a loaded machine.
 */
export const yieldTurn = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

/** Words copied, and blocks packed, between two looks at the clock. */
const FREEZE_WORDS = 1 << 18;
const PACK_BLOCKS = 4096;

/**
 * The index frozen (writes paused meanwhile) and packed, a time budget at a time: what
 * GET /v1/dump and the periodic snapshot read. Whatever else the copy must agree with
 * (source positions, active requests) is taken in the same turn as the constructor.
 */
export class PackJob {
  private readonly freezing: FreezeJob;
  private release: (() => void) | null;
  private packer: IndexPacker | null = null;
  private packed = false;
  private cancelled = false;

  constructor(
    index: KvIndex,
    pause: WritePause,
    private readonly slices = { freezeWords: FREEZE_WORDS, packBlocks: PACK_BLOCKS },
  ) {
    this.freezing = index.freeze();
    this.release = pause.hold(() => this.finishFreeze());
  }

  get done(): boolean {
    return this.packed;
  }

  /** Works for about `ms` (at least one slice); true once packed (or cancelled). */
  step(ms: number, now: () => number = performance.now.bind(performance)): boolean {
    if (this.cancelled) return true;
    const deadline = now() + ms;
    while (this.release !== null) {
      if (this.freezing.step(this.slices.freezeWords)) this.endFreeze();
      else if (now() >= deadline) return false;
    }
    this.packer ??= new IndexPacker(this.freezing.result());
    while (!this.packed) {
      this.packed = this.packer.step(this.slices.packBlocks);
      if (now() >= deadline) break;
    }
    return this.packed;
  }

  /** Steps `ms` at a time with a turn of the event loop between steps, until packed. */
  async run(ms: number): Promise<void> {
    while (!this.step(ms)) await yieldTurn();
  }

  /** The packed words (then `more`: IndexPacker.wordsWith) and the ids their refs name. */
  result(more?: Uint32Array): { words: Uint32Array; workerIds: readonly bigint[] } {
    if (!this.packed || this.cancelled) throw new Error("the pack is not complete");
    const words = more === undefined ? this.packer!.words() : this.packer!.wordsWith(more);
    return { words, workerIds: this.packer!.workerIds };
  }

  /** Stops early (a client went away): writes resume, the copy is dropped. */
  cancel(): void {
    this.cancelled = !this.packed;
    this.endFreeze();
  }

  private finishFreeze(): void {
    while (!this.freezing.step(Infinity));
    this.endFreeze();
  }

  private endFreeze(): void {
    const release = this.release;
    this.release = null;
    release?.();
  }
}
