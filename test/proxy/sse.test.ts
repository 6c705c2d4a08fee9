// Goal: the SSE scanner (src/proxy/sse.ts) passes an engine's stream on byte for byte,
// except the usage chunk kvedge asked for on the client's behalf, which it drops whole,
// and reads the usage, however the stream is cut into reads. Property test over real
// vLLM and SGLang streams (test/fixtures/engine-streams: completions and chat, with and
// without usage, errors mid-stream), each with LF, CRLF and CR line ends and with the
// fields a server may add (comments, event/id lines, `data:` without a space, several
// data lines, a BOM, multi-byte text, SGLang's `choices: []` chunks that are not
// usage), split at every byte and at random.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { EVENT_BYTES_MAX, SseScanner } from "../../src/proxy/sse";

const FIXTURES = JSON.parse(
  readFileSync(join(import.meta.dir, "..", "fixtures", "engine-streams", "streams.json"), "utf8"),
) as Record<string, string[]>;

const encoder = new TextEncoder();

/** The oracle: a write is the usage-only chunk when its JSON has no choices and a usage object. */
function isUsageWrite(write: string): boolean {
  return write.includes('"choices":[]') && write.includes('"usage":{');
}

interface Case {
  readonly name: string;
  readonly writes: string[];
  /** The usage the scanner must report (null: none). */
  readonly usage: unknown;
}

/** Line ends to write: one kind throughout, or every kind in turn (events ended by each pair). */
const LINE_ENDS: Record<string, (write: string) => string> = {
  lf: (write) => write,
  crlf: (write) => write.replaceAll("\n", "\r\n"),
  cr: (write) => write.replaceAll("\n", "\r"),
  mixed: (() => {
    const ends = ["\r\n\r\n", "\n\n", "\r\r", "\n\r\n", "\r\n\n", "\r\r\n"];
    const lines = ["\r", "\n", "\r\n"];
    let e = 0;
    let l = 0;
    return (write: string) =>
      write
        .replaceAll("\n\n", "\0")
        .replaceAll("\n", () => lines[l++ % lines.length]!)
        .replaceAll("\0", () => ends[e++ % ends.length]!);
  })(),
};

/** Adds what a server or a proxy in between may write: comments, fields, other spellings. */
function decorated(writes: string[]): string[] {
  return writes.map((write, i) => {
    let text = write.replace('"Hi"', '"H\\u00e9 日本語 🙂"');
    if (i === 0) text = `\ufeff: a comment\nretry: 1000\n${text}`;
    if (i === 1) text = `: ping\n\nid: 7\nevent: message\n${text.replace("data: ", "data:")}`;
    if (i === 2 && !isUsageWrite(write)) text = text.replace('data: {"id"', 'data: {\ndata: "id"'); // two data lines, one JSON
    if (isUsageWrite(write))
      text = `data: {"id":"b1c2","object":"chat.completion.chunk","choices":[],"sglext":{"x":1}}\n\n${text}`;
    return text;
  });
}

function cases(): Case[] {
  const out: Case[] = [];
  for (const [name, writes] of Object.entries(FIXTURES)) {
    const usageWrite = writes.find(isUsageWrite);
    const usage = usageWrite === undefined ? null : JSON.parse(usageWrite.slice(6)).usage;
    for (const [end, sep] of Object.entries(LINE_ENDS)) {
      for (const extra of [false, true]) {
        const base = extra ? decorated(writes) : writes;
        out.push({
          name: `${name} ${end}${extra ? " decorated" : ""}`,
          writes: base.map(sep),
          usage,
        });
      }
    }
  }
  return out;
}

/** What the client must receive: every write but the usage chunk's (with `drop`). */
function expected(writes: string[], drop: boolean): Uint8Array {
  const kept = drop
    ? writes.map((write) => {
        if (!isUsageWrite(write)) return write;
        const at = write.indexOf('data: {"id"', write.indexOf("sglext") + 1);
        return write.includes("sglext") ? write.slice(0, at) : ""; // the sglext chunk stays
      })
    : writes;
  return encoder.encode(kept.join(""));
}

