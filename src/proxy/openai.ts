/**
 * OpenAI-compatible requests as vLLM reads them, shared by the proxy (which must
 * tokenize a prompt exactly as the engine will) and the mock engines (which serve the
 * same API): what the prompt's token ids are, how many tokens to generate, whether to
 * stream, and Server-Sent Events framing.
 */

import { clip, KvedgeError } from "../domain/errors";
import type { CachedReport } from "../core/observed-hits";
import type { ChatMessage, PromptTokenizer } from "./tokenizer";

export const COMPLETIONS_PATH = "/v1/completions";
export const CHAT_PATH = "/v1/chat/completions";
export type OpenAiPath = typeof COMPLETIONS_PATH | typeof CHAT_PATH;

export function isOpenAiPath(path: string): path is OpenAiPath {
  return path === COMPLETIONS_PATH || path === CHAT_PATH;
}

/** Most output tokens a request may ask for (the mock engines' bound too). */
export const MAX_TOKENS_MAX = 1 << 20;
/** Output tokens when a request does not say (vLLM's is "up to the context"; ours must be finite). */
export const DEFAULT_MAX_TOKENS = 16;
const MESSAGES_MAX = 65_536;

/** A completions prompt: text to tokenize, or token ids given by the client. */
export type CompletionPrompt = { readonly text: string } | { readonly ids: Uint32Array };

/** `prompt` of /v1/completions: a string, token ids, or a list of exactly one of those. */
export function completionPrompt(body: Record<string, unknown>): CompletionPrompt {
  let prompt = body.prompt;
  if (
    Array.isArray(prompt) &&
    prompt.length > 0 &&
    (typeof prompt[0] === "string" || Array.isArray(prompt[0]))
  ) {
    if (prompt.length !== 1)
      throw new KvedgeError(
        "bad_request",
        "prompt: one prompt per request (a list of several is not supported)",
      );
    prompt = prompt[0];
  }
  if (typeof prompt === "string") return { text: prompt };
  if (Array.isArray(prompt)) {
    const ids = new Uint32Array(prompt.length);
    for (let i = 0; i < prompt.length; i++) {
      const id = prompt[i];
      if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id > 0xffff_ffff) {
        throw new KvedgeError(
          "bad_request",
          `prompt[${i}] must be a token id (an integer in [0, 2^32))`,
        );
      }
      ids[i] = id;
    }
    return { ids };
  }
  throw new KvedgeError("bad_request", "prompt is required: a string or an array of token ids");
}

/** `messages` of /v1/chat/completions, with text-part lists joined as vLLM does for string templates. */
export function chatMessages(body: Record<string, unknown>): ChatMessage[] {
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0)
    throw new KvedgeError("bad_request", "messages must be a non-empty array");
  if (messages.length > MESSAGES_MAX)
    throw new KvedgeError("bad_request", `messages has more than ${MESSAGES_MAX} entries`);
  return messages.map((message: unknown, i) => {
    if (message === null || typeof message !== "object" || Array.isArray(message)) {
      throw new KvedgeError("bad_request", `messages[${i}] must be an object`);
    }
    // A copy: the client's body may be forwarded as it is, re-serialized.
    const entry = { ...(message as Record<string, unknown>) };
    if (typeof entry.role !== "string")
      throw new KvedgeError("bad_request", `messages[${i}].role must be a string`);
    const content = entry.content;
    if (Array.isArray(entry.tool_calls))
      entry.tool_calls = entry.tool_calls.map((call: unknown, j) =>
        toolCall(call, `messages[${i}].tool_calls[${j}]`),
      );
    if (content === undefined || content === null || typeof content === "string")
      return { ...entry, content: content ?? "" };
    if (!Array.isArray(content))
      throw new KvedgeError(
        "bad_request",
        `messages[${i}].content must be a string or an array of parts`,
      );
    const texts = content.map((part: unknown, j) => {
      const p = part as { type?: unknown; text?: unknown } | null;
      if (p?.type !== "text" || typeof p.text !== "string") {
        throw new KvedgeError(
          "bad_request",
          `messages[${i}].content[${j}]: only text parts are supported`,
        );
      }
      return p.text;
    });
    return { ...entry, content: texts.join("\n") };
  });
}

