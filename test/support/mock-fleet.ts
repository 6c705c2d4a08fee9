/**
 * Mock engines in this process for proxy tests: each a NetworkedEngine (real KV
 * events over ZMTP) with an EngineServer (its OpenAI API over HTTP), and, to play an
 * engine whose answers contradict its events, a front that reports 0 cached tokens.
 */
import type { Server } from "bun";
import type { PromptTokenizer } from "../../src/proxy/tokenizer";
import { EngineServer } from "../../src/sim/engine-server";
import { NetworkedEngine } from "../../src/sim/networked-engine";
import { silentLogger } from "../../src/util/log";

export interface MockEngine {
  readonly networked: NetworkedEngine;
  readonly server: EngineServer;
  readonly http: string;
}

export interface MockFleetOptions {
  readonly speedup: number;
  readonly seed: number;
  readonly capacityBlocks?: number;
  readonly tokenizer?: PromptTokenizer;
  readonly model?: string;
}

export async function startMockEngines(
  count: number,
  options: MockFleetOptions,
): Promise<MockEngine[]> {
  const engines: MockEngine[] = [];
  for (let i = 0; i < count; i++) {
    const networked = new NetworkedEngine({
      index: i,
      capacityBlocks: options.capacityBlocks ?? 4096,
      blockSize: 16,
      hashSeed: BigInt(options.seed + i),
      endpoint: "tcp://127.0.0.1:0",
      log: silentLogger,
    });
    await networked.start();
    const server = new EngineServer({
      networked,
      speedup: options.speedup,
      host: "127.0.0.1",
      port: 0,
      vocabSize: 1000,
      log: silentLogger,
      openAi:
        options.tokenizer === undefined
          ? {}
          : { tokenizer: options.tokenizer, model: options.model ?? "mock" },
    });
    engines.push({ networked, server, http: server.start() });
  }
  return engines;
}

export async function stopMockEngines(engines: readonly MockEngine[]): Promise<void> {
  for (const engine of engines) {
    await engine.server.stop();
    await engine.networked.close();
  }
}

/** An HTTP front to `target` whose plain (not streamed) answers report 0 cached tokens. */
export function zeroCachedTokensFront(target: string): Server<undefined> {
  return Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(request) {
      const answer = await fetch(`${target}${new URL(request.url).pathname}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: await request.text(),
      });
      const body = (await answer.json()) as {
        usage?: { prompt_tokens_details: { cached_tokens: number } };
      };
      if (body.usage !== undefined) body.usage.prompt_tokens_details.cached_tokens = 0;
      return Response.json(body, { status: answer.status });
    },
  });
}

/**
 * Sends a token-id prompt through `kvedge serve --proxy` twice: a miss, then, once the
 * engine's events have reached the index, a request kvedge predicts a hit for.
 * Returns the workers that answered.
 */
export async function missThenHit(
  serve: { readonly url: string; readonly controlUrl: string },
  prompt: number[],
): Promise<[string, string]> {
  const complete = async (): Promise<string> => {
    const response = await fetch(`${serve.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: 1 }),
    });
    if (response.status !== 200)
      throw new Error(`proxied completion: HTTP ${response.status} ${await response.text()}`);
    await response.arrayBuffer();
    return response.headers.get("x-kvedge-worker-id")!;
  };
  const first = await complete();
  const deadline = performance.now() + 10_000;
  for (;;) {
    const response = await fetch(`${serve.controlUrl}/v1/match`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token_ids: prompt }),
    });
    if (((await response.json()) as { scores: unknown[] }).scores.length > 0) break;
    if (performance.now() > deadline)
      throw new Error("timed out waiting for the prompt to be indexed");
    await Bun.sleep(5);
  }
  return [first, await complete()];
}
