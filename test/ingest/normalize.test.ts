// Goal: the normalizer applies exactly what the reference's rules keep (ownership,
// locality, medium -> tier, attention groups, namespace propagation, conversion
// rejects), with local hashes equal to src/hash's for the same tokens, LoRA name,
// salt and Eagle windows; everything else is counted; a bad batch reaches the sink
// not at all. Method: real encoded batches through ingest() into a recording sink.
import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import { hashTokens, LoraAdapters } from "../../src/hash";
import { WorkerTable } from "../../src/domain/worker-table";
import { TIER_ANY, TIER_DISK, TIER_EXTERNAL, TIER_HOST } from "../../src/index/types";
import {
  KvEventNormalizer,
  type KvEventSink,
  type NormalizerOptions,
} from "../../src/ingest/normalize";
import { NamespaceTable } from "../../src/ingest/namespace";
import {
  encodeKvBatch,
  type KvBatch,
  type KvBlockStored,
  type KvEvent,
  type WireVariant,
} from "../../src/wire/kv-events";
import { u64 } from "../../src/util/u64";
import { memoryLogger } from "../../src/util/log";
import { native } from "../../src/native/library";
import { xorshift32 } from "../../src/util/random";
import { expectChildSuitePasses } from "../support/suite";

type Op =
  | {
      op: "stored";
      worker: bigint;
      rank: number;
      parent: bigint | null;
      external: bigint[];
      local: bigint[];
      /** A lower tier's store (absent: the device's). */
      tier?: number;
    }
  | { op: "removed"; worker: bigint; rank: number; external: bigint[]; tier?: number }
  | { op: "cleared"; worker: bigint; rank: number };

function recorder(): KvEventSink & { ops: Op[] } {
  const ops: Op[] = [];
  const workerTable = new WorkerTable();
  const pairs = (words: Uint32Array, start: number, count: number) =>
    Array.from({ length: count }, (_, i) =>
      u64(words[2 * (start + i)]!, words[2 * (start + i) + 1]!),
    );
  const worker = (slot: number) => ({
    worker: workerTable.workerIdOf(slot),
    rank: workerTable.dpRankOf(slot),
  });
  return {
    ops,
    workerTable,
    storeAt(slot, hasParent, parentHi, parentLo, external, local, count, start) {
      ops.push({
        op: "stored",
        ...worker(slot),
        parent: hasParent ? u64(parentHi, parentLo) : null,
        external: pairs(external, start, count),
        local: pairs(local, start, count),
      });
    },
    removeAt(slot, external, count, start) {
      ops.push({ op: "removed", ...worker(slot), external: pairs(external, start, count) });
    },
    clearAt(slot) {
      ops.push({ op: "cleared", ...worker(slot) });
    },
    storeTierAt(tier, slot, hasParent, parentHi, parentLo, external, local, count, start) {
      ops.push({
        op: "stored",
        ...worker(slot),
        parent: hasParent ? u64(parentHi, parentLo) : null,
        external: pairs(external, start, count),
        local: pairs(local, start, count),
        tier,
      });
    },
    removeTierAt(tier, slot, external, count, start) {
      ops.push({ op: "removed", ...worker(slot), external: pairs(external, start, count), tier });
    },
  };
}

function setup(options: Partial<NormalizerOptions> = {}) {
  const sink = recorder();
  const normalizer = new KvEventNormalizer({
    workerId: 7n,
    dpRank: 0,
    blockSize: 4,
    sink: sink,
    ...options,
  });
  const send = (
    events: KvEvent[],
    dpRank: number | null = null,
    variant: WireVariant = "vllm-v7",
  ) => normalizer.ingest(encodeKvBatch({ ts: 1, events, dpRank }, { variant }));
  return { sink, normalizer, send };
}

const TOKENS = Array.from({ length: 12 }, (_, i) => i + 1);

function store(
  hashes: bigint[],
  parent: bigint | null,
  extra: Partial<KvBlockStored> = {},
): KvBlockStored {
  return {
    type: "BlockStored",
    blockHashes: hashes,
    parentBlockHash: parent,
    tokenIds: TOKENS.slice(0, 4 * hashes.length),
    blockSize: 4,
    loraId: null,
    medium: "GPU",
    loraName: null,
    ...extra,
  };
}

