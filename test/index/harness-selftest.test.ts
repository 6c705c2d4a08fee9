// Goal: the differential harness can fail. Broken backends (dropped removals, no
// reclamation, Dynamo's descendant loss, a hole-blind overcount, a dump without its
// placeholder removals, copies ignored or not dumped) must each be caught within a few
// seeds and shrunk to a small repro; and the default streams must really exercise the
// paths they claim to (rejections, conflicts, capacity, unknown hashes, holes, duplicate
// copies and their partial removal).
import { describe, expect, test } from "bun:test";
import { createIndex } from "../../src/index/index";
import { ReferenceIndex } from "../../src/index/reference/reference";
import type { CrtcIndex } from "../../src/index/crtc/crtc";
import { type IndexOptions, type KvIndex, type MatchResult, TIER_ANY } from "../../src/index/types";
import { checkSeed, type HarnessBackend, replay, shrink } from "../harness/differential";
import { applyHarnessOp, generateStream, type StreamOptions } from "../harness/streams";

function firstFailure(
  backend: HarnessBackend,
  options: StreamOptions = { steps: 120 },
  seeds = 40,
): string | null {
  for (let seed = 1; seed <= seeds; seed++) {
    const report = checkSeed(seed, backend, options);
    if (report !== null) return report;
  }
  return null;
}

/** The reference, but a worker scores its deepest held block of the query, holes or not. */
class HoleBlindReference extends ReferenceIndex {
  override findMatches(local: Uint32Array, count: number, out: MatchResult): void {
    out.count = 0;
    out.ensure(64);
    for (const [handle, held] of this.heldByHandle()) {
      let path = "";
      let deepest = 0;
      for (let k = 1; k <= count; k++) {
        path += `/${(BigInt(local[2 * k - 2]!) << 32n) | BigInt(local[2 * k - 1]!)}`;
        if (held.has(path)) deepest = k;
      }
      if (deepest === 0) continue;
      out.workers[out.count] = handle;
      out.blocks[out.count++] = deepest;
    }
  }
}

/** Dynamo's mid-chain semantics: removing a block also loses the worker's blocks below it. */
class DescendantLossReference extends ReferenceIndex {
  override applyRemoved(
    workerId: bigint,
    dpRank: number,
    external: Uint32Array,
    count: number,
    first = 0,
  ): number {
    const held = this.heldPaths(workerId, dpRank);
    const removed: string[] = [];
    for (let i = first; i < first + count; i++) {
      const hash = (BigInt(external[2 * i]!) << 32n) | BigInt(external[2 * i + 1]!);
      for (const [path, name] of held) if (name === hash) removed.push(path);
    }
    const unknown = super.applyRemoved(workerId, dpRank, external, count, first);
    const lost: bigint[] = [];
    for (const [path, name] of held)
      if (removed.some((gone) => path.startsWith(`${gone}/`))) lost.push(name);
    if (lost.length > 0) {
      const pairs = new Uint32Array(2 * lost.length);
      lost.forEach((name, i) => {
        pairs[2 * i] = Number(name >> 32n);
        pairs[2 * i + 1] = Number(name & 0xffff_ffffn);
      });
      super.applyRemoved(workerId, dpRank, pairs, lost.length);
    }
    return unknown;
  }
}

const mutants: [string, (options: IndexOptions) => KvIndex][] = [
  [
    "drops every removal",
    (options) => {
      const index = createIndex("crtc", 1, options);
      index.applyRemoved = () => 0;
      return index;
    },
  ],
  [
    "never reclaims",
    (options) => {
      const index = createIndex("crtc", 1, options) as CrtcIndex;
      index.tree.reclaim = () => {};
      return index;
    },
  ],
  [
    "loses descendants on a mid-chain removal (Dynamo)",
    (options) => new DescendantLossReference(1, options),
  ],
  ["counts across holes", (options) => new HoleBlindReference(1, options)],
  [
    "lets the first removal of a block held in two copies unhold it",
    (options) => {
      const index = createIndex("crtc", 1, options) as CrtcIndex;
      index.slots.copies.add = () => {};
      return index;
    },
  ],
  [
    "dumps without the extra copies",
    (options) => {
      const index = createIndex("crtc", 1, options);
      const dump = index.dump.bind(index);
      index.dump = () => {
        const seen = new Set<string>();
        return dump().filter((event) => {
          if (event.op !== "stored") return true;
          const key = `${event.worker_id}/${event.dp_rank}/${event.block_hashes.join(",")}`;
          if (seen.has(key)) return false;
          seen.add(key);
          return true;
        });
      };
      return index;
    },
  ],
  [
    "dumps without placeholder removals",
    (options) => {
      const index = createIndex("crtc", 1, options);
      const dump = index.dump.bind(index);
      index.dump = () => dump().filter((event) => event.op !== "removed");
      return index;
    },
  ],
];

