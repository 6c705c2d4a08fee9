// Goal: the streaming decoder yields the same frames however the stream is chunked,
// hands out views for frames inside one chunk, and rejects each kind of malformed input
// with its stable code before allocating for a declared size. Method: hand-built streams
// (test/wire/zmtp-raw.ts), fed whole, byte by byte and in random chunks.
import { describe, expect, test } from "bun:test";
import { greeting, readyFrame } from "../../src/wire/zmtp/codec";
import {
  FrameDecoder,
  GREETING,
  MESSAGE_FRAME,
  NEED_MORE,
  SKIPPED_MESSAGE,
} from "../../src/wire/zmtp/decoder";
import { ZmtpError } from "../../src/wire/zmtp/errors";
import {
  commandBytes,
  concat,
  enc,
  frameBytes,
  greetingBytes,
  messageBytes,
  readyBytes,
} from "./zmtp-raw";

interface Decoded {
  kind: "greeting" | "message" | "command" | "skipped";
  body: number[];
  more: boolean;
}

function decodeChunks(chunks: Uint8Array[], maxMessageBytes = 1 << 20, maxFrames = 64): Decoded[] {
  const decoder = new FrameDecoder(maxMessageBytes, maxFrames);
  const out: Decoded[] = [];
  for (const chunk of chunks) {
    decoder.feed(chunk);
    for (let guard = 0; guard < 10_000; guard++) {
      const kind = decoder.next();
      if (kind === NEED_MORE) break;
      if (kind === GREETING) out.push({ kind: "greeting", body: [decoder.minor], more: false });
      else if (kind === SKIPPED_MESSAGE)
        out.push({ kind: "skipped", body: [decoder.skippedBytes], more: false });
      else
        out.push({
          kind: kind === MESSAGE_FRAME ? "message" : "command",
          body: Array.from(decoder.frame),
          more: decoder.more,
        });
    }
  }
  return out;
}

function errorOf(run: () => unknown): ZmtpError {
  try {
    run();
  } catch (error) {
    if (ZmtpError.is(error)) return error;
    throw error;
  }
  throw new Error("expected a ZmtpError");
}

const stream = concat(
  greetingBytes(1),
  readyBytes({ "Socket-Type": "PUB" }),
  messageBytes([enc("kv@topic"), new Uint8Array(8).fill(1), new Uint8Array(300).fill(2)]),
  commandBytes("PING", Uint8Array.of(0, 150)),
  frameBytes(0x00, new Uint8Array(255).fill(3)),
  frameBytes(0x00, new Uint8Array(256).fill(4)),
  frameBytes(0x00, enc("long form, small size"), true),
  frameBytes(0x00, new Uint8Array(0)),
);

describe("FrameDecoder", () => {
  test("the same frames whether fed whole, byte by byte, or in random chunks", () => {
    const whole = decodeChunks([stream]);
    expect(whole.map((d) => d.kind)).toEqual([
      "greeting",
      "command",
      "message",
      "message",
      "message",
      "command",
      "message",
      "message",
      "message",
      "message",
    ]);
    expect(whole[4]!.body).toHaveLength(300);
    expect(whole[2]!.more && whole[3]!.more && !whole[4]!.more).toBe(true);
    expect(whole[7]!.body).toHaveLength(256);
    expect(whole[9]!.body).toHaveLength(0);

    const bytewise = decodeChunks(Array.from(stream, (b) => Uint8Array.of(b)));
    expect(bytewise).toEqual(whole);
    let seed = 12345;
    for (let round = 0; round < 200; round++) {
      const chunks: Uint8Array[] = [];
      for (let at = 0; at < stream.length; ) {
        seed = (seed * 1103515245 + 12345) >>> 0;
        const size = 1 + (seed % 97);
        chunks.push(stream.slice(at, at + size));
        at += size;
      }
      expect(decodeChunks(chunks)).toEqual(whole);
    }
  });

  test("a frame inside one chunk is a view of it; one spanning chunks is reassembled", () => {
    const decoder = new FrameDecoder(1 << 20, 16);
    const chunk = concat(
      greetingBytes(),
      frameBytes(0, enc("inside")),
      frameBytes(0, new Uint8Array(100).fill(9)).subarray(0, 50),
    );
    decoder.feed(chunk);
    expect(decoder.next()).toBe(GREETING);
    expect(decoder.next()).toBe(MESSAGE_FRAME);
    expect(decoder.frame.buffer).toBe(chunk.buffer);
    expect(decoder.next()).toBe(NEED_MORE);
    expect(decoder.pending).toBe(48);
    const rest = frameBytes(0, new Uint8Array(100).fill(9)).subarray(50);
    decoder.feed(rest);
    expect(decoder.next()).toBe(MESSAGE_FRAME);
    expect(decoder.frame.buffer).not.toBe(rest.buffer);
    expect(Array.from(decoder.frame)).toEqual(new Array(100).fill(9));
  });

  test("ZMTP 3.0 greeting reports minor 0; our own greeting and READY decode", () => {
    expect(decodeChunks([greetingBytes(0)])[0]!.body).toEqual([0]);
    const ours = decodeChunks([greeting(), readyFrame([["Socket-Type", enc("SUB")]])]);
    expect(ours[0]!.body).toEqual([1]);
    expect(ours[1]!.kind).toBe("command");
  });

  test("our greeting and READY bytes (wire snapshot)", () => {
    expect(Buffer.from(greeting()).toString("hex")).toBe(
      `ff00000000000000007f03014e554c4c${"00".repeat(48)}`,
    );
    expect(
      Buffer.from(
        readyFrame([
          ["Socket-Type", enc("DEALER")],
          ["Identity", new Uint8Array(0)],
        ]),
      ).toString("hex"),
    ).toBe(
      "0429055245414459" +
        "0b536f636b65742d54797065" +
        "00000006" +
        "4445414c4552" +
        "084964656e74697479" +
        "00000000",
    );
  });
});

