import { hashTokens } from "../hash";
import { flagBool, flagInt, flagString, parseFlags, UsageError } from "./args";
import { type Command, HELP_FLAG } from "./command";

const flags = {
  ...HELP_FLAG,
  "block-size": { kind: "string" },
  "lora-name": { kind: "string" },
  "cache-salt": { kind: "string" },
  eagle: { kind: "boolean" },
  json: { kind: "boolean" },
} as const;

const TOKEN = /^\d{1,10}$/;
const TOKEN_LIMIT = 2 ** 32;
export const BLOCK_SIZE_MAX = 65_536;

/** Parses tokens; each must be an integer in [0, 2^32). */
export function parseTokens(words: readonly string[]): Uint32Array {
  const tokens = new Uint32Array(words.length);
  for (let i = 0; i < words.length; i++) {
    const word = words[i]!;
    const value = TOKEN.test(word) ? Number(word) : -1;
    if (value < 0 || value >= TOKEN_LIMIT) {
      throw new UsageError(`token ${i + 1} ('${word}') is not an integer in [0, 2^32)`);
    }
    tokens[i] = value;
  }
  return tokens;
}

export const hashCommand: Command = {
  name: "hash",
  summary: "print the block hashes of a token sequence (to debug hash parity with engines)",
  flags,
  help: `Usage: kvedge hash --block-size N [--lora-name X] [--cache-salt S] [--eagle] [--json] [TOKEN...]

Prints, for every complete block of the tokens, kvedge's local block hash
(XXH3-64 of the block's tokens as u32 little-endian; seed 1337, plus the LoRA
name and cache salt when given) and the sequence hash (the chained hash of all
blocks so far), as unsigned decimals. A trailing partial block is not hashed.
These are the hashes the router matches on; compare them with what an engine
reports to find a block-size, LoRA or salt mismatch.

Tokens come from the arguments or, when there are none, from stdin (separated
by whitespace or commas). Each must be an integer in [0, 2^32).

Options:
  --block-size N     tokens per block (required), 1..${BLOCK_SIZE_MAX}
  --lora-name X      LoRA adapter name mixed into the seed
  --cache-salt S     cache salt (namespace) mixed into the seed
  --eagle            Eagle windows: each block also covers the next block's first token
  --json             print {"block_size":N,"local":[...],"sequence":[...]} (decimal strings)
  -h, --help         show this help

Example:
  kvedge hash --block-size 4 1 2 3 4 5 6 7 8
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (flagString(parsed, "block-size") === undefined)
      throw new UsageError("--block-size is required");
    const blockSize = flagInt(parsed, "block-size", 0, 1, BLOCK_SIZE_MAX);
    let words = parsed.positionals;
    if (words.length === 0) {
      if (process.stdin.isTTY)
        throw new UsageError("no tokens: give them as arguments or on stdin");
      words = (await Bun.stdin.text()).split(/[\s,]+/).filter((word) => word !== "");
    }
    const tokens = parseTokens(words);
    const { local, sequence } = hashTokens(tokens, blockSize, {
      loraName: flagString(parsed, "lora-name") ?? null,
      cacheSalt: flagString(parsed, "cache-salt") ?? null,
      eagle: flagBool(parsed, "eagle"),
    });
    if (flagBool(parsed, "json")) {
      const body = {
        block_size: blockSize,
        local: local.map(String),
        sequence: sequence.map(String),
      };
      process.stdout.write(`${JSON.stringify(body)}\n`);
    } else {
      let text = "";
      for (let i = 0; i < local.length; i++) text += `${local[i]}\t${sequence[i]}\n`;
      process.stdout.write(text);
      const hashed = local.length * blockSize;
      const leftover =
        tokens.length - hashed - (flagBool(parsed, "eagle") && local.length > 0 ? 1 : 0);
      if (leftover > 0)
        process.stderr.write(
          `kvedge hash: ${leftover} trailing token(s) do not fill a block and are not hashed\n`,
        );
    }
    return 0;
  },
};
