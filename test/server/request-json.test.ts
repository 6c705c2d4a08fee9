// Goal: parseRequestJson equals JSON.parse on every input — same value (token_ids as
// checked Uint32Arrays on the fast path) or the same error — including malformed and
// unusual JSON, and it takes the fast path for ordinary route requests and batches.
// Every test runs with the digits read in JavaScript and in native code (which must
// accept exactly the same arrays and read the same values).
import { describe, expect, test } from "bun:test";
import { usingNativeHash } from "../../src/hash";
import { tokenIds } from "../../src/http/http";
import {
  defaultTokenScanner,
  parseRequestJson as parseWith,
  ScannedTokens,
  scannerBufferBytes,
  type TokenScanner,
  TOKENS_MAX,
} from "../../src/http/request-json";
import { expectChildSuitePasses } from "../support/suite";

test("the native scanner is the default when the native library is loaded", () => {
  expect(defaultTokenScanner).toBe(usingNativeHash ? "native" : "js");
});

for (const [scanner, transient] of [
  ["js", false],
  ["native", false],
  ["js", true],
  ["native", true],
] as const) {
  const parseRequestJson = (text: string) =>
    parseWith(text, scanner satisfies TokenScanner, transient);
  describe(`${scanner} scanner${transient ? ", transient token arrays" : ""}`, () => {
    /** The value with every ScannedTokens turned back into the plain array JSON.parse makes. */
    function plain(value: unknown): unknown {
      if (value instanceof ScannedTokens) return Array.from(value.tokens);
      if (Array.isArray(value)) return value.map(plain);
      if (typeof value === "object" && value !== null) {
        const out: Record<string, unknown> = {};
        for (const [key, item] of Object.entries(value)) out[key] = plain(item);
        return out;
      }
      return value;
    }

    type Outcome = { ok: true; value: unknown } | { ok: false; message: string };

    function outcome(parse: (text: string) => unknown, text: string): Outcome {
      try {
        return { ok: true, value: plain(parse(text)) };
      } catch (error) {
        return { ok: false, message: (error as Error).message };
      }
    }

    /** Whether the fast path read some token_ids of `value`. */
    function scanned(value: unknown): boolean {
      if (value instanceof ScannedTokens) return true;
      if (typeof value === "object" && value !== null) return Object.values(value).some(scanned);
      return false;
    }

    /** Checks parseRequestJson against JSON.parse; returns whether the fast path was taken. */
    function expectSameAsJsonParse(text: string): boolean {
      let fastPath = false;
      const ours = outcome((input) => {
        const value = parseRequestJson(input);
        fastPath = scanned(value);
        return value;
      }, text);
      const reference = outcome(JSON.parse, text);
      if (JSON.stringify(ours) !== JSON.stringify(reference)) {
        throw new Error(
          `differs from JSON.parse on ${JSON.stringify(text)}: ${JSON.stringify(ours)} vs ${JSON.stringify(reference)}`,
        );
      }
      if (ours.ok && reference.ok) expect(ours.value).toEqual(reference.value);
      return fastPath;
    }

    const fast = (text: string) => {
      const value = parseRequestJson(text) as Record<string, unknown>;
      expect(value.token_ids).toBeInstanceOf(ScannedTokens);
      return value;
    };

    describe("fast path", () => {
      test("an ordinary route request reads token_ids into a Uint32Array", () => {
        const value = fast('{"token_ids":[0,1,4294967295,65536],"request_id":"r1","candidates":4}');
        expect(Array.from((value.token_ids as ScannedTokens).tokens)).toEqual([
          0, 1, 4294967295, 65536,
        ]);
        expect(value.request_id).toBe("r1");
        expect(value.candidates).toBe(4);
        expect(tokenIds(value)).toEqual(new Uint32Array([0, 1, 4294967295, 65536]));
      });

      test("whitespace anywhere JSON allows it", () => {
        const value = fast(' \n{ "id" : 7 ,\t"token_ids" :\r\n[ 1 , 2\n,3 ] , "op":"route" } \n');
        expect(plain(value)).toEqual({ id: 7, token_ids: [1, 2, 3], op: "route" });
      });

      test("a batch: an array of request objects", () => {
        const value = parseRequestJson(
          '[{"id":1,"token_ids":[5]},{"id":2,"op":"done","request_id":"x"},{}]',
        ) as unknown[];
        expect((value[0] as Record<string, unknown>).token_ids).toBeInstanceOf(ScannedTokens);
        expect(plain(value)).toEqual([
          { id: 1, token_ids: [5] },
          { id: 2, op: "done", request_id: "x" },
          {},
        ]);
      });

      test("other members keep their JSON.parse values, nested structures and escapes included", () => {
        const text =
          '{"a":{"b":[1,{"c":"}]"}],"d":null},"token_ids":[9],"s":"q\\"u\\\\o}te","t":true,"n":-1.5e3,"u":"\\u00e9"}';
        expect(plain(fast(text))).toEqual(JSON.parse(text));
      });

      test("an empty token array", () => {
        expect(Array.from((fast('{"token_ids":[]}').token_ids as ScannedTokens).tokens)).toEqual(
          [],
        );
      });

      test("a long prompt", () => {
        const tokens = Array.from({ length: 50_000 }, (_, i) => (i * 2_654_435_761) >>> 0);
        const value = fast(JSON.stringify({ token_ids: tokens, lora_name: "l" }));
        expect(Array.from((value.token_ids as ScannedTokens).tokens)).toEqual(tokens);
      });
    });

    describe("everything else is JSON.parse's answer", () => {
      test.each([
        '{"token_ids":[00]}',
        '{"token_ids":[0 , 0 ]}',
        '{"token_ids":[ ]}',
        '{"token_ids":[0x1]}',
        '{"token_ids":[1]]}',
        '{"token_ids":[123456789012345678901234567890]}',
        '{"token_ids":[4294967295,4294967295]}',
        '{"token_ids":[-1]}',
        '{"token_ids":[1.5]}',
        '{"token_ids":[1e3]}',
        '{"token_ids":[1E3]}',
        '{"token_ids":[01]}',
        '{"token_ids":[4294967296]}',
        '{"token_ids":[99999999999]}',
        '{"token_ids":["1"]}',
        '{"token_ids":[null]}',
        '{"token_ids":[1,]}',
        '{"token_ids":[,1]}',
        '{"token_ids":[1 2]}',
        '{"token_ids":[1],"token_ids":[2]}',
        '{"token_ids":"1 2"}',
        '{"token_ids":null}',
        '{"token_ids":{}}',
        '{"token\\u005fids":[1]}',
        '{"token_ids":[1]',
        '{"token_ids":[1]}}',
        '{"token_ids":[1]} x',
        '{"a":1,}',
        '{,"a":1}',
        '{"a" 1}',
        '{"a":1 "b":2}',
        '{"a":[1}',
        '{"a":"x\ny"}',
        '{"a":1,"a":2,"token_ids":[3]}',
        '{"__proto__":{"x":1},"token_ids":[1]}',
        "[1,2]",
        '[{"token_ids":[1]},42]',
        "null",
        '"s"',
        "",
        " ",
        "{",
        "[",
        "[{}",
        "[{},]",
        '{"a":tru}',
        '{"a":"\\x"}',
        '\ufeff{"token_ids":[1]}',
        '{"a":1}\u00a0',
      ])("%p", (text) => {
        expectSameAsJsonParse(text);
      });

      test(`more than TOKENS_MAX (${TOKENS_MAX}) tokens go to JSON.parse (and tokenIds refuses them)`, () => {
        const text = `{"token_ids":[${"1,".repeat(TOKENS_MAX)}1]}`;
        const value = parseRequestJson(text) as Record<string, unknown>;
        expect(Array.isArray(value.token_ids)).toBe(true);
        expect(() => tokenIds(value)).toThrow(`token_ids has over ${TOKENS_MAX} tokens`);
      });

      test("fuzz: random requests, randomly mutated, against JSON.parse", () => {
        let state = 0x2545f491;
        const random = (n: number) => {
          state ^= state << 13;
          state ^= state >>> 17;
          state ^= state << 5;
          return (state >>> 0) % n;
        };
        const pieces = [
          "{",
          "}",
          "[",
          "]",
          ",",
          ":",
          '"',
          "\\",
          " ",
          "\n",
          "0",
          "1",
          "9",
          "-",
          ".",
          "e",
          "token_ids",
          "null",
          "4294967296",
          "\u00e9",
          "\u0001",
        ];
        const request = (): unknown => {
          const body: Record<string, unknown> = {};
          const keys = ["id", "op", "token_ids", "request_id", "candidates", "lora_name", "nested"];
          if (random(4) !== 0) body.token_ids = [];
          for (let k = 0; k < 1 + random(5); k++) {
            const key = keys[random(keys.length)]!;
            if (key === "token_ids")
              body[key] = Array.from({ length: random(40) }, () =>
                random(3) === 0 ? random(10) : random(0x7fff_ffff) * 2,
              );
            else if (key === "nested") body[key] = { a: [random(9), '}]"', { b: null }], c: "x,y" };
            else body[key] = random(2) === 0 ? random(1000) : `s${random(100)}`;
          }
          return body;
        };
        let fastPaths = 0;
        let mutated = 0;
        for (let i = 0; i < 20_000; i++) {
          const value = random(4) === 0 ? Array.from({ length: random(4) }, request) : request();
          let text = JSON.stringify(value, null, random(3) === 0 ? 1 : undefined);
          for (let m = random(4); m > 0; m--) {
            const at = random(text.length + 1);
            const kind = random(3);
            const piece = pieces[random(pieces.length)]!;
            if (kind === 0) text = text.slice(0, at) + piece + text.slice(at);
            else if (kind === 1) text = text.slice(0, at) + text.slice(at + 1 + random(3));
            else text = text.slice(0, at) + piece + text.slice(at + piece.length);
          }
          if (expectSameAsJsonParse(text)) fastPaths++;
          if (text !== JSON.stringify(value) && text !== JSON.stringify(value, null, 1)) mutated++;
        }
        // Both paths and plenty of malformed input were exercised.
        expect(fastPaths).toBeGreaterThan(4_000);
        expect(mutated).toBeGreaterThan(10_000);
      });
    });
    test("fuzz: long token arrays (the native scanner's block path), mutated, against JSON.parse", () => {
      let state = 0x9e3779b9;
      const random = (n: number) => {
        state ^= state << 13;
        state ^= state >>> 17;
        state ^= state << 5;
        return (state >>> 0) % n;
      };
      // Values of every digit count 1-10, around 2^32 too; most arrays hold only integers
      // of up to 7 digits (the native block path), some longer ones (its plain path).
      const token = () => {
        const kind = random(512);
        if (kind === 0) return 4_294_967_290 + random(12); // half of these are over 2^32 - 1
        if (kind < 64) return random(10);
        if (kind < 72) return random(0x7fff_ffff); // mostly 9-10 digits
        return Math.floor(random(0x7fff_ffff) / 10 ** (3 + random(7)));
      };
      const pieces = [
        " ",
        "\n",
        ",",
        "0",
        "00",
        "]",
        "[",
        "-",
        "1.5",
        "e3",
        "99999999999",
        "4294967296",
        "\u00e9",
        "x",
        '"',
      ];
      let fastPaths = 0;
      for (let i = 0; i < 3_000; i++) {
        const tokens = Array.from({ length: random(300) }, token);
        const prefix = random(2) === 0 ? '{"op":"route","token_ids":' : '{"token_ids":';
        let text = `${prefix}[${tokens.join(",")}],"id":${i}}`;
        for (let m = random(3); m > 0; m--) {
          const at = prefix.length + random(text.length - prefix.length);
          const piece = pieces[random(pieces.length)]!;
          text =
            random(2) === 0
              ? text.slice(0, at) + piece + text.slice(at)
              : text.slice(0, at) + text.slice(at + 1);
        }
        if (expectSameAsJsonParse(text)) fastPaths++;
      }
      expect(fastPaths).toBeGreaterThan(1_000);
    });

    test("an unusual integer at every offset of a 64-byte block", () => {
      // Leading zeros, empty slots, 9-10 digits and values over 2^32 - 1 where the
      // native block reader's masks meet: a block's first and last byte included.
      // Blocks start at the first integer; its length (1-8 digits) and the 8-byte
      // integers after it put the odd one at every offset of a block.
      const odd = ["0", "01", "00", "007", "", "123456789", "4294967295", "4294967296", "12345678"];
      for (let first = 1; first <= 8; first++) {
        for (let at = 1; at < 24; at++) {
          for (const value of odd) {
            const tokens = Array.from({ length: 24 }, (_, i) =>
              i === at ? value : i === 0 ? "98765432".slice(0, first) : "1234567",
            );
            expectSameAsJsonParse(`{"k":"x","token_ids":[${tokens.join(",")}]}`);
          }
        }
      }
    });

    test("an array ending at every position of a 64-byte block", () => {
      for (let length = 0; length < 200; length++) {
        const tokens = Array.from({ length }, (_, i) => (i * 7919) % 1_000_003);
        for (const prefix of [
          '{"token_ids":',
          '{"ab":1,"token_ids":',
          '{"abcdefgh":"","token_ids":',
        ]) {
          expect(expectSameAsJsonParse(`${prefix}[${tokens.join(",")}]}`)).toBe(true);
        }
      }
    });
  });
}

