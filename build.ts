/**
 * Builds kvedge.
 *
 *   bun build.ts            native library + dist/kvedge (+ dist/kvedge-linux-arm64)
 *   bun build.ts --native   only the native library (what `bun test` needs)
 *   bun build.ts --host     native library + dist/kvedge for this machine only
 *
 * The native library (native/kvedge.c) is compiled with the system C compiler
 * ($CC, else cc). Without a compiler an empty placeholder is written and kvedge
 * falls back to its pure paths (src/native/library.ts explains). dist/kvedge is a
 * single executable: Bun, our code and the native library in one file.
 */
import { existsSync, mkdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const root = import.meta.dir;
const nativeDir = join(root, "native", "build");
const distDir = join(root, "dist");
const entry = join(root, "src", "cli", "main.ts");
// kvedge's Worker threads start from this file; in the binary it sits at
// cli/thread-main.ts under the bundle's root, src/ (src/runtime/threads.ts looks there).
const threadEntry = join(root, "src", "cli", "thread-main.ts");

interface Target {
  /** Bun's compile target. */
  readonly bun: string;
  readonly outfile: string;
  /** The native library this target embeds. */
  readonly library: string;
  /** C compilers to try, in order. */
  readonly compilers: readonly string[];
  /** The Hugging Face tokenizers addon for this target (src/proxy/tokenizer.ts requires one per arch). */
  readonly tokenizersAddon: string;
}

const hostTarget: Target = {
  bun: `bun-linux-${process.arch === "arm64" ? "arm64" : "x64"}`,
  outfile: join(distDir, "kvedge"),
  library: join(nativeDir, "libkvedge.so"),
  compilers: [process.env.CC ?? "cc", "gcc", "clang"],
  tokenizersAddon: join(
    root,
    "node_modules",
    "tokenizers",
    `tokenizers.linux-${process.arch === "arm64" ? "arm64" : "x64"}-gnu.node`,
  ),
};

const arm64Target: Target = {
  bun: "bun-linux-arm64",
  outfile: join(distDir, "kvedge-linux-arm64"),
  library: join(nativeDir, "libkvedge-linux-arm64.so"),
  compilers: ["aarch64-linux-gnu-gcc"],
  tokenizersAddon: join(root, "node_modules", "tokenizers", "tokenizers.linux-arm64-gnu.node"),
};

function log(message: string): void {
  process.stderr.write(`build: ${message}\n`);
}

/** Compiles native/kvedge.c for a target; an empty file when no compiler works. */
function buildNative(target: Target): boolean {
  mkdirSync(nativeDir, { recursive: true });
  const source = join(root, "native", "kvedge.c");
  const fresh =
    existsSync(target.library) &&
    statSync(target.library).size > 0 &&
    statSync(target.library).mtimeMs >= statSync(source).mtimeMs &&
    statSync(target.library).mtimeMs >= statSync(join(root, "native", "xxhash.h")).mtimeMs;
  if (fresh) return true;
  for (const compiler of target.compilers) {
    if (Bun.which(compiler) === null) continue;
    const result = Bun.spawnSync(
      [
        compiler,
        "-O3",
        "-fPIC",
        "-shared",
        "-fvisibility=default",
        "-Wall",
        "-Wextra",
        "-o",
        target.library,
        source,
      ],
      { stderr: "pipe" },
    );
    if (result.exitCode === 0) {
      log(`native library ${target.library} (${compiler})`);
      return true;
    }
    log(`${compiler} failed: ${result.stderr.toString().trim().split("\n")[0]}`);
  }
  writeFileSync(target.library, "");
  log(
    `no C compiler for ${target.bun}: ${target.library} is empty, the pure fallback will be used`,
  );
  return false;
}

async function compile(target: Target): Promise<boolean> {
  mkdirSync(distDir, { recursive: true });
  const library = target.library;
  const result = await Bun.build({
    entrypoints: [entry, threadEntry],
    root: join(root, "src"),
    compile: { target: target.bun as "bun-linux-x64", outfile: target.outfile },
    minify: { whitespace: true, syntax: true, identifiers: false },
    plugins: [
      {
        name: "kvedge-native-library",
        setup(build) {
          // src/native/library.ts imports the host library; embed this target's instead.
          build.onResolve({ filter: /libkvedge\.so$/ }, () => ({ path: library }));
          build.onResolve({ filter: /tokenizers\.linux-(x64|arm64)-gnu\.node$/ }, () => ({
            path: target.tokenizersAddon,
          }));
        },
      },
    ],
  });
  if (!result.success) {
    for (const message of result.logs) log(String(message));
    return false;
  }
  log(`${target.outfile} (${target.bun})`);
  return true;
}

const args = new Set(process.argv.slice(2));
buildNative(hostTarget);
if (!args.has("--native")) {
  if (!(await compile(hostTarget))) process.exit(1);
  if (!args.has("--host")) {
    buildNative(arm64Target);
    // Cross-compiling fetches Bun's linux-aarch64 runtime from the npm registry.
    if (!(await compile(arm64Target))) log("skipped dist/kvedge-linux-arm64 (see above)");
  }
}
