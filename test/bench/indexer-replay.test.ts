// Goal: bench/indexer-replay.ts runs Dynamo's method end to end on a small trace and
// reports exactly the fields of its JSON contract; a run whose index ends equal to the
// engines' caches is valid. Speed is not asserted (benchmarks measure it).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildCorpus, hashQueries, OP_QUERY } from "../../bench/indexer-replay-corpus";
import { DEFAULT_SEED } from "../../src/hash";
import { PromptHasher } from "../../src/route";
import { parseTrace } from "../../src/sim/trace";

const root = join(import.meta.dir, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "kvedge-replay-"));
const trace = join(dir, "trace.jsonl");
const lines = readFileSync(join(root, "data", "traces", "conversation_trace.jsonl"), "utf8").split(
  "\n",
);
writeFileSync(trace, `${lines.slice(0, 60).join("\n")}\n`);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function bench(args: string[]) {
  const child = Bun.spawnSync(
    [
      process.execPath,
      join(root, "bench", "indexer-replay.ts"),
      "--trace",
      trace,
      "--workers",
      "4",
      "--quiescence-ms",
      "0",
      "--warmup-ops",
      "50",
      ...args,
    ],
    {
      stdout: "pipe",
      stderr: "pipe",
    },
  );
  return { code: child.exitCode, stdout: child.stdout.toString(), stderr: child.stderr.toString() };
}

const DISTRIBUTION = ["max_ns", "p50_ns", "p999_ns", "p99_ns"];
const LOOKUP = [
  "hash",
  "queue_wait",
  "sched_to_finish",
  "sched_to_finish_outside_bursts",
  "service",
];