describe("conversion to index operations", () => {
  test("store, remove and clear with local hashes from src/hash; the batch's dp rank wins", () => {
    const { sink, send } = setup();
    expect(
      send(
        [
          store([101n, 102n, 103n], 100n),
          { type: "BlockRemoved", blockHashes: [103n], medium: "GPU" },
          { type: "AllBlocksCleared" },
        ],
        3,
      ),
    ).toBe(true);
    expect(sink.ops).toEqual([
      {
        op: "stored",
        worker: 7n,
        rank: 3,
        parent: 100n,
        external: [101n, 102n, 103n],
        local: hashTokens(TOKENS, 4).local,
      },
      { op: "removed", worker: 7n, rank: 3, external: [103n] },
      { op: "cleared", worker: 7n, rank: 3 },
    ]);
  });

  test("the known-answer vector [1,2,3,4] and the configured rank when the batch has none", () => {
    const { sink, send } = setup();
    send([store([1n], null)]);
    expect(sink.ops).toEqual([
      {
        op: "stored",
        worker: 7n,
        rank: 0,
        parent: null,
        external: [1n],
        local: [14643705804678351452n],
      },
    ]);
  });

  test("LoRA name and Eagle windows reach the hash", () => {
    const { sink, send } = setup();
    const pairs = TOKENS.slice(0, 8).map((token) => [token, token + 1] as const);
    send([store([1n, 2n], null, { loraName: "my-lora", tokenIds: pairs })], null, "vllm-v9");
    const op = sink.ops[0]!;
    expect(op.op === "stored" && op.local).toEqual(
      hashTokens(TOKENS.slice(0, 9), 4, { loraName: "my-lora", eagle: true }).local,
    );
  });

  test("a repeated hash (parent included) rejects the store whole", () => {
    const { sink, normalizer, send } = setup();
    send([store([5n, 6n], 6n), store([8n, 9n, 8n], null)]);
    const many = Array.from({ length: 40 }, (_, i) => BigInt(i + 1000));
    send([
      store([...many, 1000n], null, { tokenIds: Array.from({ length: 4 * 41 }, (_, i) => i) }),
    ]);
    expect(sink.ops).toEqual([]);
    expect(normalizer.counters.rejectedEvents.self_reference).toBe(3);
    expect(normalizer.counters.rejectedBlocks.self_reference).toBe(2 + 3 + 41);
  });

  test("long stores: the parent among the hashes repeats; hashes equal in one word do not", () => {
    const { sink, normalizer, send } = setup();
    const tokens = (n: number) => ({ tokenIds: Array.from({ length: 4 * n }, (_, i) => i) });
    const many = Array.from({ length: 40 }, (_, i) => BigInt(i + 5000));
    send([store(many, 5030n, tokens(40))]); // the parent is hash 30
    // 40 hashes sharing the low word, 40 more sharing the high word.
    const sameLo = Array.from({ length: 40 }, (_, i) => (BigInt(i + 1) << 32n) | 7n);
    const sameHi = Array.from({ length: 40 }, (_, i) => (1000n << 32n) | BigInt(i));
    send([store([...sameLo, ...sameHi], null, tokens(80))]);
    expect(sink.ops.map((op) => op.op === "stored" && op.external.length)).toEqual([80]);
    expect(normalizer.counters.rejectedEvents.self_reference).toBe(1);
    expect(normalizer.counters.rejectedBlocks.self_reference).toBe(40);
  });

  test("the repeat check empties per store: long stores sharing hashes are kept", () => {
    const { sink, normalizer, send } = setup();
    const tokens = (n: number) => ({ tokenIds: Array.from({ length: 4 * n }, (_, i) => i) });
    const chain = (at: number, n: number) => Array.from({ length: n }, (_, i) => BigInt(at + i));
    const long = chain(2000, 300);
    send([store(long, null, tokens(300)), store(long, null, tokens(300))]);
    const repeated = [...chain(3000, 20), 3019n];
    send([store(chain(3000, 20), null, tokens(20)), store(repeated, null, tokens(21))]);
    expect(sink.ops.map((op) => op.op === "stored" && op.external.length)).toEqual([300, 300, 20]);
    expect(normalizer.counters.rejectedEvents.self_reference).toBe(1);
    expect(normalizer.counters.rejectedBlocks.self_reference).toBe(21);
  });

  test("repeat check: seeded stores of any length against a Set, the parent included", () => {
    const { sink, normalizer, send } = setup();
    const next = xorshift32(0x5eed);
    const u64 = () => (BigInt(next()) << 32n) | BigInt(next());
    let kept = 0;
    let rejected = 0;
    for (let round = 0; round < 300; round++) {
      const length = 1 + (next() % (round % 10 === 0 ? 3000 : 60));
      // Small words in some rounds, so pairs share a word and probe runs collide.
      const small = (i: number) => BigInt(i * 7 + (round << 12));
      const hashes = Array.from({ length }, (_, i) => (round % 3 === 0 ? small(i) : u64()));
      let parent: bigint | null = next() % 2 === 0 ? u64() : null;
      const plant = next() % 4;
      if (plant === 1) hashes[next() % length] = hashes[next() % length]!;
      if (plant === 2 && parent !== null) hashes[next() % length] = parent;
      if (plant === 3) parent = hashes[next() % length]!;
      const expected =
        new Set([...hashes, ...(parent === null ? [] : [parent])]).size <
        length + (parent === null ? 0 : 1);
      if (expected) rejected++;
      else kept++;
      send([store(hashes, parent, { tokenIds: Array.from({ length: 4 * length }, (_, i) => i) })]);
      expect(normalizer.counters.rejectedEvents.self_reference ?? 0).toBe(rejected);
      expect(sink.ops.length).toBe(kept);
    }
    expect(Math.min(kept, rejected)).toBeGreaterThan(50);
  });

  test.skipIf(native === null)(
    "the repeat check again without native code",
    () => {
      expectChildSuitePasses([import.meta.path, "-t", "repeat"], { KVEDGE_NATIVE: "0" });
    },
    60_000,
  );

  test("another block size rejects the whole event, logged once", () => {
    const records = memoryLogger();
    const { sink, normalizer, send } = setup({ log: records });
    send([store([1n, 2n], null, { blockSize: 2 })]);
    send([store([3n], null, { blockSize: 16 })]);
    expect(sink.ops).toEqual([]);
    expect(normalizer.counters.rejectedBlocks.block_size_mismatch).toBe(3);
    expect(
      records.records.filter((record) => record.fields.kind === "block_size_mismatch"),
    ).toHaveLength(1);
  });

  test("tokens running short keep the complete blocks before them", () => {
    const { sink, normalizer, send } = setup();
    send([store([1n, 2n, 3n], null, { tokenIds: TOKENS.slice(0, 9) })]);
    expect(sink.ops).toEqual([
      {
        op: "stored",
        worker: 7n,
        rank: 0,
        parent: null,
        external: [1n, 2n],
        local: hashTokens(TOKENS.slice(0, 8), 4).local,
      },
    ]);
    expect(normalizer.counters.rejectedBlocks.tokens_short).toBe(1);
  });

  test("blocks from the first multimodal one on are rejected, the prefix kept", () => {
    const { sink, normalizer, send } = setup();
    const mm = "ab".repeat(32);
    send([
      store([1n, 2n, 3n], null, { extraKeys: [null, [mm], null] }),
      store([4n], null, { extraKeys: [[[mm, 0]]] }),
    ]);
    expect(sink.ops).toEqual([
      {
        op: "stored",
        worker: 7n,
        rank: 0,
        parent: null,
        external: [1n],
        local: hashTokens(TOKENS.slice(0, 4), 4).local,
      },
    ]);
    expect(normalizer.counters.rejectedBlocks.multimodal_unsupported).toBe(3);
  });
});

