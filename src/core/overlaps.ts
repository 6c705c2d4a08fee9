/**
 * A route's overlaps from the index's answers: each worker's device match, and with the
 * lower tiers on (route.lower_tiers), the host, disk and external blocks right after it
 * (src/index/tiers.ts). Columns reused from route to route; nothing is built when no
 * worker has a lower-tier hit, so the device-only path is what it was.
 */
import type { KvIndex, MatchResult } from "../index";
import { TierMatches } from "../index/types";
import type { Overlaps } from "../route";

export class RouteOverlaps {
  private readonly tiers = new TierMatches();
  private slots = new Uint32Array(64);
  private blocks = new Uint32Array(64);
  private host = new Uint32Array(64);
  private disk = new Uint32Array(64);
  private external = new Uint32Array(64);

  constructor(
    private readonly index: KvIndex,
    private readonly lowerTiers: boolean,
  ) {}

  /** The overlaps of a query whose device matches are `matches` (slots of the router). */
  of(matches: MatchResult, chain: Uint32Array, count: number): Overlaps {
    const device = { count: matches.count, slots: matches.workers, blocks: matches.blocks };
    if (!this.lowerTiers) return device;
    const tiers = this.tiers;
    this.index.tierMatches(chain, count, matches, tiers);
    if (tiers.count === 0) return device;
    this.ensure(matches.count + tiers.count);
    let n = 0;
    for (let i = 0; i < matches.count; i++) {
      const at = tiers.indexOf(matches.workers[i]!);
      this.put(n++, matches.workers[i]!, matches.blocks[i]!, at);
    }
    for (let at = 0; at < tiers.count; at++) {
      // Workers with no device match: their lower tiers start at the root.
      const slot = tiers.workers[at]!;
      let inDevice = false;
      for (let i = 0; i < matches.count && !inDevice; i++) inDevice = matches.workers[i] === slot;
      if (!inDevice) this.put(n++, slot, 0, at);
    }
    const { slots, blocks, host, disk, external } = this;
    return { count: n, slots, blocks, host, disk, external };
  }

  private put(n: number, slot: number, blocks: number, at: number): void {
    const tiers = this.tiers;
    this.slots[n] = slot;
    this.blocks[n] = blocks;
    this.host[n] = at < 0 ? 0 : tiers.host[at]!;
    this.disk[n] = at < 0 ? 0 : tiers.disk[at]!;
    this.external[n] = at < 0 ? 0 : tiers.external[at]!;
  }

  private ensure(entries: number): void {
    if (this.slots.length >= entries) return;
    const size = Math.max(entries, 2 * this.slots.length);
    this.slots = new Uint32Array(size);
    this.blocks = new Uint32Array(size);
    this.host = new Uint32Array(size);
    this.disk = new Uint32Array(size);
    this.external = new Uint32Array(size);
  }
}
