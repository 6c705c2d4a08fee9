// Goal: the sequencer applies every batch exactly once and in order across duplicates,
// gaps with and without replay, replays that fail, time out or start late, buffer
// overflow, malformed batches and engine restarts; and it says when a source's
// state can no longer be trusted (degraded) and when it can again.
import { describe, expect, test } from "bun:test";
import { Sequencer, type SequencerHooks } from "../../src/ingest/sequencer";

interface Harness {
  seq: Sequencer;
  applied: number[];
  resets: string[];
  replays: number[];
  cancels: number;
  events: string[];
  timers: { fire: () => void; ms: number; live: boolean }[];
  clock: { now: number };
}

const bytes = (seq: number) => new Uint8Array([seq & 0xff]);

function harness(options: { replay?: boolean; bad?: Set<number>; bufferMax?: number } = {}): Harness {
  const h: Harness = {
    applied: [], resets: [], replays: [], cancels: 0, events: [], timers: [], clock: { now: 0 },
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
    replayBufferMax: options.bufferMax ?? 100,
    now: () => h.clock.now,
    setTimer: (fire, ms) => {
      const timer = { fire, ms, live: true };
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
    // Every reply re-arms the timer: only the latest is live.
    expect(h.timers.filter((timer) => timer.live)).toHaveLength(1);
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
    const shared = new Uint8Array([2]);
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

describe("engine restarts", () => {
  test("sequence going backwards resets the worker and starts over", () => {
    const h = harness();
    for (let i = 0; i < 4; i++) h.seq.live(i, bytes(i));
    h.seq.live(0, bytes(0));
    expect(h.resets).toHaveLength(1);
    expect(h.applied).toEqual([0, 1, 2, 3, 0]);
    expect(h.seq.counters.restarts).toBe(1);
    expect(h.seq.isDegraded).toBe(false);
  });

  test("a restart seen mid-stream (first seq > 0) resets, then replays from 0", () => {
    const h = harness();
    for (let i = 0; i < 10; i++) h.seq.live(i, bytes(i));
    h.seq.live(2, bytes(2));
    expect(h.resets).toHaveLength(1);
    expect(h.replays).toEqual([0]);
    h.seq.replayBatch(0, bytes(0));
    h.seq.replayBatch(1, bytes(1));
    h.seq.replayBatch(2, bytes(2));
    h.seq.replayEnd();
    expect(h.applied.slice(10)).toEqual([0, 1, 2]);
  });

  test("after a reconnect, a sequence that did not advance means a new publisher", () => {
    const h = harness();
    h.seq.connected(1);
    for (let i = 0; i < 3; i++) h.seq.live(i, bytes(i));
    h.seq.connected(2);
    h.seq.live(2, bytes(2));
    expect(h.resets).toEqual(["sequence did not advance after a reconnect"]);
  });

  test("after a reconnect, an advancing sequence is the same publisher", () => {
    const h = harness();
    h.seq.connected(1);
    h.seq.live(0, bytes(0));
    h.seq.connected(2);
    h.seq.live(1, bytes(1));
    expect(h.resets).toEqual([]);
    expect(h.applied).toEqual([0, 1]);
  });

  test("a restart during a replay cancels it and drops its buffer", () => {
    const h = harness();
    h.seq.live(0, bytes(0));
    h.seq.live(1, bytes(1));
    h.seq.live(5, bytes(5));
    expect(h.seq.isReplaying).toBe(true);
    h.seq.live(0, bytes(0));
    expect(h.cancels).toBe(1);
    expect(h.resets).toHaveLength(1);
    expect(h.seq.isReplaying).toBe(false);
    expect(h.applied).toEqual([0, 1, 0]);
    // Late replies of the abandoned replay are ignored.
    h.seq.replayBatch(2, bytes(2));
    expect(h.applied).toEqual([0, 1, 0]);
  });
});

describe("randomized: lossy network, finite replay ring, restarts", () => {
  // A model engine publishes batches 0..; the network drops some live ones; the
  // replay ring keeps the last `ring` batches. Replies are delivered synchronously.
  // Invariants per engine lifetime: batches are applied in increasing order, at most
  // once, and applied + counted-lost = all published before the next restart.
  test.each(Array.from({ length: 40 }, (_, i) => [i + 1]))("seed %p", (seed) => {
    let state = seed * 2654435761;
    const rand = () => {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      return (state >>> 0) / 2 ** 32;
    };
    const ring = 1 + Math.floor(rand() * 20);
    let published = 0;
    let epochApplied: number[] = [];
    const epochs: { applied: number[]; published: number; lostAtStart: number }[] = [];
    let lostBefore = 0;
    let pendingReplay: number | null = null;
    const sequencer: Sequencer = new Sequencer({
      apply: (seq) => {
        epochApplied.push(seq);
        return true;
      },
      reset: () => {},
      requestReplay: (start) => {
        pendingReplay = start;
      },
    }, { replayTimeoutMs: 1e9, replayCooldownMs: 0, replayBufferMax: 1000, setTimer: () => 0, clearTimer: () => {} });

    const serveReplay = () => {
      if (pendingReplay === null) return;
      const start = pendingReplay;
      pendingReplay = null;
      if (rand() < 0.1) {
        sequencer.replayFailed("refused");
        return;
      }
      for (let seq = Math.max(start, published - ring); seq < published; seq++) sequencer.replayBatch(seq, bytes(seq));
      sequencer.replayEnd();
    };

    const endEpoch = () => {
      epochs.push({ applied: epochApplied, published, lostAtStart: lostBefore });
      epochApplied = [];
    };

    for (let step = 0; step < 300; step++) {
      if (rand() < 0.02 && published > 0) {
        endEpoch();
        lostBefore = sequencer.counters.lost;
        published = 0;
        sequencer.connected(step + 100);
      }
      const seq = published++;
      if (rand() < 0.25) continue;
      sequencer.live(seq, bytes(seq));
      if (rand() < 0.7) serveReplay();
    }
    serveReplay();
    if (sequencer.isReplaying) sequencer.replayFailed("end of test");
    endEpoch();

    for (const epoch of epochs) {
      for (let i = 1; i < epoch.applied.length; i++) expect(epoch.applied[i]!).toBeGreaterThan(epoch.applied[i - 1]!);
      expect(new Set(epoch.applied).size).toBe(epoch.applied.length);
      for (const seq of epoch.applied) expect(seq).toBeLessThan(epoch.published);
    }
    // Nothing is silently skipped: every batch up to the last applied one of the final
    // epoch was applied or counted lost.
    const last = epochs.at(-1)!;
    const top = last.applied.at(-1);
    if (top !== undefined) {
      const lostThisEpoch = sequencer.counters.lost - last.lostAtStart;
      expect(last.applied.length + lostThisEpoch).toBe(top + 1);
    }
  });
});
