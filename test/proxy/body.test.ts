// Goal: what kvedge adds to a client's body (stream_options.include_usage, a prompt
// as token ids) is spliced into the client's bytes, the rest left exactly as written:
// integers past 2^53, float spellings, key order, duplicate and escaped keys, unknown
// fields, whitespace, a BOM. Hand-written cases give the exact bytes; a randomized
// property checks the meaning (JSON.parse of the result) over generated bodies.
import { describe, expect, test } from "bun:test";
import { withMember, withUsageAsked } from "../../src/proxy/body";

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => new TextDecoder("utf-8", { ignoreBOM: true }).decode(data);
const usage = (body: string) => text(withUsageAsked(bytes(body)));

describe("include_usage spliced in", () => {
  test("no stream_options: added before the closing brace, nothing else touched", () => {
    const body =
      '{"seed": 18446744073709551615, "temperature": 1.0, "top_p": 1e-3, "x": {"}": "{"},\n "stream": true }  ';
    expect(usage(body)).toBe(
      '{"seed": 18446744073709551615, "temperature": 1.0, "top_p": 1e-3, "x": {"}": "{"},\n "stream": true ,"stream_options":{"include_usage":true}}  ',
    );
  });

  test("stream_options without include_usage, with it false, null, empty, duplicated, escaped", () => {
    expect(usage('{"stream":true,"stream_options":{"continuous_usage_stats":true}}')).toBe(
      '{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}',
    );
    expect(usage('{"stream":true,"stream_options":{ "include_usage" : false }}')).toBe(
      '{"stream":true,"stream_options":{ "include_usage" : true }}',
    );
    expect(usage('{"stream":true,"stream_options":null}')).toBe(
      '{"stream":true,"stream_options":{"include_usage":true}}',
    );
    expect(usage('{"stream":true,"stream_options":{ }}')).toBe(
      '{"stream":true,"stream_options":{"include_usage":true }}',
    );
    // JSON.parse and the engines take the last of duplicate keys: so does the splice.
    expect(
      usage('{"stream_options":{"include_usage":true},"stream":true,"stream_options":{}}'),
    ).toBe(
      '{"stream_options":{"include_usage":true},"stream":true,"stream_options":{"include_usage":true}}',
    );
    expect(usage('{"stream":true,"stream\\u005foptions":{"include\\u005fusage":false}}')).toBe(
      '{"stream":true,"stream\\u005foptions":{"include\\u005fusage":true}}',
    );
  });

  test("a BOM, multi-byte text and strings full of structure survive", () => {
    const body = '\ufeff{"prompt":"日本 \\" } ] , { [ 🙂","stream":true}';
    const out = withUsageAsked(bytes(body));
    expect(text(out)).toBe(`${body.slice(0, -1)},"stream_options":{"include_usage":true}}`);
    expect(out.subarray(0, 3)).toEqual(new Uint8Array([0xef, 0xbb, 0xbf]));
  });
});

test("a member replaced in place (the prompt as token ids), or added", () => {
  expect(
    text(withMember(bytes('{"prompt": "a b", "seed": 9007199254740993}'), "prompt", "[1,2]")),
  ).toBe('{"prompt": [1,2], "seed": 9007199254740993}');
  expect(text(withMember(bytes('{"seed":1}'), "prompt", "[7]"))).toBe('{"seed":1,"prompt":[7]}');
});

/** A random JSON value's text, with random whitespace. */
function randomJson(random: () => number, depth: number): string {
  const space = () => [" ", "", "\n", "\t", "  "][Math.floor(random() * 5)]!;
  const pick = random();
  if (depth > 2 || pick < 0.5) {
    const scalars = [
      "18446744073709551615",
      "-0.0",
      "1.50",
      "1e400",
      '"a}b{c]\\"\\\\"',
      '"ü日"',
      "true",
      "null",
      "[]",
      "{}",
    ];
    return scalars[Math.floor(random() * scalars.length)]!;
  }
  if (pick < 0.75) {
    const items = Array.from({ length: Math.floor(random() * 4) }, () =>
      randomJson(random, depth + 1),
    );
    return `[${space()}${items.join(`${space()},${space()}`)}${space()}]`;
  }
  const keys = ["a", "stream", "b\\u0063", "x}", "stream_options", "include_usage"];
  const members = Array.from(
    { length: Math.floor(random() * 5) },
    () =>
      `"${keys[Math.floor(random() * keys.length)]}"${space()}:${space()}${randomJson(random, depth + 1)}`,
  );
  return `{${space()}${members.join(`${space()},${space()}`)}${space()}}`;
}

test("randomized: the result means the client's body plus include_usage, and keeps its text", () => {
  let seed = 12345;
  const random = () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x80000000;
  };
  let checked = 0;
  for (let i = 0; i < 3000; i++) {
    const body = randomJson(random, 0);
    if (!body.startsWith("{")) continue;
    const parsed = JSON.parse(body) as Record<string, unknown>;
    const options = parsed.stream_options;
    if (
      options !== undefined &&
      options !== null &&
      (typeof options !== "object" || Array.isArray(options))
    )
      continue; // refused before any splice (a 400)
    const out = usage(body);
    const want = { ...parsed, stream_options: { ...(options as object), include_usage: true } };
    expect(JSON.parse(out)).toEqual(want);
    // One splice: what differs is one place, where at most the old value was removed.
    const old = (options as Record<string, unknown> | null)?.include_usage;
    if (typeof old === "object" && old !== null) continue;
    let head = 0;
    while (head < body.length && body[head] === out[head]) head++;
    let tail = 0;
    while (tail < body.length - head && body[body.length - 1 - tail] === out[out.length - 1 - tail])
      tail++;
    const removed = body.slice(head, body.length - tail);
    expect(removed).toMatch(/^[^,:[\]{}]*$/);
    expect(removed.length).toBeLessThan(24);
    checked++;
  }
  expect(checked).toBeGreaterThan(300);
});