function scan(chunks: Uint8Array[], drop: boolean): { bytes: Buffer; scanner: SseScanner } {
  const scanner = new SseScanner(drop);
  const out: Uint8Array[] = [];
  for (const chunk of chunks) scanner.push(chunk, out);
  scanner.end(out);
  return { bytes: Buffer.concat(out), scanner };
}

/** Deterministic random cuts (mulberry32). */
function randomCuts(length: number, seed: number, count: number): number[] {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return Array.from({ length: count }, () => Math.floor(next() * (length + 1))).sort(
    (a, b) => a - b,
  );
}

function cut(bytes: Uint8Array, at: number[]): Uint8Array[] {
  const chunks: Uint8Array[] = [];
  let from = 0;
  for (const to of [...at, bytes.length]) {
    chunks.push(bytes.slice(from, to));
    from = to;
  }
  return chunks;
}

describe("the SSE scanner over vLLM and SGLang streams", () => {
  const all = cases();

  test("the fixtures cover what they must", () => {
    expect(all.length).toBe(Object.keys(FIXTURES).length * 8);
    expect(all.filter((c) => c.usage !== null).length).toBeGreaterThanOrEqual(30);
    expect(Object.keys(FIXTURES).some((name) => name.includes("error"))).toBe(true);
  });

  for (const drop of [false, true]) {
    test(`split at every byte, usage ${drop ? "dropped" : "kept"}: the bytes and the usage`, () => {
      let checked = 0;
      for (const c of all) {
        const whole = encoder.encode(c.writes.join(""));
        const want = expected(c.writes, drop);
        const splits = [
          c.writes.map((write) => encoder.encode(write)), // one read per write
          ...Array.from({ length: whole.length + 1 }, (_, at) => cut(whole, [at])),
          ...Array.from({ length: 20 }, (_, seed) => cut(whole, randomCuts(whole.length, seed, 8))),
        ];
        for (const chunks of splits) {
          const { bytes, scanner } = scan(chunks, drop);
          if (!bytes.equals(Buffer.from(want)) || !Bun.deepEquals(scanner.usage, c.usage)) {
            throw new Error(
              `${c.name}, reads of ${chunks.map((chunk) => chunk.length).join("+")} bytes: ` +
                `got ${JSON.stringify(bytes.toString())}, usage ${JSON.stringify(scanner.usage)}`,
            );
          }
          checked++;
        }
      }
      expect(checked).toBeGreaterThan(50_000);
    });
  }

  test("a usage chunk split across reads is dropped whole, and one read holding only it passes nothing", () => {
    const writes = FIXTURES.vllm_chat_stream_include_usage_cached4!;
    const usage = encoder.encode(writes[3]!);
    const scanner = new SseScanner(true);
    const out: Uint8Array[] = [];
    for (const write of writes.slice(0, 3)) scanner.push(encoder.encode(write), out);
    const before = out.length;
    scanner.push(usage.subarray(0, 40), out);
    scanner.push(usage.subarray(40), out);
    expect(out.length).toBe(before);
    expect(scanner.dropped).toBe(1);
    scanner.push(encoder.encode(writes[4]!), out);
    expect(Buffer.concat(out.slice(before)).toString()).toBe("data: [DONE]\n\n");
  });

  test("an event longer than the bound passes on unread, and an unterminated last event is flushed", () => {
    const long = `data: {"choices":[],"usage":{"x":"${"y".repeat(EVENT_BYTES_MAX)}"}}\n\n`;
    const tail = "data: {partial";
    const bytes = encoder.encode(`${long}${tail}`);
    const { bytes: out, scanner } = scan(cut(bytes, randomCuts(bytes.length, 7, 40)), true);
    expect(out.equals(Buffer.from(bytes))).toBe(true);
    expect(scanner.dropped).toBe(0);
    expect(scanner.usage).toBeNull();
  });
});
