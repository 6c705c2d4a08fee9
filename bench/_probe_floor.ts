/**
 * The floor of the serving benchmark on this machine: the load generator of
 * bench/http.ts against a Bun server that does no work (fixed answers), so a number of
 * `kvedge serve` can be read against what Bun and the generator cost alone.
 *
 *   bun bench/http-floor.ts [--json] [--generator c|bun]
 *
 * Scenarios: HTTP closed loop (32 connections) without reading the body and reading it
 * with text() and bytes(); HTTP open loop at 12.5k/s (half the HTTP goal); WebSocket
 * binary frames of 16 closed loop (4 x 4) and open loop at 25k/s (half the WS goal).
 * The no-op server answers each frame with 16 fixed answers and each HTTP request with
 * a fixed route answer. Each scenario gets a fresh server process. The open-loop
 * scenarios are sent by bench/loadgen/open-loop.c unless `--generator bun`, as in bench/http.ts.
 */
import { join } from "node:path";
import { type LoadResult, type LoadSpec, openLoopGenerator } from "./http-load";
import { benchFlags, killWithBench, provenance } from "./lib";

// `--serve none|text|bytes`: this file as the no-op server, in its own process.
const flags = benchFlags("bun bench/http-floor.ts [--json] [--generator c|bun]", {
  json: { type: "boolean" },
  generator: { type: "string" },
  serve: { type: "string" },
});
const json = flags.json === true;
const generator = openLoopGenerator(flags.generator);

if (flags.serve !== undefined) {
  const mode = flags.serve;
  const { pack } = await import("msgpackr");
  const answer = JSON.stringify({ request_id: "r-1", worker_id: "7", dp_rank: 0, query_blocks: 64, overlap_blocks: 60, cost: 12.5, candidates: [] });
  const answerBytes = pack(JSON.parse(answer));
  const frame = pack(Array.from({ length: 16 }, (_, id) => ({ id, status: 200, result: { request_id: "r-1", worker_id: "7" } })));
  const server = Bun.serve({
    port: 0,
    routes: {
      "/v1/route": {
        POST: async (request) => {
          if (mode === "text") await request.text();
          else await request.bytes();
          if (mode === "u8") return new Response(answerBytes, { headers: { "content-type": "application/msgpack" } });
          if (mode === "u8copy") return new Response(answerBytes.slice(), { headers: { "content-type": "application/msgpack" } });
          return new Response(answer, { headers: { "content-type": "application/json" } });
        },
      },
    },
    fetch(request, bun) {
      if (bun.upgrade(request, { data: undefined })) return undefined as unknown as Response;
      return new Response("not found", { status: 404 });
    },
    websocket: { perMessageDeflate: false, maxPayloadLength: 16 << 20, message: (ws) => void ws.send(frame) },
  });
  console.log(JSON.stringify({ port: server.port }));
} else {
  const scenarios: { name: string; mode: string; spec: Partial<LoadSpec> }[] = [
    { name: "msgpack req, text", mode: "text", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, bytes", mode: "bytes", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, u8", mode: "u8", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, u8copy", mode: "u8copy", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, text", mode: "text", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, bytes", mode: "bytes", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, u8", mode: "u8", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
    { name: "msgpack req, u8copy", mode: "u8copy", spec: { transport: "http", binary: true, mode: "closed", connections: 32 } },
  ];
  const rows: { scenario: string; result: LoadResult }[] = [];
  for (const scenario of scenarios) {
    const server = killWithBench(Bun.spawn([process.execPath, import.meta.path, "--serve", scenario.mode], { stdout: "pipe", stderr: "inherit" }));
    const reader = server.stdout.getReader();
    const { value } = await reader.read();
    const { port } = JSON.parse(new TextDecoder().decode(value).split("\n")[0]!) as { port: number };
    const spec: LoadSpec = {
      host: "127.0.0.1", port, transport: "http", batch: 1, mode: "closed", rate: 0, connections: 32, window: 1,
      promptTokens: 1024, poolSize: 4096, candidates: 4, warmupMs: 1_000, durationMs: 4_000, seed: 20_261_129,
      fleetWorkers: 64, fleetPairs: 1_050_000, uniqueBase: 0, serverPid: server.pid, generator, ...scenario.spec,
    };
    const load = killWithBench(Bun.spawn([process.execPath, join(import.meta.dir, "http-load.ts"), JSON.stringify(spec)], { stdout: "pipe", stderr: "inherit" }));
    const text = await new Response(load.stdout).text();
    await load.exited;
    server.kill();
    await server.exited;
    const result = JSON.parse(text.trim().split("\n").pop()!) as LoadResult;
    rows.push({ scenario: scenario.name, result });
    if (!json) {
      console.log(`${scenario.name}: ${(result.routesPerSecond / 1000).toFixed(1)}k/s, p50 ${result.p50Ms.toFixed(2)} ms, `
        + `p99 ${result.p99Ms.toFixed(2)} ms, server CPU ${(100 * result.serverCpu).toFixed(0)} % `
        + `(${((1e6 * result.serverCpu) / result.routesPerSecond).toFixed(1)} µs/request), generator CPU ${(100 * result.generatorCpu).toFixed(0)} %`
        + (result.sendLagP99Ms === null ? "" : `, send lag p99 ${result.sendLagP99Ms.toFixed(2)} ms`));
    }
  }
  if (json) console.log(JSON.stringify({ bench: "http-floor", provenance: provenance(), openLoopGenerator: generator, rows }));
}
