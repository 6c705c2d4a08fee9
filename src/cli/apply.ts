import { applyOp, ApplyInputError } from "../index/apply";
import { createIndex } from "../index/index";
import { BACKEND_NAMES, type BackendName } from "../index/types";
import { flagInt, flagString, parseFlags, UsageError } from "./args";
import { type Command, HELP_FLAG } from "./command";
import { BLOCK_SIZE_MAX } from "./hash";

const flags = {
  ...HELP_FLAG,
  backend: { kind: "string" },
  "block-size": { kind: "string" },
} as const;

/** Most bytes one input line may have (a 1M-block event is about 60 MB of JSON). */
const LINE_BYTES_MAX = 256 * 1024 * 1024;
const OUTPUT_FLUSH_BYTES = 64 * 1024;

/** Yields the lines of a byte stream (without the newline), one at a time. */
async function* lines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let pending = "";
  for await (const chunk of stream) {
    pending += decoder.decode(chunk, { stream: true });
    let newline = pending.indexOf("\n");
    while (newline >= 0) {
      yield pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      newline = pending.indexOf("\n");
    }
    if (pending.length > LINE_BYTES_MAX)
      throw new Error(`a line is longer than ${LINE_BYTES_MAX} bytes`);
  }
  pending += decoder.decode();
  if (pending !== "") yield pending;
}

export const applyCommand: Command = {
  name: "apply",
  summary: "apply index events from JSON lines, print match and stats results (offline)",
  flags,
  help: `Usage: kvedge apply [--backend crtc|positional|reference] [--block-size N] FILE|-

Reads JSON lines (FILE, or stdin for -), one operation each, applies them to a
fresh index in order and writes one JSON line per "match" and "stats" operation.

Operations (ids and hashes are unsigned decimal strings; numbers below 2^53 are
accepted too; dp_rank defaults to 0):
  {"op":"stored","worker_id":"7","dp_rank":0,"parent_block_hash":"123"|null,
   "block_hashes":["11","12"],"token_ids":[...],"block_size":4,
   "lora_name":null,"cache_salt":null}
      token_ids are hashed by kvedge (block_size tokens per block); give
      "local_hashes":["..."] instead to pass kvedge's block hashes directly
      (what an index dump contains)
  {"op":"removed","worker_id":"7","dp_rank":0,"block_hashes":["11"]}
  {"op":"cleared","worker_id":"7","dp_rank":0}
  {"op":"remove_worker","worker_id":"7"}
  {"op":"match","token_ids":[...]}       (or "local_hashes"; lora_name, cache_salt)
      -> {"op":"match","line":N,"scores":[{"worker_id":"7","dp_rank":0,"blocks":2}]}
         scores by blocks (descending), then worker_id and dp_rank; zero omitted
  {"op":"stats"}
      -> {"op":"stats","workers":..,"blocks":..,"nodes":..,"lookup_entries":..,
          "rejected":..,"bytes":..}

Events the index refuses (unknown parent, another block size, token count not
matching the blocks, no free worker slot) are counted in "rejected". A malformed
line is reported on stderr with its line number and skipped; the exit code is
then 1.

Options:
  --backend NAME   crtc (default), positional or reference
  --block-size N   tokens per block of the index, 1..${BLOCK_SIZE_MAX} (default 16)
  -h, --help       show this help
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    const backend = (flagString(parsed, "backend") ?? "crtc") as BackendName;
    if (!BACKEND_NAMES.includes(backend))
      throw new UsageError(`--backend must be one of ${BACKEND_NAMES.join(", ")}`);
    const blockSize = flagInt(parsed, "block-size", 16, 1, BLOCK_SIZE_MAX);
    if (parsed.positionals.length !== 1)
      throw new UsageError("give one input: a FILE, or - for stdin");
    const input = parsed.positionals[0]!;
    let stream: ReadableStream<Uint8Array>;
    if (input === "-") {
      stream = Bun.stdin.stream();
    } else {
      const file = Bun.file(input);
      if (!(await file.exists())) throw new Error(`cannot read ${input}: no such file`);
      stream = file.stream();
    }
    const index = createIndex(backend, blockSize);
    const stdout = Bun.stdout.writer();
    let buffered = 0;
    let malformed = 0;
    let number = 0;
    for await (const line of lines(stream)) {
      number++;
      if (line.trim() === "") continue;
      let result: ReturnType<typeof applyOp>;
      try {
        result = applyOp(index, JSON.parse(line));
      } catch (error) {
        if (!(error instanceof ApplyInputError || error instanceof SyntaxError)) throw error;
        malformed++;
        const what =
          error instanceof SyntaxError ? `invalid JSON (${error.message})` : error.message;
        process.stderr.write(`kvedge apply: line ${number}: ${what}\n`);
        continue;
      }
      if (result === null) continue;
      const text =
        result.op === "match"
          ? `${JSON.stringify({ op: "match", line: number, scores: result.scores })}\n`
          : `${JSON.stringify(result)}\n`;
      stdout.write(text);
      buffered += text.length;
      if (buffered >= OUTPUT_FLUSH_BYTES) {
        await stdout.flush();
        buffered = 0;
      }
    }
    await stdout.flush();
    if (malformed > 0)
      process.stderr.write(`kvedge apply: ${malformed} malformed line(s) skipped\n`);
    return malformed > 0 ? 1 : 0;
  },
};
