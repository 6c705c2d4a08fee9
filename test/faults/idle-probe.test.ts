// Goal: no silent tail loss. An engine whose last batches are dropped at its PUB and
// which then goes quiet is exact again in kvedge within ingest.idle_probe_ms plus one
// replay round trip, not at its next publish (it publishes nothing more): the quiet
// stream asks the replay ring for what follows its last batch and applies it. With the
// index on the socket thread and on the writer thread (`--index-threads 1`). Method: a
// real engine process (a libzmq PUB and replay ROUTER, test/interop/engine.mjs) and a
// real `kvedge serve`; the test keeps the truth (the blocks its batches leave cached)
// and waits for conditions, never for a time.
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { encodeKvBatch, type KvEvent } from "../../src/wire/kv-events";
import { stored } from "../support/engine";
import { eventually } from "../support/wait";
import { NodeEngine } from "../interop/libzmq";
import { metric, serveFor, workerView } from "./rig";

setDefaultTimeout(60_000);

const BS = 4;
const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

/** One engine stream: its batches, and the blocks they leave cached. */
class Stream {
  readonly truth = new Set<string>();
  seq = 0;

  constructor(private readonly engine: NodeEngine) {}

  publish(events: KvEvent[], lose = false): void {
    for (const event of events) {
      if (event.type === "BlockStored")
        for (const h of event.blockHashes) this.truth.add(String(h));
      else if (event.type === "BlockRemoved")
        for (const h of event.blockHashes) this.truth.delete(String(h));
    }
    const payload = encodeKvBatch(
      { ts: Date.now() / 1000, events, dpRank: 0 },
      { variant: "vllm-v7" },
    );
    this.engine.publish(this.seq++, payload, lose);
  }
}

const tokensOf = (n: number) => Array.from({ length: BS }, (_, t) => n * 10 + t + 1);
/** A one-block store whose hash (5000 + n) and tokens follow from `n`. */
const block = (n: number): KvEvent => stored([BigInt(5000 + n)], tokensOf(n), BS);

/**
 * The blocks among `candidates` kvedge answers worker 1 holds (by /v1/match, which both
 * index modes serve; the writer thread's index has no /v1/dump), as external hashes.
 */
async function heldOf(url: string, candidates: number[]): Promise<string[]> {
  const held: string[] = [];
  for (const n of candidates) {
    const response = await fetch(`${url}/v1/match`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token_ids: tokensOf(n) }),
    });
    const body = (await response.json()) as { scores: { worker_id: string; blocks: number }[] };
    if (body.scores.some((score) => score.worker_id === "1" && score.blocks === 1))
      held.push(String(5000 + n));
  }
  return held.sort();
}

const series = (outcome: string) =>
  `kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="${outcome}"}`;

describe("a lost tail, then silence", () => {
  for (const threads of ["0", "1"]) {
    test(`index threads ${threads}: the idle probe brings the lost batches; exact, equal to the engine`, async () => {
      const engine = await NodeEngine.start({
        pub: "tcp://127.0.0.1:0",
        router: "tcp://127.0.0.1:0",
        replayTopic: true,
      });
      cleanups.push(() => engine.kill());
      const serve = await serveFor(
        [`1=${engine.endpoint};replay=${engine.replayEndpoint}`],
        ["--block-size", String(BS), "--index-threads", threads, "--idle-probe-ms", "400"],
      );
      cleanups.push(() => serve.stop());
      const stream = new Stream(engine);
      const worker = () => workerView(serve.url, "1");

      // Live batches (one dropped before the subscription lands is a gap the ring fills).
      for (let n = 0; n < 5; n++) stream.publish([block(n)]);
      stream.publish([{ type: "BlockRemoved", blockHashes: [5001n], medium: "GPU", groupIdx: 0 }]);
      await eventually(
        async () => {
          const view = await worker();
          return view?.last_seq === 5 && !view.degraded ? true : undefined;
        },
        20_000,
        "the live batches indexed",
      );
      const probesBefore = await metric(serve.url, series("tail_batch"));

      // The engine's PUB drops its last three batches (they reach its replay ring); then it is quiet.
      stream.publish([block(10), block(11)], true);
      stream.publish(
        [{ type: "BlockRemoved", blockHashes: [5002n], medium: "GPU", groupIdx: 0 }],
        true,
      );
      stream.publish([block(12)], true);
      await engine.done(9);

      await eventually(
        async () => {
          const view = await worker();
          return view?.last_seq === 8 && !view.degraded ? true : undefined;
        },
        20_000,
        "the lost tail indexed",
      );
      const candidates = [0, 1, 2, 3, 4, 10, 11, 12];
      expect(await heldOf(serve.url, candidates)).toEqual([...stream.truth].sort());
      expect((await worker())?.blocks).toBe(stream.truth.size);
      expect((await metric(serve.url, series("tail_batch"))) - probesBefore).toBe(3);
      expect(await metric(serve.url, series("idle_probe"))).toBeGreaterThan(0);
      // The probe asked from the last batch applied live (5): its fingerprint proves the stream.
      expect(engine.replays).toContain(5);
      expect(
        await metric(serve.url, 'kvedge_ingest_lost_batches_total{worker_id="1",dp_rank="0"}'),
      ).toBe(0);
    });
  }
});
