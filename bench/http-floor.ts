/**
 * The floor of the serving benchmark on this machine: the load generator of
 * bench/http.ts against a Bun server that does no work (fixed answers), so a number of
 * `kvedge serve` can be read against what Bun and the generator cost alone.
 *
 *   bun bench/http-floor.ts [--json] [--generator c|bun] [--work-us N]
 *
 * Scenarios: HTTP closed loop (32 connections) without reading the body and reading it
 * with text() and bytes(), and with bytes read by a minimal HTTP/1.1 responder on raw
 * TCP (Bun.listen) instead of Bun.serve, to show what the sockets alone cost; HTTP open
 * loop at 12.5k/s (half the HTTP goal); WebSocket
 * binary frames of 16 closed loop (4 x 4) and open loop at 25k/s (half the WS goal).
 * The no-op server answers each frame with 16 fixed answers and each HTTP request with
 * a fixed route answer. Each scenario gets a fresh server process. The open-loop
 * scenarios are sent by bench/loadgen/open-loop.c unless `--generator bun`, as in bench/http.ts.
 *
 * `--work-us N` spins N µs on every HTTP request that reads its body, standing in for a route's own work: with N = what the serve path
 * costs in one process (bench/serve-path.bench.ts `all 1024`), the HTTP scenarios show
 * the most a server on this machine could reach with that per-route cost.
 */
import { join } from "node:path";
import { type LoadResult, type LoadSpec, openLoopGenerator } from "./http-load";
import { benchFlags, killWithBench, provenance } from "./lib";

// `--serve none|text|bytes`: this file as the no-op server, in its own process.
const flags = benchFlags("bun bench/http-floor.ts [--json] [--generator c|bun] [--work-us N]", {
  json: { type: "boolean" },
  generator: { type: "string" },
  "work-us": { type: "string" },
  serve: { type: "string" },
});
const json = flags.json === true;
const workUs = Number(flags["work-us"] ?? 0);
if (!Number.isFinite(workUs) || workUs < 0) {
  console.error(`--work-us must be a number of microseconds ≥ 0, got ${flags["work-us"]}`);
  process.exit(2);
}
const generator = openLoopGenerator(flags.generator);

