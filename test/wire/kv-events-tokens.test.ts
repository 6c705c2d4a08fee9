// Goal: token ids decode exactly whichever reader takes them: the native msgpack reader
// (arrays of 8 or more ids, when the library is loaded) and the TypeScript loop (short
// arrays, the encodings the native reader hands back mid-array, and the fallback),
// including arrays that end next to the payload's last byte and payloads cut short.
// Method: BlockStored batches assembled byte by byte with each id in a chosen encoding
// (fixint, uint8/16/32, and the ones only the general path reads: uint64 and signed
// ints of positive value), decoded and compared with the ids; the native reader called
// directly on exact-size inputs; and this file plus the other decoder suites run again
// in a process without the native library.
import { describe, expect, test } from "bun:test";
import { native } from "../../src/native/library";
import {
  DECODE_OK,
  DecodedBatch,
  decodeKvBatch,
  E_BAD_TOKENS,
  E_TRUNCATED,
  EVENT_SKIPPED,
} from "../../src/wire/kv-events";
import { xorshift } from "../support/kv-events";
import { expectChildSuitePasses } from "../support/suite";

/** `value` as `bytes` big-endian bytes. */
const be = (value: number, bytes: number) =>
  Array.from({ length: bytes }, (_, i) => (value >>> (8 * (bytes - 1 - i))) & 0xff);

/** One id in encoding `kind` (a kind that cannot hold it falls back to uint32). */
function encodeId(value: number, kind: number): number[] {
  switch (kind) {
    case 0:
      if (value < 0x80) return [value];
      break;
    case 1:
      if (value < 0x100) return [0xcc, value];
      break;
    case 2:
      if (value < 0x1_0000) return [0xcd, ...be(value, 2)];
      break;
    case 4:
      return [0xcf, 0, 0, 0, 0, ...be(value, 4)];
    case 5:
      if (value < 0x8000_0000) return [0xd2, ...be(value, 4)];
      break;
    case 6:
      if (value < 0x80) return [0xd0, value];
      break;
    case 7:
      return [0xd3, 0, 0, 0, 0, ...be(value, 4)];
  }
  return [0xce, ...be(value, 4)];
}

function arrayHeader(count: number): number[] {
  if (count < 16) return [0x90 + count];
  return count < 0x1_0000 ? [0xdc, ...be(count, 2)] : [0xdd, ...be(count, 4)];
}

/** `[0, [["BlockStored", [7], nil, ids, 16]]]` with each id in its own encoding. */
function storedBatch(ids: number[], kinds: number[]): Uint8Array {
  const tag = [0xab, ..."BlockStored"].map((c) => (typeof c === "string" ? c.charCodeAt(0) : c));
  const tokens = ids.flatMap((id, i) => encodeId(id, kinds[i]!));
  const event = [0x95, ...tag, 0x91, 0x07, 0xc0, ...arrayHeader(ids.length), ...tokens, 0x10];
  return Uint8Array.from([0x92, 0x00, 0x91, ...event]);
}

function decodedIds(payload: Uint8Array, batch: DecodedBatch): number[] | number {
  const status = decodeKvBatch(payload, batch);
  if (status !== DECODE_OK) return status;
  const start = batch.tokenStart[0]!;
  return Array.from(batch.tokens.subarray(start, start + batch.tokenLength[0]!));
}

/** The ids at each encoding's bounds. */
const EDGES = [0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x1_0000, 0x7fff_ffff, 0xffff_ffff];

function randomIds(next: () => number, count: number): { ids: number[]; kinds: number[] } {
  const ids: number[] = [];
  const kinds: number[] = [];
  for (let i = 0; i < count; i++) {
    const pick = next() % 100;
    // Mostly what engines send (uint16 / uint32 ids of a 128k vocabulary), some small ids,
    // a few encodings only the general path reads, and the extremes.
    const small = pick < 15 ? next() % 0x100 : next() % 200_000;
    const id = pick < 8 ? EDGES[next() % EDGES.length]! : small;
    ids.push(id);
    const kind = next() % 100;
    kinds.push(kind < 85 ? 3 : kind < 90 ? next() % 3 : 4 + (next() % 4));
  }
  return { ids, kinds };
}

