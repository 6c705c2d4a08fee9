/**
 * The fleet of the serving benchmark (bench/http-workload.ts: 64 workers, ≥ 1M
 * (block, worker) pairs) applied straight to a KvedgeCore in this process, for
 * the in-process benches of the serve path (no engines, no sockets).
 */
import { loadConfig } from "../src/config";
import { blockSeed, hashBlocks } from "../src/hash";
import { KvedgeCore } from "../src/core/core";
import { silentLogger } from "../src/util/log";
import {
  BLOCK_SIZE,
  blockTokens,
  buildFleet,
  externalHash,
  type Fleet,
  KIND_DOCUMENT,
  KIND_SYSTEM,
  KIND_TAIL,
} from "./http-workload";

export const FLEET_SEED = 20_261_129;
export const FLEET_WORKERS = 64;
export const FLEET_PAIRS = 1_050_000;

/** A core holding the benchmark fleet's blocks; `env` sets KVEDGE_* settings. */
export function fleetCore(env: Record<string, string> = {}): {
  core: KvedgeCore;
  fleet: Fleet;
} {
  const fleet = buildFleet(FLEET_SEED, FLEET_WORKERS, FLEET_PAIRS);
  const core = new KvedgeCore({ config: loadConfig({ env }).config, log: silentLogger });
  const seed = blockSeed(null, null);
  for (let w = 0; w < FLEET_WORKERS; w++) {
    const workerId = BigInt(w + 1);
    core.workerTable.acquire(workerId, 0);
    const systems = new Set<number>();
    for (const sequence of fleet.sequences[w]!) {
      const system = fleet.documentSystem[sequence.document]!;
      const blocks: [number, number, number][] = [];
      let parent: bigint | null = null;
      if (systems.has(system))
        parent = externalHash(w, KIND_SYSTEM, system, fleet.systemBlocks[system]! - 1);
      else {
        systems.add(system);
        for (let i = 0; i < fleet.systemBlocks[system]!; i++) blocks.push([KIND_SYSTEM, system, i]);
      }
      for (let i = 0; i < fleet.documentBlocks[sequence.document]!; i++)
        blocks.push([KIND_DOCUMENT, sequence.document, i]);
      for (let i = 0; i < sequence.tailBlocks; i++) blocks.push([KIND_TAIL, sequence.tail, i]);
      const tokens = new Uint32Array(blocks.length * BLOCK_SIZE);
      const external = new Uint32Array(2 * blocks.length);
      blocks.forEach(([kind, id, position], b) => {
        blockTokens(kind, id, position, tokens, b * BLOCK_SIZE);
        const hash = externalHash(w, kind, id, position);
        external[2 * b] = Number(hash >> 32n);
        external[2 * b + 1] = Number(hash & 0xffff_ffffn);
      });
      const local = new Uint32Array(2 * blocks.length);
      hashBlocks(tokens, BLOCK_SIZE, seed, local);
      const parentHi = parent === null ? 0 : Number(parent >> 32n);
      const parentLo = parent === null ? 0 : Number(parent & 0xffff_ffffn);
      core.index.applyStored(
        workerId,
        0,
        parent !== null,
        parentHi,
        parentLo,
        external,
        local,
        blocks.length,
      );
    }
  }
  const pairs = core.index.stats().blocks;
  if (pairs !== fleet.pairs) throw new Error(`indexed ${pairs} pairs, expected ${fleet.pairs}`);
  return { core, fleet };
}
