import { describe, expect, test } from "bun:test";
import { Unpackr } from "msgpackr";
import { loadConfig } from "../../src/config";
import {
  CANDIDATES_DEFAULT,
  CANDIDATES_MAX,
  decideRoute,
  matchOp,
  routeOp,
} from "../../src/server/api";
import { routeAnswer, writeRouteAnswer } from "../../src/server/route-answer";
import { KvedgeCore } from "../../src/core/core";
import { hashTokens } from "../../src/hash";
import { silentLogger } from "../../src/util/log";
import { xorshift32 } from "../../src/util/random";
import { MsgpackEncoder } from "../../src/wire/msgpack";

describe("writeRouteAnswer", () => {
  test("writes exactly the bytes of the generic writer on the answer object, for every kind of route", () => {
    const core = new KvedgeCore({
      config: loadConfig({ env: {} }).config,
      log: silentLogger,
      random: () => 0.5,
    });
    const load = core.router.load;
    const ids = [1n, 7n, 300n, 70_000n, 2n ** 32n + 5n, 2n ** 64n - 1n];
    for (const [i, id] of ids.entries()) load.table.acquire(id, i % 3);
    load.setDegraded(load.table.find(300n, 2), true);
    const random = xorshift32(11);
    const generic = new MsgpackEncoder();
    const special = new MsgpackEncoder();
    const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });
    for (let i = 0; i < 200; i++) {
      const tokens = Array.from({ length: random() % 300 }, () => random() % 50);
      const body: Record<string, unknown> = {
        token_ids: tokens,
        candidates: random() % 8,
        expected_output_tokens: random() % 1000,
        ...(i % 3 === 0 ? { request_id: `req-${i}-${"é".repeat(i % 2)}` } : {}),
        ...(i % 5 === 0 ? { temperature: 0.7, prefill_load_scale: 1.25 } : {}),
      };
      const outcome = decideRoute(core, body);
      const result = routeAnswer(core, outcome);
      generic.reset();
      generic.value(result);
      special.reset();
      writeRouteAnswer(special, core, outcome);
      expect(Buffer.from(special.written()).toString("hex")).toBe(
        Buffer.from(generic.written()).toString("hex"),
      );
      expect(unpackr.unpack(special.finish())).toEqual(result);
    }
  });
});

describe("routeOp candidates", () => {
  test("lists the CANDIDATES_DEFAULT cheapest workers unless asked, cheapest first; up to CANDIDATES_MAX when asked", () => {
    const core = new KvedgeCore({
      config: loadConfig({ env: {} }).config,
      log: silentLogger,
      random: () => 0.5,
    });
    const load = core.router.load;
    for (let w = 1; w <= 70; w++) load.table.acquire(BigInt(w), 0);
    const costsOf = (result: ReturnType<typeof routeOp>) => result.candidates.map((c) => c.cost);
    const sorted = (costs: number[]) => [...costs].sort((a, b) => a - b);
    // Load some workers first so that costs differ.
    for (let i = 0; i < 20; i++)
      routeOp(core, { token_ids: Array.from({ length: 64 + 16 * i }, (_, t) => t + 1000 * i) });
    const byDefault = routeOp(core, { token_ids: Array.from({ length: 48 }, (_, t) => t) });
    expect(byDefault.candidates).toHaveLength(CANDIDATES_DEFAULT);
    expect(costsOf(byDefault)).toEqual(sorted(costsOf(byDefault)));
    expect(byDefault.candidates[0]!.worker_id).toBe(byDefault.worker_id);
    expect(routeOp(core, { token_ids: [1, 2, 3], candidates: 0 }).candidates).toEqual([]);
    const all = routeOp(core, { token_ids: [1, 2, 3], candidates: CANDIDATES_MAX });
    expect(all.candidates).toHaveLength(CANDIDATES_MAX);
    expect(costsOf(all)).toEqual(sorted(costsOf(all)));
    expect(() => routeOp(core, { token_ids: [1, 2, 3], candidates: CANDIDATES_MAX + 1 })).toThrow(
      /candidates/,
    );
  });
});

describe("routeOp explanation", () => {
  test("every candidate carries its predicted TTFT and parts; under the default policy they make its cost", () => {
    const core = new KvedgeCore({
      config: loadConfig({ env: {} }).config,
      log: silentLogger,
      random: () => 0.5,
    });
    for (let w = 1; w <= 4; w++) core.workerTable.acquire(BigInt(w), 0);
    for (let i = 0; i < 6; i++)
      routeOp(core, {
        token_ids: Array.from({ length: 500 + 100 * i }, (_, t) => t + 1000 * i),
      });
    const answer = routeOp(core, {
      token_ids: Array.from({ length: 300 }, (_, t) => t + 99_000),
      candidates: 4,
    });
    expect(answer.candidates).toHaveLength(4);
    for (const c of answer.candidates) {
      expect(c.predicted_ttft_ms).toBeCloseTo(c.queue_ms + c.prefill_ms + c.steps_ms, 9);
      expect(c.cost).toBeCloseTo(c.predicted_ttft_ms + 12 * c.prefill_ms, 9);
      expect(c.prefill_ms).toBeCloseTo(300 / 15, 9); // nothing cached: 300 tokens at 15 per ms
      expect([c.overlap_kind, c.pending_blocks]).toEqual(["exact", 0]);
    }
    expect(answer.predicted_ttft_ms).toBe(answer.candidates[0]!.predicted_ttft_ms);
    expect(answer.candidates.some((c) => c.queue_ms > 0)).toBe(true);
  });
});

describe("LoRA adapters in queries", () => {
  test("lora_name and lora_id name the same adapter through index.lora_adapters; neither is the base model", () => {
    const core = new KvedgeCore({
      config: loadConfig({ env: { KVEDGE_BLOCK_SIZE: "4", KVEDGE_LORA_ADAPTERS: "sql-lora=3" } })
        .config,
      log: silentLogger,
    });
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    const store = (worker: bigint, lora: string | null) => {
      const local = hashTokens(tokens, 4, { loraName: lora }).local;
      const words = new Uint32Array(4);
      local.forEach((hash, i) => {
        words[2 * i] = Number(hash >> 32n);
        words[2 * i + 1] = Number(hash & 0xffff_ffffn);
      });
      core.index.applyStored(worker, 0, false, 0, 0, Uint32Array.of(0, 11, 0, 12), words, 2);
    };
    store(1n, "sql-lora"); // an engine that sent the name, or id 3 with the mapping
    store(2n, core.lora.identity(null, 9)); // an engine that sent id 9, which has no name
    const matched = (extra: Record<string, unknown>) =>
      matchOp(core, { token_ids: tokens, ...extra }).scores.map(
        (score) => `${score.worker_id}=${score.blocks}`,
      );
    expect(matched({ lora_name: "sql-lora" })).toEqual(["1=2"]);
    expect(matched({ lora_id: 3 })).toEqual(["1=2"]);
    expect(matched({ lora_id: 9 })).toEqual(["2=2"]);
    expect(matched({})).toEqual([]);
    expect(matched({ lora_id: 4 })).toEqual([]);
    expect(() => matched({ lora_id: -1 })).toThrow("lora_id");
  });
});
