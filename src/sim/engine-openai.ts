/**
 * The mock engine's OpenAI-compatible API, shaped as vLLM answers it:
 *
 *   POST /v1/completions       {"prompt": "text" | [ids], "max_tokens"?, "stream"?, "stream_options"?}
 *   POST /v1/chat/completions  {"messages": [...], "max_completion_tokens"? | "max_tokens"?, "stream"?, ...}
 *   GET  /v1/models
 *
 * The prompt's tokens (from the engine's tokenizer, or given as ids) go into the real
 * engine cache, so `usage.prompt_tokens_details.cached_tokens` is what the cache
 * really served. The generated tokens are synthetic; their text is " t<id>" per token.
 * A streamed answer sends its first chunk at the first token (model time) and the rest
 * when the request finishes: the engine model reports those two moments only.
 * Answers carry the modeled times too, outside the OpenAI fields:
 * `"kvedge_mock": {"ttft_ms", "e2e_ms"}` (model ms from arrival) next to `usage`.
 */
import { KvedgeError } from "../domain/errors";
import { asObject, reply } from "../http/http";
import {
  CHAT_PATH,
  includesUsage,
  isStream,
  maxTokensOf,
  type OpenAiPath,
  promptTokens,
  SSE_DONE,
  sseEvent,
} from "../proxy/openai";
import type { PromptTokenizer } from "../proxy/tokenizer";

/** A request the engine accepted, as its OpenAI front follows it. */
export interface Submitted {
  readonly requestId: string;
  readonly promptTokens: number;
  readonly outputTokens: number;
  /** Prompt tokens served from the prefix cache (known at the first token). */
  readonly cachedTokens: number;
  readonly ttftMs: number;
  readonly e2eMs: number;
  /** The token ids the engine generates. */
  readonly output: Uint32Array;
  readonly firstToken: Promise<void>;
  readonly done: Promise<void>;
}

/** What the OpenAI front needs of an engine (EngineServer): a way to submit a prompt. */
export interface Submitter {
  submit(prompt: Uint32Array, maxTokens: number, requestId: string | null): Submitted;
}

export interface OpenAiEngineOptions {
  readonly tokenizer: PromptTokenizer | null;
  /** The model name listed and answered with. */
  readonly model: string;
}

const tokenText = (id: number): string => ` t${id}`;

export class EngineOpenAi {
  private nextId = 0;
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(
    private readonly engine: Submitter,
    private readonly options: OpenAiEngineOptions,
  ) {}

  models(request: Request): Response {
    return reply(request, 200, {
      object: "list",
      data: [
        {
          id: this.options.model,
          object: "model",
          created: this.created,
          owned_by: "kvedge-mock-engine",
          root: this.options.model,
        },
      ],
    });
  }

  async complete(request: Request, path: OpenAiPath, raw: unknown): Promise<Response> {
    const body = asObject(raw);
    const model = body.model;
    if (model !== undefined && model !== this.options.model) {
      throw new KvedgeError("unknown_model", `The model \`${String(model)}\` does not exist.`);
    }
    const stream = isStream(body);
    const maxTokens = maxTokensOf(body);
    const prompt = await promptTokens(this.options.tokenizer, path, body);
    const chat = path === CHAT_PATH;
    const id = `${chat ? "chatcmpl" : "cmpl"}-mock-${this.nextId++}`;
    const submitted = this.engine.submit(prompt, maxTokens, id);
    const head = {
      id,
      object: chat ? "chat.completion" : "text_completion",
      created: Math.floor(Date.now() / 1000),
      model: this.options.model,
    };
    if (!stream) {
      await submitted.done;
      const text = textOf(submitted.output, 0, submitted.output.length);
      const choice = chat
        ? {
            index: 0,
            message: { role: "assistant", content: text },
            logprobs: null,
            finish_reason: "length",
          }
        : { index: 0, text, logprobs: null, finish_reason: "length", stop_reason: null };
      return reply(request, 200, {
        ...head,
        choices: [choice],
        usage: usageOf(submitted),
        kvedge_mock: timesOf(submitted),
      });
    }
    return this.streamed(
      submitted,
      { ...head, object: chat ? "chat.completion.chunk" : "text_completion" },
      chat,
      includesUsage(body),
    );
  }

  private streamed(
    submitted: Submitted,
    head: Record<string, unknown>,
    chat: boolean,
    usage: boolean,
  ): Response {
    const encoder = new TextEncoder();
    const choice = (text: string, finish: string | null) =>
      chat
        ? { index: 0, delta: { content: text }, logprobs: null, finish_reason: finish }
        : { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null };
    let open = true;
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        const send = (text: string) => {
          if (open) controller.enqueue(encoder.encode(text));
        };
        const output = submitted.output;
        void submitted.firstToken.then(() => {
          if (chat)
            send(
              sseEvent({
                ...head,
                choices: [
                  {
                    index: 0,
                    delta: { role: "assistant", content: "" },
                    logprobs: null,
                    finish_reason: null,
                  },
                ],
              }),
            );
          send(
            sseEvent({
              ...head,
              choices: [choice(textOf(output, 0, 1), output.length === 1 ? "length" : null)],
            }),
          );
        });
        void submitted.done.then(() => {
          for (let i = 1; i < output.length; i++) {
            send(
              sseEvent({
                ...head,
                choices: [
                  choice(textOf(output, i, i + 1), i === output.length - 1 ? "length" : null),
                ],
              }),
            );
          }
          if (usage)
            send(
              sseEvent({
                ...head,
                choices: [],
                usage: usageOf(submitted),
                kvedge_mock: timesOf(submitted),
              }),
            );
          send(SSE_DONE);
          if (open) controller.close();
          open = false;
        });
      },
      // The client went away; the engine model cannot abort a request, it runs to its end.
      cancel: () => {
        open = false;
      },
    });
    return new Response(body, {
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
    });
  }
}

function textOf(output: Uint32Array, from: number, to: number): string {
  let text = "";
  for (let i = from; i < to; i++) text += tokenText(output[i]!);
  return text;
}

function timesOf(submitted: Submitted) {
  return { ttft_ms: submitted.ttftMs, e2e_ms: submitted.e2eMs };
}

function usageOf(submitted: Submitted) {
  return {
    prompt_tokens: submitted.promptTokens,
    completion_tokens: submitted.outputTokens,
    total_tokens: submitted.promptTokens + submitted.outputTokens,
    prompt_tokens_details: { cached_tokens: submitted.cachedTokens },
  };
}