describe("FrameDecoder skips messages over the bound", () => {
  const oversize = concat(
    greetingBytes(),
    messageBytes([enc("a")]),
    messageBytes([new Uint8Array(600).fill(7), new Uint8Array(600), enc("tail")]), // over in its second frame
    frameBytes(0, new Uint8Array(5000), true), // over in its only frame
    messageBytes([enc("b"), new Uint8Array(1000 - 1).fill(9)]), // exactly at the bound
  );

  test("reads past them as they stream (whole, byte by byte, random chunks), then goes on", () => {
    const expected: Decoded[] = [
      { kind: "greeting", body: [1], more: false },
      { kind: "message", body: [97], more: false },
      { kind: "message", body: Array(600).fill(7), more: true },
      { kind: "skipped", body: [1204], more: false },
      { kind: "skipped", body: [5000], more: false },
      { kind: "message", body: [98], more: true },
      { kind: "message", body: Array(999).fill(9), more: false },
    ];
    expect(decodeChunks([oversize], 1000)).toEqual(expected);
    expect(
      decodeChunks(
        [...oversize].map((byte) => Uint8Array.of(byte)),
        1000,
      ),
    ).toEqual(expected);
    const chunks: Uint8Array[] = [];
    for (let at = 0, step = 1; at < oversize.length; at += step, step = ((step * 7 + 3) % 700) + 1)
      chunks.push(oversize.subarray(at, at + step));
    expect(decodeChunks(chunks, 1000)).toEqual(expected);
  });

  test("holds none of a skipped frame: a 1 GiB declaration fed 1 MiB at a time keeps nothing", () => {
    const decoder = new FrameDecoder(1 << 20, 16);
    decoder.feed(concat(greetingBytes(), Uint8Array.of(0x02, 0, 0, 0, 0, 0x40, 0, 0, 0)));
    expect(decoder.next()).toBe(GREETING);
    expect(decoder.next()).toBe(NEED_MORE);
    const mib = new Uint8Array(1 << 20);
    for (let i = 0; i < 1024; i++) {
      decoder.feed(mib);
      expect(decoder.next()).toBe(i === 1023 ? SKIPPED_MESSAGE : NEED_MORE);
      expect(decoder.midFrame).toBe(i < 1023);
    }
    expect(decoder.skippedBytes).toBe(1 << 30);
    expect(decoder.retainedBytes).toBe(1 << 20); // the chunk just fed, nothing else
  });
});