if (flags.serve !== undefined) {
  const mode = flags.serve;
  const { pack } = await import("msgpackr");
  const answer = JSON.stringify({
    request_id: "r-1",
    worker_id: "7",
    dp_rank: 0,
    query_blocks: 64,
    overlap_blocks: 60,
    cost: 12.5,
    candidates: [],
  });
  const frame = pack(
    Array.from({ length: 16 }, (_, id) => ({
      id,
      status: 200,
      result: { request_id: "r-1", worker_id: "7" },
    })),
  );
  const work = (): void => {
    if (workUs === 0) return;
    const until = performance.now() + workUs / 1000;
    while (performance.now() < until);
  };
  if (mode === "raw") {
    const port = rawResponder(
      Buffer.from(
        `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${answer.length}\r\n\r\n${answer}`,
      ),
      work,
    );
    console.log(JSON.stringify({ port }));
  } else {
    const server = Bun.serve({
      port: 0,
      routes: {
        "/v1/route": {
          POST: async (request) => {
            if (mode === "text") await request.text();
            else if (mode === "bytes") await request.bytes();
            if (mode !== "none") work();
            return new Response(answer, { headers: { "content-type": "application/json" } });
          },
        },
      },
      fetch(request, bun) {
        if (bun.upgrade(request, { data: undefined })) return undefined as unknown as Response;
        return new Response("not found", { status: 404 });
      },
      websocket: {
        perMessageDeflate: false,
        maxPayloadLength: 16 << 20,
        message: (ws) => void ws.send(frame),
      },
    });
    console.log(JSON.stringify({ port: server.port }));
  }
} else {
  const scenarios: { name: string; mode: string; spec: Partial<LoadSpec> }[] = [
    {
      name: "HTTP, body not read, closed loop",
      mode: "none",
      spec: { transport: "http", mode: "closed", connections: 32 },
    },
    {
      name: "HTTP, text(), closed loop",
      mode: "text",
      spec: { transport: "http", mode: "closed", connections: 32 },
    },
    {
      name: "HTTP, bytes(), closed loop",
      mode: "bytes",
      spec: { transport: "http", mode: "closed", connections: 32 },
    },
    {
      name: "HTTP, raw TCP, closed loop",
      mode: "raw",
      spec: { transport: "http", mode: "closed", connections: 32 },
    },
    {
      name: "HTTP, text(), open loop 12.5k/s",
      mode: "text",
      spec: { transport: "http", mode: "open", rate: 12_500, connections: 64 },
    },
    {
      name: "WS binary 16/frame, closed loop",
      mode: "none",
      spec: { transport: "ws", binary: true, batch: 16, mode: "closed", connections: 4, window: 4 },
    },
    {
      name: "WS binary 16/frame, open loop 25k/s",
      mode: "none",
      spec: {
        transport: "ws",
        binary: true,
        batch: 16,
        mode: "open",
        rate: 25_000,
        connections: 4,
      },
    },
  ];
  const rows: { scenario: string; result: LoadResult }[] = [];
  for (const scenario of scenarios) {
    const server = killWithBench(
      Bun.spawn(
        [process.execPath, import.meta.path, "--serve", scenario.mode, "--work-us", String(workUs)],
        { stdout: "pipe", stderr: "inherit" },
      ),
    );
    const reader = server.stdout.getReader();
    const { value } = await reader.read();
    const { port } = JSON.parse(new TextDecoder().decode(value).split("\n")[0]!) as {
      port: number;
    };
    const spec: LoadSpec = {
      host: "127.0.0.1",
      port,
      transport: "http",
      batch: 1,
      mode: "closed",
      rate: 0,
      connections: 32,
      window: 1,
      promptTokens: 1024,
      poolSize: 4096,
      candidates: 4,
      warmupMs: 1_000,
      durationMs: 4_000,
      seed: 20_261_129,
      fleetWorkers: 64,
      fleetPairs: 1_050_000,
      uniqueBase: 0,
      serverPid: server.pid,
      generator,
      ...scenario.spec,
    };
    const load = killWithBench(
      Bun.spawn([process.execPath, join(import.meta.dir, "http-load.ts"), JSON.stringify(spec)], {
        stdout: "pipe",
        stderr: "inherit",
      }),
    );
    const text = await new Response(load.stdout).text();
    await load.exited;
    server.kill();
    await server.exited;
    const result = JSON.parse(text.trim().split("\n").pop()!) as LoadResult;
    rows.push({ scenario: scenario.name, result });
    if (!json) {
      console.log(
        `${scenario.name}: ${(result.routesPerSecond / 1000).toFixed(1)}k/s, p50 ${result.p50Ms.toFixed(2)} ms, ` +
          `p99 ${result.p99Ms.toFixed(2)} ms, server CPU ${(100 * result.serverCpu).toFixed(0)} % ` +
          `(${((1e6 * result.serverCpu) / result.routesPerSecond).toFixed(1)} µs/request), generator CPU ${(100 * result.generatorCpu).toFixed(0)} %` +
          (result.sendLagP99Ms === null
            ? ""
            : `, send lag p99 ${result.sendLagP99Ms.toFixed(2)} ms`),
      );
    }
  }
  if (json)
    console.log(
      JSON.stringify({
        bench: "http-floor",
        provenance: provenance(),
        openLoopGenerator: generator,
        workUs,
        rows,
      }),
    );
}

/**
 * The least an HTTP/1.1 server can do per request over Bun's TCP sockets: find the end
 * of the head, read Content-Length, take the body, answer. Enough for the load
 * generator (keep-alive, Content-Length bodies, one request in flight); not a server.
 */
function rawResponder(response: Buffer, work: () => void): number {
  const HEAD_END = Buffer.from("\r\n\r\n");
  const listener = Bun.listen<{ pending: Buffer | null }>({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open(socket) {
        socket.data = { pending: null };
      },
      data(socket, chunk) {
        let bytes =
          socket.data.pending === null ? chunk : Buffer.concat([socket.data.pending, chunk]);
        socket.data.pending = null;
        for (;;) {
          const headEnd = bytes.indexOf(HEAD_END);
          if (headEnd < 0) break;
          const length = /content-length: *(\d+)/i.exec(bytes.toString("latin1", 0, headEnd));
          const end = headEnd + 4 + (length === null ? 0 : Number(length[1]));
          if (bytes.length < end) break;
          work();
          socket.write(response);
          bytes = bytes.subarray(end);
        }
        if (bytes.length > 0) socket.data.pending = Buffer.from(bytes);
      },
    },
  });
  return listener.port;
}
