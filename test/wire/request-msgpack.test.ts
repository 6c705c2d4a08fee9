import { describe, expect, test } from "bun:test";
import { pack, Unpackr } from "msgpackr";
import { parseBody, tokenIds } from "../../src/http/http";
import { BinRef, MsgpackRequestReader } from "../../src/wire/request-msgpack";
import { xorshift32 } from "../../src/util/random";
import { KvedgeError } from "../../src/domain/errors";

const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });

/** A MessagePack writer that picks among the encodings of each value at random. */
function encoder(random: () => number) {
  const out: number[] = [];
  const pick = <T>(options: T[]): T => options[random() % options.length]!;
  const be = (value: number, bytes: number) => {
    for (let i = bytes - 1; i >= 0; i--) out.push(Math.floor(value / 256 ** i) % 256);
  };
  const header = (
    length: number,
    fix: number | null,
    w8: number | null,
    w16: number,
    w32: number,
  ) => {
    const forms: (() => void)[] = [
      () => {
        out.push(w16);
        be(length, 2);
      },
      () => {
        out.push(w32);
        be(length, 4);
      },
    ];
    if (fix !== null && length < (fix === 0xa0 ? 32 : 16)) forms.push(() => out.push(fix + length));
    if (w8 !== null && length < 256)
      forms.push(() => {
        out.push(w8);
        be(length, 1);
      });
    pick(forms.filter((_, i) => length < 65536 || i !== 0))();
  };
  const api = {
    out,
    map: (entries: number) => header(entries, 0x80, null, 0xde, 0xdf),
    array: (length: number) => header(length, 0x90, null, 0xdc, 0xdd),
    str: (text: string) => {
      const bytes = Buffer.from(text, "utf8");
      header(bytes.length, 0xa0, 0xd9, 0xda, 0xdb);
      out.push(...bytes);
    },
    bin: (bytes: Uint8Array) => {
      header(bytes.length, null, 0xc4, 0xc5, 0xc6);
      out.push(...bytes);
    },
    int: (value: number) => {
      const forms: (() => void)[] = [];
      if (value >= 0 && value <= 0x7f) forms.push(() => out.push(value));
      if (value >= -32 && value < 0) forms.push(() => out.push(0x100 + value));
      if (value >= 0 && value <= 0xff)
        forms.push(() => {
          out.push(0xcc);
          be(value, 1);
        });
      if (value >= 0 && value <= 0xffff)
        forms.push(() => {
          out.push(0xcd);
          be(value, 2);
        });
      if (value >= 0 && value <= 0xffff_ffff)
        forms.push(() => {
          out.push(0xce);
          be(value, 4);
        });
      if (value >= -128 && value <= 127)
        forms.push(() => {
          out.push(0xd0);
          be((value + 256) % 256, 1);
        });
      if (value >= -32768 && value <= 32767)
        forms.push(() => {
          out.push(0xd1);
          be((value + 65536) % 65536, 2);
        });
      if (value >= -(2 ** 31) && value < 2 ** 31)
        forms.push(() => {
          out.push(0xd2);
          be((value + 2 ** 32) % 2 ** 32, 4);
        });
      // 64-bit forms: msgpackr gives bigints, the reader declines.
      if (value >= 0)
        forms.push(() => {
          out.push(0xcf);
          be(value, 8);
        });
      pick(forms)();
    },
    float64: (value: number) => {
      const bytes = new Uint8Array(8);
      new DataView(bytes.buffer).setFloat64(0, value);
      out.push(0xcb, ...bytes);
    },
    float32: (value: number) => {
      const bytes = new Uint8Array(4);
      new DataView(bytes.buffer).setFloat32(0, value);
      out.push(0xca, ...bytes);
    },
  };
  return api;
}

const KEYS = [
  "id",
  "op",
  "request_id",
  "lora_name",
  "lora_id",
  "cache_salt",
  "expected_output_tokens",
  "overlap_score_credit",
  "prefill_load_scale",
  "temperature",
  "candidates",
];