describe("filters, in the reference's order", () => {
  test("ownership and locality", () => {
    const { sink, normalizer, send } = setup();
    send(
      [
        store([1n], null, { ownership: "kvcr" }),
        store([2n], null, { ownership: "someone" }),
        store([3n], null, { locality: "REMOTE" }),
        store([4n], null, { locality: "local" }),
        { type: "AllBlocksCleared", ownership: "kvcr" },
      ],
      null,
      "fork-f1",
    );
    expect(sink.ops.map((op) => op.op === "stored" && op.external)).toEqual([[4n]]);
    expect(normalizer.counters.rejectedEvents.ownership).toBe(3);
    expect(normalizer.counters.rejectedEvents.locality).toBe(1);
  });

  test("medium -> tier, any case: every tier applied; a store of an unknown medium filtered", () => {
    const { sink, normalizer, send } = setup();
    send([
      store([1n], null, { medium: "GPU" }),
      store([2n], null, { medium: null }),
      store([3n], null, { medium: "" }),
      store([4n], null, { medium: "CPU" }),
      store([5n, 6n], null, { medium: "cpu_tier2" }),
      store([7n], null, { medium: "SHARED" }),
      store([8n], null, { medium: "FLOPPY" }),
      { type: "BlockRemoved", blockHashes: [4n], medium: "CPU" },
    ]);
    const applied = sink.ops.map((op) => op.op !== "cleared" && [op.op, op.external, op.tier]);
    expect(applied).toEqual([
      ["stored", [1n], undefined],
      ["stored", [2n], undefined],
      ["stored", [3n], undefined],
      ["stored", [4n], TIER_HOST],
      ["stored", [5n, 6n], TIER_DISK],
      ["stored", [7n], TIER_EXTERNAL],
      ["removed", [4n], TIER_HOST],
    ]);
    expect(normalizer.counters.eventsByTier).toEqual({
      device: 3,
      host_pinned: 2,
      disk: 1,
      external: 1,
      any: 0,
    });
    expect(normalizer.counters.blocksByTier).toEqual({
      device: 3,
      host_pinned: 2,
      disk: 2,
      external: 1,
      any: 0,
    });
    expect(normalizer.counters.rejectedEvents.unknown_medium).toBe(1);
  });

  test("a removal of an unknown medium, or of none, removes from every tier", () => {
    const { sink, normalizer, send } = setup();
    send([
      { type: "BlockRemoved", blockHashes: [4n], medium: "FLOPPY" },
      { type: "BlockRemoved", blockHashes: [5n], medium: null },
      { type: "BlockRemoved", blockHashes: [6n], medium: "" },
      { type: "BlockRemoved", blockHashes: [7n], medium: "gpu" },
    ]);
    // Every lower tier first, then the device; a known medium names its tier only.
    expect(sink.ops.map((op) => op.op !== "cleared" && [op.op, op.external, op.tier])).toEqual([
      ["removed", [4n], TIER_ANY],
      ["removed", [4n], undefined],
      ["removed", [5n], TIER_ANY],
      ["removed", [5n], undefined],
      ["removed", [6n], TIER_ANY],
      ["removed", [6n], undefined],
      ["removed", [7n], undefined],
    ]);
    expect(normalizer.counters.eventsByTier.any).toBe(3);
    expect(normalizer.counters.rejectedEvents.unknown_medium).toBe(0);
  });

  test("salts are remembered per tier: a host removal leaves the device's salt (D4)", () => {
    const { sink, normalizer, send } = setup();
    const salted = (tokens: number[]) => hashTokens(tokens, 4, { cacheSalt: "tenant-a" }).local;
    send([
      store([1n], null, { extraKeys: [["tenant-a"]] }),
      store([1n], null, { extraKeys: [["tenant-a"]], medium: "CPU" }),
      { type: "BlockRemoved", blockHashes: [1n], medium: "CPU" },
      // Offloaded below a device-held parent: the device's record gives the salt.
      store([2n], 1n, { tokenIds: TOKENS.slice(4, 8), medium: "CPU" }),
      store([3n], 1n, { tokenIds: TOKENS.slice(4, 8) }),
    ]);
    const stores = sink.ops.filter((op) => op.op === "stored");
    expect(stores.map((op) => op.op === "stored" && op.local)).toEqual([
      salted(TOKENS.slice(0, 4)),
      salted(TOKENS.slice(0, 4)),
      salted(TOKENS.slice(4, 8)),
      salted(TOKENS.slice(4, 8)),
    ]);
    // An unknown-medium removal forgets in every tier; a clear too.
    send([{ type: "BlockRemoved", blockHashes: [2n], medium: "FLOPPY" }]);
    expect(normalizer.namespaceEntries).toBe(2); // 1 and 3 on the device
    send([{ type: "AllBlocksCleared" }]);
    expect(normalizer.namespaceEntries).toBe(0);
  });

  test("attention groups: learned kinds filter later events without a kind", () => {
    const { sink, normalizer, send } = setup();
    send(
      [
        store([1n], null, { groupIdx: 1, kvCacheSpecKind: "sliding_window" }),
        store([2n], null, { groupIdx: 0, kvCacheSpecKind: "full_attention" }),
        { type: "BlockRemoved", blockHashes: [1n], groupIdx: 1, medium: "GPU" },
        { type: "BlockRemoved", blockHashes: [2n], groupIdx: 0, medium: "GPU" },
        store([3n], null, { groupIdx: 2 }),
        store([4n], null, { groupIdx: 0 }),
      ],
      1,
    );
    expect(sink.ops.map((op) => [op.op, op.op === "cleared" ? [] : op.external])).toEqual([
      ["stored", [2n]],
      ["removed", [2n]],
      ["stored", [4n]],
    ]);
    expect(normalizer.counters.rejectedEvents.attention_group).toBe(3);
    // Learned per dp rank: rank 2 has not learned group 1, which is then not 0: filtered.
    send([{ type: "BlockRemoved", blockHashes: [1n], groupIdx: 1 }], 2);
    expect(normalizer.counters.rejectedEvents.attention_group).toBe(4);
  });
});

