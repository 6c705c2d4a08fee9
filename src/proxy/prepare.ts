/**
 * A proxied request's body made ready to route and forward: parsed, checked, its
 * prompt tokenized as the engine will (./openai.ts), and the bytes to send the engine,
 * which are the client's with at most kvedge's own additions spliced in (./body.ts).
 * Pure and self-contained, so it runs on whichever thread has the time: the one that
 * received the request for a small body, a tokenizer thread for a large one
 * (./preparer.ts).
 */
import { clip, KvedgeError } from "../domain/errors";
import { withMember, withUsageAsked } from "./body";
import {
  COMPLETIONS_PATH,
  includesUsage,
  isStream,
  maxTokensOf,
  type OpenAiPath,
  type PromptLimits,
  promptTokens,
} from "./openai";
import type { PromptTokenizer } from "./tokenizer";

export interface PrepareOptions {
  /** The model served, and its LoRA adapters' names: a request naming another gets 404. */
  readonly model: string;
  readonly adapters: readonly string[];
  /** Completions prompts go out as the token ids kvedge computed. */
  readonly forwardTokenIds: boolean;
  readonly limits: PromptLimits;
}

/** What routing and forwarding need of a request (every field structured-clones). */
export interface Prepared {
  readonly tokens: Uint32Array;
  readonly stream: boolean;
  /** kvedge asked for usage on the client's behalf: its chunk must not reach the client. */
  readonly stripUsage: boolean;
  readonly maxTokens: number;
  readonly cacheSalt: string | null;
  /** The LoRA adapter the request's model names (null: the base model). */
  readonly loraName: string | null;
  /** The bytes sent to the engine. */
  readonly forwarded: Uint8Array;
}

/** Longest model name an error message quotes. */
const MODEL_SHOWN_MAX = 256;
const utf8 = new TextDecoder();

export async function prepareRequest(
  bytes: Uint8Array,
  path: OpenAiPath,
  options: PrepareOptions,
  tokenizer: PromptTokenizer | null,
): Promise<Prepared> {
  const body = parseObject(bytes);
  const loraName = loraOf(body.model, options);
  const stream = isStream(body);
  const maxTokens = maxTokensOf(body);
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && typeof salt !== "string")
    throw new KvedgeError("bad_request", "cache_salt must be a string", { param: "cache_salt" });
  const streamOptions = body.stream_options;
  if (
    streamOptions !== undefined &&
    streamOptions !== null &&
    (typeof streamOptions !== "object" || Array.isArray(streamOptions))
  ) {
    throw new KvedgeError("bad_request", "stream_options must be an object", {
      param: "stream_options",
    });
  }
  const tokens = await promptTokens(tokenizer, path, body, options.limits);
  if (tokens.length === 0) throw new KvedgeError("bad_request", "the prompt has no tokens");
  const stripUsage = stream && !includesUsage(body);
  let forwarded = bytes;
  if (stripUsage) forwarded = withUsageAsked(forwarded);
  if (options.forwardTokenIds && path === COMPLETIONS_PATH)
    forwarded = withMember(forwarded, "prompt", `[${tokens.join(",")}]`);
  return {
    tokens,
    stream,
    stripUsage,
    maxTokens,
    cacheSalt: typeof salt === "string" ? salt : null,
    loraName,
    forwarded,
  };
}

/**
 * The LoRA adapter a request's model names (null: the served model itself); a model
 * that is neither the served one nor a configured adapter is refused.
 */
function loraOf(model: unknown, options: PrepareOptions): string | null {
  if (model === undefined || model === options.model) return null;
  if (typeof model === "string" && options.adapters.includes(model)) return model;
  const named = typeof model === "string" ? model : JSON.stringify(model);
  throw new KvedgeError(
    "unknown_model",
    `The model \`${clip(named, MODEL_SHOWN_MAX)}\` does not exist (this proxy serves ${options.model}).`,
    { param: "model" },
  );
}

function parseObject(bytes: Uint8Array): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(utf8.decode(bytes));
  } catch (error) {
    throw new KvedgeError(
      "bad_request",
      `malformed JSON body: ${clip((error as Error).message, 200)}`,
    );
  }
  if (value === null || typeof value !== "object" || Array.isArray(value))
    throw new KvedgeError("bad_request", "the body must be a JSON object");
  return value as Record<string, unknown>;
}