/** A random frame: mostly what the reader takes, sometimes something it must decline. */
function randomFrame(random: () => number): Uint8Array {
  const e = encoder(random);
  const chance = (n: number) => random() % n === 0;
  const scalar = () => {
    switch (random() % 10) {
      case 0:
        e.out.push(0xc0);
        break;
      case 1:
        e.out.push(chance(2) ? 0xc2 : 0xc3);
        break;
      case 2:
        e.float64([0, -0, 0.5, 1e300, -2.25, Number.NaN, Infinity][random() % 7]!);
        break;
      case 3:
        if (chance(4)) e.float32(1.5);
        else e.int(random() % 100);
        break;
      case 4:
        e.str(
          chance(6) ? "é-id" : ["route", "match", "done", "prefill_done", "x", ""][random() % 6]!,
        );
        break;
      case 5:
        e.str(`req-${random() % 1000}`);
        break;
      default:
        e.int(
          [
            0,
            1,
            127,
            128,
            255,
            256,
            65535,
            65536,
            2 ** 31 - 1,
            2 ** 32 - 1,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32768,
            -(2 ** 31),
          ][random() % 17]!,
        );
    }
  };
  const request = () => {
    const keys = KEYS.filter(() => chance(3));
    const withTokens = !chance(5);
    const unknown = chance(12);
    const duplicate = chance(8) && keys.length > 0;
    e.map(keys.length + (withTokens ? 1 : 0) + (unknown ? 1 : 0) + (duplicate ? 1 : 0));
    for (const key of keys) {
      e.str(key);
      if (chance(15))
        e.bin(Uint8Array.of(1, 2, 3, 4)); // a bin where only token_ids may have one
      else scalar();
    }
    if (duplicate) {
      e.str(keys[0]!);
      scalar();
    }
    if (withTokens) {
      e.str("token_ids");
      if (chance(10)) {
        e.array(2);
        e.int(1);
        e.int(2);
      } else {
        const length = [0, 4, 8, 64, 6, 4096][random() % 6]!;
        e.bin(Uint8Array.from({ length }, () => random() % 256));
      }
    }
    if (unknown) {
      e.str(chance(2) ? "toString" : "local_hashes");
      e.int(1);
    }
  };
  if (chance(3)) {
    request();
  } else {
    const count = chance(10) ? 0 : 1 + (random() % 6);
    e.array(count);
    for (let i = 0; i < count; i++) {
      if (chance(20)) e.str("not a request");
      else request();
    }
  }
  if (chance(15)) e.out.push(0xc0); // trailing bytes
  return Uint8Array.from(e.out);
}

/** A body as msgpackr gives it: only the keys present, token bytes as a Uint8Array. */
function plain(body: Record<string, unknown>): Record<string, unknown> {
  const result: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(body)) {
    if (value === undefined) continue;
    result[key] =
      value instanceof BinRef
        ? Uint8Array.from(value.source.subarray(value.start, value.end))
        : value;
  }
  return result;
}

