// Goal: what the compiled `kvedge serve --proxy` does with bodies, on one thread and
// behind two route lanes. The engine receives the client's bytes as they were written
// (integers past 2^53, float spellings, key order, unknown fields), through both
// endpoints, streamed or not; only stream_options.include_usage is spliced in when
// kvedge needs it. Bad input gets a clear error the client can read: a 9 MiB body
// with a Content-Length gets a JSON 413 even from a client that writes it all before
// reading; a 1 MB model name is not echoed back; prompts over the token and byte limits
// get 400. Large chats are tokenized on the tokenizer thread, small ones inline. What
// engines report is checked: cached_tokens that cannot be true is a bad answer, and a
// usage without cached_tokens counts as a miss once the engine has reported some.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { connect } from "node:net";
import { TestEngine } from "../support/engine";
import { FaultyEngine } from "../support/faulty-engine";
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

const SEED = "18446744073709551615";
const completionBodies = [
  `{"prompt":[1,2,3],"seed":${SEED},"temperature":1.0,"top_p":1e-1,"zzz":{"b":1,"a":[2.50,-0.0]},"max_tokens":2}`,
  `{ "max_tokens" : 2 ,\n "prompt" : "Hello there" , "seed" : ${SEED}, "logit_bias": {"50256": -100.00} }`,
];
const chatBodies = [
  `{"messages":[{"role":"user","content":"H\\u00e9llo \\ud83d\\ude42"}],"seed":${SEED},"temperature":0.70,"n":1,"x-unknown":[1e2]}`,
];

