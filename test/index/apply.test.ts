// Goal: the apply layer validates every field (the error names it, nothing changes),
// hashes token_ids exactly like src/hash (LoRA and salt in the seed), counts events the
// index must refuse, and orders match scores. Method: operations applied in process.
import { describe, expect, test } from "bun:test";
import { ApplyInputError, applyOp } from "../../src/index/apply";
import { createIndex } from "../../src/index/index";
import { BACKEND_NAMES } from "../../src/index/types";
import { hashTokens } from "../../src/hash";

const stored = (extra: Record<string, unknown> = {}) => ({
  op: "stored",
  worker_id: "7",
  dp_rank: 0,
  parent_block_hash: null,
  block_hashes: ["11", "12"],
  token_ids: [1, 2, 3, 4, 5, 6, 7, 8],
  block_size: 4,
  lora_name: null,
  ...extra,
});

describe("applyOp", () => {
  test.each([
    ["expected a JSON object", null],
    ["expected a JSON object", [1]],
    ["op must be one of", { op: "nope" }],
    ["worker_id is missing", { ...stored(), worker_id: undefined }],
    ["worker_id must be an unsigned 64-bit integer", { ...stored(), worker_id: "-1" }],
    [
      "worker_id must be an unsigned 64-bit integer",
      { ...stored(), worker_id: "18446744073709551616" },
    ],
    ["worker_id must be an unsigned 64-bit integer", { ...stored(), worker_id: 2 ** 53 }],
    ["dp_rank must be an integer in [0, 2^32)", { ...stored(), dp_rank: -1 }],
    ["dp_rank must be an integer in [0, 2^32)", { ...stored(), dp_rank: "0" }],
    [
      "parent_block_hash must be null or an unsigned 64-bit integer",
      { ...stored(), parent_block_hash: "0x10" },
    ],
    ["block_hashes must be an array", { ...stored(), block_hashes: "11" }],
    [
      "block_hashes[1] must be an unsigned 64-bit integer",
      { ...stored(), block_hashes: ["11", 1.5] },
    ],
    ["token_ids[1] must be an integer in [0, 2^32)", { ...stored(), token_ids: [1, -2] }],
    ["give exactly one of token_ids and local_hashes", { ...stored(), local_hashes: ["1", "2"] }],
    ["give exactly one of token_ids and local_hashes", { ...stored(), token_ids: undefined }],
    ["block_size must be a positive integer", { ...stored(), block_size: 0 }],
    ["lora_name must be a string or null", { ...stored(), lora_name: 5 }],
    ["block_hashes is missing", { op: "removed", worker_id: "7" }],
    ["worker_id is missing", { op: "remove_worker" }],
    ["token_ids must be an array", { op: "match", token_ids: "1 2" }],
    ["tier must be one of device, host_pinned, disk, external", { ...stored(), tier: "CPU" }],
    ["tier must be one of device, host_pinned, disk, external", { ...stored(), tier: "any" }],
    [
      "tier must be one of device, host_pinned, disk, external, any",
      { op: "removed", worker_id: "7", block_hashes: ["11"], tier: "gpu" },
    ],
    [
      "parent_sequence_hash goes only with a lower tier and no parent_block_hash",
      { ...stored(), parent_sequence_hash: "5" },
    ],
    [
      "parent_sequence_hash goes only with a lower tier and no parent_block_hash",
      { ...stored(), tier: "disk", parent_block_hash: "3", parent_sequence_hash: "5" },
    ],
  ])("refused, naming the field: %s", (message, op) => {
    const index = createIndex("crtc", 4);
    let error: unknown;
    try {
      applyOp(index, op);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ApplyInputError);
    expect((error as Error).message).toContain(message);
    expect(index.stats()).toMatchObject({ workers: 0, blocks: 0, rejected: { total: 0 } });
  });

  test("token_ids are hashed like src/hash, LoRA name and cache salt in the seed", () => {
    const index = createIndex("reference", 4);
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    applyOp(index, stored({ lora_name: "my-lora", cache_salt: "tenant-a" }));
    const { local } = hashTokens(tokens, 4, { loraName: "my-lora", cacheSalt: "tenant-a" });
    expect(applyOp(index, { op: "match", local_hashes: local.map(String) })).toEqual({
      op: "match",
      scores: [{ worker_id: "7", dp_rank: 0, blocks: 2 }],
    });
    expect(applyOp(index, { op: "match", token_ids: tokens })!.op).toBe("match");
    expect(
      (applyOp(index, { op: "match", token_ids: tokens }) as { scores: unknown[] }).scores,
    ).toEqual([]);
    expect(
      applyOp(index, {
        op: "match",
        token_ids: [...tokens, 9, 10],
        lora_name: "my-lora",
        cache_salt: "tenant-a",
      }),
    ).toEqual({ op: "match", scores: [{ worker_id: "7", dp_rank: 0, blocks: 2 }] });
  });

  test("events the index must refuse are counted, not errors", () => {
    const index = createIndex("crtc", 4);
    applyOp(index, stored({ block_size: 16 }));
    applyOp(index, stored({ token_ids: [1, 2, 3, 4, 5, 6, 7] }));
    applyOp(index, stored({ local_hashes: ["1"], token_ids: undefined }));
    applyOp(index, stored({ parent_block_hash: "99" }));
    expect(index.stats().rejected).toEqual({
      total: 4,
      parentNotFound: 1,
      blockSizeMismatch: 1,
      capacity: 0,
      invalid: 2,
    });
    expect(applyOp(index, { op: "stats" })).toEqual({
      op: "stats",
      workers: 0,
      blocks: 0,
      nodes: 0,
      lookup_entries: 0,
      rejected: 4,
      bytes: index.stats().bytes,
    });
  });

  test("scores sort by blocks, then worker id and dp rank numerically", () => {
    const index = createIndex("crtc", 1);
    const add = (worker: string, rank: number, blocks: number) =>
      applyOp(index, {
        op: "stored",
        worker_id: worker,
        dp_rank: rank,
        parent_block_hash: null,
        block_hashes: Array.from({ length: blocks }, (_, i) => String(i + 1)),
        local_hashes: Array.from({ length: blocks }, (_, i) => String(i + 1)),
      });
    add("10", 0, 2);
    add("9", 1, 2);
    add("9", 0, 2);
    add("18446744073709551615", 0, 3);
    add("2", 0, 1);
    expect(applyOp(index, { op: "match", local_hashes: ["1", "2", "3"] })).toEqual({
      op: "match",
      scores: [
        { worker_id: "18446744073709551615", dp_rank: 0, blocks: 3 },
        { worker_id: "9", dp_rank: 0, blocks: 2 },
        { worker_id: "9", dp_rank: 1, blocks: 2 },
        { worker_id: "10", dp_rank: 0, blocks: 2 },
        { worker_id: "2", dp_rank: 0, blocks: 1 },
      ],
    });
  });

  test.each(BACKEND_NAMES)(
    "%s: lower tiers continue the device match, count copies, and a removal of any tier clears them",
    (backend) => {
      const index = createIndex(backend, 4);
      const host = (worker: string, parent: string | null, hash: string, tokens: number[]) =>
        applyOp(index, {
          ...stored({ worker_id: worker, parent_block_hash: parent }),
          tier: "host_pinned",
          block_hashes: [hash],
          token_ids: tokens,
        });
      const match = () =>
        applyOp(index, { op: "match", token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] });
      applyOp(index, stored()); // device: blocks 11, 12
      host("7", "12", "13", [9, 10, 11, 12]); // the host tier continues it
      host("7", "12", "13", [9, 10, 11, 12]); // a second copy
      host("8", null, "21", [1, 2, 3, 4]); // a worker with the host tier only
      const both = {
        op: "match" as const,
        scores: [
          { worker_id: "7", dp_rank: 0, blocks: 2, host_pinned: 1, disk: 0, external: 0 },
          { worker_id: "8", dp_rank: 0, blocks: 0, host_pinned: 1, disk: 0, external: 0 },
        ],
      };
      expect(match()).toEqual(both);
      applyOp(index, { op: "removed", worker_id: "7", block_hashes: ["13"], tier: "host_pinned" });
      expect(match()).toEqual(both); // one copy left
      applyOp(index, { op: "removed", worker_id: "7", block_hashes: ["13"], tier: "any" });
      applyOp(index, { op: "removed", worker_id: "8", block_hashes: ["21"] }); // device only
      expect(match()).toEqual({
        op: "match",
        scores: [
          { worker_id: "7", dp_rank: 0, blocks: 2 },
          { worker_id: "8", dp_rank: 0, blocks: 0, host_pinned: 1, disk: 0, external: 0 },
        ],
      });
      applyOp(index, { op: "cleared", worker_id: "8", dp_rank: 0 });
      expect(match()).toEqual({
        op: "match",
        scores: [{ worker_id: "7", dp_rank: 0, blocks: 2 }],
      });
    },
  );

  test("numbers below 2^53 are accepted for ids and hashes", () => {
    const index = createIndex("crtc", 1);
    applyOp(index, {
      op: "stored",
      worker_id: 5,
      parent_block_hash: null,
      block_hashes: [9_007_199_254_740_991],
      local_hashes: [3],
    });
    applyOp(index, {
      op: "stored",
      worker_id: "5",
      parent_block_hash: "9007199254740991",
      block_hashes: ["1"],
      local_hashes: ["4"],
    });
    expect(applyOp(index, { op: "match", local_hashes: [3, 4] })).toEqual({
      op: "match",
      scores: [{ worker_id: "5", dp_rank: 0, blocks: 2 }],
    });
  });
});
