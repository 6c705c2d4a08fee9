// Goal: streams reach the client whole however the engine frames and cuts them, through
// the compiled `kvedge serve --proxy`, on one thread and behind two route lanes. An
// engine that writes its usage chunk and `data: [DONE]` apart (vLLM's way) ends 40 of 40
// streams with [DONE] for clients that did not ask for usage (the chunk kvedge asked
// for is dropped); CRLF and CR line ends and events cut in two writes arrive as the
// engine wrote them, usage chunk dropped or kept as the client asked. The engine is a
// raw-TCP server writing vLLM's completions and chat streams one write per event
// (test/support/faulty-engine.ts). Before listening, the main thread and each lane warm
// the proxy's path on scratch pieces (src/proxy/warmup.ts), logged per thread, nothing of
// it reaching the real engine, proxy or load; the streams after it are served as above.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { TestEngine } from "../support/engine";
import { FaultyEngine, type Framing, vllmWrites } from "../support/faulty-engine";
import { type ServeProcess, startServe } from "../support/serve";
import { QWEN3_DIR } from "../support/tokenizers";
import { until } from "../support/wait";

type Json = Record<string, any>;
let engine: FaultyEngine;
let events: TestEngine;

beforeAll(async () => {
  engine = new FaultyEngine().start();
  events = await new TestEngine().start();
});

afterAll(async () => {
  engine?.stop();
  await events?.stop();
});

function framed(writes: string[], framing: Framing): string {
  const text = writes.join("");
  if (framing === "crlf") return text.replaceAll("\n", "\r\n");
  if (framing === "cr") return text.replaceAll("\n", "\r");
  return text;
}

for (const lanes of [0, 2]) {
  describe(`streams through --route-threads ${lanes}`, () => {
    let serve: ServeProcess;
    let engineRequests = 0;
    beforeAll(async () => {
      engineRequests = engine.requests.length;
      serve = await startServe([
        "--proxy",
        "--tokenizer",
        QWEN3_DIR,
        "--model",
        "m",
        "--warmup-routes",
        "0",
        "--warmup-streams",
        "200",
        "--route-threads",
        String(lanes),
        "--workers",
        `1=${events.endpoint};http=${engine.url}`,
      ]);
    });
    afterAll(async () => {
      await serve?.stop();
    });

    const send = (chat: boolean, extra: Json) =>
      fetch(`${serve.url}${chat ? "/v1/chat/completions" : "/v1/completions"}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          max_tokens: 2,
          stream: true,
          ...(chat ? { messages: [{ role: "user", content: "Hi" }] } : { prompt: [1, 2, 3, 4] }),
          ...extra,
        }),
      });

    const metric = async (line: string) => {
      const text = await (await fetch(`${serve.controlUrl}/metrics`)).text();
      const found = text.split("\n").find((l) => l.startsWith(`${line} `));
      return Number(found?.slice(line.length + 1) ?? Number.NaN);
    };

    test("the proxy's path was warmed on the main thread and in each lane before listening, on scratch pieces only", async () => {
      const listening = serve.logs.findIndex((line) => line.msg === "listening");
      const warmed = serve.logs
        .slice(0, listening)
        .filter((line) => line.msg === "warmed up" && line.proxy_requests !== undefined);
      const lanesWarmed = Array.from({ length: lanes }, (_, lane) => ({
        lane,
        proxy_requests: 200,
      }));
      expect(warmed.map(({ lane, proxy_requests }) => ({ lane, proxy_requests }))).toEqual([
        { lane: undefined, proxy_requests: 200 },
        ...lanesWarmed,
      ]);
      expect(serve.logs.some((line) => line.msg === "warm-up failed; serving without it")).toBe(
        false,
      );
      // Nothing of it reached the real engine, proxy or load.
      expect(engine.requests.length).toBe(engineRequests);
      expect(await metric('kvedge_proxy_requests_total{outcome="completed"}')).toBe(0);
      expect(await metric('kvedge_worker_active_requests{worker_id="1",dp_rank="0"}')).toBe(0);
    });

    test("40 of 40 streams end with [DONE] when the engine writes usage and [DONE] apart", async () => {
      const completed = await metric('kvedge_proxy_requests_total{outcome="completed"}');
      engine.gapMs = 5;
      const texts = await Promise.all(
        Array.from({ length: 40 }, async (_, i) => (await send(i % 2 === 1, {})).text()),
      );
      engine.gapMs = 2;
      const done = texts.filter((text) => text.endsWith("data: [DONE]\n\n"));
      expect(done.length).toBe(40);
      for (const [i, text] of texts.entries())
        expect(text).toBe(framed(vllmWrites(i % 2 === 1, false), "lf"));
      // Behind lanes the main thread hears of each end a message later than the client.
      const counted = () => metric('kvedge_proxy_requests_total{outcome="completed"}');
      await until(async () => (await counted()) >= completed + 40, "40 completed");
      expect(await counted()).toBe(completed + 40);
      await until(
        async () =>
          (await metric('kvedge_worker_active_requests{worker_id="1",dp_rank="0"}')) === 0,
        "no load left",
      );
    });

    test("CRLF, CR and events cut in two writes: the client gets the engine's bytes", async () => {
      for (const framing of ["crlf", "cr", "split"] as const) {
        for (const chat of [false, true]) {
          for (const usage of [false, true]) {
            const extra = usage ? { stream_options: { include_usage: true } } : {};
            const text = await (await send(chat, { x_framing: framing, ...extra })).text();
            expect(`${framing} ${chat} ${usage}: ${text}`).toBe(
              `${framing} ${chat} ${usage}: ${framed(vllmWrites(chat, usage), framing)}`,
            );
          }
        }
      }
    });
  });
}