describe("FrameDecoder rejects malformed input with a stable code", () => {
  const afterGreeting =
    (bytes: Uint8Array, maxMessageBytes = 1000, maxFrames = 4) =>
    () =>
      decodeChunks([greetingBytes(), bytes], maxMessageBytes, maxFrames);
  const cases: [string, () => unknown, string][] = [
    [
      "not ZMTP (an HTTP request)",
      () => decodeChunks([enc("GET / HTTP/1.1\r\n")]),
      "ZMTP_BAD_SIGNATURE",
    ],
    [
      "ZMTP 1.0 identity frame",
      () => decodeChunks([Uint8Array.of(0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x00)]),
      "ZMTP_BAD_SIGNATURE",
    ],
    [
      "ZMTP 2.0 peer",
      () => decodeChunks([Uint8Array.of(0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 1)]),
      "ZMTP_UNSUPPORTED_VERSION",
    ],
    ["CURVE mechanism", () => decodeChunks([greetingBytes(1, "CURVE")]), "ZMTP_BAD_MECHANISM"],
    [
      "NULL with trailing garbage in the mechanism",
      () => decodeChunks([greetingBytes(1, "NULLX")]),
      "ZMTP_BAD_MECHANISM",
    ],
    ["reserved flag bits", afterGreeting(Uint8Array.of(0x08, 0)), "ZMTP_BAD_FLAGS"],
    ["command with MORE", afterGreeting(Uint8Array.of(0x05, 1, 0)), "ZMTP_BAD_FLAGS"],
    ["size >= 2^32", afterGreeting(Uint8Array.of(0x02, 0, 0, 0, 1, 0, 0, 0, 0)), "ZMTP_OVERSIZE"],
    [
      "too many frames",
      afterGreeting(messageBytes([enc("a"), enc("b"), enc("c"), enc("d"), enc("e")])),
      "ZMTP_TOO_MANY_FRAMES",
    ],
    [
      "command over 64 KiB",
      afterGreeting(Uint8Array.of(0x06, 0, 0, 0, 0, 0, 1, 0, 1), 1 << 20),
      "ZMTP_OVERSIZE",
    ],
  ];
  for (const [name, run, code] of cases) {
    test(name, () => {
      expect(errorOf(run).code).toBe(code);
    });
  }

  test("a declared 2^62-byte frame fails on its 9 header bytes alone (nothing allocated)", () => {
    const decoder = new FrameDecoder(1 << 20, 16);
    decoder.feed(greetingBytes());
    expect(decoder.next()).toBe(GREETING);
    decoder.feed(Uint8Array.of(0x02, 0x40, 0, 0, 0, 0, 0, 0, 0));
    expect(errorOf(() => decoder.next()).code).toBe("ZMTP_OVERSIZE");
    expect(decoder.pending).toBe(0);
    // The decoder is dead after an error.
    expect(errorOf(() => decoder.next()).kind).toBe("bad_flags");
  });

  test("a bound-sized declaration with no body yet holds only what arrived", () => {
    const decoder = new FrameDecoder(1 << 20, 16);
    decoder.feed(
      concat(
        greetingBytes(),
        Uint8Array.of(0x02, 0, 0, 0, 0, 0, 0x10, 0, 0),
        Uint8Array.of(1, 2, 3),
      ),
    );
    expect(decoder.next()).toBe(GREETING);
    expect(decoder.next()).toBe(NEED_MORE);
    expect(decoder.pending).toBe(3);
  });

  test("feeding before the previous chunk is consumed is a usage error (not a ZmtpError)", () => {
    const decoder = new FrameDecoder(1 << 20, 16);
    decoder.feed(concat(greetingBytes(), frameBytes(0, enc("x"))));
    expect(decoder.next()).toBe(GREETING);
    expect(() => decoder.feed(enc("y"))).toThrow("previous chunk not consumed");
  });

  test("command bodies: name length, metadata and PING are validated", async () => {
    const { parseCommand, parseMetadata, parsePing } = await import("../../src/wire/zmtp/codec");
    expect(errorOf(() => parseCommand(new Uint8Array(0))).code).toBe("ZMTP_BAD_COMMAND");
    expect(errorOf(() => parseCommand(Uint8Array.of(9, 0x50))).code).toBe("ZMTP_BAD_COMMAND");
    expect(errorOf(() => parsePing(Uint8Array.of(1))).code).toBe("ZMTP_BAD_COMMAND");
    expect(parsePing(concat(Uint8Array.of(0, 10), new Uint8Array(40))).context).toHaveLength(16);
    expect(errorOf(() => parseMetadata(Uint8Array.of(4, 0x61, 0x62))).code).toBe(
      "ZMTP_BAD_METADATA",
    );
    expect(errorOf(() => parseMetadata(Uint8Array.of(1, 0x61, 0, 0, 0, 9, 1))).code).toBe(
      "ZMTP_BAD_METADATA",
    );
    expect(errorOf(() => parseMetadata(Uint8Array.of(0))).code).toBe("ZMTP_BAD_METADATA");
    const many = concat(...Array.from({ length: 300 }, () => Uint8Array.of(1, 0x61, 0, 0, 0, 0)));
    expect(errorOf(() => parseMetadata(many)).code).toBe("ZMTP_BAD_METADATA");
    const parsed = parseMetadata(
      readyBytes({ "Socket-Type": "PUB", Identity: "" }).subarray(2 + 6),
    );
    expect([...parsed.keys()]).toEqual(["socket-type", "identity"]);
  });
});
