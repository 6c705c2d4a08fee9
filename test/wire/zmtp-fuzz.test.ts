// Goal: no input makes the ZMTP reader throw anything but a ZmtpError, hold more than the
// message bound, or disturb other connections; a dropped connection is counted and later
// valid traffic still flows. Method: seeded random bytes and mutations of a valid stream
// (truncations, flipped bits, wrong flags, huge lengths, bad greetings and commands), fed
// to the decoder in random chunks and, over real TCP, to a bound SUB that is also serving
// a live publisher. KVEDGE_SEED and KVEDGE_FUZZ_ITERATIONS change the run.
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { PubSocket, SubSocket, type ZmtpSocket } from "../../src/wire/zmtp";
import { parseCommand, parseMetadata, parsePing } from "../../src/wire/zmtp/codec";
import { COMMAND_FRAME, FrameDecoder, MESSAGE_FRAME, NEED_MORE } from "../../src/wire/zmtp/decoder";
import { ZmtpError } from "../../src/wire/zmtp/errors";
import {
  commandBytes,
  concat,
  enc,
  frameBytes,
  greetingBytes,
  messageBytes,
  RawPeer,
  readyBytes,
} from "./zmtp-raw";
import { until } from "../support/wait";

setDefaultTimeout(60_000);
const SEED = Number(process.env.KVEDGE_SEED ?? 0x5eed) >>> 0;
const ITERATIONS = Number(process.env.KVEDGE_FUZZ_ITERATIONS ?? 20_000);
const MAX_MESSAGE_BYTES = 4096;

function rng(seed: number): (n: number) => number {
  let state = seed || 0x9e3779b9;
  return (n) => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) % n;
  };
}

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
function track<T extends ZmtpSocket | RawPeer>(socket: T): T {
  cleanups.push(() => socket.close());
  return socket;
}

/** A valid peer stream exercising every construct the reader knows. */
function validStream(): Uint8Array {
  return concat(
    greetingBytes(1),
    readyBytes({ "Socket-Type": "PUB", Identity: "", "X-Extra": "v" }),
    messageBytes([enc("kv@topic"), new Uint8Array(8).fill(1), new Uint8Array(300).fill(2)]),
    commandBytes("PING", concat(Uint8Array.of(0, 50), enc("context"))),
    commandBytes("PONG"),
    commandBytes("SUBSCRIBE", enc("kv")),
    frameBytes(0x00, enc("long"), true),
    messageBytes([enc("a"), new Uint8Array(0), enc("c")]),
  );
}

function mutate(valid: Uint8Array, next: (n: number) => number): Uint8Array {
  const bytes = valid.slice();
  switch (next(8)) {
    case 0: // truncation
      return bytes.subarray(0, next(bytes.length));
    case 1: // bit flips
      for (let i = 1 + next(4); i > 0; i--) bytes[next(bytes.length)]! ^= 1 << next(8);
      return bytes;
    case 2: // a random byte after the greeting (often a flags or size byte)
      bytes[64 + next(bytes.length - 64)] = next(256);
      return bytes;
    case 3: {
      // a huge LONG length
      const at = 64 + next(bytes.length - 64);
      const huge = Uint8Array.of(
        0x02 | next(8),
        next(256),
        next(256),
        next(256),
        next(256),
        next(256),
        next(256),
        next(256),
        next(256),
      );
      return concat(bytes.subarray(0, at), huge, bytes.subarray(at));
    }
    case 4: // bad greeting byte
      bytes[next(64)] = next(256);
      return bytes;
    case 5: {
      // a garbled command body (name length / metadata lengths)
      const garbage = new Uint8Array(1 + next(40)).map(() => next(256));
      return concat(bytes.subarray(0, 64), frameBytes(0x04, garbage), bytes.subarray(64));
    }
    case 6: {
      // random bytes spliced in
      const at = next(bytes.length);
      return concat(
        bytes.subarray(0, at),
        new Uint8Array(1 + next(32)).map(() => next(256)),
        bytes.subarray(at),
      );
    }
    default:
      // a frame over the bound, declared honestly
      return concat(bytes, frameBytes(0, new Uint8Array(MAX_MESSAGE_BYTES + 1 + next(100))));
  }
}

/**
 * Feeds `bytes` in random chunks through the decoder and the command parsers, like a
 * connection does. Returns the error code or "ok"/"partial"; throws on anything else.
 */
