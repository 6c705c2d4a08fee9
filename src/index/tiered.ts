/**
 * The lower tiers of the typed-array backends (crtc, positional): their events go to
 * one LowerTiers (./tiers.ts) over the backend's worker slots, which resolves a parent
 * held on the device through the backend's `sequenceOf`. A worker that stores only in a
 * lower tier gets its (empty) device lookup too, so it is present like any other.
 */
import type { ExternalLookup } from "./lookup";
import { SlotIndex } from "./slot-index";
import { LowerTiers } from "./tiers";
import { type IndexOptions, type MatchResult, StoreStatus, type TierMatches } from "./types";
import type { WorkerSlots } from "./workers";

/** `present`'s answer when the store goes on (not a StoreStatus). */
const PRESENT = -1;

export abstract class TieredIndex extends SlotIndex {
  abstract readonly slots: WorkerSlots;
  readonly tiers: LowerTiers;

  constructor(options: IndexOptions) {
    super(options);
    this.tiers = new LowerTiers(this.counters, (slot, hi, lo, out) =>
      this.sequenceOf(slot, hi, lo, out),
    );
  }

  /** The sequence hash of the device block `slot` names (hi, lo), into out[0..1]; false if none. */
  protected abstract sequenceOf(slot: number, hi: number, lo: number, out: Uint32Array): boolean;

  /** A device lookup for a slot that has none (the crtc also publishes its identity). */
  protected abstract attachSlot(slot: number): ExternalLookup;

  storeTierAt(
    tier: number,
    slot: number,
    hasParent: boolean,
    parentHi: number,
    parentLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    const status = this.present(slot, hasParent, count);
    if (status !== PRESENT) return status as StoreStatus;
    return this.tiers.store(
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
  }

  storeTierUnder(
    tier: number,
    slot: number,
    hasBase: boolean,
    baseHi: number,
    baseLo: number,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first = 0,
  ): StoreStatus {
    const status = this.present(slot, false, count);
    if (status !== PRESENT) return status as StoreStatus;
    return this.tiers.storeUnder(
      tier,
      slot,
      hasBase,
      baseHi,
      baseLo,
      external,
      local,
      count,
      first,
    );
  }

  /**
   * Before a lower-tier store: a worker not present has no parent to name (rejected), no
   * slot to get (rejected), or nothing to store (counted, done); otherwise it is present
   * (PRESENT: the store goes on).
   */
  private present(slot: number, hasParent: boolean, count: number): number {
    if (this.slots.lookupOf(slot) !== null) return PRESENT;
    if (hasParent) {
      this.counters.tierRejectedParentNotFound++;
      return StoreStatus.ParentNotFound;
    }
    if (count === 0) {
      this.counters.tierStoredEvents++;
      return StoreStatus.Ok;
    }
    if (slot < 0) {
      this.counters.rejectedCapacity++;
      return StoreStatus.CapacityExhausted;
    }
    this.attachSlot(slot);
    return PRESENT;
  }

  removeTierAt(
    tier: number,
    slot: number,
    external: Uint32Array,
    count: number,
    first = 0,
  ): number {
    return this.tiers.remove(tier, slot, external, count, first);
  }

  tierMatches(chain: Uint32Array, count: number, device: MatchResult, out: TierMatches): void {
    this.tiers.matches(chain, count, device, this.slots.highWater, out);
  }
}
