import { describe, expect, test } from "bun:test";
import { Unpackr } from "msgpackr";
import { xorshift32 } from "../../src/util/random";
import { MsgpackEncoder, type MsgpackValue } from "../../src/wire/msgpack";

const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });
const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");

function written(value: MsgpackValue): Uint8Array {
  const encoder = new MsgpackEncoder(8);
  encoder.value(value);
  return encoder.finish();
}

describe("MsgpackEncoder", () => {
  test("smallest encodings, byte for byte", () => {
    const cases: [MsgpackValue, string][] = [
      [null, "c0"],
      [undefined, "c0"],
      [true, "c3"],
      [false, "c2"],
      [0, "00"],
      [127, "7f"],
      [128, "cc80"],
      [255, "ccff"],
      [256, "cd0100"],
      [65_536, "ce00010000"],
      [2 ** 32, "cf0000000100000000"],
      [-1, "ff"],
      [-32, "e0"],
      [-33, "d0df"],
      [-129, "d1ff7f"],
      [-32_769, "d2ffff7fff"],
      [-(2 ** 31) - 1, "d3ffffffff7fffffff"],
      [5n, "05"],
      [200n, "ccc8"],
      [2n ** 64n - 1n, "cfffffffffffffffff"],
      [-(2n ** 63n), "d38000000000000000"],
      [0.5, "cb3fe0000000000000"],
      [2 ** 53, "cb4340000000000000"],
      [Number.NaN, "cb7ff8000000000000"],
      ["", "a0"],
      ["a", "a161"],
      ["x".repeat(31), `bf${"78".repeat(31)}`],
      ["x".repeat(32), `d920${"78".repeat(32)}`],
      ["é", "a2c3a9"],
      [new Uint8Array([1, 2]), "c4020102"],
      [[], "90"],
      [[1, [2]], "92019102"],
      [{}, "80"],
      [{ a: 1, b: undefined }, "81a16101"],
      [new Array(16).fill(0), `dc0010${"00".repeat(16)}`],
      [new Array(65_536).fill(0), `dd00010000${"00".repeat(65_536)}`],
    ];
    for (const [value, expected] of cases)
      expect([value, hex(written(value))]).toEqual([value, expected]);
  });

  test("out-of-range bigints are refused", () => {
    expect(() => written(2n ** 64n)).toThrow(RangeError);
    expect(() => written(-(2n ** 63n) - 1n)).toThrow(RangeError);
  });

  test("random nested values decode with msgpackr to what was written", () => {
    const random = xorshift32(7);
    const pick = (n: number) => random() % n;
    const text = (): string => {
      const length = [0, 1, 31, 32, 33, 63, 64, 65, 255, 256, 70_000][pick(11)]!;
      // Whole code points (a lone surrogate would not survive UTF-8).
      const alphabet = Array.from(pick(3) === 0 ? "aé€😀" : "abcxyz_-09");
      let s = "";
      while (s.length < length) s += alphabet[pick(alphabet.length)]!;
      return s;
    };
    const value = (depth: number): MsgpackValue => {
      switch (depth > 3 ? pick(6) : pick(9)) {
        case 0:
          return null;
        case 1:
          return pick(2) === 0;
        case 2:
          return (random() - 2 ** 31) * (pick(2) === 0 ? 1 : 2 ** 20);
        case 3:
          return (random() / 7) * (pick(2) === 0 ? 1 : -1);
        case 4:
          return BigInt.asUintN(64, (BigInt(random()) << 32n) | BigInt(random()));
        case 5:
          return text();
        case 6:
          return Array.from({ length: [0, 3, 15, 16][pick(4)]! }, () => value(depth + 1));
        case 7:
          return new Uint8Array(Array.from({ length: pick(300) }, () => pick(256)));
        default: {
          const object: Record<string, MsgpackValue> = {};
          for (let i = pick(20); i > 0; i--) object[text() || "k"] = value(depth + 1);
          return object;
        }
      }
    };
    const encoder = new MsgpackEncoder(4);
    for (let i = 0; i < 500; i++) {
      const original = value(0);
      encoder.reset();
      encoder.value(original);
      const decoded = unpackr.unpack(encoder.written());
      // msgpackr turns uint64 values below 2^53 into numbers and bins into Buffers.
      const normalize = (v: unknown): unknown => {
        if (typeof v === "bigint") return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
        if (v instanceof Uint8Array) return hex(v);
        if (Array.isArray(v)) return v.map(normalize);
        if (v !== null && typeof v === "object")
          return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, normalize(x)]));
        return v;
      };
      expect(normalize(decoded)).toEqual(normalize(original));
    }
  });

  test("reset reuses the buffer; written() is a view, finish() a copy", () => {
    const encoder = new MsgpackEncoder(4);
    encoder.value({ request_id: "r1", worker_id: "7", candidates: [{ cost: 1.5 }] });
    const copy = encoder.finish();
    const view = encoder.written();
    expect(hex(view)).toBe(hex(copy));
    encoder.reset();
    encoder.value(1);
    expect(hex(encoder.written())).toBe("01");
    expect(unpackr.unpack(copy)).toEqual({
      request_id: "r1",
      worker_id: "7",
      candidates: [{ cost: 1.5 }],
    });
  });
});
