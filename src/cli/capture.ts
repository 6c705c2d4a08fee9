import type { FileSink } from "bun";
import { checkEndpoint } from "../config";
import { loraAdapterList } from "../config/values";
import { LoraAdapters } from "../hash";
import { Capture, type CaptureOptions } from "../ingest/capture";
import { createLogger } from "../util/log";
import { parseU64 } from "../util/u64";
import { flagInt, flagNumber, flagString, type Parsed, parseFlags, UsageError } from "./args";
import { type Command, HELP_FLAG } from "./command";
import { BLOCK_SIZE_MAX } from "./hash";

const flags = {
  ...HELP_FLAG,
  endpoint: { kind: "string" },
  "replay-endpoint": { kind: "string" },
  "worker-id": { kind: "string" },
  "dp-rank": { kind: "string" },
  topic: { kind: "string" },
  "block-size": { kind: "string" },
  count: { kind: "string" },
  duration: { kind: "string" },
  out: { kind: "string" },
  "lora-adapters": { kind: "string" },
  "idle-probe-ms": { kind: "string" },
} as const;

const DP_RANK_MAX = 0xffff_ffff;

export const captureCommand: Command = {
  name: "capture",
  summary: "record an engine's KV events as JSON lines that `kvedge apply` replays",
  flags,
  help: `Usage: kvedge capture --endpoint URL [--replay-endpoint URL] [--worker-id ID] [--dp-rank R]
                      [--topic T] [--block-size N] [--count N] [--duration S] [--out FILE]
                      [--lora-adapters NAME[=ID],...] [--idle-probe-ms MS]

The "tcpdump for KV events": subscribes to one engine's KV-event publisher, decodes,
sequences (replaying gaps from --replay-endpoint, clearing on an engine restart) and
normalizes its events exactly as \`kvedge serve\` does, and writes the ones kvedge would
index as JSON lines in the format \`kvedge apply\` reads:

  {"op":"stored","worker_id":"7","dp_rank":0,"parent_block_hash":"123","block_hashes":[...],
   "token_ids":[...],"block_size":16,"lora_name":null,"cache_salt":null}
  {"op":"removed",...}  {"op":"cleared",...}

Replay a capture offline with \`kvedge apply --block-size N FILE\` and ask it "match"
questions to see what the router saw. Events kvedge would not index (other tiers,
another block size, filtered groups, ...) are counted in the summary, not written.
The capture is the wire: a "cleared" line is an AllBlocksCleared the engine sent.
kvedge's own continuity decisions (an engine restart proven, a rebuild from the replay
ring, lost batches) go to stderr as log lines and into the summary, not into the file.
Stops after --count events, after --duration seconds, or on Ctrl-C; then prints a
summary (batches, events, gaps, replays, decode errors) on stderr. Exits 1 if it never
connected to a publisher.

Options:
  --endpoint URL         the engine's PUB socket: tcp://HOST:PORT (connect), tcp://*:PORT (bind), ipc:///PATH
  --replay-endpoint URL  the engine's replay ROUTER socket (vLLM's replay_endpoint)
  --worker-id ID         worker id written into the events (default 0)
  --dp-rank R            dp rank when batches carry none (default 0)
  --topic T              subscription prefix (default "": everything)
  --block-size N         the router's block size; stores of another size are counted (default 16)
  --count N              stop after N events written
  --duration S           stop after S seconds
  --out FILE             write to FILE instead of stdout
  --lora-adapters LIST   NAME[=ID],...: LoRA ids the engine sends alone are read as these names
                         (index.lora_adapters); an id without a name is written with the
                         local hashes kvedge computed for it
  --idle-probe-ms MS     a quiet stream asks the replay endpoint for a lost tail this often
                         (ingest.idle_probe_ms; default 1000, 0 = never)
  -h, --help             show this help
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (parsed.positionals.length > 0)
      throw new UsageError(`unexpected argument '${parsed.positionals[0]}'`);
    const stream = streamOf(parsed);
    const countMax = flagInt(parsed, "count", Number.MAX_SAFE_INTEGER, 1, Number.MAX_SAFE_INTEGER);
    const durationS = flagNumber(parsed, "duration", 0, 0, 365 * 86_400);
    const outPath = flagString(parsed, "out");
    const out: FileSink =
      outPath === undefined || outPath === "-" ? Bun.stdout.writer() : Bun.file(outPath).writer();

    let written = 0;
    let finish: () => void = () => {};
    const finished = new Promise<void>((resolve) => {
      finish = resolve;
    });
    const capture = new Capture({
      ...stream,
      log: createLogger({ level: "warn" }),
      onOp: (op) => {
        if (written >= countMax) return;
        out.write(`${JSON.stringify(op)}\n`);
        written++;
        if (written >= countMax) finish();
      },
    });
    await capture.start();
    const timer = durationS > 0 ? setTimeout(finish, durationS * 1000) : null;
    process.once("SIGINT", finish);
    process.once("SIGTERM", finish);
    await finished;
    if (timer !== null) clearTimeout(timer);
    await capture.stop();
    await out.flush();
    if (outPath !== undefined && outPath !== "-") await out.end();
    process.stderr.write(capture.summary(written));
    // Nothing recorded because nothing was there is a failure, not an empty capture.
    if (!capture.connected) {
      process.stderr.write(`kvedge capture: never connected to ${stream.endpoint}\n`);
      return 1;
    }
    return 0;
  },
};

/** The stream to capture and how to read it, from the flags (usage errors thrown). */
function streamOf(parsed: Parsed): Omit<CaptureOptions, "log" | "onOp"> {
  const endpoint = flagString(parsed, "endpoint");
  if (endpoint === undefined) throw new UsageError("--endpoint is required");
  const replayEndpoint = flagString(parsed, "replay-endpoint") ?? null;
  for (const [name, value, bindable] of [
    ["--endpoint", endpoint, true],
    ["--replay-endpoint", replayEndpoint, false],
  ] as const) {
    if (value === null) continue;
    try {
      checkEndpoint(value, bindable);
    } catch (error) {
      throw new UsageError(`${name} ${(error as Error).message}`);
    }
  }
  const workerIdText = flagString(parsed, "worker-id") ?? "0";
  const workerId = parseU64(workerIdText);
  if (workerId === null)
    throw new UsageError(`--worker-id must be an unsigned 64-bit integer, got '${workerIdText}'`);
  let lora: LoraAdapters;
  try {
    lora = new LoraAdapters(loraAdapterList.fromText(flagString(parsed, "lora-adapters") ?? ""));
  } catch (error) {
    throw new UsageError(`--lora-adapters ${(error as Error).message}`);
  }
  return {
    workerId,
    dpRank: flagInt(parsed, "dp-rank", 0, 0, DP_RANK_MAX),
    endpoint,
    replayEndpoint,
    topic: flagString(parsed, "topic") ?? "",
    blockSize: flagInt(parsed, "block-size", 16, 1, BLOCK_SIZE_MAX),
    lora,
    idleProbeMs: flagInt(parsed, "idle-probe-ms", 1000, 0, 3_600_000),
  };
}
