#!/usr/bin/env bun
/**
 * kvedge command line: `kvedge <command> [options]`.
 *
 * Usage mistakes print one line to stderr and exit 2; failures at run time exit 1.
 */
import packageJson from "../../package.json";
import { usingNativeHash } from "../hash";
import { nativeUnavailableReason } from "../native/library";
import { applyCommand } from "./apply";
import { UsageError } from "./args";
import { captureCommand } from "./capture";
import type { Command } from "./command";
import { demoCommand } from "./demo";
import { hashCommand } from "./hash";
import { mockEngineCommand } from "./mock-engine";
import { replayCommand } from "./replay";
import { serveCommand } from "./serve";

export const VERSION: string = packageJson.version;

/** Only commands that really work are listed here. */
const commands: readonly Command[] = [
  demoCommand,
  serveCommand,
  captureCommand,
  applyCommand,
  hashCommand,
  replayCommand,
  mockEngineCommand,
];

function mainHelp(): string {
  const width = Math.max(...commands.map((command) => command.name.length));
  const lines = commands.map((command) => `  ${command.name.padEnd(width)}  ${command.summary}`);
  return `kvedge ${VERSION} — a KV-cache-aware router for LLM inference fleets

Usage: kvedge <command> [options]
       kvedge <command> --help

Commands:
${lines.join("\n")}

Options:
  -h, --help      show this help
  -V, --version   print the version
`;
}

export async function main(argv: string[]): Promise<number> {
  const [first, ...rest] = argv;
  if (first === undefined || first === "-h" || first === "--help" || first === "help") {
    process.stdout.write(mainHelp());
    return 0;
  }
  if (first === "-V" || first === "--version") {
    const hashing = usingNativeHash
      ? "native hashing"
      : `fallback hashing: ${nativeUnavailableReason}`;
    process.stdout.write(
      `kvedge ${VERSION} (bun ${Bun.version}, ${process.platform}-${process.arch}, ${hashing})\n`,
    );
    return 0;
  }
  const command = commands.find((candidate) => candidate.name === first);
  if (command === undefined) {
    const what = first.startsWith("-") ? `unknown option ${first}` : `unknown command '${first}'`;
    process.stderr.write(`kvedge: ${what} (see kvedge --help)\n`);
    return 2;
  }
  if (rest.includes("-h") || rest.includes("--help")) {
    process.stdout.write(command.help);
    return 0;
  }
  try {
    return await command.run(rest);
  } catch (error) {
    if (error instanceof UsageError) {
      process.stderr.write(
        `kvedge ${command.name}: ${error.message} (see kvedge ${command.name} --help)\n`,
      );
      return 2;
    }
    const message = error instanceof Error ? error.message : String(error);
    process.stderr.write(`kvedge ${command.name}: ${message}\n`);
    return 1;
  }
}

if (import.meta.main) {
  process.exitCode = await main(process.argv.slice(2));
}
