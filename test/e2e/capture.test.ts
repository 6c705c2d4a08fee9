// Goal: `kvedge capture` records what kvedge would index from a live engine — in order,
// with a lost batch replayed and the effective cache salt — as JSON lines that
// `kvedge apply` turns back into the same matches; it stops on --count or --duration
// and prints a summary.
import { afterEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { cleared, removed, stored, TestEngine } from "../support/engine";
import { kvedgeBinary, runKvedge } from "../support/kvedge";

const BS = 4;

describe("kvedge capture", () => {
  const cleanups: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  test("records stores, removals and clears (a lost batch replayed) for kvedge apply", async () => {
    const engine = await new TestEngine({ replay: true }).start();
    cleanups.push(() => engine.stop());
    const dir = mkdtempSync(join(tmpdir(), "kvedge-capture-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const out = join(dir, "events.jsonl");
    const proc = Bun.spawn(
      [
        kvedgeBinary(),
        "capture",
        "--endpoint",
        engine.endpoint,
        "--replay-endpoint",
        engine.replayEndpoint!,
        "--worker-id",
        "42",
        "--block-size",
        String(BS),
        "--count",
        "5",
        "--out",
        out,
      ],
      { stdout: "pipe", stderr: "pipe" },
    );
    cleanups.push(() => proc.kill());
    await engine.waitForSubscriber();
    // The connect probe must have seen the empty ring, or it would rebuild from what follows.
    await engine.waitForReplayRequests(1);

    engine.publish([stored([1n, 2n], [1, 2, 3, 4, 5, 6, 7, 8], BS)]);
    engine.publish([stored([3n], [9, 10, 11, 12], BS, 2n)], true); // lost on the wire: replayed
    engine.publish([stored([7n], [1, 1, 1, 1], BS), stored([8n], [5, 5, 5, 5, 5], 5)]); // block size 5: not indexed
    engine.publish([removed([7n])]);
    engine.publish([cleared]);

    expect(await proc.exited).toBe(0);
    const stderr = await new Response(proc.stderr).text();
    expect(stderr).toContain("5 events written (3 stored, 1 removed, 1 cleared)");
    expect(stderr).toContain("gaps 1, replays 2 (0 failed)");
    expect(stderr).toContain("block_size_mismatch=1");

    const lines = readFileSync(out, "utf8")
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line));
    expect(lines.map((line) => line.op)).toEqual([
      "stored",
      "stored",
      "stored",
      "removed",
      "cleared",
    ]);
    expect(lines[0]).toEqual({
      op: "stored",
      worker_id: "42",
      dp_rank: 0,
      parent_block_hash: null,
      block_hashes: ["1", "2"],
      token_ids: [1, 2, 3, 4, 5, 6, 7, 8],
      block_size: BS,
      lora_name: null,
      cache_salt: null,
    });
    expect(lines[1]).toMatchObject({
      parent_block_hash: "2",
      block_hashes: ["3"],
      token_ids: [9, 10, 11, 12],
    });

    // Replayed into an index (before the final clear), the capture answers like the router.
    const upToClear = `${lines
      .slice(0, 4)
      .map((line) => JSON.stringify(line))
      .join("\n")}\n`;
    const match = `${JSON.stringify({ op: "match", token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] })}\n`;
    const applied = await runKvedge(["apply", "--block-size", String(BS), "-"], {
      stdin: upToClear + match,
    });
    expect(applied.code).toBe(0);
    expect(JSON.parse(applied.stdout).scores).toEqual([{ worker_id: "42", dp_rank: 0, blocks: 3 }]);
  });

  test("SGLang's map-form salts are carried to continuation blocks (what the router hashes)", async () => {
    const engine = await new TestEngine({ variant: "sglang-s5" }).start();
    cleanups.push(() => engine.stop());
    const proc = Bun.spawn(
      [
        kvedgeBinary(),
        "capture",
        "--endpoint",
        engine.endpoint,
        "--block-size",
        String(BS),
        "--count",
        "2",
      ],
      { stdout: "pipe", stderr: "pipe" },
    );
    cleanups.push(() => proc.kill());
    await engine.waitForSubscriber();
    engine.publish([
      stored([1n], [1, 2, 3, 4], BS, null, { cacheSalt: "tenant-a" } as never),
      stored([2n], [5, 6, 7, 8], BS, 1n),
    ]);
    expect(await proc.exited).toBe(0);
    const lines = (await new Response(proc.stdout).text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line));
    expect(lines.map((line) => line.cache_salt)).toEqual(["tenant-a", "tenant-a"]);
  });

  test("--duration stops a capture that sees nothing, with a summary", async () => {
    const engine = await new TestEngine().start();
    cleanups.push(() => engine.stop());
    const result = await runKvedge(["capture", "--endpoint", engine.endpoint, "--duration", "0.3"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toBe("");
    expect(result.stderr).toContain("kvedge capture: 0 batches");
  });

  test("a capture that never connected exits 1 and says so", async () => {
    const closed = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    const port = closed.port;
    closed.stop(true);
    const result = await runKvedge([
      "capture",
      "--endpoint",
      `tcp://127.0.0.1:${port}`,
      "--duration",
      "0.3",
    ]);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`never connected to tcp://127.0.0.1:${port}`);
  });

  test.each([
    [["capture"], "--endpoint is required"],
    [["capture", "--endpoint", "http://x:1"], "--endpoint has scheme 'http'"],
    [["capture", "--endpoint", "tcp://127.0.0.1:1", "--worker-id", "-3"], "--worker-id must be"],
    [["capture", "--endpoint", "tcp://127.0.0.1:1", "--count", "0"], "--count must be an integer"],
  ])("usage error %p → %p", async (args, message) => {
    const result = await runKvedge(args);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
  });
});
