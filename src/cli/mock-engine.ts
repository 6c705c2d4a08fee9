import { randomBytes } from "node:crypto";
import { EngineServer } from "../sim/engine-server";
import { CAPACITY_BLOCKS_MAX } from "../sim/engine-cache";
import { BUFFER_STEPS_MAX, DEFAULT_BUFFER_STEPS, NetworkedEngine } from "../sim/networked-engine";
import { createRng } from "../sim/random";
import { DEFAULT_VOCAB_SIZE } from "../sim/tokens";
import { loadTokenizer, type PromptTokenizer, TokenizerError } from "../proxy/tokenizer";
import { createLogger } from "../util/log";
import { parseU64 } from "../util/u64";
import { flagBool, flagInt, flagNumber, flagString, parseFlags, UsageError } from "./args";
import { type Command, HELP_FLAG } from "./command";
import { TIME_MODEL_FLAGS, TIME_MODEL_HELP, timeModelOf } from "./demo";

const flags = {
  ...HELP_FLAG,
  ...TIME_MODEL_FLAGS,
  endpoint: { kind: "string" },
  "replay-endpoint": { kind: "string" },
  "capacity-blocks": { kind: "string" },
  "cpu-capacity-blocks": { kind: "string" },
  "block-size": { kind: "string" },
  "map-form": { kind: "boolean" },
  speedup: { kind: "string" },
  "http-host": { kind: "string" },
  "http-port": { kind: "string" },
  topic: { kind: "string" },
  "buffer-steps": { kind: "string" },
  "hash-seed": { kind: "string" },
  "drop-rate": { kind: "string" },
  tokenizer: { kind: "string" },
  model: { kind: "string" },
} as const;