describe("transient token arrays", () => {
  const prompt = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
  for (const scanner of ["js", "native"] as const satisfies TokenScanner[]) {
    test(`${scanner}: a batch's arrays are distinct and right, copies outlive later parses`, () => {
      const batch = [prompt(5, 100), prompt(3000, 7), prompt(9000, 1_000_000)]; // the later ones outgrow the buffer
      const text = JSON.stringify(batch.map((tokens, id) => ({ id, token_ids: tokens })));
      const views = (parseWith(text, scanner, true) as { token_ids: ScannedTokens }[]).map(
        (item) => item.token_ids.tokens,
      );
      expect(views.map((tokens) => Array.from(tokens))).toEqual(batch);
      const copy = (parseWith(text, scanner, false) as { token_ids: ScannedTokens }[])[0]!.token_ids
        .tokens;
      // Views are only good until the next parse (the buffer is reused); copies stay.
      parseWith(JSON.stringify({ token_ids: prompt(5, 4_000_000) }), scanner, true);
      expect(Array.from(copy)).toEqual(batch[0]!);
      parseWith(JSON.stringify({ token_ids: prompt(5, 9) }), scanner, false);
      expect(Array.from(copy)).toEqual(batch[0]!);
    });
  }
});

test("the scanner's buffers shrink back after a huge request", () => {
  parseWith(JSON.stringify({ token_ids: [1, 2, 3] }), defaultTokenScanner, true);
  const small = scannerBufferBytes();
  const huge = `{"token_ids":[${Array.from({ length: 1_500_000 }, (_, i) => i % 100_000).join(",")}]}`;
  const parsed = parseWith(huge, defaultTokenScanner, true) as { token_ids: ScannedTokens };
  expect(parsed.token_ids.tokens.length).toBe(1_500_000);
  expect(scannerBufferBytes()).toBeGreaterThan(4 * 1_500_000);
  parseWith(JSON.stringify({ token_ids: [1, 2, 3] }), defaultTokenScanner, true);
  expect(scannerBufferBytes()).toBeLessThanOrEqual(small);
});

// This machine's CPU picks the native reader's AVX2 conversion; the SSE2 + scalar one
// (CPUs without AVX2) is checked by running every native-scanner test above again
// with it forced.
test.skipIf(defaultTokenScanner !== "native")(
  "the native scanner without AVX2 passes the same tests",
  () => {
    expectChildSuitePasses([import.meta.path, "-t", "^native scanner"], {
      KVEDGE_NATIVE_AVX2: "0",
    });
  },
  60_000,
);
