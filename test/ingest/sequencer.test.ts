// Goal: the sequencer applies every batch exactly once and in order across duplicates,
// gaps with and without replay, replays that fail, time out or start late, buffer
// overflow, malformed batches and engine restarts; a stream gone quiet after losing its
// last batches gets them from the replay ring (idle probe); and it says when a
// source's state can no longer be trusted (degraded) and when it can again.
import { describe, expect, test } from "bun:test";
import { fingerprint, Sequencer, type SequencerHooks } from "../../src/ingest/sequencer";

interface Harness {
  seq: Sequencer;
  applied: number[];
  resets: string[];
  replays: number[];
  cancels: number;
  events: string[];
  timers: { fire: () => void; ms: number; at: number; live: boolean }[];
  clock: { now: number };
}

/** A batch's bytes: its seq, and which engine lifetime published it (fingerprints differ across lifetimes). */
const bytes = (seq: number, life = 0) => new Uint8Array([seq & 0xff, life]);

function harness(
  options: { replay?: boolean; bad?: Set<number>; bufferMax?: number; idleProbeMs?: number } = {},
): Harness {
  const h: Harness = {
    applied: [],
    resets: [],
    replays: [],
    cancels: 0,
    events: [],
    timers: [],
    clock: { now: 0 },
  } as unknown as Harness;
  const hooks: SequencerHooks = {
    apply: (seq, payload) => {
      expect(payload[0]).toBe(seq & 0xff);
      if (options.bad?.has(seq)) return false;
      h.applied.push(seq);
      return true;
    },
    reset: (reason) => h.resets.push(reason),
    event: (kind) => h.events.push(kind),
  };
  if (options.replay !== false) {
    hooks.requestReplay = (start) => h.replays.push(start);
    hooks.cancelReplay = () => h.cancels++;
  }
  h.seq = new Sequencer(hooks, {
    replayTimeoutMs: 1000,
    replayCooldownMs: 5000,
    replayBufferBytes: 2 * (options.bufferMax ?? 100),
    replayDeadlineMs: 10_000,
    idleProbeMs: options.idleProbeMs ?? 0,
    now: () => h.clock.now,
    setTimer: (fire, ms) => {
      const timer = { fire, ms, at: h.clock.now + ms, live: true };
      h.timers.push(timer);
      return timer;
    },
    clearTimer: (timer) => {
      (timer as { live: boolean }).live = false;
    },
  });
  return h;
}

const fireTimers = (h: Harness) => {
  for (const timer of h.timers.splice(0)) if (timer.live) timer.fire();
};

/** Moves the fake clock to `to`, firing every timer due on the way, in time order. */
const advanceTo = (h: Harness, to: number) => {
  for (;;) {
    const due = h.timers
      .filter((timer) => timer.live && timer.at <= to)
      .sort((a, b) => a.at - b.at)[0];
    if (due === undefined) break;
    h.clock.now = Math.max(h.clock.now, due.at);
    due.live = false;
    due.fire();
  }
  h.clock.now = to;
};

describe("in-order delivery", () => {
  test("contiguous batches from 0 are applied in order", () => {
    const h = harness();
    for (let i = 0; i < 5; i++) h.seq.live(i, bytes(i));
    expect(h.applied).toEqual([0, 1, 2, 3, 4]);
    expect(h.seq.isDegraded).toBe(false);
    expect(h.seq.counters.applied).toBe(5);
  });

  test("a duplicate is skipped and counted", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(1, bytes(1));
    h.seq.live(1, bytes(1));
    h.seq.live(2, bytes(2));
    expect(h.applied).toEqual([0, 1, 2]);
    expect(h.seq.counters.duplicates).toBe(1);
    expect(h.resets).toEqual([]);
  });
});