/**
 * A tool call as templates get it from vLLM: `function.arguments` parsed from its JSON
 * string into an object ({} when empty), as vLLM does before rendering.
 */
function toolCall(call: unknown, where: string): unknown {
  const fn = (call as { function?: { arguments?: unknown } } | null)?.function;
  if (fn === undefined || fn === null || typeof fn !== "object") return call;
  let args = fn.arguments;
  if (args === undefined || args === null || args === "") args = {};
  else if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      throw new KvedgeError("bad_request", `${where}.function.arguments is not valid JSON`);
    }
  }
  return { ...(call as object), function: { ...fn, arguments: args } };
}

/** The largest prompt accepted: its text (what is tokenized) in UTF-8 bytes, and its tokens. */
export interface PromptLimits {
  readonly bytes: number;
  readonly tokens: number;
}

const NO_LIMITS: PromptLimits = {
  bytes: Number.POSITIVE_INFINITY,
  tokens: Number.POSITIVE_INFINITY,
};

/**
 * The prompt's token ids as the engine computes them: completions text with the
 * tokenizer's special tokens (BOS) unless `add_special_tokens: false`; chat through
 * the chat template, then without special tokens (the template writes them) unless
 * `add_special_tokens: true`. Without a tokenizer only token-id prompts work. A prompt
 * over `limits` is refused (400) before it is tokenized, or once its tokens are counted.
 */
export async function promptTokens(
  tokenizer: PromptTokenizer | null,
  path: OpenAiPath,
  body: Record<string, unknown>,
  limits: PromptLimits = NO_LIMITS,
): Promise<Uint32Array> {
  const addSpecial = body.add_special_tokens;
  if (addSpecial !== undefined && typeof addSpecial !== "boolean")
    throw new KvedgeError("bad_request", "add_special_tokens must be a boolean");
  const param = path === COMPLETIONS_PATH ? "prompt" : "messages";
  let tokens: Uint32Array;
  if (path === COMPLETIONS_PATH) {
    const prompt = completionPrompt(body);
    if ("ids" in prompt) tokens = prompt.ids;
    else {
      checkPromptBytes(prompt.text, limits, param);
      tokens = await needTokenizer(tokenizer).encode(prompt.text, addSpecial ?? true);
    }
  } else tokens = await chatTokens(tokenizer, body, addSpecial, limits);
  if (tokens.length > limits.tokens) {
    throw new KvedgeError(
      "bad_request",
      `the prompt has ${tokens.length} tokens, over the limit of ${limits.tokens} (proxy.max_prompt_tokens)`,
      { param },
    );
  }
  return tokens;
}

function checkPromptBytes(text: string, limits: PromptLimits, param: string): void {
  // UTF-8 takes at most 3 bytes per UTF-16 unit: count only when it could matter.
  if (text.length * 3 <= limits.bytes) return;
  const bytes = Buffer.byteLength(text);
  if (bytes <= limits.bytes) return;
  throw new KvedgeError(
    "bad_request",
    `the prompt's text is ${bytes} bytes, over the limit of ${limits.bytes} (proxy.max_prompt_bytes)`,
    { param },
  );
}

