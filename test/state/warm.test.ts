// Goal: a warm restart restores only what a stream can confirm. Blocks of a worker or
// dp rank that no configured source serves (the fleet was reconfigured between
// restarts) are dropped at load, counted and logged once, so no query is answered from
// them; the ranks a configured stream had published come back with it (an engine
// restart will clear them); restored streams are not exact before their connection's
// continuity check. Method: a snapshot file written from a real index, loaded into a
// real core whose configured engine is not there (so nothing is ever confirmed).
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/load";
import { KvedgeCore } from "../../src/core/core";
import { hashTokens } from "../../src/hash";
import { createIndex } from "../../src/index";
import { freezeNow, packIndex } from "../../src/index/pack";
import { memoryLogger } from "../../src/util/log";
import { writeSnapshotFile } from "../../src/state/snapshot";
import { loadSnapshot } from "../../src/state/warm";
import { freePort } from "../support/wait";

const BS = 4;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const tokens = (first: number) => Array.from({ length: 2 * BS }, (_, i) => first + i);

function words(values: bigint[]): Uint32Array {
  const out = new Uint32Array(2 * values.length);
  values.forEach((value, i) => {
    out[2 * i] = Number(value >> 32n);
    out[2 * i + 1] = Number(value & 0xffff_ffffn);
  });
  return out;
}

/** A snapshot of two-block chains on (1, 0), (1, 3), (1, 5) and (2, 0). */
async function writeSnapshot(dir: string): Promise<void> {
  const index = createIndex("crtc", BS);
  const chains: [bigint, number, number][] = [
    [1n, 0, 100],
    [1n, 3, 200],
    [1n, 5, 300],
    [2n, 0, 400],
  ];
  for (const [worker, rank, first] of chains) {
    const external = words([BigInt(first), BigInt(first + 1)]);
    const local = words(hashTokens(tokens(first), BS).local);
    index.applyStored(worker, rank, false, 0, 0, external, local, 2);
  }
  const { words: packed, workerIds } = packIndex(freezeNow(index.freeze()));
  const position = { lastSeq: 4, fingerprint: 9, degraded: false };
  await writeSnapshotFile(dir, {
    blockSize: BS,
    createdAt: new Date().toISOString(),
    workerIds: [...workerIds],
    words: packed,
    positions: [
      { workerId: 1n, dpRank: 0, ...position, ranks: [0, 3] },
      { workerId: 2n, dpRank: 0, ...position, ranks: [0] },
    ],
  });
}

test("blocks no configured source serves are dropped; a stream's other ranks come back with it; unconfirmed", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-warm-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  await writeSnapshot(dir);
  // Worker 1 (dp 0) is configured; no engine listens there, so nothing is ever confirmed.
  const port = freePort();
  const { config } = loadConfig({
    env: { KVEDGE_BLOCK_SIZE: String(BS), KVEDGE_WORKERS: `1=tcp://127.0.0.1:${port}` },
  });
  const log = memoryLogger();
  const core = new KvedgeCore({ config, log });
  cleanups.push(() => core.stop());
  expect(loadSnapshot(core, dir, config.workers, log)).toEqual([]);

  const held = (first: number) => {
    const prompt = core.hash(Uint32Array.from(tokens(first)), null, null);
    return core
      .match(prompt.local, prompt.blockCount)
      .map((score) => `${score.workerId}:${score.dpRank}=${score.blocks}`);
  };
  expect([held(100), held(200), held(300), held(400)]).toEqual([["1:0=2"], ["1:3=2"], [], []]);
  const dropped = log.records.filter((record) => record.message.startsWith("snapshot blocks"));
  expect(
    dropped.map((record) => [record.level, record.fields.blocks, record.fields.ranks]),
  ).toEqual([["warn", 4, "1:5,2:0"]]);
  // The served position waits in its worker's slot for the configured source.
  expect(core.restoredPositionOf(1n, 0)?.lastSeq).toBe(4);
  expect(core.restoredPositionOf(2n, 0)).toBeUndefined();

  await core.start();
  const [source] = core.engineSources;
  expect(source!.ranks).toEqual([0, 3]);
  // Not exact before a connection has checked the saved position against the engine.
  expect(source!.sequencer.isDegraded).toBe(true);
  expect(source!.sequencer.lastSeq).toBe(4);
  expect(
    core.workers().map((view) => [`${view.workerId}:${view.dpRank}`, view.degraded, view.blocks]),
  ).toEqual([
    ["1:0", true, 2],
    ["1:3", true, 2],
  ]);
});