export const mockEngineCommand: Command = {
  name: "mock-engine",
  summary:
    "run one mock engine: a vLLM-like KV cache publishing real vLLM KV events, driven over HTTP",
  flags,
  help: `Usage: kvedge mock-engine --endpoint tcp://127.0.0.1:PORT --capacity-blocks N [options]

A stand-in for one vLLM worker, as a router sees it from outside: a KV cache with
prefix caching and LRU eviction, run by vLLM's scheduler loop (continuous batching,
chunked prefill) on a modeled clock. It publishes vLLM KV events (BlockStored,
BlockRemoved, AllBlocksCleared; one batch per step, sequence numbers from 0) on a
ZeroMQ PUB socket and serves vLLM's replay protocol on a ROUTER socket. Requests
arrive over HTTP. Prints one JSON line with its addresses on stdout once it
listens; logs go to stderr. SIGINT/SIGTERM stop it.

Options:
  --endpoint EP          where the PUB socket binds: tcp://HOST:PORT (port 0: any free port), ipc:///PATH
  --replay-endpoint EP   where the replay ROUTER binds (default: no replay)
  --capacity-blocks N    KV capacity in blocks (required)
  --cpu-capacity-blocks N  a CPU offload tier of N blocks (0: none): evicted blocks spill there,
                         published as vLLM's medium "CPU" events, and load back for cheap
  --block-size N         tokens per block (16)
  --map-form             encode events as maps (vLLM 0.24+) instead of tagged arrays
  --topic T              topic frame of every message ("")
  --buffer-steps N       batches kept for replay (${DEFAULT_BUFFER_STEPS})
  --speedup X            model seconds per wall second (1)
  --http-host H          HTTP API host (127.0.0.1)
  --http-port P          HTTP API port (0: any free port)
  --hash-seed N          the engine's block-hash seed (default: random, like vLLM's)
  --drop-rate P          keep a fraction P of live messages off the wire (still replayable),
                         to exercise a subscriber's gap recovery (0)
  --tokenizer DIR        the model's tokenizer.json + tokenizer_config.json, so the OpenAI API
                         takes text prompts and chat messages (default: token-id prompts only)
  --model NAME           the model name the OpenAI API serves (default: the tokenizer's, else "mock")
${TIME_MODEL_HELP}
HTTP API (times in model ms):
  POST /v1/generate {"request_id"?, "token_ids": [...], "max_tokens": N, "stream"?: true}
       -> {"request_id","prompt_tokens","cached_tokens","output_tokens","ttft_ms","e2e_ms"}
          when done; with "stream": true, NDJSON lines {"event":"first_token",...} then {"event":"done",...}
  POST /v1/completions, /v1/chat/completions (stream or not), GET /v1/models: OpenAI-compatible,
       usage.prompt_tokens_details.cached_tokens from the engine's prefix cache
  POST /v1/reset    reset the prefix cache (AllBlocksCleared); 409 while requests run
  GET  /v1/stats    counters
  GET  /v1/cache    cached blocks (external hashes) and the last published seq
  GET  /healthz
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (parsed.positionals.length > 0)
      throw new UsageError(`unexpected argument '${parsed.positionals[0]}'`);
    const endpoint = flagString(parsed, "endpoint");
    if (endpoint === undefined)
      throw new UsageError("--endpoint is required (e.g. tcp://127.0.0.1:5557)");
    if (flagString(parsed, "capacity-blocks") === undefined)
      throw new UsageError("--capacity-blocks is required");
    const capacityBlocks = flagInt(parsed, "capacity-blocks", 0, 1, CAPACITY_BLOCKS_MAX);
    const blockSize = flagInt(parsed, "block-size", 16, 1, 4096);
    const speedup = flagNumber(parsed, "speedup", 1, 0.001, 1e6);
    const bufferSteps = flagInt(parsed, "buffer-steps", DEFAULT_BUFFER_STEPS, 1, BUFFER_STEPS_MAX);
    const dropRate = flagNumber(parsed, "drop-rate", 0, 0, 1);
    const seedText = flagString(parsed, "hash-seed");
    const hashSeed = seedText === undefined ? randomBytes(8).readBigUInt64BE() : parseU64(seedText);
    if (hashSeed === null)
      throw new UsageError(`--hash-seed must be an unsigned 64-bit integer, got '${seedText}'`);
    const time = timeModelOf(parsed);
    const tokenizer = tokenizerOf(flagString(parsed, "tokenizer"));
    const model = flagString(parsed, "model") ?? tokenizer?.model ?? "mock";
    const log = createLogger();
    const drop = createRng(Number(hashSeed & 0xffff_ffffn));
    // Handlers before anything opens: a signal as soon as the address line shows is a clean stop.
    const stopped = new Promise<string>((resolve) => {
      process.once("SIGINT", () => resolve("SIGINT"));
      process.once("SIGTERM", () => resolve("SIGTERM"));
    });
    const networked = new NetworkedEngine({
      index: 0,
      capacityBlocks,
      cpuCapacityBlocks: flagInt(parsed, "cpu-capacity-blocks", 0, 0, CAPACITY_BLOCKS_MAX),
      blockSize,
      hashSeed,
      time,
      endpoint,
      replayEndpoint: flagString(parsed, "replay-endpoint") ?? null,
      topic: flagString(parsed, "topic") ?? "",
      form: flagBool(parsed, "map-form") ? "map" : "array",
      bufferSteps,
      log: log.child({ component: "zmtp" }),
      ...(dropRate > 0 ? { dropLive: () => drop() < dropRate } : {}),
    });
    try {
      await networked.start();
    } catch (error) {
      await networked.close();
      throw new Error(`cannot bind: ${(error as Error).message}`);
    }
    const server = new EngineServer({
      networked,
      speedup,
      host: flagString(parsed, "http-host") ?? "127.0.0.1",
      port: flagInt(parsed, "http-port", 0, 0, 65_535),
      vocabSize: DEFAULT_VOCAB_SIZE,
      log,
      openAi: { tokenizer, model },
    });
    let http: string;
    try {
      http = server.start();
    } catch (error) {
      await networked.close();
      throw new Error(`cannot listen for HTTP: ${(error as Error).message}`);
    }
    process.stdout.write(
      `${JSON.stringify({
        endpoint: networked.endpoint,
        replay_endpoint: networked.replayEndpoint,
        http,
        capacity_blocks: capacityBlocks,
        block_size: blockSize,
        speedup,
      })}\n`,
    );
    log.info("mock engine listening", {
      endpoint: networked.endpoint,
      replay_endpoint: networked.replayEndpoint,
      http,
    });
    log.info("stopping", { signal: await stopped });
    await server.stop();
    await networked.close();
    return 0;
  },
};

/** The --tokenizer directory's tokenizer, or null without the flag. */
function tokenizerOf(dir: string | undefined): PromptTokenizer | null {
  if (dir === undefined) return null;
  try {
    return loadTokenizer(dir);
  } catch (error) {
    if (error instanceof TokenizerError) throw new UsageError(`--tokenizer: ${error.message}`);
    throw error;
  }
}
