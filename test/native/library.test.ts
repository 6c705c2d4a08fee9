// Goal: the native library and libc load once, from one module, and every user of
// them (hashing, the JSON token reader, CPU pinning) falls back cleanly when the
// library is switched off — checked in a child process that loads the same modules.
// The built library keeps the prefetches its hot loops were written with (a compiler
// once deleted them silently) — checked in its disassembly.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { usingNativeHash } from "../../src/hash";
import { libc, native, nativeUnavailableReason } from "../../src/native/library";
import { defaultTokenScanner } from "../../src/http/request-json";

const src = join(import.meta.dir, "..", "..", "src");
const library = join(import.meta.dir, "..", "..", "native", "build", "libkvedge.so");

type Report = Record<string, unknown>;

async function runChild(script: string, env: Record<string, string>): Promise<Report> {
  const child = Bun.spawn([process.execPath, "-e", script], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...env },
  });
  const out = await new Response(child.stdout).text();
  const err = await new Response(child.stderr).text();
  expect({ code: await child.exited, err }).toEqual({ code: 0, err: "" });
  return JSON.parse(out);
}

const at = (path: string): string => JSON.stringify(join(src, path));
const childScript = `
  import { libc, native, nativeUnavailableReason } from ${at("native/library.ts")};
  import { DEFAULT_SEED, hashBlocks, usingNativeHash } from ${at("hash/index.ts")};
  import { defaultTokenScanner, parseRequestJson } from ${at("http/request-json.ts")};
  import { getAffinity } from ${at("runtime/affinity.ts")};
  const out = new Uint32Array(4);
  const blocks = hashBlocks(Uint32Array.of(1, 2, 3, 4), 2, DEFAULT_SEED, out);
  const parsed = parseRequestJson('{"token_ids":[5,6,7]}');
  console.log(JSON.stringify({
    native: native !== null, reason: nativeUnavailableReason, libc: libc !== null,
    usingNativeHash, scanner: defaultTokenScanner, blocks, hashes: [...out],
    tokens: [...parsed.token_ids.tokens], cpus: getAffinity().length,
  }));
`;

describe("the native loader", () => {
  test("in tests the library and libc are loaded and in use", () => {
    expect(nativeUnavailableReason).toBeNull();
    expect(native).not.toBeNull();
    expect(libc).not.toBeNull();
    expect(usingNativeHash).toBe(true);
    expect(defaultTokenScanner).toBe("native");
  });

  test("KVEDGE_NATIVE=0: every user falls back, results are the same, libc stays", async () => {
    const loaded = await runChild(childScript, { KVEDGE_NATIVE: "" });
    const off = await runChild(childScript, { KVEDGE_NATIVE: "0" });
    expect(loaded).toMatchObject({
      native: true,
      reason: null,
      usingNativeHash: true,
      scanner: "native",
    });
    expect(off).toMatchObject({
      native: false,
      reason: "disabled by KVEDGE_NATIVE=0",
      usingNativeHash: false,
      scanner: "js",
      libc: true,
    });
    expect(off.blocks).toBe(2);
    expect(off.tokens).toEqual([5, 6, 7]);
    expect({ ...off, native: 0, reason: 0, usingNativeHash: 0, scanner: 0 }).toEqual({
      ...loaded,
      native: 0,
      reason: 0,
      usingNativeHash: 0,
      scanner: 0,
    });
    expect(off.cpus).toBeGreaterThan(0);
  });
});

describe("the built library", () => {
  // GCC took `static inline void` helpers whose only effect was __builtin_prefetch for
  // const functions and dropped their calls (docs/decisions.md#native-prefetch).
  test("its lookup and repeat-check loops still prefetch", () => {
    const objdump = Bun.which("objdump");
    if (objdump === null) throw new Error("objdump is needed (binutils, with the C compiler)");
    const listing = Bun.spawnSync([objdump, "-d", "--no-show-raw-insn", library]).stdout.toString();
    const prefetchesIn = (fn: string): number => {
      const body = listing.split(`<${fn}>:`)[1]?.split(/\n\n/)[0] ?? "";
      return (body.match(/\b(prefetch\w*|prfm)\b/g) ?? []).length;
    };
    expect({
      remove: prefetchesIn("kv_lookup_remove") > 0,
      insert: prefetchesIn("kv_lookup_insert_run") > 0,
      repeat: prefetchesIn("kv_pairs_repeat") > 0,
    }).toEqual({ remove: true, insert: true, repeat: true });
  });
});
