// Goal: the mock engine's KV cache behaves like vLLM's prefix cache, checked against
// hand-worked cases: hashes (recomputed independently with the pure XXH3), hits and
// partial reuse, the last-token rule, LRU eviction order, pinning, duplicates, reset,
// and the exact event stream each step produces.
import { describe, expect, test } from "bun:test";
import {
  EngineCache,
  type BlockRemovedEvent,
  type BlockStoredEvent,
  type CacheSequence,
  type KvEvent,
} from "../../src/sim/engine-cache";
import { hashTokens } from "../../src/hash";
import { xxh3 } from "../../src/hash/xxh3";

const SEED = 0x1234_5678_9abc_def0n;
const BS = 4;

function cacheOf(capacityBlocks: number, hashSeed = SEED, keepDuplicates = true): EngineCache {
  return new EngineCache({ capacityBlocks, blockSize: BS, hashSeed, keepDuplicates });
}

/** Publishes what the cache did since the last call (a step's end) and takes the events. */
function published(cache: EngineCache) {
  cache.publish();
  return cache.takeEvents();
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

function sequence(
  cache: EngineCache,
  tokens: number[],
  promptLength = tokens.length,
): CacheSequence {
  return cache.prepare(Uint32Array.from(tokens), promptLength);
}

/** The engine's external hashes, recomputed from their definition with the pure-TS XXH3. */
function externalHashes(tokens: number[], seed = SEED): bigint[] {
  const out: bigint[] = [];
  let parent = 0n;
  for (let b = 0; (b + 1) * BS <= tokens.length; b++) {
    const block = new Uint8Array(Uint32Array.from(tokens.slice(b * BS, (b + 1) * BS)).buffer);
    const content = xxh3(block, seed);
    if (b === 0) {
      parent = content;
    } else {
      const pair = new DataView(new ArrayBuffer(16));
      pair.setBigUint64(0, parent, true);
      pair.setBigUint64(8, content, true);
      parent = xxh3(new Uint8Array(pair.buffer), 1337n);
    }
    out.push(parent);
  }
  return out;
}

function stored(hashes: bigint[], parent: bigint | null, tokens: number[]): BlockStoredEvent {
  return {
    type: "BlockStored",
    block_hashes: hashes,
    parent_block_hash: parent,
    token_ids: tokens,
    block_size: BS,
    lora_name: null,
    medium: "GPU",
  };
}

function removed(hashes: bigint[]): BlockRemovedEvent {
  return { type: "BlockRemoved", block_hashes: hashes, medium: "GPU" };
}

/** Allocates, commits the prompt, then the whole sequence, then releases: one request's life. */
function serve(cache: EngineCache, tokens: number[], promptLength = tokens.length): CacheSequence {
  const seq = sequence(cache, tokens, promptLength);
  expect(cache.allocate(seq)).toBe(true);
  cache.commit(seq, promptLength);
  cache.commit(seq, tokens.length);
  cache.release(seq);
  cache.verify();
  return seq;
}

describe("EngineCache hashing", () => {
  test("external hashes chain the block tokens under the engine's seed", () => {
    const cache = cacheOf(8);
    const tokens = range(1, 12);
    const seq = sequence(cache, tokens);
    const ext = externalHashes(tokens);
    for (let i = 0; i < 3; i++) {
      expect((BigInt(seq.ext[2 * i]!) << 32n) | BigInt(seq.ext[2 * i + 1]!)).toBe(ext[i]!);
    }
  });

  test("external hashes are not kvedge's hashes and differ between engines", () => {
    const tokens = range(1, 8);
    const a = externalHashes(tokens, 1n);
    const b = externalHashes(tokens, 2n);
    const local = hashTokens(tokens, BS);
    expect(a[0]).not.toBe(b[0]);
    expect(a).not.toEqual(local.local);
    expect(a).not.toEqual(local.sequence);
  });

  test("the introspected path is kvedge's sequence hash of the block", () => {
    const cache = cacheOf(8);
    const tokens = range(1, 8);
    serve(cache, tokens);
    expect(cache.snapshot()).toEqual([]); // nothing published yet: the published view is empty
    cache.publish();
    const paths = cache
      .snapshot()
      .sort((x, y) => x.position - y.position)
      .map((block) => block.path);
    expect(paths).toEqual(hashTokens(tokens, BS).sequence);
  });
});

describe("EngineCache prefix caching", () => {
  test("first request stores its full prompt blocks, chained from the root", () => {
    const cache = cacheOf(8);
    const tokens = range(1, 10); // 2 full blocks + 2 tokens
    const seq = sequence(cache, tokens);
    expect(cache.allocate(seq)).toBe(true);
    expect(seq.hitBlocks).toBe(0);
    expect(seq.slots!.length).toBe(3);
    expect(published(cache)).toEqual([]);
    cache.commit(seq, 10);
    const ext = externalHashes(tokens);
    expect(published(cache)).toEqual([stored([ext[0]!, ext[1]!], null, range(1, 8))]);
    expect(cache.cachedBlocks).toBe(2);
    expect(cache.usedBlocks).toBe(3);
    cache.release(seq);
    expect(cache.usedBlocks).toBe(0);
    expect(cache.cachedBlocks).toBe(2);
    cache.verify();
  });

  test("a shared prefix is reused and only the new blocks are stored, parent = last reused block", () => {
    const cache = cacheOf(8);
    serve(cache, range(1, 10));
    published(cache);
    const tokens = [...range(1, 8), 100, 101, 102, 103, 104];
    const seq = sequence(cache, tokens);
    expect(cache.sequencePrefixBlocks(seq)).toBe(2);
    expect(cache.cachedPrefixBlocks(Uint32Array.from(tokens), tokens.length)).toBe(2);
    expect(cache.allocate(seq)).toBe(true);
    expect(seq.hitBlocks).toBe(2);
    cache.commit(seq, tokens.length);
    const ext = externalHashes(tokens);
    expect(published(cache)).toEqual([stored([ext[2]!], ext[1]!, [100, 101, 102, 103])]);
    expect(cache.counters.hitBlocks).toBe(2);
    cache.release(seq);
    cache.verify();
  });

  test("partial reuse: a prompt that diverges in block 1 reuses block 0 only", () => {
    const cache = cacheOf(8);
    serve(cache, range(1, 12));
    published(cache);
    const tokens = [1, 2, 3, 4, 5, 6, 7, 99, 9, 10, 11, 12];
    const seq = sequence(cache, tokens);
    expect(cache.allocate(seq)).toBe(true);
    expect(seq.hitBlocks).toBe(1);
    cache.commit(seq, tokens.length);
    const ext = externalHashes(tokens);
    expect(ext[1]).not.toBe(externalHashes(range(1, 12))[1]);
    expect(published(cache)).toEqual([stored([ext[1]!, ext[2]!], ext[0]!, tokens.slice(4))]);
    cache.release(seq);
  });

  test("the last prompt token is always computed: a fully cached 8-token prompt reuses 1 block", () => {
    const cache = cacheOf(8);
    serve(cache, range(1, 8));
    published(cache);
    const seq = sequence(cache, range(1, 8));
    expect(cache.allocate(seq)).toBe(true);
    expect(seq.hitBlocks).toBe(1);
    cache.commit(seq, 8); // block 1 recomputed: its hash is cached, so this is a second copy
    const ext = externalHashes(range(1, 8));
    expect(published(cache)).toEqual([stored([ext[1]!], ext[0]!, range(5, 4))]);
    expect(cache.counters.duplicateBlocks).toBe(1);
    expect(cache.usedBlocks).toBe(2);
    cache.release(seq);
    expect(cache.cachedBlocks).toBe(3);
    expect(cache.distinctBlocks).toBe(2);
    expect(cache.snapshot().map((block) => block.copies)).toEqual([1, 2].sort());
    cache.verify();
  });

  test("with duplicates adopted, the recomputed last block is not announced", () => {
    const cache = cacheOf(8, SEED, false);
    serve(cache, range(1, 8));
    published(cache);
    const seq = sequence(cache, range(1, 8));
    expect(cache.allocate(seq)).toBe(true);
    cache.commit(seq, 8);
    expect(published(cache)).toEqual([]);
    expect(cache.counters.duplicateBlocks).toBe(1);
    cache.release(seq);
    expect(cache.cachedBlocks).toBe(2);
    cache.verify();
  });

  test("output blocks are stored at the end of the sequence, chained to the prompt", () => {
    const cache = cacheOf(8);
    const tokens = range(1, 13); // prompt 6 tokens, output 7: blocks [1..4] [5..8] [9..12] + 1
    const seq = sequence(cache, tokens, 6);
    expect(cache.allocate(seq)).toBe(true);
    expect(seq.slots!.length).toBe(4);
    cache.commit(seq, 6);
    const ext = externalHashes(tokens);
    expect(published(cache)).toEqual([stored([ext[0]!], null, range(1, 4))]);
    cache.commit(seq, 13);
    expect(published(cache)).toEqual([stored([ext[1]!, ext[2]!], ext[0]!, range(5, 8))]);
    cache.release(seq);
    cache.verify();
  });
});

describe("EngineCache eviction and pinning", () => {
  const a = range(1, 8);
  const b = range(101, 8);
  const c = range(201, 8);
  const d = range(301, 8);

  test("LRU: the oldest request's blocks go first, its tail block before its head", () => {
    const cache = cacheOf(6);
    for (const tokens of [a, b, c]) serve(cache, tokens);
    published(cache);
    expect(cache.cachedBlocks).toBe(6);
    const seq = sequence(cache, d);
    expect(cache.allocate(seq)).toBe(true);
    const ea = externalHashes(a);
    expect(published(cache)).toEqual([removed([ea[1]!, ea[0]!])]);
    expect(cache.counters.evictedBlocks).toBe(2);
    expect(cache.cachedPrefixBlocks(Uint32Array.from(a), 8)).toBe(0);
    expect(cache.cachedPrefixBlocks(Uint32Array.from(b), 8)).toBe(1);
    cache.release(seq);
    cache.verify();
  });

  test("a hit refreshes recency: the touched request survives, the next oldest goes", () => {
    const cache = cacheOf(6);
    for (const tokens of [a, b, c]) serve(cache, tokens);
    serve(cache, [...a.slice(0, 4), 7, 7, 7, 7]); // reuses a[0..4); its new block evicts a[1]
    published(cache);
    const seq = sequence(cache, d);
    expect(cache.allocate(seq)).toBe(true);
    const eb = externalHashes(b);
    expect(published(cache)).toEqual([removed([eb[1]!, eb[0]!])]);
    expect(cache.cachedPrefixBlocks(Uint32Array.from([...a.slice(0, 4), 7, 7, 7, 7, 0]), 9)).toBe(
      2,
    );
    cache.release(seq);
    cache.verify();
  });

  test("pinned blocks are never evicted; an allocation that does not fit changes nothing", () => {
    const cache = cacheOf(6);
    const running = sequence(cache, range(1, 16));
    expect(cache.allocate(running)).toBe(true);
    cache.commit(running, 16);
    published(cache);
    expect(cache.freeBlocks).toBe(2);
    const blocked = sequence(cache, range(500, 12));
    expect(cache.allocate(blocked)).toBe(false);
    expect(blocked.slots).toBeNull();
    expect(published(cache)).toEqual([]);
    expect(cache.freeBlocks).toBe(2);
    expect(cache.cachedBlocks).toBe(4);
    cache.release(running);
    expect(cache.allocate(blocked)).toBe(true);
    const er = externalHashes(range(1, 16));
    // 2 never-used slots first, then the released request's blocks, tail first.
    expect(published(cache)).toEqual([removed([er[3]!])]);
    cache.release(blocked);
    cache.verify();
  });

  test("hit blocks waiting in the free queue do not count as free for the same request", () => {
    const cache = cacheOf(4);
    serve(cache, range(1, 8)); // 2 cached blocks, both free
    const seq = sequence(cache, [...range(1, 8), ...range(50, 12)]); // 5 blocks: 2 hit + 3 new
    expect(cache.allocate(seq)).toBe(false);
    expect(cache.freeBlocks).toBe(4);
  });

  test("a sequence larger than the cache never allocates", () => {
    const cache = cacheOf(2);
    expect(cache.allocate(sequence(cache, range(1, 9)))).toBe(false);
  });
});

describe("EngineCache duplicates and reset", () => {
  test("two concurrent sequences computing the same prefix: two copies, each stored and removed", () => {
    const cache = cacheOf(8);
    const tokens = range(1, 9);
    const first = sequence(cache, tokens);
    const second = sequence(cache, tokens);
    expect(cache.allocate(first)).toBe(true);
    expect(cache.allocate(second)).toBe(true);
    expect(cache.usedBlocks).toBe(6);
    cache.commit(first, 9);
    cache.commit(second, 9);
    const ext = externalHashes(tokens);
    const both = stored([ext[0]!, ext[1]!], null, range(1, 8));
    expect(published(cache)).toEqual([both, both]);
    expect(cache.counters.duplicateBlocks).toBe(2);
    expect(cache.usedBlocks).toBe(6); // each keeps its own copy
    expect(cache.cachedBlocks).toBe(4);
    expect(cache.distinctBlocks).toBe(2);
    cache.verify();
    cache.release(first);
    cache.release(second);
    expect(cache.snapshot().map((block) => block.copies)).toEqual([2, 2]);
    // A new request hits the oldest copies; the other two go first, one removal each.
    const third = sequence(cache, [...range(1, 8), 50]);
    expect(cache.allocate(third)).toBe(true);
    expect(third.hitBlocks).toBe(2);
    published(cache);
    const fill = sequence(cache, range(100, 20)); // 5 blocks: the free slots, then the second copies
    expect(cache.allocate(fill)).toBe(true);
    const events = published(cache);
    expect(events.length).toBe(1);
    expect(
      (events[0] as BlockRemovedEvent).block_hashes
        .filter((h) => h === ext[0] || h === ext[1])
        .sort(),
    ).toEqual([ext[0]!, ext[1]!].sort());
    expect(cache.snapshot().map((block) => block.copies)).toEqual([1, 1]);
    expect(cache.cachedPrefixBlocks(Uint32Array.from(tokens), 9)).toBe(2);
    cache.verify();
  });

  test("with duplicates adopted: one BlockStored, a shared copy", () => {
    const cache = cacheOf(8, SEED, false);
    const tokens = range(1, 9);
    const first = sequence(cache, tokens);
    const second = sequence(cache, tokens);
    expect(cache.allocate(first)).toBe(true);
    expect(cache.allocate(second)).toBe(true);
    cache.commit(first, 9);
    cache.commit(second, 9);
    const ext = externalHashes(tokens);
    expect(published(cache)).toEqual([stored([ext[0]!, ext[1]!], null, range(1, 8))]);
    expect(cache.usedBlocks).toBe(4); // 2 shared + 2 partial tails
    cache.release(first);
    cache.release(second);
    expect(cache.cachedBlocks).toBe(2);
    cache.verify();
  });

  test("reset refuses while blocks are pinned, then clears everything with AllBlocksCleared", () => {
    const cache = cacheOf(8);
    serve(cache, range(1, 8));
    const running = sequence(cache, range(20, 8));
    expect(cache.allocate(running)).toBe(true);
    published(cache);
    expect(cache.reset()).toBe(false);
    expect(published(cache)).toEqual([]);
    cache.release(running);
    expect(cache.reset()).toBe(true);
    const events: KvEvent[] = published(cache);
    expect(events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(cache.cachedBlocks).toBe(0);
    expect(cache.snapshot()).toEqual([]);
    expect(cache.cachedPrefixBlocks(Uint32Array.from(range(1, 9)), 9)).toBe(0);
    cache.verify();
    // The cache works normally afterwards, from an empty state.
    serve(cache, range(1, 8));
    expect(published(cache)).toEqual([stored(externalHashes(range(1, 8)), null, range(1, 8))]);
  });

  test("no events are built when recording is off, but the cache behaves the same", () => {
    const quiet = new EngineCache({
      capacityBlocks: 4,
      blockSize: BS,
      hashSeed: SEED,
      recordEvents: false,
    });
    for (const start of [1, 100, 200]) serve(quiet, range(start, 8));
    expect(quiet.takeEvents()).toEqual([]);
    expect(quiet.counters.evictedBlocks).toBe(2);
    expect(quiet.cachedBlocks).toBe(4);
  });

  test("misuse fails loudly", () => {
    const cache = cacheOf(4);
    const seq = sequence(cache, range(1, 4));
    expect(() => cache.release(seq)).toThrow("not allocated");
    expect(() => cache.commit(seq, 4)).toThrow("not allocated");
    expect(cache.allocate(seq)).toBe(true);
    expect(() => cache.allocate(seq)).toThrow("already allocated");
    expect(() => cacheOf(0)).toThrow("capacityBlocks");
    expect(() => cache.prepare(Uint32Array.from([1, 2]), 3)).toThrow("promptLength");
  });
});

describe("EngineCache CPU tier", () => {
  const cpuCache = (capacity: number, cpu: number) =>
    new EngineCache({
      capacityBlocks: capacity,
      blockSize: BS,
      hashSeed: SEED,
      cpuCapacityBlocks: cpu,
    });

  test("an evicted block spills to the CPU tier (a CPU store with its tokens) and loads back instead of a prefill", () => {
    const cache = cpuCache(3, 8);
    serve(cache, range(1, 8)); // blocks A0, A1
    published(cache);
    serve(cache, range(100, 12)); // 3 blocks: evicts A1 (the tail), then A0
    const a = externalHashes(range(1, 8));
    const events = published(cache);
    // The spills come before the device removal of the same allocation, child first.
    expect(events.slice(0, 2)).toEqual([
      { ...stored([a[1]!], a[0]!, range(5, 4)), medium: "CPU" },
      { ...stored([a[0]!], null, range(1, 4)), medium: "CPU" },
    ]);
    expect(events[2]).toEqual(removed([a[1]!, a[0]!]));
    expect(
      cache
        .hostSnapshot()
        .map((block) => block.hash)
        .sort(),
    ).toEqual([a[0]!, a[1]!].sort());
    expect(cache.counters.spilledBlocks).toBe(2);
    // A prompt continuing A: both blocks load back from the CPU tier (the last token computed).
    const again = sequence(cache, range(1, 9));
    expect(cache.allocate(again)).toBe(true);
    expect([again.hitBlocks, again.loadedBlocks]).toEqual([0, 2]);
    expect(cache.counters.hostHitBlocks).toBe(2);
    cache.commit(again, 9);
    // Loaded blocks are on the device again: stored there; the CPU tier keeps its copies
    // (and gets the blocks this allocation evicted).
    const onDevice = published(cache).filter((e) => e.type === "BlockStored" && e.medium === "GPU");
    expect(onDevice).toEqual([stored([a[0]!, a[1]!], null, range(1, 8))]);
    const held = cache.hostSnapshot().map((block) => block.hash);
    expect(held).toContain(a[0]!);
    expect(held).toContain(a[1]!);
    cache.release(again);
    cache.verify();
  });

  test("a full CPU tier evicts its least recently used block (a CPU removal)", () => {
    const cache = cpuCache(2, 1);
    serve(cache, range(1, 8)); // A0, A1
    published(cache);
    serve(cache, range(100, 8)); // evicts A1 (spilled), then A0: the tier is full, A1 goes
    const a = externalHashes(range(1, 8));
    const events = published(cache);
    expect(events.slice(0, 3)).toEqual([
      { ...stored([a[1]!], a[0]!, range(5, 4)), medium: "CPU" },
      { type: "BlockRemoved", block_hashes: [a[1]!], medium: "CPU" },
      { ...stored([a[0]!], null, range(1, 4)), medium: "CPU" },
    ]);
    expect(cache.counters.hostEvictedBlocks).toBe(1);
    expect(cache.hostSnapshot().map((block) => block.hash)).toEqual([a[0]!]);
    cache.verify();
  });

  test("reset empties the CPU tier too (AllBlocksCleared covers every tier)", () => {
    const cache = cpuCache(2, 4);
    serve(cache, range(1, 8));
    serve(cache, range(100, 8));
    published(cache);
    expect(cache.hostSnapshot().length).toBeGreaterThan(0);
    expect(cache.reset()).toBe(true);
    expect(published(cache)).toEqual([{ type: "AllBlocksCleared" }]);
    expect(cache.hostSnapshot()).toEqual([]);
    cache.verify();
  });
});
