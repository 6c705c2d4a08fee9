// Goal: the KV-event walker decodes every shape vLLM and SGLang send (array and map
// eras, tails, hash encodings, Eagle pairs, salts, SGLang's metadata) to exactly the
// expected columns, skips an event it cannot read alone (the rest of the batch
// decoded), refuses a batch it cannot walk with the right stable code, and the encoder
// writes the bytes an engine writes. Method: fixtures encoded by an independent encoder
// (Python msgpack) with hand-written expectations, hand-assembled hex, seeded random
// batches of every producer variant compared three ways (walker, msgpackr reference,
// source objects), and one crafted input per error code.
import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import fixtures from "../fixtures/kv-events/vllm-fixtures.json";
import {
  DECODE_ERROR_KINDS,
  DECODE_OK,
  DecodedBatch,
  decodeKvBatch,
  encodeKvBatch,
  EVENT_SKIPPED,
  WIRE_VARIANTS,
  type KvBatch,
  type KvHash,
  type WireVariant,
} from "../../src/wire/kv-events";
import {
  expectedSnapshot,
  randomBatch,
  referenceDecode,
  snapshotBatch,
  xorshift,
  type BatchSnapshot,
} from "../support/kv-events";

// msgpackr's default packer writes objects as records; plain maps are wanted here.
const packer = new Packr({ useRecords: false });
const pack = (value: unknown) => packer.pack(value);
const hex = (text: string) =>
  Uint8Array.from(Buffer.from(text.replace(/#.*$/gm, "").replace(/\s+/g, ""), "hex"));
const toHex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");

function decode(payload: Uint8Array, batch = new DecodedBatch()): BatchSnapshot | string {
  const status = decodeKvBatch(payload, batch);
  return status === DECODE_OK ? snapshotBatch(batch) : DECODE_ERROR_KINDS[status]!;
}

interface FixtureEvent {
  hashes: string[];
  parent: string | null;
  [key: string]: unknown;
}
interface Fixture {
  name: string;
  hex: string;
  expect: { events: FixtureEvent[]; [key: string]: unknown };
  batch?: unknown;
  variant?: WireVariant;
}

function expectedOf(fixture: Fixture): BatchSnapshot {
  return {
    ...fixture.expect,
    events: fixture.expect.events.map((event) => ({
      ...event,
      hashes: event.hashes.map(BigInt),
      parent: event.parent === null ? null : BigInt(event.parent),
    })),
  } as unknown as BatchSnapshot;
}

/** Fixture hashes are "u:<u64>", "i:<i64>" or "b:<hex digest>". */
function batchOf(fixture: Fixture): KvBatch {
  const hash = (text: string): KvHash =>
    text.startsWith("b:") ? hex(text.slice(2)) : BigInt(text.slice(2));
  return JSON.parse(JSON.stringify(fixture.batch), (key, value) => {
    if (key === "blockHashes") return (value as string[]).map(hash);
    if (key === "parentBlockHash") return value === null ? null : hash(value as string);
    return value;
  }) as KvBatch;
}

describe("fixtures from an independent encoder (Python msgpack)", () => {
  for (const fixture of fixtures as Fixture[]) {
    test(fixture.name, () => {
      const payload = hex(fixture.hex);
      expect(decode(payload)).toEqual(expectedOf(fixture));
      const reference = referenceDecode(payload);
      expect(reference.ok && reference.batch).toEqual(expectedOf(fixture));
      if (fixture.batch !== undefined) {
        const encoded = encodeKvBatch(batchOf(fixture), { variant: fixture.variant! });
        expect(toHex(encoded)).toBe(fixture.hex);
      }
    });
  }
});

describe("hand-assembled bytes", () => {
  test("array era BlockStored with a 3-byte hash, a negative fixint hash and a uint16 token", () => {
    const payload = hex(`
      93                                  # batch: array of 3
        cb 41d9 54fc 4000 0000            # ts = 1700000000.0 as float64
        91                                # events: array of 1
          98                              # BlockStored: 8 fields
            ab 426c6f636b53746f726564     # "BlockStored"
            92 c4 03 010203  ff           # hashes: bytes 01 02 03 -> 0x010203; -1 -> 2^64 - 1
            cc c8                         # parent: uint8 200
            92 cd 1234 00                 # tokens: 0x1234, 0
            02                            # block_size 2
            c0                            # lora_id nil
            a3 475055                     # medium "GPU"
            a1 78                         # lora_name "x"
        07                                # dp rank 7
    `);
    expect(decode(payload)).toEqual({
      ts: 1700000000,
      dpRank: 7,
      unknownTags: 0,
      unknownFields: 0,
      events: [
        {
          kind: "stored",
          hashes: [0x010203n, 2n ** 64n - 1n],
          parent: 200n,
          tokens: [0x1234, 0],
          eagle: false,
          blockSize: 2,
          medium: "GPU",
          loraName: "x",
          loraId: null,
          cacheSalt: null,
          groupIdx: null,
          slidingWindow: null,
          specKind: null,
          locality: null,
          ownership: null,
          mmBlock: -1,
        },
      ],
    });
  });

  test("int64 and uint64 hashes are the same 64 bits; float32 ts; array16 and str8 headers", () => {
    const payload = hex(`
      92 ca 3f800000                      # [1.0f32,
        dc 0001                           #  events as array16 of 1
          93 ac 426c6f636b52656d6f766564  #  ["BlockRemoved",
             92 d3 8000000000000000       #    [int64 -2^63,
                cf 8000000000000000       #     uint64 2^63],
             d9 03 475055                 #    "GPU" as str8]]
    `);
    const snapshot = decode(payload) as BatchSnapshot;
    expect(snapshot.ts).toBe(1);
    expect(snapshot.events[0]!.hashes).toEqual([2n ** 63n, 2n ** 63n]);
    expect(snapshot.events[0]!.medium).toBe("GPU");
  });

  test("the encoder's bytes for a two-event vLLM V4 batch (hexdump snapshot)", () => {
    const bytes = encodeKvBatch(
      {
        ts: 1.5,
        dpRank: 1,
        events: [
          {
            type: "BlockStored",
            blockHashes: [2n ** 64n - 2n],
            parentBlockHash: null,
            tokenIds: [1, 2],
            blockSize: 2,
            loraId: null,
            medium: "GPU",
            loraName: null,
          },
          { type: "AllBlocksCleared" },
        ],
      },
      { variant: "vllm-v4" },
    );
    expect(hexdump(bytes)).toMatchInlineSnapshot(`
      "00000000  93 cb 3f f8 00 00 00 00  00 00 92 98 ab 42 6c 6f  |..?..........Blo|
      00000010  63 6b 53 74 6f 72 65 64  91 cf ff ff ff ff ff ff  |ckStored........|
      00000020  ff fe c0 92 01 02 02 c0  a3 47 50 55 c0 91 b0 41  |.........GPU...A|
      00000030  6c 6c 42 6c 6f 63 6b 73  43 6c 65 61 72 65 64 01  |llBlocksCleared.|"
    `);
  });
});

function hexdump(bytes: Uint8Array): string {
  const lines: string[] = [];
  for (let at = 0; at < bytes.length; at += 16) {
    const row = Array.from(bytes.subarray(at, at + 16));
    const cells = row.map((byte) => byte.toString(16).padStart(2, "0"));
    const left = cells.slice(0, 8).join(" ");
    const right = cells.slice(8).join(" ");
    const text = row
      .map((byte) => (byte >= 0x20 && byte < 0x7f ? String.fromCharCode(byte) : "."))
      .join("");
    lines.push(
      `${at.toString(16).padStart(8, "0")}  ${left.padEnd(23)}  ${right.padEnd(23)}  |${text}|`,
    );
  }
  return lines.join("\n");
}

describe("seeded random batches of every variant: walker = msgpackr reference = source", () => {
  WIRE_VARIANTS.forEach((variant, v) => {
    test(variant, () => {
      const next = xorshift(11 + v);
      const decoded = new DecodedBatch();
      for (let round = 0; round < 150; round++) {
        const batch = randomBatch(next, { variant });
        const payload = encodeKvBatch(batch, { variant });
        const expected = expectedSnapshot(batch, variant);
        expect(decode(payload, decoded)).toEqual(expected);
        const reference = referenceDecode(payload);
        expect(reference.ok && reference.batch).toEqual(expected);
      }
    });
  });
});

describe("refused input: one code per kind", () => {
  const valid = encodeKvBatch(
    {
      ts: 1,
      events: [
        {
          type: "BlockStored",
          blockHashes: [1n, 2n],
          parentBlockHash: null,
          tokenIds: [1, 2],
          blockSize: 1,
          loraId: null,
          medium: "GPU",
          loraName: null,
        },
      ],
    },
    { variant: "vllm-v4" },
  );
  const next = pack([2, [["AllBlocksCleared"]]]);
  const base = [[1, 2], null, [1, 2], 1, null, "GPU", null];
  const storedEvent = (fields: unknown[]) => pack(["BlockStored", ...fields]);
  const withField = (index: number, value: unknown) =>
    storedEvent(base.map((field, i) => (i === index ? value : field)));
  type Kind = (typeof DECODE_ERROR_KINDS)[number];
  type Limits = Partial<ConstructorParameters<typeof DecodedBatch>[0]>;

  // What leaves no way to read on: the whole batch is refused.
  const batchCases: [string, Uint8Array, Kind, Limits?][] = [
    ["truncated", valid.subarray(0, valid.length - 3), "truncated"],
    ["trailing bytes", Uint8Array.from([...valid, 0xc0]), "trailing_bytes"],
    [
      "an array32 claiming 2^32 - 1 events",
      hex("92 cb 3ff0000000000000 dd ffffffff 00"),
      "truncated",
    ],
    ["a map16 claiming more pairs than bytes", hex("de ffff a2 7473 01"), "truncated"],
    [
      "the never-used byte 0xc1 inside an event (it cannot be skipped)",
      pack([1, [["BlockStored", [1], null, [1], 1, null, null, null, null, { x: 1 }]]]).map(
        (b, i, a) => (i === a.length - 1 ? 0xc1 : b),
      ),
      "bad_msgpack",
    ],
    ["a batch that is a string", pack("hello"), "bad_batch"],
    ["a batch of one element", pack([1.5]), "bad_batch"],
    ["ts that is a string", pack(["now", []]), "bad_batch"],
    ["events that is a map", pack([1.5, { a: 1 }]), "bad_batch"],
    ["a negative dp rank", pack([1.5, [], -1]), "bad_field"],
    ["a map batch without events", pack({ ts: 1 }), "missing_field"],
    [
      "both dp rank aliases",
      pack({ ts: 1, events: [], dp_rank: 1, data_parallel_rank: 1 }),
      "duplicate_key",
    ],
    ["a payload over the size bound", valid, "too_large", { payloadBytesMax: valid.length - 1 }],
    [
      "more events than allowed",
      pack([1, [["AllBlocksCleared"], ["AllBlocksCleared"]]]),
      "too_many_events",
      { eventsMax: 1 },
    ],
    ["more blocks than allowed", valid, "too_many_blocks", { blocksMax: 1 }],
    ["more tokens than allowed", valid, "too_many_tokens", { tokensMax: 1 }],
    ["an unknown field nested too deep", pack([1, [], null, nest(40)]), "too_deep"],
    [
      "an event nested too deep (it cannot be skipped)",
      pack([1, [["BlockStored", [1], null, [1], 1, null, null, null, null, nest(40)]]]),
      "too_deep",
    ],
  ];
  for (const [name, payload, kind, limits] of batchCases) {
    test(`${name} -> ${kind}, the batch refused whole`, () => {
      const batch = new DecodedBatch(limits);
      expect(decode(payload, batch)).toBe(kind);
      expect(batch.eventCount).toBe(0);
      expect(decode(next, batch)).not.toBeTypeOf("string");
      expect(batch.eventCount).toBe(1);
    });
  }

  // One event that does not fit: skipped alone, what follows it in the batch is read.
  const eventCases: [string, Uint8Array, Kind, "stored" | "removed" | null, Limits?][] = [
    ["an event that is a number", pack(7), "bad_event", null],
    ["an empty event array", pack([]), "bad_event", null],
    ["a tag that is an int", pack([1, [1]]), "bad_event", null],
    ["a map event whose type is an int", pack({ type: 3 }), "bad_event", null],
    ["a string hash", withField(0, ["abc"]), "bad_hash", "stored"],
    ["a float hash", withField(0, [1.5]), "bad_hash", "stored"],
    ["an empty bytes hash", withField(0, [new Uint8Array(0)]), "bad_hash", "stored"],
    ["a 65-byte hash", withField(0, [new Uint8Array(65)]), "bad_hash", "stored"],
    ["a string parent", withField(1, "p"), "bad_hash", "stored"],
    ["a negative token", withField(2, [1, -1]), "bad_tokens", "stored"],
    ["a token of 2^32", withField(2, [2 ** 32]), "bad_tokens", "stored"],
    ["a bigram of three", withField(2, [[1, 2, 3]]), "bad_tokens", "stored"],
    ["a bigram list with a bare token", withField(2, [[1, 2], 3]), "bad_tokens", "stored"],
    ["a block size of nil", withField(3, null), "bad_field", "stored"],
    ["a lora_id that is a string", withField(4, "x"), "bad_field", "stored"],
    ["a lora_id of 2^32", withField(4, 2 ** 32), "bad_field", "stored"],
    ["a medium that is an int", withField(5, 1), "bad_field", "stored"],
    ["metadata whose cache_salt is an int", withField(6, { cache_salt: 1 }), "bad_field", "stored"],
    ["extra keys that are a string", storedEvent([...base, "x"]), "bad_field", "stored"],
    ["a float in the tail", storedEvent([...base, null, 1.5]), "bad_field", "stored"],
    ["a BlockStored of four fields", storedEvent(base.slice(0, 3)), "missing_field", "stored"],
    ["a map event without type", pack({ block_hashes: [] }), "missing_field", null],
    [
      "a map BlockStored without token_ids",
      pack({ type: "BlockStored", block_hashes: [], block_size: 1 }),
      "missing_field",
      "stored",
    ],
    [
      "a repeated map key",
      hex(
        "83 a4 74797065 ac 426c6f636b52656d6f766564 ac 626c6f636b5f686173686573 90 ac 626c6f636b5f686173686573 90",
      ),
      "duplicate_key",
      "removed",
    ],
    [
      "a medium that is not UTF-8",
      hex("93 ac 426c6f636b52656d6f766564 90 a2 c328"),
      "bad_string",
      "removed",
    ],
    ["an unknown tag that is not UTF-8", hex("91 a2 eda0"), "bad_string", null],
    [
      "a medium over the string bound",
      withField(5, "G".repeat(17)),
      "string_too_long",
      "stored",
      { stringBytesMax: 16 },
    ],
  ];
  const good = pack(["BlockRemoved", [5], "GPU"]);
  for (const [name, event, kind, skipped, limits] of eventCases) {
    test(`${name} -> ${kind}, that event skipped alone`, () => {
      const batch = new DecodedBatch(limits);
      // [1.5, [event, good event], 4]
      const payload = Uint8Array.from([...hex("93 cb 3ff8000000000000 92"), ...event, ...good, 4]);
      const snapshot = decode(payload, batch) as BatchSnapshot;
      expect(snapshot.events.map((e) => [e.kind, e.skipped])).toEqual([
        ["skipped", skipped],
        ["removed", undefined],
      ]);
      expect(snapshot.events[1]!.hashes).toEqual([5n]);
      expect(snapshot.dpRank).toBe(4);
      expect(batch.kind[0]).toBe(EVENT_SKIPPED);
      expect(DECODE_ERROR_KINDS[batch.skipError[0]!]).toBe(kind);
      expect(batch.skippedEvents).toBe(1);
      // Nothing of the skipped event stays behind: its hashes and tokens were rolled back.
      expect(batch.hashStart[1]).toBe(0);
      expect(batch.tokenCount).toBe(0);
      const reference = referenceDecode(payload, batch.limits);
      // The reference (msgpackr) reads on past the event too (it may not see the fault).
      if (reference.ok) expect(reference.batch.events.at(-1)!.kind).toBe("removed");
    });
  }

  test("every error kind has a case above", () => {
    const covered = new Set([...batchCases, ...eventCases].map((entry) => entry[2]));
    expect(DECODE_ERROR_KINDS.filter((kind) => kind !== "ok" && !covered.has(kind))).toEqual([]);
  });

  test("a huge count allocates nothing: the hash array keeps its size", () => {
    const batch = new DecodedBatch();
    const before = batch.hashes.length;
    // events: [["BlockStored", <array32 of 2^32 - 1 hashes>, ...]]
    const payload = hex("92 01 91 95 ab 426c6f636b53746f726564 dd fffffffe 01 c0 90 01");
    expect(decode(payload, batch)).toBe("truncated");
    expect(batch.hashes.length).toBe(before);
  });

  test("an error reports the offset of the value that failed", () => {
    const batch = new DecodedBatch();
    const payload = pack([1.5, [], "bad dp rank"]);
    expect(decodeKvBatch(payload, batch)).not.toBe(DECODE_OK);
    expect(payload[batch.errorOffset]).toBe(0xab);
    const event = Uint8Array.from([...hex("92 01 91"), ...withField(5, 1)]);
    expect(decodeKvBatch(event, batch)).toBe(DECODE_OK);
    expect(event[batch.skipAt[0]!]).toBe(0x01);
  });
});

function nest(depth: number): unknown {
  let value: unknown = 0;
  for (let i = 0; i < depth; i++) value = [value];
  return value;
}

describe("unknown tags and fields are skipped and counted", () => {
  test("an unknown tag in either form, unknown keys, extra positional items", () => {
    const payload = pack([
      1.5,
      [
        ["BlockMoved", [1], "CPU"],
        { type: "Renamed", anything: { deep: [1, 2] } },
        ["AllBlocksCleared", null, "future", 3],
        { type: "BlockRemoved", block_hashes: [9], token_ids: [1], future: null },
      ],
      0,
      "extra",
    ]);
    const snapshot = decode(payload) as BatchSnapshot;
    expect(snapshot.unknownTags).toBe(2);
    // 2 positional items after ownership, 2 keys BlockRemoved does not have, 1 batch item.
    expect(snapshot.unknownFields).toBe(5);
    expect(snapshot.events.map((event) => event.kind)).toEqual(["cleared", "removed"]);
  });

  test("non-string map keys are unknown fields", () => {
    const event = new Map<unknown, unknown>([
      ["type", "BlockRemoved"],
      [1, "x"],
      ["block_hashes", [4]],
    ]);
    const snapshot = decode(pack([1, [event]])) as BatchSnapshot;
    expect(snapshot.unknownFields).toBe(1);
    expect(snapshot.events[0]!.hashes).toEqual([4n]);
  });
});

describe("extra keys: the salt, and the first block kvedge cannot hash", () => {
  /** A vLLM V5 (9 fields) or, with `tail`, a V6+ store: [salt, mmBlock]. */
  const read = (extraKeys: unknown, loraName: string | null = null, tail: unknown[] = []) => {
    const snapshot = decode(
      pack([
        1,
        [["BlockStored", [1, 2], null, [1, 2], 1, null, null, loraName, extraKeys, ...tail]],
      ]),
    ) as BatchSnapshot;
    const event = snapshot.events[0]!;
    return [event.cacheSalt, event.mmBlock];
  };
  test("vLLM's raw salt after the LoRA name; an MM hash and bytes make block 0 unhashable", () => {
    expect(read([["lora", "a".repeat(64), "tenant", new Uint8Array(4)]], "lora")).toEqual([
      "tenant",
      0,
    ]);
  });
  test("the LoRA name alone on every block is hashed (seeded by name)", () => {
    expect(read([["lora"], ["lora"]], "lora")).toEqual([null, -1]);
  });
  test("only the first string equal to the LoRA name is the adapter's", () => {
    expect(read([["lora", "lora"]], "lora")).toEqual(["lora", -1]);
  });
  test("Dynamo's prefixed salt wins; a bare string beside it is a multimodal id", () => {
    expect(read([["mm-uuid", "dynamo-cache-salt:tenant"]])).toEqual(["tenant", 0]);
  });
  test("two bare strings in block 0: the last is the salt, the other a multimodal id", () => {
    expect(read([["uuid-image-A", "tenant"]])).toEqual(["tenant", 0]);
  });
  test("a bare string of block 0 that recurs in block 1 is a multimodal id, no salt", () => {
    expect(read([["uuid-image-A"], ["uuid-image-A"]])).toEqual([null, 0]);
  });
  test("any other item in a later block makes that block unhashable; salts are block 0's only", () => {
    expect(read([null, ["tenant"]])).toEqual([null, 1]);
    expect(read([["tenant"], [["0123", 4]]])).toEqual(["tenant", 1]);
    expect(read(null)).toEqual([null, -1]);
  });
  test("in the pair era (10+ fields) a bare 64-hex string is a salt, a pair a multimodal id", () => {
    expect(read([["a".repeat(64)]], null, [0])).toEqual(["a".repeat(64), -1]);
    expect(read([[["uuid-image-A", 0]]], null, [0])).toEqual([null, 0]);
  });
  test("an empty prefixed salt stays the raw string (the engine hashed that)", () => {
    expect(read([["dynamo-cache-salt:"]])).toEqual(["dynamo-cache-salt:", -1]);
  });
  test("a map event's extra keys before its lora_name are read once the name is known", () => {
    const payload = pack([
      1,
      [
        new Map<string, unknown>([
          ["type", "BlockStored"],
          ["block_hashes", [1]],
          ["token_ids", [1]],
          ["block_size", 1],
          ["extra_keys", [["lora", "tenant"]]],
          ["lora_name", "lora"],
        ]),
      ],
    ]);
    const event = (decode(payload) as BatchSnapshot).events[0]!;
    expect([event.cacheSalt, event.mmBlock, event.loraName]).toEqual(["tenant", -1, "lora"]);
    expect(referenceDecode(payload)).toEqual({
      ok: true,
      batch: decode(payload) as BatchSnapshot,
    });
  });
});

describe("SGLang's metadata and LoRA ids", () => {
  test("a map or an array at position 7 is SGLang's metadata, not a LoRA name", () => {
    for (const metadata of [{ cache_salt: "s", session_id: "x" }, ["s", "x"]]) {
      const event = (
        decode(
          pack([1, [["BlockStored", [1], null, [1], 1, null, "GPU", metadata]], 0]),
        ) as BatchSnapshot
      ).events[0]!;
      expect([event.cacheSalt, event.loraName]).toEqual(["s", null]);
    }
  });
  test("lora_id is kept in both forms", () => {
    const array = decode(pack([1, [["BlockStored", [1], null, [1], 1, 7]]])) as BatchSnapshot;
    const map = decode(
      pack([
        1,
        [{ type: "BlockStored", block_hashes: [1], token_ids: [1], block_size: 1, lora_id: 9 }],
      ]),
    ) as BatchSnapshot;
    expect([array.events[0]!.loraId, map.events[0]!.loraId]).toEqual([7, 9]);
  });
  test("session_id is read and not counted as unknown", () => {
    const snapshot = decode(
      pack([
        1,
        [
          {
            type: "BlockStored",
            block_hashes: [1],
            token_ids: [1],
            block_size: 1,
            session_id: "s",
          },
        ],
      ]),
    ) as BatchSnapshot;
    expect(snapshot.unknownFields).toBe(0);
  });
});

test("a reused DecodedBatch grows for a large batch and keeps no stale data after a small one", () => {
  const batch = new DecodedBatch();
  const large: KvBatch = {
    ts: 1,
    events: Array.from({ length: 200 }, (_, e) => ({
      type: "BlockStored" as const,
      blockHashes: Array.from({ length: 64 }, (_, i) => BigInt(e * 64 + i)),
      parentBlockHash: null,
      tokenIds: Array.from({ length: 64 * 16 }, (_, i) => i),
      blockSize: 16,
      loraId: null,
      medium: "GPU",
      loraName: null,
    })),
  };
  expect(
    (decode(encodeKvBatch(large, { variant: "vllm-v7" }), batch) as BatchSnapshot).events,
  ).toHaveLength(200);
  expect(batch.hashes.length).toBeGreaterThanOrEqual(2 * 200 * 64);
  const small: KvBatch = { ts: 2, events: [{ type: "BlockRemoved", blockHashes: [5n] }] };
  expect(decode(encodeKvBatch(small, { variant: "vllm-v9" }), batch)).toEqual(
    expectedSnapshot(small, "vllm-v9"),
  );
});