/** Lower-tier mistakes: caught on streams with tiers. */
const tierMutants: [string, (options: IndexOptions) => KvIndex][] = [
  [
    "never counts a lower tier in a match",
    (options) => {
      const index = createIndex("crtc", 1, options);
      index.tierMatches = (_chain, _count, _device, out) => out.reset(0);
      return index;
    },
  ],
  [
    "leaves lower tiers alone on a removal of unknown medium",
    (options) => {
      const index = createIndex("crtc", 1, options);
      const remove = index.removeTierAt.bind(index);
      index.removeTierAt = (tier, slot, external, count, first) =>
        tier === TIER_ANY ? 0 : remove(tier, slot, external, count, first);
      return index;
    },
  ],
  [
    "resolves a lower tier's parent in its own tier only",
    (options) => {
      const index = createIndex("crtc", 1, options) as CrtcIndex;
      (index as unknown as { tiers: { deviceSequence: () => boolean } }).tiers.deviceSequence =
        () => false;
      return index;
    },
  ],
  [
    "lets a clear keep the lower tiers",
    (options) => {
      const index = createIndex("crtc", 1, options) as CrtcIndex;
      index.tiers.clear = () => 0;
      return index;
    },
  ],
];

describe("the harness catches broken backends", () => {
  for (const [name, create] of tierMutants) {
    test(`a backend that ${name} fails, with a small repro`, () => {
      const report = firstFailure({ name, create }, { steps: 120, tiers: true });
      expect(report).not.toBeNull();
      const shrunk = Number(/shrunk to (\d+) of/.exec(report!)?.[1]);
      expect(shrunk).toBeLessThanOrEqual(8);
    });
  }

  for (const [name, create] of mutants) {
    test(`a backend that ${name} fails, with a small repro`, () => {
      const report = firstFailure({ name, create }, { steps: 120 });
      expect(report).not.toBeNull();
      const shrunk = Number(/shrunk to (\d+) of/.exec(report!)?.[1]);
      expect(shrunk).toBeLessThanOrEqual(8);
    });
  }

  test("shrinking keeps the failure and drops what does not matter", () => {
    const stream = generateStream(4, { steps: 200 });
    const fails = (ops: typeof stream.ops) =>
      ops.some((op) => op.kind === "cleared") && ops.some((op) => op.kind === "remove_worker");
    expect(fails(stream.ops)).toBe(true);
    expect(
      shrink(stream, fails)
        .map((op) => op.kind)
        .sort(),
    ).toEqual(["cleared", "remove_worker"]);
  });

  test("a correct backend passes the same seeds", () => {
    expect(
      firstFailure(
        { name: "crtc", create: (options) => createIndex("crtc", 1, options) },
        { steps: 120 },
        10,
      ),
    ).toBeNull();
    const stream = generateStream(1, { steps: 50 });
    expect(
      replay(stream, { name: "reference", create: (options) => new ReferenceIndex(1, options) }),
    ).toBeNull();
  });
});

describe("the default streams exercise every path", () => {
  test("streams with lower tiers", () => {
    const totals = {
      stored: 0,
      removed: 0,
      duplicate: 0,
      copiesRemoved: 0,
      unknown: 0,
      parentNotFound: 0,
      conflicts: 0,
      anyTier: 0,
    };
    for (let seed = 1; seed <= 100; seed++) {
      const stream = generateStream(seed, { steps: 120, tiers: true, conflicts: true });
      const oracle = new ReferenceIndex(1, {});
      for (const op of stream.ops) applyHarnessOp(oracle, op);
      const c = oracle.counters;
      totals.stored += c.tierBlocksStored;
      totals.removed += c.tierBlocksRemoved;
      totals.duplicate += c.tierBlocksDuplicate;
      totals.copiesRemoved += c.tierCopiesRemoved;
      totals.unknown += c.tierBlocksUnknown;
      totals.parentNotFound += c.tierRejectedParentNotFound;
      totals.conflicts += c.tierHashConflicts;
      totals.anyTier += stream.ops.filter(
        (op) => op.kind === "tier_removed" && op.tier === TIER_ANY,
      ).length;
    }
    for (const [key, value] of Object.entries(totals))
      expect({ [key]: value > 10 }).toEqual({ [key]: true });
  });

  test.each([
    ["plain", {}],
    ["conflicts", { conflicts: true }],
    ["three slots", { maxWorkers: 3 }],
  ] as [string, StreamOptions][])("%s streams", (_name, options) => {
    const totals = {
      parentNotFound: 0,
      capacity: 0,
      conflicts: 0,
      unknown: 0,
      duplicates: 0,
      copiesRemoved: 0,
      ghosts: 0,
      cleared: 0,
      removedWorkers: 0,
    };
    for (let seed = 1; seed <= 100; seed++) {
      const stream = generateStream(seed, { ...options, steps: 120 });
      const oracle = new ReferenceIndex(1, { maxWorkers: options.maxWorkers ?? 65_536 });
      for (const op of stream.ops) applyHarnessOp(oracle, op);
      const c = oracle.counters;
      totals.parentNotFound += c.rejectedParentNotFound;
      totals.capacity += c.rejectedCapacity;
      totals.conflicts += c.hashConflicts;
      totals.unknown += c.blocksUnknown;
      totals.duplicates += c.blocksDuplicate;
      totals.copiesRemoved += c.copiesRemoved;
      totals.cleared += c.clearedEvents;
      totals.removedWorkers += c.workersRemoved;
      // A dump with removed events stored through a hole: held blocks below an unheld one.
      totals.ghosts += oracle.dump().filter((event) => event.op === "removed").length;
    }
    for (const [key, value] of Object.entries(totals)) {
      if (key === "capacity" && options.maxWorkers === undefined) continue;
      if (key === "conflicts" && !options.conflicts) continue;
      expect({ [key]: value > 10 }).toEqual({ [key]: true });
    }
  });
});
