// Goal: the warm-up routes what it is asked to on its own scratch core, through every
// request form, and leaves nothing behind that changes how the real core routes.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { routeOp } from "../../src/server/api";
import { KvedgeCore } from "../../src/core/core";
import { warmUp } from "../../src/server/warmup";
import { silentLogger } from "../../src/util/log";
import { xorshift32 } from "../../src/util/random";

/** A core with 6 workers holding overlapping prefixes, and 300 route bodies for it. */
function fleet() {
  const core = new KvedgeCore({
    config: loadConfig({ env: {} }).config,
    log: silentLogger,
    random: xorshift32(5),
  });
  const random = xorshift32(99);
  const shared = Array.from({ length: 64 }, () => random() % 1000);
  for (let w = 1; w <= 6; w++) {
    core.workerTable.acquire(BigInt(w), 0);
    const held = Uint32Array.from([
      ...shared.slice(0, 16 * w),
      ...Array.from({ length: 32 }, () => random() % 1000),
    ]);
    const { local, blockCount } = core.hash(held, null, null);
    core.index.applyStored(
      BigInt(w),
      0,
      false,
      0,
      0,
      local.slice(0, 2 * blockCount),
      local,
      blockCount,
    );
  }
  const bodies = Array.from({ length: 300 }, (_, i) => ({
    token_ids: [
      ...shared.slice(0, 16 * (i % 5)),
      ...Array.from({ length: 40 + (i % 90) }, () => random() % 1000),
    ],
    candidates: 3,
    ...(i % 4 === 0 ? { request_id: `r-${i}` } : {}),
  }));
  return { core, bodies };
}

const answers = (core: KvedgeCore, bodies: object[]) =>
  bodies.map((body) => {
    const { request_id: _id, ...answer } = routeOp(core, body);
    return answer;
  });

describe("warmUp", () => {
  test("routes at least what it is asked, in every form, and finishes every request", () => {
    const config = loadConfig({ env: {} }).config;
    expect(warmUp(config, 0)).toEqual({ routes: 0, ms: 0 });
    // Rounds of 16 binary routes, then a JSON frame, an HTTP JSON and an HTTP MessagePack body.
    expect(warmUp(config, 1).routes).toBe(16);
    expect(warmUp(config, 19).routes).toBe(19);
    expect(warmUp(config, 20).routes).toBe(35);
    for (const backend of ["positional", "reference"]) {
      expect(
        warmUp(loadConfig({ env: { KVEDGE_INDEX_BACKEND: backend } }).config, 100).routes,
      ).toBeGreaterThanOrEqual(100);
    }
  });

  test("a warm-up between two identical cores leaves their decisions identical", () => {
    const before = fleet();
    const expected = answers(before.core, before.bodies);
    warmUp(loadConfig({ env: {} }).config, 500);
    const after = fleet();
    expect(answers(after.core, after.bodies)).toEqual(expected);
    // and the answers were not trivial: several workers chosen, overlaps found
    expect(new Set(expected.map((a) => a.worker_id)).size).toBeGreaterThan(2);
    expect(expected.some((a) => (a.overlap_blocks as number) > 0)).toBe(true);
  });
});