/** The body kvedge must send when it asks for usage itself: one member added at the end. */
const withUsage = (body: string) => {
  const close = body.lastIndexOf("}");
  return `${body.slice(0, close)},"stream_options":{"include_usage":true}${body.slice(close)}`;
};
const streamed = (body: string) => body.replace(/^\{/, '{"stream":true,');

for (const lanes of [0, 2]) {
  describe(`bodies through --route-threads ${lanes}`, () => {
    let serve: ServeProcess;
    beforeAll(async () => {
      serve = await startServe([
        "--proxy",
        "--tokenizer",
        QWEN3_DIR,
        "--model",
        "m",
        "--warmup-routes",
        "0",
        "--warmup-streams",
        "0",
        "--route-threads",
        String(lanes),
        "--max-prompt-tokens",
        "20000",
        "--max-prompt-bytes",
        "60000",
        "--observed-window",
        "2",
        "--workers",
        `1=${events.endpoint};http=${engine.url}`,
      ]);
    });
    afterAll(async () => {
      await serve?.stop();
    });

    const post = (path: string, body: string) =>
      fetch(`${serve.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      });
    const metric = async (line: string) => {
      const text = await (await fetch(`${serve.controlUrl}/metrics`)).text();
      const found = text.split("\n").find((l) => l.startsWith(`${line} `));
      return Number(found?.slice(line.length + 1) ?? Number.NaN);
    };
    const last = () => engine.requests.at(-1)!.text;

    test("the engine receives the client's bytes; include_usage spliced in only when kvedge asks", async () => {
      for (const [path, bodies] of [
        ["/v1/completions", completionBodies],
        ["/v1/chat/completions", chatBodies],
      ] as const) {
        for (const body of bodies) {
          const cases = [
            [body, body],
            [streamed(body), withUsage(streamed(body))],
            [
              withUsage(streamed(body)).replace("true}", 'true, "continuous_usage_stats": false}'),
              withUsage(streamed(body)).replace("true}", 'true, "continuous_usage_stats": false}'),
            ],
          ];
          for (const [sent, received] of cases) {
            const response = await post(path, sent!);
            expect(response.status).toBe(200);
            await response.arrayBuffer();
            expect(last()).toBe(received!);
          }
        }
      }
    });

    test("a 9 MiB body with a Content-Length: a JSON 413, even for a client that writes it all first", async () => {
      const size = 9 * 1024 * 1024;
      const viaFetch = await post("/v1/completions", `{"prompt":"${"x".repeat(size)}"}`);
      expect(viaFetch.status).toBe(413);
      expect(((await viaFetch.json()) as Json).error.code).toBe("too_large");
      const { port, hostname } = new URL(serve.url);
      const raw = await new Promise<string>((resolve) => {
        const socket = connect(Number(port), hostname);
        let text = "";
        socket.on("data", (data) => {
          text += data.toString();
        });
        socket.on("error", () => {});
        socket.on("close", () => resolve(text));
        socket.write(
          `POST /v1/chat/completions HTTP/1.1\r\nhost: ${hostname}:${port}\r\ncontent-type: application/json\r\ncontent-length: ${size}\r\n\r\n`,
        );
        socket.end(Buffer.alloc(size, 0x20));
      });
      expect(raw.startsWith("HTTP/1.1 413")).toBe(true);
      expect(raw).toContain('"code":"too_large"');
    });

    test("a 1 MB model name is not echoed back", async () => {
      const response = await post(
        "/v1/completions",
        JSON.stringify({ model: "m".repeat(1_000_000), prompt: [1, 2] }),
      );
      expect(response.status).toBe(404);
      const text = await response.text();
      expect(text.length).toBeLessThan(1024);
      expect((JSON.parse(text) as Json).error.code).toBe("unknown_model");
    });

    test("prompts over the token and byte limits: 400 naming the limit", async () => {
      const tokens = await post(
        "/v1/completions",
        JSON.stringify({ prompt: Array.from({ length: 20_001 }, (_, i) => i % 1000) }),
      );
      expect(tokens.status).toBe(400);
      const tokensError = ((await tokens.json()) as Json).error;
      expect(tokensError.message).toContain("proxy.max_prompt_tokens");
      expect(tokensError.param).toBe("prompt");
      const bytes = await post(
        "/v1/chat/completions",
        JSON.stringify({ messages: [{ role: "user", content: "é".repeat(40_000) }] }),
      );
      expect(bytes.status).toBe(400);
      expect(((await bytes.json()) as Json).error.message).toContain("proxy.max_prompt_bytes");
    });

    test("a large chat is tokenized on the tokenizer thread, a small one inline", async () => {
      const thread = await metric('kvedge_proxy_prepared_total{where="thread"}');
      const inline = await metric('kvedge_proxy_prepared_total{where="inline"}');
      const long = { messages: [{ role: "user", content: "word ".repeat(10_000) }], max_tokens: 1 };
      expect((await post("/v1/chat/completions", JSON.stringify(long))).status).toBe(200);
      const short = { messages: [{ role: "user", content: "word" }], max_tokens: 1 };
      expect((await post("/v1/chat/completions", JSON.stringify(short))).status).toBe(200);
      expect(await metric('kvedge_proxy_prepared_total{where="thread"}')).toBe(thread + 1);
      expect(await metric('kvedge_proxy_prepared_total{where="inline"}')).toBe(inline + 1);
    });

    test("cached_tokens that cannot be true is a bad answer; left out after a report, a miss", async () => {
      const ask = (usage: unknown) =>
        post("/v1/completions", JSON.stringify({ prompt: [1, 2, 3, 4], x_usage: usage }));
      const details = (cached: unknown) => ({
        prompt_tokens: 4,
        prompt_tokens_details: { cached_tokens: cached },
      });
      const view = async () =>
        (await (await fetch(`${serve.controlUrl}/metrics`)).text())
          .split("\n")
          .filter((l) => l.startsWith("kvedge_observed_"))
          .join("\n");
      const worker = '{worker_id="1",dp_rank="0"}';
      const counts = async () => ({
        bad: await metric(`kvedge_observed_bad_answers_total${worker}`),
        answers: await metric(`kvedge_observed_answers_total${worker}`),
        cached: await metric(`kvedge_observed_cached_tokens_total${worker}`),
        prompt: await metric(`kvedge_observed_prompt_tokens_total${worker}`),
      });
      const before = await counts();
      for (const bad of [1e308, -1, "4", 2.5, 5])
        expect((await ask(details(bad))).status).toBe(200);
      await ask(details(3));
      await ask({ prompt_tokens: 4 }); // cached_tokens left out: 0, now that the engine reports it
      // An answer is counted as it ends on the main thread: behind lanes, a message later.
      await until(async () => (await counts()).answers - before.answers >= 7, "7 answers seen");
      const after = await counts();
      expect(after.bad - before.bad).toBe(5);
      expect(after.answers - before.answers).toBe(7);
      expect(after.cached - before.cached).toBe(3);
      expect(after.prompt - before.prompt).toBe(8);
      expect(await view()).not.toContain("Inf");
    });
  });
}
