// Goal: the outgoing queue never reorders, loses or duplicates bytes whatever the kernel
// accepts per write, and its message count (what the HWM compares) returns to zero
// exactly when everything was handed over. Method: a write target that takes a random
// number of bytes per call (sometimes none, like a full socket buffer) and "drains" at
// random points; the bytes it took must decode to the messages queued, in order. The
// real kernel path is covered by the socket tests; this one reaches every partial-write
// interleaving deterministically (seeded, KVEDGE_SEED).
import { expect, test } from "bun:test";
import { FrameDecoder, MESSAGE_FRAME, NEED_MORE } from "../../src/wire/zmtp/decoder";
import { DIRECT_BYTES_MIN, Outbox, STAGE_BYTES } from "../../src/wire/zmtp/outbox";
import { concat, greetingBytes } from "./zmtp-raw";

const SEED = Number(process.env.KVEDGE_SEED ?? 7) >>> 0;

function rng(seed: number): (n: number) => number {
  let state = seed || 0x9e3779b9;
  return (n) => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) % n;
  };
}

class StingyKernel {
  taken: Uint8Array[] = [];
  bytes = 0;
  full = false;
  constructor(private readonly next: (n: number) => number) {}
  write(data: Uint8Array, offset: number, length: number): number {
    if (this.full) return 0;
    const roll = this.next(10);
    const take = roll === 0 ? 0 : roll < 4 ? Math.min(length, this.next(length + 1)) : length;
    if (take < length) this.full = true;
    this.taken.push(data.slice(offset, offset + take));
    this.bytes += take;
    return take;
  }
}

test(`random messages through random partial writes arrive whole and in order (seed ${SEED})`, async () => {
  const next = rng(SEED);
  for (let round = 0; round < 30; round++) {
    const kernel = new StingyKernel(next);
    let idleCalls = 0;
    const outbox = new Outbox(
      kernel,
      () => {},
      () => idleCalls++,
    );
    const sent: number[][] = [];
    for (let m = 0; m < 40; m++) {
      const sizes = Array.from({ length: 1 + next(3) }, () => {
        const kind = next(10);
        return kind < 6
          ? next(300)
          : kind < 9
            ? DIRECT_BYTES_MIN + next(1000)
            : STAGE_BYTES + next(50_000);
      });
      const frames = sizes.map((size, i) => new Uint8Array(size).fill((m * 7 + i) & 0xff));
      outbox.message(frames);
      // The caller may reuse its buffers at once: scribble over them.
      for (const frame of frames) frame.fill(0xee);
      sent.push(sizes.map((size, i) => size * 1000 + ((m * 7 + i) & 0xff)));
      if (next(4) === 0) await Promise.resolve(); // let the end-of-tick flush run
      if (kernel.full && next(3) === 0) {
        kernel.full = false;
        outbox.drain();
      }
    }
    for (let guard = 0; !outbox.idle || outbox.queuedMessages > 0; guard++) {
      expect(guard).toBeLessThan(100_000);
      await Promise.resolve();
      kernel.full = false;
      outbox.drain();
    }
    expect(outbox.queuedMessages).toBe(0);
    expect(idleCalls).toBeGreaterThan(0);

    const decoder = new FrameDecoder(1 << 30, 16);
    decoder.feed(concat(greetingBytes(), ...kernel.taken));
    const received: number[][] = [];
    let current: number[] = [];
    for (let kind = decoder.next(); kind !== NEED_MORE; kind = decoder.next()) {
      if (kind !== MESSAGE_FRAME) continue;
      const frame = decoder.frame;
      const fill = frame.length === 0 ? -1 : frame[0]!;
      if (frame.length > 0) expect(frame.every((b) => b === fill)).toBe(true);
      current.push(frame.length * 1000 + (fill & 0xff));
      if (!decoder.more) {
        received.push(current);
        current = [];
      }
    }
    // Empty frames carry no fill byte; compare lengths for them.
    const normalize = (messages: number[][]) =>
      messages.map((m) => m.map((v) => (v < 1000 ? 0 : v)));
    expect(normalize(received)).toEqual(normalize(sent));
  }
});

test("queuedMessages holds while the kernel is full and drops to zero on drain", () => {
  const kernel = {
    open: false,
    write: (_d: Uint8Array, _o: number, length: number) => (kernel.open ? length : 0),
  };
  const outbox = new Outbox(
    kernel,
    () => {},
    () => {},
  );
  for (let i = 0; i < 10; i++) outbox.message([new Uint8Array(100_000)]);
  expect(outbox.queuedMessages).toBe(10);
  expect(outbox.blocked).toBe(true);
  kernel.open = true;
  outbox.drain();
  expect(outbox.queuedMessages).toBe(0);
  expect(outbox.idle).toBe(true);
});