describe("gaps with replay", () => {
  test("gap → replay from last+1; live batches held meanwhile; replay then buffer applied once", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(3, bytes(3));
    h.seq.live(4, bytes(4));
    expect(h.replays).toEqual([1]);
    expect(h.applied).toEqual([0]);
    expect(h.seq.isReplaying).toBe(true);
    // The engine replays everything it has from 1, overlapping the buffered live batches.
    for (const seq of [1, 2, 3, 4]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4]);
    expect(h.seq.counters.replayed).toBe(4);
    expect(h.seq.counters.duplicates).toBe(2);
    expect(h.seq.isDegraded).toBe(false);
    h.seq.live(5, bytes(5));
    expect(h.applied.at(-1)).toBe(5);
  });

  test("first batch after a late start is a gap from 0", () => {
    const h = harness();
    h.seq.live(7, bytes(7));
    expect(h.replays).toEqual([0]);
    for (let seq = 0; seq <= 7; seq++) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a replay that starts after the gap (engine ring too short) counts the loss, degrades", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(10, bytes(10));
    for (const seq of [6, 7, 8, 9, 10]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 6, 7, 8, 9, 10]);
    expect(h.seq.counters.lost).toBe(5);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("a gap still open after a complete replay is a loss, not a second replay", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(5, bytes(5));
    h.seq.replayBatch(1, bytes(1));
    h.seq.replayEnd();
    expect(h.replays).toEqual([1]);
    expect(h.applied).toEqual([0, 1, 5]);
    expect(h.seq.counters.lost).toBe(3);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("replay timeout: failure counted, buffer applied with the loss, cooldown blocks new replays", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(2, bytes(2));
    h.seq.live(3, bytes(3));
    fireTimers(h);
    expect(h.seq.counters.replaysFailed).toBe(1);
    expect(h.cancels).toBe(1);
    expect(h.applied).toEqual([0, 2, 3]);
    expect(h.seq.counters.lost).toBe(1);
    expect(h.seq.isDegraded).toBe(true);
    // Within the cooldown a new gap is a loss at once.
    h.seq.live(6, bytes(6));
    expect(h.replays).toEqual([1]);
    expect(h.applied.at(-1)).toBe(6);
    // After it, replays are asked for again.
    h.clock.now = 6000;
    h.seq.live(9, bytes(9));
    expect(h.replays).toEqual([1, 7]);
  });

  test("replay replies keep the timeout from firing while they flow", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(3, bytes(3));
    h.seq.replayBatch(1, bytes(1));
    // Every reply re-arms the idle timer: only the latest is live (besides the overall deadline).
    expect(h.timers.filter((timer) => timer.live && timer.ms === 1000)).toHaveLength(1);
    h.seq.replayBatch(2, bytes(2));
    h.seq.replayEnd();
    expect(h.timers.filter((timer) => timer.live)).toHaveLength(0);
    expect(h.applied).toEqual([0, 1, 2, 3]);
  });

  test("buffer overflow during a replay drops live batches; the next gap replays them", () => {
    const h = harness({ bufferMax: 2 });
    h.seq.live(0, bytes(0));
    for (const seq of [5, 6, 7, 8]) h.seq.live(seq, bytes(seq));
    expect(h.seq.counters.bufferDropped).toBe(2);
    for (const seq of [1, 2, 3, 4]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6]);
    h.seq.live(9, bytes(9));
    expect(h.replays).toEqual([1, 7]);
    for (const seq of [7, 8, 9]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(h.seq.counters.lost).toBe(0);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("buffered payloads are copied (the receive buffer may be reused)", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    const shared = bytes(2);
    h.seq.live(2, shared);
    shared[0] = 99;
    h.seq.replayBatch(1, bytes(1));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2]);
  });
});

describe("gaps without replay", () => {
  test("no replay endpoint: the gap is counted lost and the source degraded", () => {
    const h = harness({ replay: false });
    h.seq.live(0, bytes(0));
    h.seq.live(4, bytes(4));
    expect(h.applied).toEqual([0, 4]);
    expect(h.seq.counters.gaps).toBe(1);
    expect(h.seq.counters.lost).toBe(3);
    expect(h.seq.isDegraded).toBe(true);
    expect(h.events).toContain("degraded");
  });

  test("a malformed batch advances the sequence, is counted, and degrades the source", () => {
    const h = harness({ bad: new Set([1]) });
    for (let i = 0; i < 3; i++) h.seq.live(i, bytes(i));
    expect(h.applied).toEqual([0, 2]);
    expect(h.seq.counters.malformed).toBe(1);
    expect(h.seq.isDegraded).toBe(true);
    expect(h.replays).toEqual([]);
  });

  test("markExact (an applied AllBlocksCleared) clears the degraded state", () => {
    const h = harness({ replay: false });
    h.seq.live(3, bytes(3));
    expect(h.seq.isDegraded).toBe(true);
    h.seq.markExact();
    expect(h.seq.isDegraded).toBe(false);
  });
});