describe("cache namespace propagation", () => {
  test("a child inherits its parent's salt; removal and clear forget it", () => {
    const { sink, normalizer, send } = setup();
    send([
      store([1n], null, { extraKeys: [["tenant-a"]] }),
      store([2n], 1n, { tokenIds: TOKENS.slice(4, 8) }),
    ]);
    const salted = (tokens: number[]) => hashTokens(tokens, 4, { cacheSalt: "tenant-a" }).local;
    expect(sink.ops.map((op) => op.op === "stored" && op.local)).toEqual([
      salted(TOKENS.slice(0, 4)),
      salted(TOKENS.slice(4, 8)),
    ]);
    expect(normalizer.namespaceEntries).toBe(2);
    send([{ type: "BlockRemoved", blockHashes: [2n], medium: "GPU" }]);
    expect(normalizer.namespaceEntries).toBe(1);
    send([{ type: "AllBlocksCleared" }]);
    expect(normalizer.namespaceEntries).toBe(0);
    // Joining mid-chain: the parent is unknown, so the unsalted reading applies.
    send([store([3n], 1n)]);
    const last = sink.ops[sink.ops.length - 1]!;
    expect(last.op === "stored" && last.local).toEqual(hashTokens(TOKENS.slice(0, 4), 4).local);
  });

  test("a hash stored under two salts becomes ambiguous: its children are filtered", () => {
    const { sink, normalizer, send } = setup();
    send(
      [
        store([1n], null, { cacheSalt: "a" }),
        store([1n], null, { cacheSalt: "b" }),
        store([2n], 1n),
        { type: "BlockRemoved", blockHashes: [1n] },
      ],
      null,
      "sglang-s5",
    );
    expect(sink.ops.filter((op) => op.op === "stored")).toHaveLength(2);
    expect(normalizer.counters.rejectedEvents.namespace_ambiguous).toBe(1);
    // The ambiguous entry survives the removal; a clear of the rank forgets it.
    expect(normalizer.namespaceEntries).toBe(1);
    send([{ type: "AllBlocksCleared" }]);
    expect(normalizer.namespaceEntries).toBe(0);
  });

  test("the namespace table returns its memory after churn", () => {
    const table = new NamespaceTable(1 << 20);
    const empty = table.bytes;
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 10_000; i++) table.record(round % 2, i, i * 7, "tenant");
      expect(table.size).toBe(10_000);
      for (let i = 0; i < 10_000; i++) {
        expect(table.get(round % 2, i, i * 7)).toBe("tenant");
        table.forget(round % 2, i, i * 7);
      }
      expect(table.size).toBe(0);
      expect(table.bytes).toBe(empty);
    }
  });

  test("past its bound the table refuses new entries and counts them", () => {
    const table = new NamespaceTable(2);
    for (let i = 0; i < 5; i++) table.record(0, 0, i, "s");
    expect(table.size).toBe(2);
    expect(table.refused).toBe(3);
  });
});