async function chatTokens(
  tokenizer: PromptTokenizer | null,
  body: Record<string, unknown>,
  addSpecial: boolean | undefined,
  limits: PromptLimits,
): Promise<Uint32Array> {
  const messages = chatMessages(body);
  const tokenizerOf = needTokenizer(tokenizer);
  if (!tokenizerOf.hasChatTemplate)
    throw new KvedgeError(
      "bad_request",
      "the model's tokenizer has no chat template: use /v1/completions",
    );
  const extra = body.chat_template_kwargs;
  if (
    extra !== undefined &&
    (extra === null || typeof extra !== "object" || Array.isArray(extra))
  ) {
    throw new KvedgeError("bad_request", "chat_template_kwargs must be an object");
  }
  const generation = body.add_generation_prompt;
  const continueFinal = body.continue_final_message;
  if (generation !== undefined && typeof generation !== "boolean")
    throw new KvedgeError("bad_request", "add_generation_prompt must be a boolean");
  if (continueFinal !== undefined && typeof continueFinal !== "boolean")
    throw new KvedgeError("bad_request", "continue_final_message must be a boolean");
  let text: string;
  try {
    text = tokenizerOf.renderChat(messages, {
      addGenerationPrompt: generation ?? true,
      continueFinalMessage: continueFinal ?? false,
      tools: body.tools,
      ...(extra === undefined ? {} : { extra: extra as Record<string, unknown> }),
    });
  } catch (error) {
    throw new KvedgeError(
      "bad_request",
      `the chat template failed on these messages: ${clip((error as Error).message, 512)}`,
    );
  }
  checkPromptBytes(text, limits, "messages");
  return await tokenizerOf.encode(text, addSpecial ?? false);
}

function needTokenizer(tokenizer: PromptTokenizer | null): PromptTokenizer {
  if (tokenizer === null)
    throw new KvedgeError(
      "bad_request",
      "no tokenizer is loaded: give the prompt as token ids (/v1/completions)",
    );
  return tokenizer;
}

/** `max_completion_tokens` (chat) or `max_tokens`, default DEFAULT_MAX_TOKENS. */
export function maxTokensOf(body: Record<string, unknown>): number {
  const value = body.max_completion_tokens ?? body.max_tokens;
  if (value === undefined || value === null) return DEFAULT_MAX_TOKENS;
  if (
    typeof value !== "number" ||
    !Number.isInteger(value) ||
    value < 1 ||
    value > MAX_TOKENS_MAX
  ) {
    throw new KvedgeError("bad_request", `max_tokens must be an integer in [1, ${MAX_TOKENS_MAX}]`);
  }
  return value;
}

export function isStream(body: Record<string, unknown>): boolean {
  if (body.stream !== undefined && body.stream !== null && typeof body.stream !== "boolean")
    throw new KvedgeError("bad_request", "stream must be a boolean");
  return body.stream === true;
}

/** Whether a streamed answer should end with a usage chunk (`stream_options.include_usage`). */
export function includesUsage(body: Record<string, unknown>): boolean {
  const options = body.stream_options as { include_usage?: unknown } | null | undefined;
  return options !== null && typeof options === "object" && options.include_usage === true;
}

/**
 * What a `usage` object says of the cached prompt tokens (src/core/observed-hits.ts):
 * `prompt_tokens_details.cached_tokens` if it is an integer in [0, the prompt's tokens]
 * (the fewer of kvedge's count and the engine's `prompt_tokens`), "bad" if it is there
 * and is not, "absent" if it is not there, "no_usage" without a usage object.
 */
export function cachedReport(usage: unknown, promptTokens: number): CachedReport {
  if (usage === null || typeof usage !== "object" || Array.isArray(usage)) return "no_usage";
  const { prompt_tokens: reported, prompt_tokens_details: details } = usage as {
    prompt_tokens?: unknown;
    prompt_tokens_details?: { cached_tokens?: unknown } | null;
  };
  const cached =
    details !== null && typeof details === "object" ? details.cached_tokens : undefined;
  if (cached === undefined || cached === null) return "absent";
  const bound =
    typeof reported === "number" && Number.isInteger(reported) && reported >= 0
      ? Math.min(reported, promptTokens)
      : promptTokens;
  if (typeof cached !== "number" || !Number.isInteger(cached) || cached < 0 || cached > bound)
    return "bad";
  return cached;
}

export const SSE_DONE = "data: [DONE]\n\n";

export function sseEvent(value: unknown): string {
  return `data: ${JSON.stringify(value)}\n\n`;
}
