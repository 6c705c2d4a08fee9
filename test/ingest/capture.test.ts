// Goal: the capture conversion (src/ingest/capture.ts) turns one live engine stream
// into the operations `kvedge apply` reads — stores (also an Eagle store, with the
// local hashes kvedge computed), removals and clears, in order — and counts what it
// saw; in process, against a real publisher on loopback.
import { afterEach, describe, expect, test } from "bun:test";
import { hashTokens } from "../../src/hash";
import { Capture, type CapturedOp } from "../../src/ingest/capture";
import { silentLogger } from "../../src/util/log";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { until } from "../support/wait";

const BS = 4;

describe("Capture", () => {
  const cleanups: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  test("stores, an Eagle store, a removal and a clear become apply's operations", async () => {
    const engine = await new TestEngine({}).start();
    cleanups.push(() => engine.stop());
    const ops: CapturedOp[] = [];
    const capture = new Capture({
      workerId: 2n ** 64n - 1n,
      dpRank: 3,
      endpoint: engine.endpoint,
      replayEndpoint: null,
      topic: "",
      blockSize: BS,
      log: silentLogger,
      onOp: (op) => ops.push(op),
    });
    cleanups.push(() => capture.stop());
    await capture.start();
    await engine.waitForSubscriber();
    engine.publish([stored([1n, 2n], [1, 2, 3, 4, 5, 6, 7, 8], BS)]);
    // Eagle: bigram pairs, a window of BS + 1 tokens per block.
    const pairs = [
      [9, 8],
      [8, 7],
      [7, 6],
      [6, 5],
    ] as const;
    engine.publish([stored([5n], [], BS, 2n, { tokenIds: pairs })]);
    engine.publish([removed([1n])]);
    engine.publish([cleared]);
    await until(() => ops.length >= 4, "four captured operations");
    expect(capture.connected).toBe(true);
    const worker = (2n ** 64n - 1n).toString();
    expect(ops[0]).toEqual({
      op: "stored",
      worker_id: worker,
      dp_rank: 3,
      parent_block_hash: null,
      block_hashes: ["1", "2"],
      token_ids: [1, 2, 3, 4, 5, 6, 7, 8],
      block_size: BS,
      lora_name: null,
      cache_salt: null,
    });
    expect(ops[2]).toEqual({ op: "removed", worker_id: worker, dp_rank: 3, block_hashes: ["1"] });
    expect(ops[3]).toEqual({ op: "cleared", worker_id: worker, dp_rank: 3 });
    expect(capture.kinds).toEqual({ stored: 2, removed: 1, cleared: 1 });
    expect(capture.summary(4)).toContain("4 events written (2 stored, 1 removed, 1 cleared)");
    const local = hashTokens([9, 8, 7, 6, 5], BS, { eagle: true }).local.map(String);
    expect(ops[1]).toMatchObject({
      parent_block_hash: "2",
      block_hashes: ["5"],
      eagle_token_ids: [9, 8, 7, 6, 5],
      local_hashes: local,
    });
    expect(ops[1]!.token_ids).toBeUndefined();
  });
});

describe("a capture is the wire", () => {
  const cleanups: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  test("no `cleared` for a rank the engine never published: kvedge's rebuild is not an event", async () => {
    // The engine publishes dp rank 1 only; the capture is configured for rank 0. Its
    // connect probe finds the ring from 0 and rebuilds: in `serve` that clears the
    // worker's ranks; a capture writes only what the engine sent.
    const engine = await new TestEngine({ replay: true, dpRank: 1 }).start();
    cleanups.push(() => engine.stop());
    engine.publish([stored([1n], [1, 2, 3, 4], BS)], true);
    const ops: CapturedOp[] = [];
    const capture = new Capture({
      workerId: 5n,
      dpRank: 0,
      endpoint: engine.endpoint,
      replayEndpoint: engine.replayEndpoint,
      topic: "",
      blockSize: BS,
      log: silentLogger,
      onOp: (op) => ops.push(op),
    });
    cleanups.push(() => capture.stop());
    await capture.start();
    await engine.waitForSubscriber();
    await until(() => capture.source.sequencer.counters.rebuilds === 1, "the probe's rebuild");
    engine.publish([cleared]);
    await until(() => ops.length >= 2, "the store and the engine's clear");
    expect(ops.map((op) => [op.op, op.dp_rank])).toEqual([
      ["stored", 1],
      ["cleared", 1],
    ]);
    expect(capture.kinds).toEqual({ stored: 1, removed: 0, cleared: 1 });
    expect(capture.summary(2)).toContain("rebuilt from the replay ring 1");
  });
});
