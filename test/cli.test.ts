// Goal: the CLI contract — help, version, one-line usage errors with exit 2, and
// `kvedge hash` output — checked on the compiled binary users run.
import { describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import packageJson from "../package.json";
import { getAffinity } from "../src/runtime/affinity";
import { kvedgeBinary, runKvedge } from "./support/kvedge";
import { startServe } from "./support/serve";

const HASH_JSON =
  '{"block_size":4,"local":["14643705804678351452","16777012769546811212"],' +
  '"sequence":["14643705804678351452","4945711292740353085"]}\n';

describe("kvedge", () => {
  test("--version prints the package version", async () => {
    const result = await runKvedge(["--version"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toBe(
      `kvedge ${packageJson.version} (bun ${Bun.version}, ${process.platform}-${process.arch}, native hashing)\n`,
    );
  });

  test("--help lists the commands that exist", async () => {
    const result = await runKvedge(["--help"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("Usage: kvedge <command>");
    expect(result.stdout).toMatch(/^ {2}hash {2}/m);
  });

  test("no arguments prints help", async () => {
    expect((await runKvedge([])).stdout).toContain("Commands:");
  });

  test("an unknown command is a one-line error, exit 2", async () => {
    const result = await runKvedge(["frobnicate"]);
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe("kvedge: unknown command 'frobnicate' (see kvedge --help)\n");
  });

  test("an unknown top-level option is a one-line error, exit 2", async () => {
    const result = await runKvedge(["--frobnicate"]);
    expect(result.code).toBe(2);
    expect(result.stderr.trim().split("\n")).toHaveLength(1);
  });
});

describe("kvedge hash", () => {
  test("the issue's example, as JSON", async () => {
    const result = await runKvedge([
      "hash",
      "--block-size",
      "4",
      "--json",
      "1",
      "2",
      "3",
      "4",
      "5",
      "6",
      "7",
      "8",
    ]);
    expect(result).toEqual({ code: 0, stdout: HASH_JSON, stderr: "" });
  });

  test("plain output: local and sequence hash per block; partial block noted on stderr", async () => {
    const result = await runKvedge([
      "hash",
      "--block-size=4",
      "1",
      "2",
      "3",
      "4",
      "5",
      "6",
      "7",
      "8",
      "9",
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toBe(
      "14643705804678351452\t14643705804678351452\n16777012769546811212\t4945711292740353085\n",
    );
    expect(result.stderr).toContain("1 trailing token(s)");
  });

  test("tokens from stdin, whitespace and commas", async () => {
    const result = await runKvedge(["hash", "--block-size", "4", "--json"], {
      stdin: "1, 2,3\n4 5\t6,7,8\n",
    });
    expect(result).toEqual({ code: 0, stdout: HASH_JSON, stderr: "" });
  });

  test("LoRA name and cache salt change the seed", async () => {
    const result = await runKvedge([
      "hash",
      "--block-size",
      "4",
      "--lora-name",
      "my-lora",
      "--cache-salt",
      "tenant-a",
      "--json",
      "1",
      "2",
      "3",
      "4",
    ]);
    expect(JSON.parse(result.stdout).local).toEqual(["6157910915076630503"]);
  });

  test("the fallback path (KVEDGE_NATIVE=0) prints the same", async () => {
    const args = [
      "hash",
      "--block-size",
      "2",
      "--lora-name",
      "a",
      "--json",
      "1",
      "2",
      "3",
      "4",
      "5",
      "6",
    ];
    const fallbackEnv = { ...process.env, KVEDGE_NATIVE: "0" };
    const native = await runKvedge(args);
    const fallback = await runKvedge(args, { env: fallbackEnv });
    expect(fallback).toEqual(native);
    const version = await runKvedge(["--version"], { env: fallbackEnv });
    expect(version.stdout).toContain("fallback hashing: disabled by KVEDGE_NATIVE=0");
  });

  test.each([["-1"], ["4294967296"], ["1.5"], ["abc"], ["0x10"], [""]])(
    "token %p is refused with exit 2",
    async (token) => {
      const result = await runKvedge(["hash", "--block-size", "1", "7", token]);
      expect(result.code).toBe(2);
      expect(result.stdout).toBe("");
      expect(result.stderr).toContain("token 2");
      expect(result.stderr).toContain("is not an integer in [0, 2^32)");
    },
  );

  test("the largest token is accepted", async () => {
    expect((await runKvedge(["hash", "--block-size", "1", "4294967295"])).code).toBe(0);
  });

  test.each([
    [["hash", "1", "2"], "--block-size is required"],
    [["hash", "--block-size", "0", "1"], "--block-size must be an integer in [1, 65536]"],
    [["hash", "--block-size", "x", "1"], "--block-size must be an integer"],
    [["hash", "--block-size"], "option --block-size needs a value"],
    [["hash", "--block-size", "4", "--bogus", "1"], "unknown option --bogus"],
    [["hash", "--block-size", "4", "--json=yes", "1"], "option --json takes no value"],
  ])("bad flags %p → %p, exit 2", async (args, message) => {
    const result = await runKvedge(args);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
    expect(result.stderr.trim().split("\n")).toHaveLength(1);
  });

  test("hash --help", async () => {
    const result = await runKvedge(["hash", "--help"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toStartWith("Usage: kvedge hash --block-size N");
  });
});

describe("the single binary", () => {
  test("runs from an empty directory with a minimal PATH (no Bun, no node_modules)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kvedge-bin-"));
    try {
      const copy = join(dir, "kvedge");
      copyFileSync(kvedgeBinary(), copy);
      Bun.spawnSync(["chmod", "+x", copy]);
      const env = { PATH: "/nonexistent", HOME: dir };
      const result = await runKvedge(
        ["hash", "--block-size", "4", "--json", "1", "2", "3", "4", "5", "6", "7", "8"],
        { binary: copy, cwd: dir, env },
      );
      expect(result).toEqual({ code: 0, stdout: HASH_JSON, stderr: "" });
      // The embedded native library loaded from inside the binary.
      const version = await runKvedge(["--version"], { binary: copy, cwd: dir, env });
      expect(version.stdout).toContain("native hashing");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("pins its threads through libc in the binary, also with KVEDGE_NATIVE=0", async () => {
    const cpu = getAffinity().at(-1)!;
    for (const env of [{ KVEDGE_NATIVE: "" }, { KVEDGE_NATIVE: "0" }]) {
      const serve = await startServe(["--cpus", String(cpu)], env);
      try {
        const line = await serve.waitForLog((entry) => entry.msg === "pinned to CPUs");
        expect(line.cpus).toBe(String(cpu));
        expect(line.threads).toBeGreaterThan(1);
      } finally {
        expect(await serve.stop()).toBe(0);
      }
    }
  });
});
