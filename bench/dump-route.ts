/**
 * Routing while /v1/dump streams a large index: route latency (p50, p99, max) from
 * closed-loop clients, with no dump and during a dump, the dump's time and bytes, and
 * the server's RSS. The server (this file with --server) fills its index directly with
 * BLOCKS (worker, block) pairs in 64-block chains over 16 workers, then listens; the
 * clients and the dump reader run in this process.
 *
 *   bun bench/dump-route.ts [--blocks N] [--clients C] [--seconds S]
 */
import { loadConfig } from "../src/config";
import { startApp } from "../src/server/app";
import { createMetricsRegistry } from "../src/util/metrics";
import { KvedgeCore } from "../src/core/core";
import { silentLogger } from "../src/util/log";

const args = process.argv.slice(2);
const arg = (name: string, fallback: number): number => {
  const at = args.indexOf(`--${name}`);
  return at < 0 ? fallback : Number(args[at + 1]);
};
const BLOCKS = arg("blocks", 3_000_000);
const CLIENTS = arg("clients", 4);
const SECONDS = arg("seconds", 3);
const WORKERS = 16;
const CHAIN = 64;

if (args.includes("--server")) await server();
else await main();

async function server(): Promise<void> {
  const config = loadConfig({ env: {} }).config;
  const core = new KvedgeCore({ config, log: silentLogger, random: Math.random });
  const index = core.index;
  const external = new Uint32Array(2 * CHAIN);
  const local = new Uint32Array(2 * CHAIN);
  let block = 0;
  for (let chain = 0; block < BLOCKS; chain++) {
    for (let i = 0; i < CHAIN; i++) {
      external[2 * i + 1] = block + i + 1;
      local[2 * i] = chain + 1;
      local[2 * i + 1] = i + 1;
    }
    index.applyStored(BigInt(chain % WORKERS), 0, false, 0, 0, external, local, CHAIN, 0);
    block += CHAIN;
  }
  for (let w = 0; w < WORKERS; w++) core.workerTable.acquire(BigInt(w), 0);
  const app = startApp({
    host: "127.0.0.1",
    port: 0,
    bodyLimitBytes: 1 << 20,
    adminToken: null,
    core,
    registry: createMetricsRegistry(),
    log: silentLogger,
  });
  process.stdout.write(`${JSON.stringify({ url: app.url, blocks: index.stats().blocks })}\n`);
  // Ends with its parent (stdin closes), or after a bound.
  setTimeout(() => process.exit(0), 600_000).unref();
  for await (const _ of Bun.stdin.stream()) {
    /* parent alive */
  }
  process.exit(0);
}

async function main(): Promise<void> {
  const child = Bun.spawn(
    [process.execPath, import.meta.path, "--server", "--blocks", String(BLOCKS)],
    { stdin: "pipe", stdout: "pipe", stderr: "inherit" },
  );
  const reader = child.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) text += new TextDecoder().decode((await reader.read()).value);
  const { url, blocks } = JSON.parse(text) as { url: string; blocks: number };
  const rss = async (): Promise<number> => {
    const metrics = await (await fetch(`${url}/metrics`)).text();
    return Number(/^process_resident_memory_bytes (\S+)$/m.exec(metrics)?.[1] ?? NaN) / 2 ** 20;
  };

  const body = JSON.stringify({ token_ids: Array.from({ length: 256 }, (_, i) => (i % 64) + 1) });
  const routes = async (until: () => boolean): Promise<number[]> => {
    const times: number[] = [];
    await Promise.all(
      Array.from({ length: CLIENTS }, async () => {
        while (!until()) {
          const started = performance.now();
          const response = await fetch(`${url}/v1/route`, {
            method: "POST",
            body,
            headers: { "content-type": "application/json" },
          });
          await response.arrayBuffer();
          times.push(performance.now() - started);
        }
      }),
    );
    return times;
  };
  const summary = (times: number[]) => {
    const sorted = [...times].sort((a, b) => a - b);
    const at = (q: number) =>
      sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!.toFixed(2);
    return `n=${sorted.length} p50=${at(0.5)} ms p99=${at(0.99)} ms max=${sorted[sorted.length - 1]!.toFixed(2)} ms`;
  };

  const rssBefore = await rss();
  const quietEnd = performance.now() + SECONDS * 1000;
  const quiet = await routes(() => performance.now() > quietEnd);

  let dumping = true;
  let dumpBytes = 0;
  let dumpMs = 0;
  let rssPeak = rssBefore;
  const dump = (async () => {
    const started = performance.now();
    const response = await fetch(`${url}/v1/dump`);
    for await (const chunk of response.body!) dumpBytes += chunk.byteLength;
    dumpMs = performance.now() - started;
    dumping = false;
  })();
  const sampler = (async () => {
    while (dumping) {
      rssPeak = Math.max(rssPeak, await rss());
      await Bun.sleep(200);
    }
  })();
  const during = await routes(() => !dumping);
  await Promise.all([dump, sampler]);

  console.log(`index: ${blocks} (block, worker) pairs; ${CLIENTS} closed-loop route clients`);
  console.log(`routes, no dump:     ${summary(quiet)}`);
  console.log(`routes, during dump: ${summary(during)}`);
  console.log(
    `dump: ${(dumpBytes / 2 ** 20).toFixed(1)} MiB in ${(dumpMs / 1000).toFixed(2)} s; server RSS ${rssBefore.toFixed(0)} MiB before, ${rssPeak.toFixed(0)} MiB peak during`,
  );
  child.stdin.end();
  await child.exited;
}