describe("one live connection", () => {
  test("a lower seq is a late duplicate, not a restart (a replay overtook it in flight)", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(3, bytes(3));
    // The replay serves everything the engine has, past the live batch still in flight.
    for (const seq of [1, 2, 3, 4, 5]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    h.seq.live(4, bytes(4));
    h.seq.live(6, bytes(6));
    expect(h.resets).toEqual([]);
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(h.seq.counters.duplicates).toBe(2);
    expect(h.seq.counters.restarts).toBe(0);
  });

  test("seq 0 again on the same connection is a duplicate too", () => {
    const h = harness();
    for (let i = 0; i < 4; i++) h.seq.live(i, bytes(i));
    h.seq.live(0, bytes(0));
    expect(h.resets).toEqual([]);
    expect(h.applied).toEqual([0, 1, 2, 3]);
  });
});

/** Serves a replay from `ring` (the engine's kept batches) starting at `start`. */
function serve(h: Harness, ring: { seq: number; life: number }[]): void {
  const start = h.replays.at(-1)!;
  for (const batch of ring)
    if (batch.seq >= start) h.seq.replayBatch(batch.seq, bytes(batch.seq, batch.life));
  h.seq.replayEnd();
}

const ringOf = (from: number, to: number, life: number) =>
  Array.from({ length: to - from + 1 }, (_, i) => ({ seq: from + i, life }));

