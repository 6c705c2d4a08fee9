/**
 * The engine the proxy's warm-up (./warmup.ts) talks to: a `Bun.serve` on a loopback port
 * of its own answering /v1/completions and /v1/chat/completions as vLLM's OpenAI server
 * does. A streamed answer is one write per event, a millisecond apart (tokens come over
 * time): the content chunks, then the usage chunk when `stream_options.include_usage`
 * asks for it, then `data: [DONE]`; a plain one is JSON with its usage. The usage counts
 * a token-id prompt's tokens and reports nothing cached (the scratch core predicts
 * nothing for fresh prompts either).
 */
import type { Server } from "bun";
import { CHAT_PATH, COMPLETIONS_PATH, SSE_DONE, sseEvent } from "./openai";

const CREATED = 1_700_000_000;
const EVENT_GAP_MS = 1;

type Json = Record<string, unknown>;

export class ScratchEngine {
  private constructor(private readonly server: Server<undefined>) {}

  static start(): ScratchEngine {
    const server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      development: false,
      async fetch(request) {
        const path = new URL(request.url).pathname;
        if (request.method !== "POST" || (path !== COMPLETIONS_PATH && path !== CHAT_PATH))
          return new Response("not found", { status: 404 });
        return answer((await request.json()) as Json, path === CHAT_PATH);
      },
    });
    return new ScratchEngine(server);
  }

  get url(): string {
    return `http://127.0.0.1:${this.server.port}`;
  }

  /** Requests not answered to their end yet. */
  get pending(): number {
    return this.server.pendingRequests;
  }

  /** Closes the port and every connection. */
  async stop(): Promise<void> {
    await this.server.stop(true);
  }
}

function answer(body: Json, chat: boolean): Response {
  const prompt = Array.isArray(body.prompt) ? body.prompt.length : 1;
  const usage = {
    prompt_tokens: prompt,
    total_tokens: prompt + 2,
    completion_tokens: 2,
    prompt_tokens_details: { cached_tokens: 0 },
  };
  const model = typeof body.model === "string" ? body.model : "scratch";
  if (body.stream !== true) {
    const choice = chat
      ? { index: 0, message: { role: "assistant", content: "Hi!" }, finish_reason: "length" }
      : { index: 0, text: " Hello world", finish_reason: "length" };
    const object = chat ? "chat.completion" : "text_completion";
    return Response.json({
      id: "scratch",
      object,
      created: CREATED,
      model,
      choices: [choice],
      usage,
    });
  }
  const asked = (body.stream_options as Json | undefined)?.include_usage === true;
  const events = streamed(chat, model, asked ? usage : null);
  let next = 0;
  const stream = new ReadableStream<string>({
    async pull(controller) {
      if (next > 0) await Bun.sleep(EVENT_GAP_MS);
      controller.enqueue(events[next++]!);
      if (next === events.length) controller.close();
    },
  });
  return new Response(stream, {
    headers: { "content-type": "text/event-stream; charset=utf-8" },
  });
}

/** The events of a vLLM stream, each written apart. */
function streamed(chat: boolean, model: string, usage: object | null): string[] {
  const object = chat ? "chat.completion.chunk" : "text_completion";
  const chunk = (choices: object[], extra: Json = {}) =>
    sseEvent({ id: "scratch", object, created: CREATED, model, choices, ...extra });
  const choices = chat
    ? [
        { index: 0, delta: { role: "assistant", content: "" }, finish_reason: null },
        { index: 0, delta: { content: "Hi" }, finish_reason: null },
        { index: 0, delta: { content: "!" }, finish_reason: "stop" },
      ]
    : [
        { index: 0, text: " Hello", finish_reason: null },
        { index: 0, text: " world", finish_reason: "length" },
      ];
  const events = choices.map((choice) => chunk([choice], chat ? {} : { usage: null }));
  if (usage !== null) events.push(chunk([], { usage }));
  events.push(SSE_DONE);
  return events;
}