describe("indexer replay bench", () => {
  for (const [cell, args] of [
    ["page size 16, vLLM cadence", ["--block-size", "16", "--engine-blocks", "2048"]],
    ["page size 1, SGLang cadence", ["--block-size", "1", "--engine-blocks", "32768"]],
  ] as const) {
    test(`${cell}: one JSON line with the contract's fields, valid`, () => {
      const result = bench([...args, "--window-ms", "2000", "--json"]);
      expect(result.stderr).toBe("");
      expect(result.code).toBe(0);
      const outputLines = result.stdout.trim().split("\n");
      expect(outputLines).toHaveLength(1);
      const report = JSON.parse(outputLines[0]!);
      expect(Object.keys(report).sort()).toEqual([
        "achieved_block_ops_per_s",
        "bytes_per_pair",
        "config",
        "drain_s",
        "kept_up",
        "lookup",
        "offered_block_ops_per_s",
        "peak_rss_mb",
        "update",
        "valid",
      ]);
      const timed = [...LOOKUP, "service_ns_per_matched_block"].sort();
      const keys = [...timed, "deadline_bursts", "matched_blocks"].sort();
      expect(Object.keys(report.lookup).sort()).toEqual(keys);
      for (const key of timed) expect(Object.keys(report.lookup[key]).sort()).toEqual(DISTRIBUTION);
      // The longest match per lookup, in blocks: ordered quantiles, within the queries' blocks.
      const matched = report.lookup.matched_blocks;
      expect(Object.keys(matched).sort()).toEqual(["max", "p50", "p99", "p999"]);
      expect(
        matched.p50 <= matched.p99 && matched.p99 <= matched.p999 && matched.p999 <= matched.max,
      ).toBe(true);
      expect(matched.max).toBeLessThanOrEqual(report.config.query_blocks);
      // Issuing on time depends on the machine's load (a bench property, not asserted here);
      // every other reason (drain, losses, an index unequal to the engines) must be absent.
      const reasons: string[] = report.config.failure_reasons;
      expect(reasons.filter((reason) => !reason.startsWith("ops accepted late"))).toEqual([]);
      expect(report.valid).toBe(reasons.length === 0);
      expect(report.config.blockSize).toBe(Number(args[1]));
      expect(report.config.cadence).toBe(args[1] === "1" ? "sglang" : "vllm");
      const { update, config } = report;
      expect(update.stored_blocks).toBeGreaterThan(0);
      expect(update.removed_blocks).toBeGreaterThan(0);
      expect(config.total_block_ops).toBe(
        config.query_blocks + update.stored_blocks + update.removed_blocks,
      );
      expect(config.index.blocks).toBeGreaterThan(0);
      expect(report.bytes_per_pair).toBeCloseTo(config.index.bytes / config.index.blocks, 1);
      expect(config.provenance.trace_sha256).toMatch(/^[0-9a-f]{64}$/);
      // Every worker's first request falls due at 0: one burst of at least one query each.
      expect(report.lookup.deadline_bursts.largest).toBeGreaterThanOrEqual(4);
      expect(config.queryHashes).toBe("tokens");
      expect(typeof config.provenance.bun).toBe("string");
    }, 60_000);
  }

  test("--route-threads 2: lanes on the shared index; the contract, plus threads", () => {
    const result = bench([
      "--block-size",
      "16",
      "--engine-blocks",
      "2048",
      "--window-ms",
      "2000",
      "--route-threads",
      "2",
      "--index-budget-mb",
      "64",
      "--json",
    ]);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    const report = JSON.parse(result.stdout.trim());
    expect(Object.keys(report.lookup).sort()).toEqual([...LOOKUP, "deadline_bursts"].sort());
    const reasons: string[] = report.config.failure_reasons;
    expect(reasons.filter((reason) => !reason.startsWith("ops accepted late"))).toEqual([]);
    const { threads, config } = report;
    expect(threads.lanes).toHaveLength(2);
    // Every query was looked up on a lane, through the shared index's readers.
    let lookups = 0;
    for (const lane of threads.lanes as { stats: { lookups: number } }[]) {
      lookups += lane.stats.lookups;
    }
    expect(lookups).toBe(config.requests);
    expect(threads.writer_cpu_s).toBeGreaterThanOrEqual(0);
    const modeled = Object.keys(threads.own_core_sched_to_finish_by_lanes);
    expect(modeled).toEqual(["1", "2", "4", "8", "16", "64"]);
    // The same model over the queries that share no deadline: a subset, so never more,
    // and empty exactly when the measured distribution over them is.
    const outside = threads.own_core_sched_to_finish_outside_bursts_by_lanes;
    expect(Object.keys(outside)).toEqual(modeled);
    const all = threads.own_core_sched_to_finish_by_lanes;
    expect(outside["1"].max_ns).toBeLessThanOrEqual(all["1"].max_ns);
    const measuredOutside = report.lookup.sched_to_finish_outside_bursts.max_ns > 0;
    expect(outside["1"].max_ns > 0).toBe(measuredOutside);
  }, 60_000);

  test("a bad flag value exits 2 naming it", () => {
    const result = bench(["--block-size", "0"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("--block-size");
    const hashes = bench(["--query-hashes", "chain"]);
    expect(hashes.code).toBe(2);
    expect(hashes.stderr).toContain("--query-hashes");
  });

  test("--query-hashes pre: each query's hashes are the prompt's, as routes make them", () => {
    const corpus = buildCorpus(parseTrace(readFileSync(trace, "utf8")), {
      workers: 4,
      engineBlocks: 2048,
      blockSize: 16,
      cadence: "vllm",
      prefillChunk: 2048,
      windowMs: 2000,
      seed: 42,
    });
    const hashed = hashQueries(corpus, 16);
    const hasher = new PromptHasher();
    let queries = 0;
    for (let i = 0; i < corpus.count; i++) {
      if (corpus.kind[i] !== OP_QUERY) {
        expect(hashed[i]!.count).toBe(0);
        continue;
      }
      queries++;
      const expected = hasher.hash(corpus.tokens(i), 16, DEFAULT_SEED);
      expect(hashed[i]!.count).toBe(expected.blockCount);
      expect(hashed[i]!.local).toEqual(expected.local.slice(0, 2 * expected.blockCount));
    }
    expect(queries).toBe(60);
  });

  for (const threads of ["0", "2"]) {
    test(`--query-hashes pre, --route-threads ${threads}: valid, every query looked up`, () => {
      const result = bench([
        "--block-size",
        "16",
        "--engine-blocks",
        "2048",
        "--window-ms",
        "2000",
        "--route-threads",
        threads,
        "--index-budget-mb",
        "64",
        "--query-hashes",
        "pre",
        "--json",
      ]);
      expect(result.stderr).toBe("");
      expect(result.code).toBe(0);
      const report = JSON.parse(result.stdout.trim());
      const reasons: string[] = report.config.failure_reasons;
      expect(reasons.filter((reason) => !reason.startsWith("ops accepted late"))).toEqual([]);
      expect(report.config.queryHashes).toBe("pre");
      if (threads === "0") expect(report.lookup.matched_blocks.max).toBeGreaterThan(0);
      else {
        const lanes = report.threads.lanes as { stats: { lookups: number } }[];
        const lookups = lanes.reduce((sum, lane) => sum + lane.stats.lookups, 0);
        expect(lookups).toBe(report.config.requests);
      }
    }, 60_000);
  }
});