describe("MsgpackRequestReader", () => {
  test("every frame it takes reads as msgpackr reads it; every prefix and every trailing byte is declined", () => {
    const random = xorshift32(41);
    const reader = new MsgpackRequestReader(4096);
    let taken = 0;
    let declined = 0;
    for (let n = 0; n < 4000; n++) {
      const frame = randomFrame(random);
      const asBuffer = random() % 2 === 0;
      const input = asBuffer ? Buffer.from(frame) : frame;
      if (!reader.read(input)) {
        declined++;
        continue;
      }
      taken++;
      const expected = unpackr.unpack(Buffer.from(frame)) as unknown;
      const requests = Array.isArray(expected) ? expected : [expected];
      expect(reader.isBatch).toBe(Array.isArray(expected));
      expect(reader.count).toBe(requests.length);
      for (let i = 0; i < requests.length; i++) {
        const got = plain(reader.request(i));
        const want = Object.fromEntries(
          Object.entries(requests[i] as object).map(([k, v]) => [
            k,
            v instanceof Uint8Array ? Uint8Array.from(v) : v,
          ]),
        );
        expect(got).toEqual(want);
      }
      for (const cut of [1, 2, 5, Math.floor(frame.length / 2), frame.length - 1]) {
        if (cut > 0 && cut < frame.length) expect(reader.read(frame.subarray(0, cut))).toBe(false);
      }
      const longer = new Uint8Array(frame.length + 1);
      longer.set(frame);
      expect(reader.read(longer)).toBe(false);
    }
    // Both sides are exercised.
    expect(taken).toBeGreaterThan(500);
    expect(declined).toBeGreaterThan(500);
  });

  test("takes the frames gateways send: msgpackr's own encoding of route batches with token_ids as bytes", () => {
    const reader = new MsgpackRequestReader(4096);
    const tokens = Uint32Array.from({ length: 1024 }, (_, i) => i * 7919);
    const bytes = new Uint8Array(tokens.buffer);
    const batch = Array.from({ length: 16 }, (_, id) => ({
      id,
      op: "route",
      candidates: 4,
      token_ids: bytes,
      request_id: `r-${id}`,
    }));
    expect(reader.read(pack(batch))).toBe(true);
    expect(reader.count).toBe(16);
    const body = reader.request(3);
    expect([body.id, body.op, body.candidates, body.request_id, body.lora_name]).toEqual([
      3,
      "route",
      4,
      "r-3",
      undefined,
    ]);
    expect(Array.from(tokenIds(body))).toEqual(Array.from(tokens));
    expect(reader.read(pack({ id: "a", op: "done", request_id: "r-1" }))).toBe(true);
    expect(reader.isBatch).toBe(false);
    expect(() => reader.request(1)).toThrow(RangeError);
    // Over the batch limit: declined, so the msgpackr path answers 413 as before.
    expect(new MsgpackRequestReader(2).read(pack(batch.slice(0, 3)))).toBe(false);
  });

  test("token_ids copied out of a Buffer or a plain byte array, and checked as before", () => {
    const reader = new MsgpackRequestReader(16);
    const tokens = Uint32Array.of(5, 0, 0xffff_ffff, 70_000);
    for (const wrap of [(b: Uint8Array) => Buffer.from(b), (b: Uint8Array) => b]) {
      expect(
        reader.read(wrap(pack({ op: "route", token_ids: new Uint8Array(tokens.buffer) }))),
      ).toBe(true);
      expect(Array.from(tokenIds(reader.request(0)))).toEqual(Array.from(tokens));
      expect(reader.read(wrap(pack({ op: "route", token_ids: Uint8Array.of(1, 2, 3) })))).toBe(
        true,
      );
      expect(() => tokenIds(reader.request(0))).toThrow(KvedgeError);
      expect(() => tokenIds(reader.request(0))).toThrow("multiple of 4 bytes), got 3 bytes");
    }
  });

  test("HTTP bodies: one request map of the usual shape is read here, anything else by msgpackr, with the same result", () => {
    const tokens = new Uint8Array(Uint32Array.of(1, 2, 3, 4).buffer);
    const usual = pack({ token_ids: tokens, candidates: 2, request_id: "h-1" });
    const viaReader = parseBody({ msgpack: usual }, true) as Record<string, unknown>;
    expect(viaReader.token_ids).toBeInstanceOf(BinRef);
    expect(Array.from(tokenIds(viaReader))).toEqual([1, 2, 3, 4]);
    expect(plain(viaReader)).toEqual({
      ...(unpackr.unpack(usual) as object),
      token_ids: Uint8Array.from(tokens),
    });
    // Not transient (the body is kept), a batch, or another shape: msgpackr, as before.
    expect(parseBody({ msgpack: usual }, false)).toEqual(unpackr.unpack(usual));
    expect(parseBody({ msgpack: pack([{ token_ids: tokens }]) }, true)).toEqual([
      { token_ids: Uint8Array.from(tokens) },
    ]);
    const other = pack({ local_hashes: ["1", "2"] });
    expect(parseBody({ msgpack: other }, true)).toEqual({ local_hashes: ["1", "2"] });
  });
});
