/**
 * The lower tiers as plain code (the reference's half of ../README.md, "Lower tiers"):
 * per worker and lower tier, the blocks it holds there by external hash, each with its
 * sequence hash (the chain of local hashes from the root), its parent's, its local hash
 * and its copies; and the reverse, sequence hash -> external hash. Records keyed by
 * decimal strings, bigints for hashes: clarity over speed, as in ./reference.ts.
 */
import { chainHashes } from "../../hash";
import { parseU64, putU64, u64 } from "../../util/u64";
import { type IndexCounters, TIER_ANY, TIER_EXTERNAL, TIER_HOST, TIER_NAMES } from "../types";

export interface TierBlock {
  readonly seq: bigint;
  readonly parent: bigint | null;
  readonly local: bigint;
  copies: number;
}

/** One worker's blocks in one lower tier. */
export interface TierHeld {
  /** External hash (decimal) -> block. */
  readonly lookup: Record<string, TierBlock>;
  /** Sequence hash (decimal) -> external hash (decimal). */
  readonly held: Record<string, string>;
}

/** A worker's lower tiers, index = tier (0, the device, unused). */
export type WorkerTiers = TierHeld[];

export function emptyTiers(): WorkerTiers {
  return [0, 1, 2, 3].map(() => ({ lookup: {}, held: {} }));
}

/** The sequence hash after `base` (null: the root) and one local hash. */
export function chainStep(base: bigint | null, local: bigint): bigint {
  if (base === null) return local;
  const pairs = new Uint32Array(4);
  putU64(pairs, 0, base);
  putU64(pairs, 2, local);
  chainHashes(pairs, 2, pairs);
  return u64(pairs[2]!, pairs[3]!);
}

export class ReferenceTiers {
  constructor(private readonly counters: IndexCounters) {}

  /** The sequence hash a worker's lower tier names `hash` with (this tier first, then the others). */
  sequenceIn(tiers: WorkerTiers, tier: number, hash: bigint): bigint | null {
    return tiers[tier]!.lookup[`${hash}`]?.seq ?? null;
  }

  /** Stores blocks below `base` (null: the root) in `tier`; stops at a conflict. */
  store(
    tiers: WorkerTiers,
    tier: number,
    base: bigint | null,
    external: Uint32Array,
    local: Uint32Array,
    count: number,
    first: number,
  ): void {
    this.counters.tierStoredEvents++;
    const mine = tiers[tier]!;
    let parent = base;
    for (let i = first; i < first + count; i++) {
      const hash = `${u64(external[2 * i]!, external[2 * i + 1]!)}`;
      const localHash = u64(local[2 * i]!, local[2 * i + 1]!);
      const seq = chainStep(parent, localHash);
      const named = mine.lookup[hash];
      if (mine.held[`${seq}`] !== undefined) {
        if (named === undefined || named.seq !== seq) return this.conflict();
        named.copies++;
        this.counters.tierBlocksDuplicate++;
      } else {
        // The hash names another block of this tier: the producer broke the invariant.
        if (named !== undefined) return this.conflict();
        mine.lookup[hash] = { seq, parent, local: localHash, copies: 1 };
        mine.held[`${seq}`] = hash;
        this.counters.tierBlocksStored++;
      }
      parent = seq;
    }
  }

  private conflict(): void {
    this.counters.tierHashConflicts++;
  }

  /** A removal in `tier`, or in every lower tier (TIER_ANY, whose unknown hashes are not counted). */
  remove(
    tiers: WorkerTiers | undefined,
    tier: number,
    external: Uint32Array,
    count: number,
    first: number,
  ): number {
    this.counters.tierRemovedEvents++;
    let unknown = 0;
    for (let i = first; i < first + count; i++) {
      const hash = `${u64(external[2 * i]!, external[2 * i + 1]!)}`;
      if (tier === TIER_ANY) {
        for (let each = TIER_HOST; each <= TIER_EXTERNAL; each++) this.removeOne(tiers, each, hash);
      } else if (!this.removeOne(tiers, tier, hash)) unknown++;
    }
    this.counters.tierBlocksUnknown += unknown;
    return unknown;
  }

  /** One copy of `hash` off `tier`; false if the tier does not hold it. */
  private removeOne(tiers: WorkerTiers | undefined, tier: number, hash: string): boolean {
    const mine = tiers?.[tier];
    const block = mine?.lookup[hash];
    if (mine === undefined || block === undefined) return false;
    if (block.copies > 1) {
      block.copies--;
      this.counters.tierCopiesRemoved++;
      return true;
    }
    delete mine.lookup[hash];
    delete mine.held[`${block.seq}`];
    this.counters.tierBlocksRemoved++;
    return true;
  }

  /** Every lower tier empty. */
  clear(tiers: WorkerTiers): void {
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      const mine = tiers[tier]!;
      this.counters.tierBlocksRemoved += Object.keys(mine.lookup).length;
      for (const key of Object.keys(mine.lookup)) delete mine.lookup[key];
      for (const key of Object.keys(mine.held)) delete mine.held[key];
    }
  }

  /**
   * Host hits right after the device's `deviceBlocks`, disk right after those, external
   * after those: [host, disk, external] for one worker, on a query of sequence hashes.
   */
  hits(tiers: WorkerTiers, sequence: readonly bigint[], deviceBlocks: number): number[] {
    const hits = [0, 0, 0];
    let at = deviceBlocks;
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      while (at < sequence.length && tiers[tier]!.held[`${sequence[at]}`] !== undefined) {
        hits[tier - 1]!++;
        at++;
      }
    }
    return hits;
  }

  /** Lines for `canonical()`: each block as "<tier> <external hash> -> <sequence hash>". */
  lines(tiers: WorkerTiers, name: string): string[] {
    const lines: string[] = [];
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      for (const [hash, block] of Object.entries(tiers[tier]!.lookup)) {
        const times = block.copies > 1 ? ` x${block.copies}` : "";
        lines.push(`${name} ${TIER_NAMES[tier]} ${hash} -> ${block.seq}${times}`);
      }
    }
    return lines;
  }

  /** Held blocks per lower tier (index = tier) and copies beyond the first. */
  count(tiers: WorkerTiers, into: number[]): void {
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      for (const block of Object.values(tiers[tier]!.lookup)) {
        into[tier]!++;
        into[0]! += block.copies - 1;
      }
    }
  }

  /** The dump's words of one worker's tier: 8 per block (see pack.ts FrozenTierBlocks). */
  words(tiers: WorkerTiers, tier: number): Uint32Array {
    const blocks = Object.entries(tiers[tier]!.lookup);
    const words = new Uint32Array(8 * blocks.length);
    blocks.forEach(([hash, block], n) => {
      putU64(words, 8 * n, parseU64(hash)!);
      putU64(words, 8 * n + 2, block.local);
      if (block.parent !== null) {
        words[8 * n + 4] = 1;
        putU64(words, 8 * n + 5, block.parent);
      }
      words[8 * n + 7] = block.copies - 1;
    });
    return words;
  }

  /** verify(): lookup and held are two directions of one bijection per tier. */
  verify(tiers: WorkerTiers): void {
    for (let tier = TIER_HOST; tier <= TIER_EXTERNAL; tier++) {
      const { lookup, held } = tiers[tier]!;
      if (Object.keys(lookup).length !== Object.keys(held).length)
        throw new Error("reference: tier lookup and held sizes differ");
      for (const [hash, block] of Object.entries(lookup))
        if (held[`${block.seq}`] !== hash || block.copies < 1)
          throw new Error("reference: tier lookup and held disagree");
    }
  }
}