describe("bad input", () => {
  test("a batch that does not decode reaches the sink not at all; the next one applies", () => {
    const records = memoryLogger();
    const { sink, normalizer, send } = setup({ log: records });
    const good = encodeKvBatch({ ts: 1, events: [store([1n, 2n], null)] }, { form: "array" });
    const bad = good.slice();
    bad[bad.length - 2] = 0xc1; // inside the last event: the first event decoded fine, but the batch is refused whole
    expect(normalizer.ingest(bad)).toBe(false);
    expect(normalizer.ingest(bad)).toBe(false);
    expect(sink.ops).toEqual([]);
    expect(normalizer.counters.batchesDropped).toBe(2);
    expect(
      Object.entries(normalizer.counters.decodeErrors).filter(([, count]) => count > 0),
    ).toHaveLength(1);
    expect(records.records.filter((record) => record.level === "warn")).toHaveLength(1);
    expect(send([store([1n], null)])).toBe(true);
    expect(sink.ops).toHaveLength(1);
  });

  test("counters add up", () => {
    const { normalizer, send } = setup();
    const batch: KvBatch = {
      ts: 1,
      events: [
        store([1n], null),
        { type: "BlockRemoved", blockHashes: [1n] },
        { type: "AllBlocksCleared" },
      ],
    };
    send([...batch.events]);
    expect(normalizer.counters.events).toEqual({ stored: 1, removed: 1, cleared: 1 });
    expect(normalizer.counters.appliedStoredBlocks).toBe(1);
    expect(normalizer.counters.appliedRemovedBlocks).toBe(1);
    expect(normalizer.counters.appliedClears).toBe(1);
    expect(normalizer.counters.batches).toBe(1);
  });
});

