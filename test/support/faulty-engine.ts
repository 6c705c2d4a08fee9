/**
 * An OpenAI engine on raw TCP (./raw-http.ts) that answers as vLLM writes its answers,
 * one socket write per event (the usage chunk and `data: [DONE]` apart), or fails the
 * way the request's `x_fault` field says: an error status, garbage, a close or a reset
 * before or in the middle of the answer, broken chunk framing, or a hang. `x_framing`
 * writes the stream as other servers and proxies in between do: CRLF or CR line ends,
 * or every event cut in two writes; `x_usage` is the usage a plain answer reports.
 * Unknown fields reach engines untouched, so all of these travel inside the client's
 * own body.
 * Streams come from test/fixtures/engine-streams (vLLM's completions and chat shapes).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { type RawConnection, RawHttpServer, type RawRequest } from "./raw-http";

export type Framing = "lf" | "crlf" | "cr" | "split";

export type Fault =
  | "ok"
  | "status"
  | "garbage"
  | "close-before"
  | "reset-before"
  | "hang-before"
  | "close-mid"
  | "reset-mid"
  | "garble-mid"
  | "hang-mid";

const STREAMS = JSON.parse(
  readFileSync(join(import.meta.dir, "..", "fixtures", "engine-streams", "streams.json"), "utf8"),
) as Record<string, string[]>;

/** The writes of a vLLM stream: completions or chat, with or without its usage chunk. */
export function vllmWrites(chat: boolean, usage: boolean): string[] {
  if (chat) return STREAMS[`vllm_chat_stream${usage ? "_include_usage_cached4" : ""}`]!;
  return STREAMS[`vllm_completions_stream${usage ? "_include_usage_cached4" : ""}`]!;
}

const PLAIN = {
  id: "cmpl-1",
  object: "text_completion",
  created: 1700000000,
  model: "m",
  choices: [{ index: 0, text: " Hello world", finish_reason: "length" }],
  usage: { prompt_tokens: 5, total_tokens: 7, completion_tokens: 2, prompt_tokens_details: null },
};

/** The writes as a framing writes them. */
function framed(writes: string[], framing: Framing): string[] {
  if (framing === "crlf") return writes.map((write) => write.replaceAll("\n", "\r\n"));
  if (framing === "cr") return writes.map((write) => write.replaceAll("\n", "\r"));
  if (framing === "split") return writes.flatMap((write) => [write.slice(0, 9), write.slice(9)]);
  return writes;
}

export class FaultyEngine {
  readonly server: RawHttpServer;
  /** Pause between two writes of a stream (lets the reader see them apart). */
  gapMs = 2;
  /** When set, a stream stops after its first write until this resolves (a barrier). */
  hold: Promise<void> | null = null;
  /** After the barrier, each stream waits a random time up to this before going on. */
  spreadMs = 0;

  constructor() {
    this.server = new RawHttpServer((request, connection) => this.answer(request, connection));
  }

  start(): this {
    this.server.start();
    return this;
  }

  get url(): string {
    return this.server.url;
  }

  /** Requests received, and connections open now. */
  get requests(): readonly RawRequest[] {
    return this.server.requests;
  }

  get open(): number {
    return this.server.open;
  }

  stop(): void {
    this.server.stop();
  }

  private async answer(request: RawRequest, c: RawConnection): Promise<void> {
    let body: Record<string, any> = {};
    try {
      body = JSON.parse(request.text);
    } catch {}
    const fault = (body.x_fault ?? "ok") as Fault;
    if (fault === "hang-before") return;
    if (fault === "close-before") return c.close();
    if (fault === "reset-before") return c.reset();
    if (fault === "garbage") return c.write("SSH-2.0-OpenSSH_9.6\r\nnot http\r\n\r\n");
    if (fault === "status")
      return c.json(500, { error: { message: "the engine broke", type: "InternalServerError" } });
    // `x_usage`: the usage a plain answer reports (an engine's counts, true or not).
    if (body.stream !== true) return c.json(200, { ...PLAIN, usage: body.x_usage ?? PLAIN.usage });
    const usage = body.stream_options?.include_usage === true;
    const writes = framed(
      vllmWrites(request.path === "/v1/chat/completions", usage),
      body.x_framing ?? "lf",
    );
    c.streamHead();
    const mid = fault !== "ok";
    for (const [i, write] of (mid ? writes.slice(0, 2) : writes).entries()) {
      c.chunk(write);
      if (i === 0 && this.hold !== null) {
        await this.hold;
        if (this.spreadMs > 0) await Bun.sleep(Math.random() * this.spreadMs);
      }
      await Bun.sleep(this.gapMs);
      if (c.closed) return;
    }
    if (fault === "ok") c.endChunks();
    else if (fault === "close-mid") c.close();
    else if (fault === "reset-mid") c.reset();
    else if (fault === "garble-mid") c.write("zz\r\nnot a chunk\r\n");
  }
}
