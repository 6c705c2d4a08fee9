/**
 * Test helpers for networked mock engines: a virtual-time driver that publishes every
 * step's batch (so a test can stop at checkpoints), and comparison of an index dump with
 * the engines' real cache contents (external hash → kvedge path hash and copies, per worker).
 */
import { expect } from "bun:test";
import type { IndexOp } from "../../src/index/ops";
import { checkIndex } from "../../src/sim/index-check";
import type { NetworkedEngine } from "../../src/sim/networked-engine";
import { createPolicy, type RoutingPolicy } from "../../src/sim/policies";
import { requestTokens, routeQuery } from "../../src/sim/simulator";
import { DEFAULT_VOCAB_SIZE } from "../../src/sim/tokens";
import type { Trace } from "../../src/sim/trace";

/** kvedge's sequence hash of a block after `previous` (the chain step of src/hash). */
export function chainStep(previous: bigint, local: bigint): bigint {
  const pair = new DataView(new ArrayBuffer(16));
  pair.setBigUint64(0, previous, true);
  pair.setBigUint64(8, local, true);
  return BigInt(Bun.hash.xxHash3(new Uint8Array(pair.buffer), 1337n));
}

/** Per worker id (decimal): external hash (decimal) → path hash, from an index dump. */
export function indexedPaths(ops: readonly IndexOp[]): Map<string, Map<string, bigint>> {
  const workers = new Map<string, Map<string, bigint>>();
  for (const op of ops) {
    if (op.op === "remove_worker") {
      workers.delete(op.worker_id);
      continue;
    }
    if (op.op !== "cleared" && (op.tier ?? "device") !== "device") continue;
    let blocks = workers.get(op.worker_id);
    if (blocks === undefined) workers.set(op.worker_id, (blocks = new Map()));
    if (op.op === "cleared") {
      blocks.clear();
    } else if (op.op === "removed") {
      for (const hash of op.block_hashes) blocks.delete(hash);
    } else {
      let previous = op.parent_block_hash === null ? null : blocks.get(op.parent_block_hash);
      if (previous === undefined)
        throw new Error(`dump stores under unknown parent ${op.parent_block_hash}`);
      op.block_hashes.forEach((hash, i) => {
        const local = BigInt(op.local_hashes![i]!);
        previous = previous === null ? local : chainStep(previous!, local);
        blocks.set(hash, previous);
      });
    }
  }
  return workers;
}

/**
 * Per worker id (decimal): external hash (decimal) → copies held, from an index dump (a
 * dump stores a block once per copy; its removals drop placeholders only).
 */
export function indexedCopies(ops: readonly IndexOp[]): Map<string, Map<string, number>> {
  const workers = new Map<string, Map<string, number>>();
  for (const op of ops) {
    if (op.op !== "stored" && op.op !== "removed") continue;
    if ((op.tier ?? "device") !== "device") continue;
    let copies = workers.get(op.worker_id);
    if (copies === undefined) workers.set(op.worker_id, (copies = new Map()));
    for (const hash of op.block_hashes) {
      const now = (copies.get(hash) ?? 0) + (op.op === "stored" ? 1 : -1);
      if (now > 0) copies.set(hash, now);
      else copies.delete(hash);
    }
  }
  return workers;
}

/** The same view of an engine's real cache. */
export function cachedPaths(engine: NetworkedEngine): Map<string, bigint> {
  return new Map(
    engine.engine.cache.snapshot().map((block) => [block.hash.toString(), block.path]),
  );
}

/** Asserts the dump holds exactly each engine's cached blocks, with their token paths and copies. */
export function expectIndexEqualsEngines(
  ops: readonly IndexOp[],
  engines: readonly NetworkedEngine[],
  ids: readonly string[],
): number {
  const indexed = indexedPaths(ops);
  const copies = indexedCopies(ops);
  let blocks = 0;
  engines.forEach((engine, w) => {
    const actual = cachedPaths(engine);
    const seen = indexed.get(ids[w]!) ?? new Map<string, bigint>();
    expect(seen.size).toBe(actual.size);
    for (const [hash, path] of actual) {
      if (seen.get(hash) !== path)
        throw new Error(
          `worker ${ids[w]}: block ${hash} indexed as ${seen.get(hash)}, cached with path ${path}`,
        );
    }
    // Every block with as many copies as the engine holds (vLLM's duplicates).
    const held = copies.get(ids[w]!) ?? new Map<string, number>();
    for (const block of engine.engine.cache.snapshot()) {
      if (held.get(block.hash.toString()) !== block.copies)
        throw new Error(
          `worker ${ids[w]}: block ${block.hash} indexed with ${held.get(block.hash.toString())} copies, cached with ${block.copies}`,
        );
    }
    blocks += actual.size;
  });
  // And the CPU tiers (src/sim/index-check.ts compares both tiers and every copy).
  const check = checkIndex(
    ops,
    engines.map((engine) => engine.engine.cache),
    ids,
  );
  expect(check.index_matches_engines).toBe(true);
  return blocks + check.index_host_blocks;
}

/**
 * Runs a trace over networked engines in virtual time (round robin unless a policy is
 * given), publishing after every step and submission, stopping wherever the test asks.
 */
export class VirtualRig {
  next = 0;
  private readonly policy: RoutingPolicy;

  constructor(
    readonly engines: readonly NetworkedEngine[],
    readonly trace: Trace,
    policy?: RoutingPolicy,
  ) {
    this.policy =
      policy ?? createPolicy("round_robin", { workers: engines.length, blockSize: 16, seed: 1 });
  }

  /** Routes and submits requests up to (not including) `until`, with every step before them. */
  runTo(until: number): void {
    const limit = Math.min(until, this.trace.count);
    for (; this.next < limit; this.next++) {
      const arrival = this.trace.arrivalMs[this.next]!;
      this.stepUntil(arrival);
      const tokens = requestTokens(this.trace, this.next, DEFAULT_VOCAB_SIZE);
      const query = routeQuery(this.next, tokens, this.trace.inputLength[this.next]!, 16);
      const target = this.engines[this.policy.route(query, arrival)]!;
      target.engine.submit({ id: this.next, tokens, promptLength: query.promptLength }, arrival);
      target.publish();
    }
  }

  /** Runs every engine to idle. */
  drain(): void {
    this.stepUntil(Infinity);
  }

  /**
   * Makes each engine's last batch one that went on the wire (so a subscriber can see
   * any gap before it): steps a busy engine once more, resets an idle one.
   */
  settleDrops(dropped: (seq: number) => boolean): void {
    for (const networked of this.engines) {
      for (let guard = 0; networked.lastSeq >= 0 && dropped(networked.lastSeq); guard++) {
        if (guard > 1000) throw new Error("cannot get a batch through");
        if (networked.engine.idle) {
          if (!networked.reset()) throw new Error("reset refused on an idle engine");
        } else {
          networked.engine.step();
          networked.publish();
        }
      }
    }
  }

  private stepUntil(limitMs: number): void {
    for (;;) {
      let best: NetworkedEngine | null = null;
      for (const networked of this.engines) {
        const due = networked.engine.nextEventMs();
        if (
          due !== Infinity &&
          due <= limitMs &&
          (best === null || due < best.engine.nextEventMs())
        ) {
          best = networked;
        }
      }
      if (best === null) return;
      best.engine.step();
      best.publish();
    }
  }
}
