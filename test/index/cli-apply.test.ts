// Goal: `kvedge apply` as users run it (the compiled binary): the examples,
// malformed lines reported with their line number and skipped (exit 1, nothing else
// affected), file and stdin input, usage errors, and all three backends printing the
// same results for seeded event streams. Method: runKvedge on dist/kvedge.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { MatchResult } from "../../src/index/types";
import { applyHarnessOp, applyLine, generateStream, matchLine, pairs } from "../harness/streams";
import { runKvedge } from "../support/kvedge";

const EXAMPLE = [
  '{"op":"stored","worker_id":"7","dp_rank":0,"parent_block_hash":null,"block_hashes":["11","12"],' +
    '"token_ids":[1,2,3,4,5,6,7,8],"block_size":4,"lora_name":null}',
  '{"op":"stored","worker_id":"8","dp_rank":1,"parent_block_hash":null,"block_hashes":["21"],' +
    '"token_ids":[1,2,3,4],"block_size":4}',
  '{"op":"match","token_ids":[1,2,3,4,5,6,7,8,9]}',
  '{"op":"removed","worker_id":"7","dp_rank":0,"block_hashes":["12","99"]}',
  '{"op":"match","token_ids":[1,2,3,4,5,6,7,8]}',
  '{"op":"stats"}',
  '{"op":"cleared","worker_id":"8","dp_rank":1}',
  '{"op":"remove_worker","worker_id":"7"}',
  '{"op":"stats"}',
].join("\n");

describe("kvedge apply", () => {
  test("the issue's operations, through stdin", async () => {
    const result = await runKvedge(["apply", "--block-size", "4", "-"], { stdin: `${EXAMPLE}\n` });
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    const lines = result.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line));
    expect(lines[0]).toEqual({
      op: "match",
      line: 3,
      scores: [
        { worker_id: "7", dp_rank: 0, blocks: 2 },
        { worker_id: "8", dp_rank: 1, blocks: 1 },
      ],
    });
    expect(lines[1]).toEqual({
      op: "match",
      line: 5,
      scores: [
        { worker_id: "7", dp_rank: 0, blocks: 1 },
        { worker_id: "8", dp_rank: 1, blocks: 1 },
      ],
    });
    expect(lines[2]).toMatchObject({
      op: "stats",
      workers: 2,
      blocks: 2,
      nodes: 1,
      lookup_entries: 2,
      rejected: 0,
    });
    expect(lines[3]).toMatchObject({
      op: "stats",
      workers: 1,
      blocks: 0,
      nodes: 0,
      lookup_entries: 0,
    });
    expect(Object.keys(lines[3])).toEqual([
      "op",
      "workers",
      "blocks",
      "nodes",
      "lookup_entries",
      "rejected",
      "bytes",
    ]);
  });

  test("a malformed line is reported with its number and skipped; exit 1; the rest applies", async () => {
    const input = [
      '{"op":"stored","worker_id":"1","parent_block_hash":null,"block_hashes":["5"],"local_hashes":["1"]}',
      "{not json",
      '{"op":"stored","worker_id":"1","parent_block_hash":null,"block_hashes":["6","x"],"local_hashes":["2","3"]}',
      "",
      '{"op":"frobnicate"}',
      '{"op":"match","local_hashes":["1","2"]}',
    ].join("\n");
    const result = await runKvedge(["apply", "--block-size", "1", "-"], { stdin: input });
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("kvedge apply: line 2: invalid JSON");
    expect(result.stderr).toContain(
      "kvedge apply: line 3: block_hashes[1] must be an unsigned 64-bit integer",
    );
    expect(result.stderr).toContain("kvedge apply: line 5: op must be one of");
    expect(result.stderr).toContain("3 malformed line(s) skipped");
    expect(result.stdout).toBe(
      '{"op":"match","line":6,"scores":[{"worker_id":"1","dp_rank":0,"blocks":1}]}\n',
    );
  });

  test("reads a file; wrong block sizes are counted as rejected", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-apply-"));
    try {
      const file = join(dir, "events.jsonl");
      writeFileSync(file, `${EXAMPLE}\n`);
      const result = await runKvedge(["apply", "--backend", "positional", file]); // default block size 16
      expect(result.code).toBe(0);
      const last = JSON.parse(result.stdout.trim().split("\n").at(-1)!);
      expect(last).toMatchObject({ op: "stats", workers: 0, blocks: 0, rejected: 2 });
      const missing = await runKvedge(["apply", join(dir, "nope.jsonl")]);
      expect(missing.code).toBe(1);
      expect(missing.stderr).toContain("no such file");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test.each([
    [["apply"], "give one input"],
    [["apply", "--backend", "btree", "-"], "--backend must be one of crtc, positional, reference"],
    [["apply", "--block-size", "0", "-"], "--block-size must be an integer in [1, 65536]"],
  ])("usage error %p, exit 2", async (args, message) => {
    const result = await runKvedge(args);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
  });

  test("every backend prints what the reference model computes, on seeded streams", async () => {
    for (const seed of [1, 2, 3]) {
      const stream = generateStream(seed, { steps: 150, conflicts: true });
      const lines: string[] = [];
      const oracle = new ReferenceIndex(1);
      const out = new MatchResult();
      const expected: string[] = [];
      for (const op of stream.ops) {
        lines.push(applyLine(op));
        applyHarnessOp(oracle, op);
        const query = stream.queries[lines.length % stream.queries.length]!;
        lines.push(matchLine(query));
        oracle.findMatches(pairs(query), query.length, out);
        const scores = [];
        for (let i = 0; i < out.count; i++) {
          scores.push({
            id: oracle.workerIdOf(out.workers[i]!),
            dp_rank: oracle.dpRankOf(out.workers[i]!),
            blocks: out.blocks[i]!,
          });
        }
        scores.sort(
          (x, y) =>
            y.blocks - x.blocks ||
            (x.id < y.id ? -1 : x.id > y.id ? 1 : 0) ||
            x.dp_rank - y.dp_rank,
        );
        expected.push(
          JSON.stringify({
            op: "match",
            line: lines.length,
            scores: scores.map((s) => ({
              worker_id: String(s.id),
              dp_rank: s.dp_rank,
              blocks: s.blocks,
            })),
          }),
        );
      }
      const outputs = await Promise.all(
        (["crtc", "positional", "reference"] as const).map((backend) =>
          runKvedge(["apply", "--backend", backend, "--block-size", "1", "-"], {
            stdin: `${lines.join("\n")}\n`,
          }),
        ),
      );
      for (const result of outputs) {
        expect(result.stderr).toBe("");
        expect(result.stdout.trim().split("\n")).toEqual(expected);
      }
    }
  });
});