function run(bytes: Uint8Array, next: (n: number) => number): string {
  const decoder = new FrameDecoder(MAX_MESSAGE_BYTES, 16);
  try {
    for (let at = 0; at < bytes.length; ) {
      const size = 1 + next(200);
      decoder.feed(bytes.subarray(at, at + size));
      at += size;
      for (let kind = decoder.next(); kind !== NEED_MORE; kind = decoder.next()) {
        if (kind === MESSAGE_FRAME)
          expect(decoder.frame.length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
        if (kind === COMMAND_FRAME) {
          const { name, data } = parseCommand(decoder.frame);
          if (name === "READY") parseMetadata(data);
          if (name === "PING") parsePing(data);
        }
      }
      // Never more buffered than one bounded frame.
      expect(decoder.pending).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    }
    return decoder.pending === 0 ? "ok" : "partial";
  } catch (error) {
    if (ZmtpError.is(error)) return error.code;
    throw error;
  }
}

describe("fuzzing the frame reader", () => {
  test(`random bytes (${ITERATIONS} streams, seed ${SEED})`, () => {
    const next = rng(SEED);
    const outcomes = new Map<string, number>();
    for (let i = 0; i < ITERATIONS; i++) {
      const prefix = next(2) === 0 ? greetingBytes(next(3)) : new Uint8Array(0);
      const noise = new Uint8Array(next(600)).map(() => next(256));
      const outcome = run(concat(prefix, noise), next);
      outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    }
    // Random bytes after a valid greeting must hit several distinct error kinds.
    expect(outcomes.get("ZMTP_BAD_SIGNATURE")).toBeGreaterThan(0);
    expect(outcomes.get("ZMTP_BAD_FLAGS")).toBeGreaterThan(0);
    expect(outcomes.get("ZMTP_OVERSIZE")).toBeGreaterThan(0);
  });

  test(`mutations of a valid stream (${ITERATIONS} streams, seed ${SEED})`, () => {
    const next = rng(SEED + 1);
    const valid = validStream();
    expect(run(valid, next)).toBe("ok");
    const outcomes = new Map<string, number>();
    for (let i = 0; i < ITERATIONS; i++) {
      const outcome = run(mutate(valid, next), next);
      outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    }
    for (const code of [
      "partial",
      "ZMTP_OVERSIZE",
      "ZMTP_BAD_FLAGS",
      "ZMTP_BAD_SIGNATURE",
      "ZMTP_BAD_COMMAND",
      "ZMTP_BAD_METADATA",
    ]) {
      expect(outcomes.get(code) ?? 0).toBeGreaterThan(0);
    }
  });
});

describe("fuzzing over TCP", () => {
  test("bad connections are dropped and counted while a live publisher keeps flowing; new peers still work", async () => {
    const sub = track(
      new SubSocket({ maxMessageBytes: MAX_MESSAGE_BYTES, handshakeTimeoutMs: 300 }),
    );
    sub.subscribe("");
    const bound = await sub.bind("tcp://127.0.0.1:0");
    const live: number[] = [];
    sub.onMessage = (frames, peer) => {
      if (
        peer.socketType === "PUB" &&
        frames[0]!.length === 4 &&
        new TextDecoder().decode(frames[0]!) === "live"
      ) {
        live.push(new DataView(frames[1]!.buffer, frames[1]!.byteOffset).getUint32(0));
      }
    };
    const pub = track(new PubSocket());
    pub.connect(bound);
    const seq = new Uint8Array(4);
    let sent = 0;
    const publish = () => {
      new DataView(seq.buffer).setUint32(0, sent++);
      pub.send([enc("live"), seq]);
    };
    await until(() => {
      if (live.length > 0) return true;
      publish();
      return false;
    }, "the live publisher's first message");

    const next = rng(SEED + 2);
    const valid = validStream();
    const count = 120;
    const peers: RawPeer[] = [];
    for (let i = 0; i < count; i++) {
      const raw = track(await RawPeer.connect(bound));
      peers.push(raw);
      const bytes =
        i % 4 === 0 ? new Uint8Array(next(300)).map(() => next(256)) : mutate(valid, next);
      await raw.write(bytes);
      publish();
      if (i % 10 === 0) await new Promise((resolve) => setImmediate(resolve)); // let the SUB read
    }
    // Most were dropped at their first bad byte; streams that are merely incomplete wait
    // for the handshake timeout, or (handshake done, then truncated) for us to hang up.
    const droppedByUs = () => peers.filter((raw) => raw.closed).length;
    await until(() => droppedByUs() > count / 2, "most mutated streams to be dropped by the SUB");
    for (const raw of peers) raw.close();
    const ended = () => sub.counters.handshakeFailures + sub.counters.disconnects;
    await until(() => ended() >= count, "every raw peer's connection to end", 15_000);
    expect(sub.counters.handshakeFailures + sub.counters.disconnects).toBe(count);
    expect(sub.counters.protocolErrorsTotal).toBeGreaterThan(count / 2);
    expect(sub.counters.connectionsActive).toBe(1); // the live publisher only

    // The live publisher never missed a message (one TCP stream: in order, none lost).
    const last = sent;
    publish();
    await until(() => live.at(-1) === last, "the live stream's last message");
    const first = live[0]!;
    expect(live).toEqual(Array.from({ length: last - first + 1 }, (_, i) => first + i));

    // A fresh publisher connecting after the storm works too.
    const late = track(new PubSocket());
    late.connect(bound);
    const got: string[] = [];
    sub.onMessage = (frames) => got.push(new TextDecoder().decode(frames[0]!));
    await until(() => {
      if (got.includes("late")) return true;
      late.send([enc("late")]);
      return false;
    }, "a message from the late publisher");
  });
});
