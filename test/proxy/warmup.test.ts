// Goal: the proxy's warm-up carries every request it sends to its end through the
// scratch proxy, on the main thread's path and a lane's, within the configured limits,
// and leaves nothing behind (its engine's port closed); an engine that cannot be reached
// makes it fail, as any warm-up request that fails must.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config";
import { Exchange, originOf } from "../../src/http/client";
import { loadTokenizer } from "../../src/proxy/tokenizer";
import { warmUpProxy } from "../../src/proxy/warmup";
import { QWEN3_DIR } from "../support/tokenizers";

const config = (env: Record<string, string> = {}) => loadConfig({ env }).config;

/** Whether something answers at `url` (a connection refused: no). */
async function listening(url: string): Promise<boolean> {
  const exchange = new Exchange(
    { origin: originOf(url), method: "GET", path: "/", headers: [], body: null },
    { connectMs: 2_000, firstByteMs: 2_000, idleMs: 2_000 },
  );
  try {
    await exchange.head;
    return true;
  } catch (error) {
    return (error as { failure?: string }).failure !== "refused";
  } finally {
    exchange.abort();
  }
}

describe("warmUpProxy", () => {
  test("nothing asked, nothing done", async () => {
    const none = await warmUpProxy({
      config: config(),
      requests: 0,
      tokenizer: null,
      paths: ["local"],
    });
    expect(none).toEqual({ requests: 0, completed: 0, texts: 0, ms: 0, engineUrl: null });
  });

  test("both paths, token-id prompts: every request completed, the engine's port closed after", async () => {
    const result = await warmUpProxy({
      config: config(),
      requests: 300,
      tokenizer: null,
      paths: ["local", "lane"],
    });
    expect(result.requests).toBe(300);
    expect(result.completed).toBe(300);
    expect(await listening(result.engineUrl!)).toBe(false);
  });

  test("with a tokenizer, text prompts and chats too, over few engine connections", async () => {
    const result = await warmUpProxy({
      config: config({ KVEDGE_UPSTREAM_CONNECTIONS: "3" }),
      requests: 90,
      tokenizer: loadTokenizer(QWEN3_DIR),
      paths: ["lane", "local"],
    });
    expect(result.completed).toBe(90);
    // 4 of every 9 kinds: a completion's text, and three chats
    expect(result.texts).toBe(40);
    expect(await listening(result.engineUrl!)).toBe(false);
  });

  test("limits too small for text prompts: token ids only, within them", async () => {
    const result = await warmUpProxy({
      config: config({ KVEDGE_MAX_PROMPT_TOKENS: "40", KVEDGE_BODY_LIMIT_BYTES: "1024" }),
      requests: 60,
      tokenizer: loadTokenizer(QWEN3_DIR),
      paths: ["local", "lane"],
    });
    expect(result).toMatchObject({ completed: 60, texts: 0 });
  });

  test("an engine that refuses connections fails the warm-up, and a next one still runs", async () => {
    const gone = await warmUpProxy({
      config: config(),
      requests: 1,
      tokenizer: null,
      paths: ["local"],
    });
    const refused = warmUpProxy({
      config: config(),
      requests: 20,
      tokenizer: null,
      paths: ["local"],
      engineUrl: gone.engineUrl!,
    });
    await expect(refused).rejects.toThrow(
      /a warm-up request failed \(local: \/v1\/completions: 502/,
    );
    expect(
      (await warmUpProxy({ config: config(), requests: 20, tokenizer: null, paths: ["lane"] }))
        .completed,
    ).toBe(20);
  });
});
