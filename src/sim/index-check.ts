/**
 * Whether an index holds exactly what mock engines cache: per worker, every block by
 * tier and external hash, with its copies (vLLM's duplicates on the device; the CPU
 * tier holds each block once). The demo ends with this check, on `kvedge serve`'s dump
 * or, in virtual time, on an index of this process fed the engines' events through
 * kvedge's own ingest (`EventIndex`).
 */
import { createIndex, type IndexOp, type KvIndex } from "../index";
import { KvEventNormalizer } from "../ingest/normalize";
import { encodeKvBatch } from "../wire/kv-events";
import type { EngineCache, KvEventBatch } from "./engine-cache";
import { toWireEvent } from "./networked-engine";

/** What the check found: blocks on each side (device and CPU tier), and whether they are equal. */
export interface IndexCheck {
  readonly index_blocks: number;
  readonly index_host_blocks: number;
  readonly engine_cached_blocks: number;
  readonly engine_host_blocks: number;
  /** Device copies beyond each block's first (vLLM's duplicates), at the end: indexed / held. */
  readonly index_extra_copies: number;
  readonly engine_extra_copies: number;
  /** Copies the engines computed of blocks they had cached already, over the whole run. */
  readonly engine_duplicates_computed: number;
  readonly index_matches_engines: boolean;
}

/** Per worker id (decimal): "tier hash" -> copies, from dump events in order. */
export function heldOf(ops: Iterable<IndexOp>): Map<string, Map<string, number>> {
  const held = new Map<string, Map<string, number>>();
  for (const op of ops) {
    if (op.op === "remove_worker") {
      held.delete(op.worker_id);
      continue;
    }
    let copies = held.get(op.worker_id);
    if (copies === undefined) held.set(op.worker_id, (copies = new Map()));
    if (op.op === "cleared") {
      copies.clear();
      continue;
    }
    const tier = op.tier ?? "device";
    for (const hash of op.block_hashes) {
      const key = `${tier} ${hash}`;
      const now = (copies.get(key) ?? 0) + (op.op === "stored" ? 1 : -1);
      if (now > 0) copies.set(key, now);
      else copies.delete(key);
    }
  }
  return held;
}

/** An engine's cache the same way: "device hash" -> copies, "host_pinned hash" -> 1. */
export function cachedOf(cache: EngineCache): Map<string, number> {
  const cached = new Map<string, number>();
  for (const block of cache.snapshot()) cached.set(`device ${block.hash}`, block.copies);
  for (const block of cache.hostSnapshot()) cached.set(`host_pinned ${block.hash}`, 1);
  return cached;
}

/** Compares an index (its dump's events) with the engines, worker `ids[w]` being engine w. */
export function checkIndex(
  ops: Iterable<IndexOp>,
  caches: readonly EngineCache[],
  ids: readonly string[],
): IndexCheck {
  const held = heldOf(ops);
  const count = { index: 0, indexHost: 0, engine: 0, engineHost: 0 };
  const extra = { index: 0, engine: 0, computed: 0 };
  let matches = true;
  caches.forEach((cache, w) => {
    const indexed = held.get(ids[w]!) ?? new Map<string, number>();
    const cached = cachedOf(cache);
    for (const [key, copies] of indexed) {
      if (!key.startsWith("device ")) count.indexHost++;
      else {
        count.index++;
        extra.index += copies - 1;
      }
    }
    const snapshot = cache.snapshot();
    for (const block of snapshot) extra.engine += block.copies - 1;
    count.engine += snapshot.length;
    count.engineHost += cache.hostSnapshot().length;
    extra.computed += cache.counters.duplicateBlocks;
    if (indexed.size !== cached.size) matches = false;
    for (const [key, copies] of cached) if (indexed.get(key) !== copies) matches = false;
  });
  return {
    index_blocks: count.index,
    index_host_blocks: count.indexHost,
    engine_cached_blocks: count.engine,
    engine_host_blocks: count.engineHost,
    index_extra_copies: extra.index,
    engine_extra_copies: extra.engine,
    engine_duplicates_computed: extra.computed,
    index_matches_engines: matches,
  };
}

/** A crtc index in this process fed engines' batches through kvedge's ingest (virtual time). */
export class EventIndex {
  readonly index: KvIndex;
  private readonly normalizers: KvEventNormalizer[] = [];

  constructor(workers: number, blockSize: number) {
    this.index = createIndex("crtc", blockSize);
    for (let w = 0; w < workers; w++)
      this.normalizers.push(
        new KvEventNormalizer({ workerId: BigInt(w), dpRank: 0, blockSize, sink: this.index }),
      );
  }

  /** Engine `worker`'s batch, as its publisher would encode it. */
  apply(worker: number, batch: KvEventBatch): void {
    const events = batch.events.map(toWireEvent);
    const payload = encodeKvBatch({ ts: batch.ts, events }, { form: "array" });
    if (!this.normalizers[worker]!.ingest(payload))
      throw new Error("a mock engine batch did not decode");
  }

  /** The index against the engines `workers` (default: every engine), engine w being worker w. */
  check(caches: readonly EngineCache[], workers?: readonly number[]): IndexCheck {
    const checked = workers ?? caches.map((_, w) => w);
    return checkIndex(
      this.index.dump(),
      checked.map((w) => caches[w]!),
      checked.map(String),
    );
  }
}