describe("continuity on (re)connect, with a replay endpoint", () => {
  test("every connect probes from 0 and holds the worker degraded until the probe ends", () => {
    const h = harness();
    h.seq.connected();
    expect(h.replays).toEqual([0]);
    expect(h.seq.isDegraded).toBe(true);
    h.seq.live(3, bytes(3));
    serve(h, ringOf(0, 2, 0));
    expect(h.applied).toEqual([0, 1, 2, 3]);
    expect(h.seq.counters.rebuilds).toBe(1);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("empty ring after a restart: the idle engine holds nothing, the worker is cleared (case 2)", () => {
    const h = harness();
    h.seq.connected();
    serve(h, ringOf(0, 4, 0));
    expect(h.resets).toHaveLength(1);
    h.seq.connected();
    serve(h, []);
    expect(h.resets).toHaveLength(2);
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.seq.lastSeq).toBe(-1);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("an engine that restarted and published past the old last seq is rebuilt, not continued (case 1)", () => {
    const h = harness();
    h.seq.connected();
    serve(h, []);
    for (let i = 0; i < 5; i++) h.seq.live(i, bytes(i, 0));
    h.seq.connected();
    serve(h, ringOf(0, 8, 1));
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    expect(h.seq.lastSeq).toBe(8);
    expect(h.seq.isDegraded).toBe(false);
    h.seq.live(9, bytes(9, 1));
    expect(h.applied.at(-1)).toBe(9);
  });

  test("the same engine after a reconnect: the fingerprint of last matches, only newer batches apply", () => {
    const h = harness();
    h.seq.connected();
    serve(h, []);
    for (let i = 0; i < 5; i++) h.seq.live(i, bytes(i, 0));
    h.seq.connected();
    serve(h, ringOf(0, 7, 0));
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(h.seq.counters.continued).toBe(1);
    expect(h.seq.counters.restarts).toBe(0);
    expect(h.resets).toEqual([]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a ring that starts later but holds last continues when the fingerprint matches", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    serve(h, ringOf(6, 12, 0));
    expect(h.applied).toEqual([11, 12]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a restarted engine whose ring no longer starts at 0: cleared, loss counted, degraded", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    serve(h, ringOf(6, 12, 1));
    expect(h.resets).toHaveLength(1);
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.seq.counters.lost).toBe(6);
    expect(h.applied).toEqual([6, 7, 8, 9, 10, 11, 12]);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("a ring that ends before last: the engine restarted; rebuilt from its ring", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    serve(h, ringOf(0, 3, 1));
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.applied).toEqual([0, 1, 2, 3]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a ring starting at last + 1 continues; one starting past it counts the gap", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    serve(h, ringOf(11, 12, 0));
    expect(h.applied).toEqual([11, 12]);
    expect(h.seq.isDegraded).toBe(false);
    h.seq.connected();
    serve(h, ringOf(20, 21, 0));
    expect(h.seq.counters.lost).toBe(7);
    expect(h.seq.isDegraded).toBe(true);
    expect(h.resets).toEqual([]);
  });

  test("a degraded worker is rebuilt (and exact again) when the ring starts at 0", () => {
    const h = harness({ replay: true });
    h.seq.connected();
    serve(h, ringOf(0, 2, 0));
    h.seq.replayFailed("x");
    h.seq.live(5, bytes(5));
    h.seq.replayFailed("refused");
    expect(h.seq.isDegraded).toBe(true);
    h.seq.connected();
    serve(h, ringOf(0, 6, 0));
    expect(h.seq.isDegraded).toBe(false);
    expect(h.seq.counters.rebuilds).toBe(2);
  });

  test("a probe that fails leaves the worker degraded; a held batch 0 then proves a fresh engine", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    h.seq.live(0, bytes(0, 1));
    h.seq.live(1, bytes(1, 1));
    fireTimers(h);
    expect(h.seq.counters.replaysFailed).toBe(1);
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.applied).toEqual([0, 1]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a probe that fails with no proof of a new stream: degraded, blocks kept", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    h.seq.live(11, bytes(11));
    h.seq.replayFailed("refused");
    expect(h.resets).toEqual([]);
    expect(h.applied).toEqual([11]);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("a new connection abandons the replay in flight and its held batches", () => {
    const h = harness();
    h.seq.connected();
    h.seq.live(0, bytes(0));
    h.seq.connected();
    expect(h.cancels).toBe(1);
    serve(h, []);
    expect(h.applied).toEqual([]);
  });
});

describe("continuity: bounds and saved positions", () => {
  test("a restored exact position is not exact until a connection's probe confirms it", () => {
    const h = harness();
    h.seq.restore(3, fingerprintOf(3, 0), false);
    expect(h.seq.isDegraded).toBe(true);
    h.seq.connected();
    expect(h.seq.isDegraded).toBe(true);
    for (const seq of [0, 1, 2, 3, 4]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([4]);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("probe replies awaiting the fingerprint are byte-capped: over the cap the probe fails, nothing half-applied", () => {
    const h = harness({ bufferMax: 2 }); // 4 bytes: two 2-byte batches
    h.seq.restore(10, fingerprintOf(10, 0), false);
    h.seq.connected();
    for (const seq of [0, 1, 2]) h.seq.replayBatch(seq, bytes(seq));
    expect(h.seq.counters.replaysFailed).toBe(1);
    expect(h.applied).toEqual([]);
    expect(h.resets).toEqual([]);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("a position restored as degraded stays degraded when the probe only continues it", () => {
    const h = harness();
    h.seq.restore(10, fingerprintOf(10, 0), true);
    h.seq.connected();
    serve(h, ringOf(5, 12, 0));
    expect(h.applied).toEqual([11, 12]);
    expect(h.seq.isDegraded).toBe(true);
  });
});

describe("the fingerprint of last", () => {
  test("is of the bytes as applied, though the caller reuses its buffer after each call", () => {
    const h = harness();
    const receive = new Uint8Array(2);
    for (let i = 0; i < 5; i++) {
      receive.set(bytes(i, 0));
      h.seq.live(i, receive);
    }
    receive.fill(0xff);
    expect(h.seq.lastFingerprint).toBe(fingerprintOf(4, 0));
    h.seq.connected();
    serve(h, ringOf(0, 6, 0));
    expect(h.applied).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(h.seq.counters.continued).toBe(1);
    expect(h.resets).toEqual([]);
  });

  test("follows batches much larger and then smaller than the kept copy", () => {
    const h = harness();
    const batch = (seq: number, length: number) => {
      const payload = new Uint8Array(length);
      for (let k = 0; k < length; k++) payload[k] = (seq * 7 + k) & 0xff;
      payload[0] = seq & 0xff;
      return payload;
    };
    const small = Array.from({ length: 70 }, (_, i) => 2 + (i % 9));
    const lengths = [3, 100_000, 5, ...small, 70_000, 4];
    lengths.forEach((length, seq) => {
      const payload = batch(seq, length);
      h.seq.live(seq, payload);
      payload.fill(0);
      expect(h.seq.lastFingerprint).toBe(fingerprint(batch(seq, length)));
    });
    expect(h.applied.length).toBe(lengths.length);
  });

  test("a restored fingerprint is kept as it was saved", () => {
    const h = harness();
    h.seq.restore(10, 12345, false);
    expect(h.seq.lastFingerprint).toBe(12345);
    h.seq.restore(10, -2, false);
    expect(h.seq.lastFingerprint).toBe(-1);
  });
});

describe("continuity on (re)connect, without a replay endpoint", () => {
  test("after a connect the worker is degraded until batch 0 (a fresh engine) arrives (case 3)", () => {
    const h = harness({ replay: false });
    h.seq.connected();
    expect(h.seq.isDegraded).toBe(true);
    h.seq.live(0, bytes(0));
    expect(h.seq.isDegraded).toBe(false);
    // The change is announced (the router's view of the worker follows the events).
    expect(h.events.slice(-1)).toEqual(["exact"]);
  });

  test("batch 0 after a reconnect is a restart: cleared, exact", () => {
    const h = harness({ replay: false });
    h.seq.connected();
    for (let i = 0; i < 3; i++) h.seq.live(i, bytes(i));
    h.seq.connected();
    h.seq.live(0, bytes(0, 1));
    expect(h.resets).toHaveLength(1);
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a sequence that did not advance after a reconnect means a new publisher", () => {
    const h = harness({ replay: false });
    h.seq.connected();
    for (let i = 0; i < 3; i++) h.seq.live(i, bytes(i));
    h.seq.connected();
    h.seq.live(2, bytes(2, 1));
    expect(h.resets).toEqual(["sequence did not advance after a reconnect"]);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("an advancing sequence after a reconnect may be a restarted engine: applied, but degraded (case 1)", () => {
    const h = harness({ replay: false });
    h.seq.connected();
    h.seq.live(0, bytes(0));
    h.seq.connected();
    h.seq.live(1, bytes(1, 1));
    expect(h.resets).toEqual([]);
    expect(h.applied).toEqual([0, 1]);
    expect(h.seq.isDegraded).toBe(true);
    // An AllBlocksCleared makes it exact again.
    h.seq.markExact();
    expect(h.seq.isDegraded).toBe(false);
  });
});

describe("stray sequence numbers (case 10)", () => {
  test("one batch with seq 2^53 - 1 is skipped and counted once; the stream goes on without a reset", () => {
    const h = harness();
    for (let i = 0; i < 3; i++) h.seq.live(i, bytes(i));
    h.seq.live(2 ** 53 - 1, bytes(0));
    h.seq.live(3, bytes(3));
    h.seq.live(4, bytes(4));
    expect(h.applied).toEqual([0, 1, 2, 3, 4]);
    expect(h.seq.counters.lost).toBe(1);
    expect(h.seq.counters.straySeqs).toBe(1);
    expect(h.resets).toEqual([]);
    expect(h.seq.lastSeq).toBe(4);
  });

  test("a far jump confirmed by the next batch is the stream's real position", () => {
    const h = harness({ replay: false });
    h.seq.live(0, bytes(0));
    h.seq.live(5_000_000, bytes(5_000_000));
    h.seq.live(5_000_001, bytes(5_000_001));
    expect(h.applied).toEqual([0, 5_000_001]);
    expect(h.seq.lastSeq).toBe(5_000_001);
    expect(h.seq.counters.lost).toBe(1 + 5_000_000);
  });
});

describe("replay bounds (case 7)", () => {
  test("a replay that keeps resending a batch ends at its deadline; live batches then apply", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(2, bytes(2));
    for (let i = 0; i < 50; i++) h.seq.replayBatch(1, bytes(1));
    expect(h.seq.isReplaying).toBe(true);
    const deadline = h.timers.find((timer) => timer.live && timer.ms === 10_000)!;
    deadline.fire();
    expect(h.seq.isReplaying).toBe(false);
    expect(h.seq.counters.replaysFailed).toBe(1);
    expect(h.applied).toEqual([0, 1, 2]);
  });

  test("live batches held during a replay are capped in bytes", () => {
    const h = harness({ bufferMax: 3 });
    h.seq.live(0, bytes(0));
    h.seq.live(2, new Uint8Array(4).fill(2));
    h.seq.live(3, new Uint8Array(4).fill(3));
    expect(h.seq.counters.bufferDropped).toBe(1);
    expect(h.seq.counters.bufferedBytesMax).toBe(4);
  });
});

function fingerprintOf(seq: number, life: number): number {
  return fingerprint(bytes(seq, life));
}

describe("idle probe: a quiet stream asks the ring for a lost tail", () => {
  test("the tail the live stream lost is applied once the stream has been quiet idleProbeMs", () => {
    const h = harness({ idleProbeMs: 1000 });
    for (const seq of [0, 1, 2]) h.seq.live(seq, bytes(seq));
    // 3 and 4 were published and dropped at the engine's PUB; then it went quiet.
    advanceTo(h, 999);
    expect(h.replays).toEqual([]);
    advanceTo(h, 1000);
    expect(h.replays).toEqual([2]);
    // The ring from `last`: our last batch (its fingerprint proves the same stream), then the tail.
    for (const seq of [2, 3, 4]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4]);
    expect(h.seq.counters.idleProbes).toBe(1);
    expect(h.seq.counters.idleProbeBatches).toBe(2);
    expect(h.seq.counters.lost).toBe(0);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("activity postpones it; while quiet it asks once every idleProbeMs", () => {
    const h = harness({ idleProbeMs: 1000 });
    h.seq.live(0, bytes(0));
    advanceTo(h, 600);
    h.seq.live(1, bytes(1));
    advanceTo(h, 1599);
    expect(h.replays).toEqual([]);
    advanceTo(h, 1600);
    expect(h.replays).toEqual([1]);
    h.seq.replayBatch(1, bytes(1));
    h.seq.replayEnd();
    advanceTo(h, 2599);
    expect(h.replays).toEqual([1]);
    advanceTo(h, 2600);
    expect(h.replays).toEqual([1, 1]);
    // Only one quiet timer is ever armed, however many batches arrive.
    h.seq.replayBatch(1, bytes(1));
    h.seq.replayEnd();
    for (let seq = 2; seq < 50; seq++) h.seq.live(seq, bytes(seq));
    expect(h.timers.filter((timer) => timer.live)).toHaveLength(1);
  });

  test("a ring whose first batch is not ours (a restarted engine) applies nothing and degrades", () => {
    const h = harness({ idleProbeMs: 1000 });
    for (const seq of [0, 1, 2]) h.seq.live(seq, bytes(seq));
    advanceTo(h, 1000);
    h.seq.replayBatch(2, bytes(2, 1)); // seq 2 of another engine lifetime
    expect(h.cancels).toBe(1);
    h.seq.replayBatch(3, bytes(3, 1));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2]);
    expect(h.seq.isDegraded).toBe(true);
  });

  test("a ring without our last batch (empty, or starting past it) degrades", () => {
    for (const first of [null, 3]) {
      const h = harness({ idleProbeMs: 1000 });
      for (const seq of [0, 1, 2]) h.seq.live(seq, bytes(seq));
      advanceTo(h, 1000);
      if (first !== null) h.seq.replayBatch(first, bytes(first));
      h.seq.replayEnd();
      expect(h.applied).toEqual([0, 1, 2]);
      expect(h.seq.isDegraded).toBe(true);
    }
  });

  test("live batches that arrive during the probe wait for it, then apply in order", () => {
    const h = harness({ idleProbeMs: 1000 });
    for (const seq of [0, 1]) h.seq.live(seq, bytes(seq));
    advanceTo(h, 1000);
    h.seq.live(4, bytes(4));
    expect(h.applied).toEqual([0, 1]);
    for (const seq of [1, 2, 3, 4]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1, 2, 3, 4]);
    expect(h.seq.counters.duplicates).toBe(1);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a probe that fails is counted, degrades nothing, and waits out the cooldown", () => {
    const h = harness({ idleProbeMs: 1000 });
    h.seq.live(0, bytes(0));
    advanceTo(h, 1000);
    expect(h.replays).toEqual([0]);
    advanceTo(h, 2000); // the reply timeout (1000 ms)
    expect(h.seq.counters.replaysFailed).toBe(1);
    expect(h.seq.isDegraded).toBe(false);
    advanceTo(h, 6999);
    expect(h.replays).toEqual([0]);
    advanceTo(h, 7000); // cooldown (5000 ms) over
    expect(h.replays).toEqual([0, 0]);
  });

  test("never without a replay endpoint, nor when idleProbeMs is 0, nor while trust is unknown", () => {
    const none = harness({ replay: false, idleProbeMs: 1000 });
    none.seq.live(0, bytes(0));
    const off = harness({ idleProbeMs: 0 });
    off.seq.live(0, bytes(0));
    advanceTo(none, 10_000);
    advanceTo(off, 10_000);
    expect([none.timers.length, off.timers.length, off.replays]).toEqual([0, 0, []]);
    // A connect probe that failed leaves the engine unknown: no idle probe until batch 0 or a clear.
    const unknown = harness({ idleProbeMs: 1000 });
    unknown.seq.connected();
    advanceTo(unknown, 1000); // the connect probe times out
    expect(unknown.replays).toEqual([0]);
    advanceTo(unknown, 20_000);
    expect(unknown.replays).toEqual([0]);
    expect(unknown.seq.isDegraded).toBe(true);
  });

  test("an empty stream (nothing applied yet) asks the ring from 0", () => {
    const h = harness({ idleProbeMs: 1000 });
    h.seq.connected();
    h.seq.replayEnd(); // an empty ring: the engine holds nothing
    advanceTo(h, 1000);
    expect(h.replays).toEqual([0, 0]);
    for (const seq of [0, 1]) h.seq.replayBatch(seq, bytes(seq));
    h.seq.replayEnd();
    expect(h.applied).toEqual([0, 1]);
    expect(h.seq.isDegraded).toBe(false);
  });
});

describe("randomized: lossy network, finite ring, restarts, reconnects; exact means equal", () => {
  // A model engine publishes batches; each batch adds one element (life, seq) to its
  // cache. The consumer's "index" is what it applied since its last reset. Live
  // messages are dropped, replays fail, the engine restarts (sometimes idle) and the
  // connection drops. Whenever the sequencer says exact and idle, index == engine.
  test.each(Array.from({ length: 60 }, (_, i) => [i + 1]))("seed %p", (seed) => {
    let state = seed * 2654435761;
    const rand = () => {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      return (state >>> 0) / 2 ** 32;
    };
    const hasReplay = rand() < 0.8;
    const ringSize = 1 + Math.floor(rand() * 30);
    let life = 0;
    let engine: number[] = [];
    let index = new Set<string>();
    let pending: number | null = null;
    const hooks: SequencerHooks = {
      apply: (seq, payload) => {
        expect(payload[0]).toBe(seq & 0xff);
        index.add(`${payload[1]}:${seq}`);
        return true;
      },
      reset: () => {
        index = new Set();
      },
    };
    if (hasReplay) hooks.requestReplay = (start) => (pending = start);
    const sequencer = new Sequencer(hooks, {
      replayTimeoutMs: 1e9,
      replayDeadlineMs: 1e9,
      replayCooldownMs: 0,
      replayBufferBytes: 1 << 20,
      setTimer: () => 0,
      clearTimer: () => {},
    });
    const serveReplay = () => {
      if (pending === null) return;
      const start = pending;
      pending = null;
      if (rand() < 0.1) return sequencer.replayFailed("refused");
      for (let seq = Math.max(start, engine.length - ringSize); seq < engine.length; seq++) {
        sequencer.replayBatch(seq, bytes(seq, life));
      }
      sequencer.replayEnd();
    };
    let compared = 0;
    const check = () => {
      if (sequencer.isDegraded || sequencer.isReplaying) return;
      compared++;
      // A dropped trailing batch can't be noticed before the next one: exact as of lastSeq.
      const want = new Set(
        engine.filter((seq) => seq <= sequencer.lastSeq).map((seq) => `${life}:${seq}`),
      );
      expect([...index].sort()).toEqual([...want].sort());
    };
    sequencer.connected();
    serveReplay();
    for (let step = 0; step < 400; step++) {
      const r = rand();
      if (r < 0.03) {
        // A restart (always a new connection); sometimes idle: nothing published before the probe.
        life++;
        engine = [];
        sequencer.connected();
        if (rand() < 0.5) {
          serveReplay();
          check();
          continue;
        }
      } else if (r < 0.06) {
        sequencer.connected();
      }
      const seq = engine.length;
      engine.push(seq);
      if (rand() < 0.2) continue;
      sequencer.live(seq, bytes(seq, life));
      if (rand() < 0.7) serveReplay();
      check();
    }
    serveReplay();
    check();
    expect(compared).toBeGreaterThan(0);
  });
});

describe("randomized with idle probes: once the engine has gone quiet and been probed, exact means equal to all it published", () => {
  // The model above, on a fake clock, with the engine going quiet now and then: after
  // an idle probe served in full, "exact" must mean equal to everything the engine
  // published, not only up to the last batch received live.
  test.each(Array.from({ length: 40 }, (_, i) => [i + 1]))("seed %p", (seed) => {
    let state = seed * 40503 + 17;
    const rand = () => {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      return (state >>> 0) / 2 ** 32;
    };
    const ringSize = 4 + Math.floor(rand() * 30);
    let life = 0;
    let engine: number[] = [];
    let index = new Set<string>();
    let pending: number | null = null;
    let now = 0;
    const timers: { at: number; fire: () => void; live: boolean }[] = [];
    const sequencer = new Sequencer(
      {
        apply: (seq, payload) => {
          index.add(`${payload[1]}:${seq}`);
          return true;
        },
        reset: () => {
          index = new Set();
        },
        requestReplay: (start) => {
          pending = start;
        },
        cancelReplay: () => {
          pending = null;
        },
      },
      {
        replayTimeoutMs: 1e9,
        replayDeadlineMs: 1e9,
        replayCooldownMs: 0,
        replayBufferBytes: 1 << 20,
        idleProbeMs: 100,
        now: () => now,
        setTimer: (fire, ms) => {
          const timer = { at: now + ms, fire, live: true };
          timers.push(timer);
          return timer;
        },
        clearTimer: (timer) => {
          (timer as { live: boolean }).live = false;
        },
      },
    );
    /** Serves the replay asked for; false when it failed. */
    const serveReplay = (): boolean => {
      if (pending === null) return true;
      const start = pending;
      pending = null;
      if (rand() < 0.1) {
        sequencer.replayFailed("refused");
        return false;
      }
      for (let seq = Math.max(start, engine.length - ringSize); seq < engine.length; seq++) {
        sequencer.replayBatch(seq, bytes(seq, life));
        if (!sequencer.isReplaying) return true; // abandoned: the ring did not continue ours
      }
      sequencer.replayEnd();
      return true;
    };
    const quiet = () => {
      now += 100;
      for (const timer of timers.splice(0)) if (timer.live && timer.at <= now) timer.fire();
    };
    let strict = 0;
    const check = (all: boolean) => {
      if (sequencer.isDegraded || sequencer.isReplaying) return;
      const upTo = all ? engine.length - 1 : sequencer.lastSeq;
      const want = engine.filter((seq) => seq <= upTo).map((seq) => `${life}:${seq}`);
      expect([...index].sort()).toEqual(want.sort());
      if (all) strict++;
    };
    sequencer.connected();
    serveReplay();
    for (let step = 0; step < 400; step++) {
      now += 1;
      const r = rand();
      if (r < 0.02) {
        life++;
        engine = [];
        sequencer.connected();
        serveReplay();
      } else if (r < 0.15) {
        // The engine goes quiet: its quiet timer asks the ring; served in full, all is known.
        quiet();
        const served = pending !== null && serveReplay();
        check(served);
        continue;
      }
      const seq = engine.length;
      engine.push(seq);
      if (rand() < 0.25) continue; // dropped at the engine's PUB
      sequencer.live(seq, bytes(seq, life));
      if (rand() < 0.7) serveReplay();
      check(false);
    }
    expect(strict).toBeGreaterThan(0);
  });
});

describe("why a worker is degraded, in words", () => {
  test("each cause names itself; exact again, there is no reason", () => {
    const gap = harness({ replay: false });
    gap.seq.live(0, bytes(0));
    expect(gap.seq.degradedReason).toBeNull();
    gap.seq.live(4, bytes(4));
    expect(gap.seq.degradedReason).toBe("3 batches lost: a gap, and no replay endpoint");
    gap.seq.live(9, bytes(9)); // a second cause does not replace the first
    expect(gap.seq.degradedReason).toBe("3 batches lost: a gap, and no replay endpoint");
    gap.seq.markExact();
    expect(gap.seq.degradedReason).toBeNull();

    const unknown = harness({ replay: false });
    unknown.seq.connected();
    expect(unknown.seq.degradedReason).toBe(
      "connected without a replay endpoint: state unknown until batch 0 or a clear",
    );

    const probing = harness();
    probing.seq.restore(10, fingerprintOf(10, 0), false);
    probing.seq.connected();
    expect(probing.seq.degradedReason).toBe(
      "connect probe running: the engine's state is not known yet",
    );
    probing.seq.live(11, bytes(11));
    probing.seq.replayFailed("refused");
    expect(probing.seq.degradedReason).toBe("connect probe failed (refused): state unknown");

    const late = harness();
    late.seq.restore(10, fingerprintOf(10, 0), false);
    late.seq.connected();
    serve(late, ringOf(6, 12, 1));
    expect(late.seq.degradedReason).toBe(
      "6 batches lost: restarted engine's replay ring starts late",
    );

    const malformed = harness({ bad: new Set([1]) });
    for (let i = 0; i < 3; i++) malformed.seq.live(i, bytes(i));
    expect(malformed.seq.degradedReason).toBe("1 batch lost: malformed batch");

    const saved = harness();
    saved.seq.restore(5, fingerprintOf(5, 0), true);
    expect(saved.seq.degradedReason).toBe("degraded when the snapshot was saved");
  });
});