describe("token ids in every encoding", () => {
  test("random arrays of 0-40 and 200-700 ids decode to their ids", () => {
    const next = xorshift(20);
    const batch = new DecodedBatch();
    for (let round = 0; round < 3000; round++) {
      const count = round % 10 === 0 ? 200 + (next() % 500) : next() % 41;
      const { ids, kinds } = randomIds(next, count);
      expect(decodedIds(storedBatch(ids, kinds), batch)).toEqual(ids);
    }
  });

  test("arrays of what engines send, and with another encoding at each position", () => {
    const next = xorshift(21);
    const batch = new DecodedBatch();
    for (const count of [7, 8, 9, 16, 64, 129]) {
      const { ids } = randomIds(next, count);
      const engineKinds = ids.map((id) => (id < 0x1_0000 ? 2 : 3));
      expect(decodedIds(storedBatch(ids, engineKinds), batch)).toEqual(ids);
      for (let at = 0; at < count; at++) {
        const kinds: number[] = [...engineKinds];
        kinds[at] = 4 + (at % 4);
        expect(decodedIds(storedBatch(ids, kinds), batch)).toEqual(ids);
      }
    }
  });

  test("a batch cut anywhere in its token ids is refused as truncated, with nothing kept", () => {
    const next = xorshift(22);
    const batch = new DecodedBatch();
    for (const count of [5, 12, 40]) {
      const { ids, kinds } = randomIds(next, count);
      const payload = storedBatch(ids, kinds);
      for (let cut = 20; cut < payload.length; cut++) {
        expect(decodedIds(payload.subarray(0, cut), batch)).toBe(E_TRUNCATED);
        expect(batch.eventCount).toBe(0);
      }
    }
  });

  test("a negative id in the middle of a long array makes its event skipped", () => {
    const ids = Array.from({ length: 20 }, (_, i) => 1000 + i);
    const payload = [
      ...storedBatch(
        ids,
        ids.map(() => 3),
      ),
    ];
    // The 11th id becomes -1 (16 bytes before the array, its 1-byte header, 5 bytes an id).
    const at = 17 + 10 * 5;
    payload.splice(at, 5, 0xff);
    const batch = new DecodedBatch();
    expect(decodeKvBatch(Uint8Array.from(payload), batch)).toBe(DECODE_OK);
    expect([batch.kind[0], batch.skipError[0], batch.tokenCount]).toEqual([
      EVENT_SKIPPED,
      E_BAD_TOKENS,
      0,
    ]);
  });
});

/** The reference: positive fixint, uint8, uint16, uint32, one at a time; stops at anything else. */
function readOneByOne(bytes: Uint8Array, count: number): { values: number[]; end: number } {
  const values: number[] = [];
  let p = 0;
  while (values.length < count && p < bytes.length) {
    const type = bytes[p]!;
    const size = type < 0x80 ? 1 : type === 0xcc ? 2 : type === 0xcd ? 3 : type === 0xce ? 5 : 0;
    if (size === 0 || p + size > bytes.length) break;
    let value = type < 0x80 ? type : 0;
    for (let k = 1; k < size; k++) value = value * 256 + bytes[p + k]!;
    values.push(value);
    p += size;
  }
  return { values, end: p };
}

describe.skipIf(native === null)("the native msgpack reader", () => {
  // Read at call time: this body runs (and is skipped) without the library too.
  const read = (
    bytes: Uint8Array,
    length: number,
    start: number,
    count: number,
    out: Uint32Array,
    at: number,
    end: Uint32Array,
  ) => native!.kv_msgpack_u32s(bytes, length, start, count, out, at, end);

  test("reads up to count values into out[at..], stopping at another encoding or the end", () => {
    const bytes = Uint8Array.from([
      0x05, 0xcc, 0xfe, 0xcd, 0x12, 0x34, 0xce, 0xde, 0xad, 0xbe, 0xef, 0xd0, 0x01,
    ]);
    const out = new Uint32Array(8).fill(9);
    const end = new Uint32Array(1);
    expect(read(bytes, bytes.length, 0, 8, out, 2, end)).toBe(4);
    expect(Array.from(out)).toEqual([9, 9, 5, 0xfe, 0x1234, 0xdeadbeef, 9, 9]);
    expect(end[0]).toBe(11);
    expect(read(bytes, bytes.length, 1, 2, out, 0, end)).toBe(2);
    expect(end[0]).toBe(6);
    // A value cut by the end of the input is not read.
    expect(read(bytes, 9, 0, 8, out, 0, end)).toBe(3);
    expect(end[0]).toBe(6);
    expect(read(bytes, bytes.length, 13, 4, out, 0, end)).toBe(0);
    expect(end[0]).toBe(13);
  });

  test("equals a one-value-at-a-time reading on random inputs of their exact size", () => {
    const next = xorshift(23);
    const out = new Uint32Array(512);
    const end = new Uint32Array(1);
    for (let round = 0; round < 2000; round++) {
      const { ids, kinds } = randomIds(next, next() % 120);
      const bytes = Uint8Array.from(ids.flatMap((id, i) => encodeId(id, kinds[i]!)));
      const cut = bytes.subarray(0, next() % (bytes.length + 1)).slice();
      const { values: expected, end: p } = readOneByOne(cut, ids.length);
      const got = read(cut, cut.length, 0, ids.length, out, 0, end);
      expect(Array.from(out.subarray(0, got))).toEqual(expected);
      expect(end[0]).toBe(p);
    }
  });
});

// The decoder suites again with the TypeScript loop reading every id.
test.skipIf(native === null)(
  "the decoder suites pass without native code",
  () => {
    const suites = ["kv-events-tokens.test.ts", "kv-events.test.ts", "kv-events-fuzz.test.ts"].map(
      (file) => `${import.meta.dir}/${file}`,
    );
    expectChildSuitePasses(suites, { KVEDGE_NATIVE: "0" });
  },
  120_000,
);