describe("an event that cannot be read", () => {
  /** [1.0, [stored h1, <bad store>, ...tail], 0]: the bad store has a string for a hash. */
  const batchWith = (...tail: unknown[]) =>
    new Packr({ useRecords: false }).pack([
      1,
      [
        ["BlockStored", [1], null, [1, 2, 3, 4], 4, null, "GPU", null],
        ["BlockStored", ["not-a-hash"], null, [5, 6, 7, 8], 4, null, "GPU", null],
        ...tail,
      ],
      0,
    ]);

  test("is skipped and counted alone: the rest of its batch is applied; the batch is incomplete", () => {
    const records = memoryLogger();
    const { sink, normalizer } = setup({ log: records });
    expect(normalizer.ingest(batchWith(["BlockRemoved", [9], "GPU"]))).toBe(true);
    expect(sink.ops.map((op) => op.op)).toEqual(["stored", "removed"]);
    expect(normalizer.incomplete).toBe(true);
    expect(normalizer.counters.skippedEvents.bad_hash).toBe(1);
    expect(normalizer.counters.batchesDropped).toBe(0);
    expect(records.records.filter((record) => record.level === "warn")).toHaveLength(1);
  });

  test("a clear after it makes the state known again; one before it does not", () => {
    const { normalizer } = setup();
    normalizer.ingest(batchWith(["AllBlocksCleared"]));
    expect(normalizer.incomplete).toBe(false);
    const before = new Packr({ useRecords: false }).pack([
      1,
      [["AllBlocksCleared"], ["BlockRemoved", "not-a-list", "GPU"]],
      0,
    ]);
    normalizer.ingest(before);
    expect(normalizer.incomplete).toBe(true);
    expect(normalizer.counters.skippedEvents.bad_hash).toBe(2);
  });
});

describe("LoRA identity", () => {
  const local = (lora: string | null) =>
    hashTokens(TOKENS.slice(0, 4), 4, { loraName: lora }).local;

  test("blocks named only by lora_id are keyed apart from the base model and from every name", () => {
    const { sink, send } = setup();
    send([store([1n], null, { loraId: 3 })], null, "vllm-v3");
    const op = sink.ops[0]!;
    const hashed = op.op === "stored" ? op.local : [];
    expect(hashed).not.toEqual(local(null));
    expect(hashed).toEqual(local(new LoraAdapters().identity(null, 3)));
    expect(hashed).not.toEqual(local("3"));
  });

  test("a configured adapter turns the id into its name; a name sent by the engine wins", () => {
    const lora = new LoraAdapters([{ name: "sql-lora", id: 3 }]);
    const { sink, send } = setup({ lora });
    send([store([1n], null, { loraId: 3 })], null, "vllm-v3");
    send([store([2n], null, { loraId: 3, loraName: "other" })], null, "vllm-v4");
    expect(sink.ops.map((op) => op.op === "stored" && op.local)).toEqual([
      local("sql-lora"),
      local("other"),
    ]);
  });
});

describe("namespaces: an unsalted store over salted blocks (Dynamo's rule)", () => {
  test("makes them ambiguous: a child store that would inherit is filtered", () => {
    const { sink, normalizer, send } = setup();
    send(
      [store([1n], null, { cacheSalt: "a" }), store([1n], null), store([2n], 1n)],
      null,
      "sglang-s5",
    );
    expect(sink.ops.filter((op) => op.op === "stored")).toHaveLength(2);
    expect(normalizer.counters.rejectedEvents.namespace_ambiguous).toBe(1);
  });
});

describe("vLLM V5's bare multimodal ids", () => {
  test("a custom MM id in block 0 recurring in block 1 is no salt: the blocks are rejected", () => {
    const { sink, normalizer, send } = setup();
    send(
      [store([1n, 2n], null, { extraKeys: [["uuid-image-A"], ["uuid-image-A"]] })],
      null,
      "vllm-v5",
    );
    expect(sink.ops).toEqual([]);
    expect(normalizer.counters.rejectedBlocks.multimodal_unsupported).toBe(2);
  });
});
