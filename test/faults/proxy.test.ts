// Goal: a network path that stalls or cuts a connection in the middle of a ZMTP frame
// (a TCP proxy between kvedge and a real mock engine process) ends with the worker's
// index equal to the engine's cache: kvedge notices (heartbeat timeout, or the cut),
// reconnects, proves by its connect probe that the stream continues, and replays what
// it missed.
import { afterEach, describe, expect, test } from "bun:test";
import type { Socket, TCPSocketListener } from "bun";
import type { ServeProcess } from "../support/serve";
import { eventually } from "../support/wait";
import {
  expectExactAndEqual,
  generate,
  metric,
  type MockEngineProcess,
  prompts,
  serveFor,
  startMockEngine,
  stopEngine,
  subscribed,
} from "./rig";

/** Forwards loopback TCP to `target`; can cut the next engine→kvedge chunk in half, or stall. */
class TcpProxy {
  listener: TCPSocketListener<{ peer: Socket<unknown> | null; pending: Uint8Array[] }> | null =
    null;
  cutNext = false;
  stalled = false;
  cuts = 0;
  /** kvedge-side connections closed (by kvedge, or by a cut). */
  closes = 0;
  private readonly open = new Set<Socket<any>>();

  constructor(private readonly targetPort: number) {}

  start(): number {
    this.listener = Bun.listen<{ peer: Socket<unknown> | null; pending: Uint8Array[] }>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open: (client) => {
          client.data = { peer: null, pending: [] };
          this.open.add(client);
          void Bun.connect<unknown>({
            hostname: "127.0.0.1",
            port: this.targetPort,
            socket: {
              open: (upstream) => {
                this.open.add(upstream);
                client.data.peer = upstream;
                for (const chunk of client.data.pending.splice(0)) upstream.write(chunk);
              },
              data: (upstream, chunk) => this.downstream(client, upstream, chunk),
              close: (upstream) => {
                this.open.delete(upstream);
                client.end();
              },
              error: () => {
                client.end();
              },
            },
          }).catch(() => client.end());
        },
        data: (client, chunk) => {
          if (client.data.peer === null) client.data.pending.push(new Uint8Array(chunk));
          else client.data.peer.write(chunk);
        },
        close: (client) => {
          this.open.delete(client);
          this.closes++;
          client.data.peer?.end();
        },
      },
    });
    return this.listener.port;
  }

  private downstream(client: Socket<any>, upstream: Socket<unknown>, chunk: Uint8Array): void {
    if (this.stalled) return; // the path is dead but no one closes it: nothing more reaches kvedge
    if (this.cutNext && chunk.length > 1) {
      this.cutNext = false;
      this.cuts++;
      client.write(chunk.subarray(0, chunk.length >> 1));
      client.end();
      upstream.end();
      return;
    }
    client.write(chunk);
  }

  stop(): void {
    for (const socket of this.open) socket.end();
    this.listener?.stop(true);
  }
}

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

async function setup(): Promise<{
  engine: MockEngineProcess;
  proxy: TcpProxy;
  serve: ServeProcess;
}> {
  const engine = await startMockEngine();
  cleanups.push(() => stopEngine(engine));
  const proxy = new TcpProxy(Number(new URL(engine.endpoint.replace("tcp:", "http:")).port));
  const port = proxy.start();
  cleanups.push(() => proxy.stop());
  const serve = await serveFor(
    [`1=tcp://127.0.0.1:${port};replay=${engine.replayEndpoint}`],
    ["--heartbeat-interval-ms", "200", "--heartbeat-timeout-ms", "1000"],
  );
  cleanups.push(() => serve.stop());
  await subscribed(engine);
  return { engine, proxy, serve };
}

describe("a TCP path that fails mid-stream", () => {
  test("cut in the middle of a frame: reconnect, probe, replay; index equals the engine", async () => {
    const { engine, proxy, serve } = await setup();
    await generate(engine, prompts(4, 3, 11));
    await expectExactAndEqual(serve, "1", engine);
    proxy.cutNext = true;
    await generate(engine, prompts(4, 3, 12));
    // The engine answers its HTTP request before its events pass the proxy: wait for them.
    const cut = () => (proxy.cuts > 0 ? true : undefined);
    await eventually(cut, 10_000, "the proxy cutting a frame");
    expect(proxy.cuts).toBe(1);
    await expectExactAndEqual(serve, "1", engine);
    expect(
      await metric(
        serve.url,
        'kvedge_ingest_continuity_total{worker_id="1",dp_rank="0",outcome="continued"}',
      ),
    ).toBe(1);
  });

  test("a stall (bytes swallowed) is noticed by the heartbeat; after it the index equals the engine", async () => {
    const { engine, proxy, serve } = await setup();
    await generate(engine, prompts(4, 3, 13));
    await expectExactAndEqual(serve, "1", engine);
    proxy.stalled = true;
    const closes = proxy.closes;
    await generate(engine, prompts(4, 3, 14));
    // kvedge hears nothing (not even PONGs) and drops the connection after its heartbeat timeout.
    await eventually(
      () => (proxy.closes > closes ? true : undefined),
      15_000,
      "kvedge dropping the stalled connection",
    );
    proxy.stalled = false;
    await expectExactAndEqual(serve, "1", engine);
    await generate(engine, prompts(2, 3, 15));
    await expectExactAndEqual(serve, "1", engine);
  });
});
