// Goal: many streams at once never jam the proxy. 1,000 concurrent streams through the
// compiled `kvedge serve --proxy` to one engine, on one thread and behind two route
// lanes: the engine holds every stream open after its first event until all 1,000 are
// in flight at once (a barrier: a proxy capped below 1,000, as Bun's fetch is at 256 per
// process, never gets there), then finishes them; every client gets [DONE], /healthz
// keeps answering meanwhile, and nothing is left held after. Past
// proxy.upstream_connections, requests wait visibly (kvedge_proxy_upstream_queued) and
// are served when a connection frees, or get 503 with Retry-After when their wait is
// over. The clients use kvedge's own HTTP client (the test process's fetch has the same
// 256 cap). Bounded: 1,000 streams, loopback only. Latency is measured by
// bench/proxy-load.ts, not asserted here.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Exchange, originOf } from "../../src/http/client";
import { TestEngine } from "../support/engine";
import { FaultyEngine } from "../support/faulty-engine";
import { metricsOf as metrics, type ServeProcess, startServe } from "../support/serve";
import { until } from "../support/wait";

const STREAMS = 1000;
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

const NO_LIMITS = { connectMs: 10_000, firstByteMs: 0, idleMs: 0 };

/** One streamed completion through kvedge, read to its end with kvedge's own client. */
async function stream(url: string, i: number): Promise<{ status: number; text: string }> {
  const body = JSON.stringify({ prompt: [1 + (i % 50), 2, 3], max_tokens: 2, stream: true });
  const exchange = new Exchange(
    {
      origin: originOf(url),
      method: "POST",
      path: "/v1/completions",
      headers: [["content-type", "application/json"]],
      body: new TextEncoder().encode(body),
    },
    NO_LIMITS,
  );
  const head = await exchange.head;
  const parts: Uint8Array[] = [];
  for (;;) {
    const step = await exchange.read();
    if (step.done) break;
    parts.push(step.value);
  }
  return { status: head.status, text: Buffer.concat(parts).toString() };
}

function serveArgs(lanes: number, extra: string[] = []): string[] {
  return [
    "--proxy",
    "--model",
    "m",
    "--warmup-routes",
    "0",
    "--warmup-streams",
    "0",
    "--route-threads",
    String(lanes),
    "--workers",
    `1=${events.endpoint};http=${engine.url}`,
    ...extra,
  ];
}

/** Opens the engine's barrier once `count` streams are in flight there (or when released). */
function barrier(count: number): () => void {
  let open!: () => void;
  engine.hold = new Promise<void>((resolve) => {
    open = resolve;
  });
  let done = false;
  void until(() => done || engine.open >= count, `${count} streams at the engine`, 60_000).then(
    () => open(),
  );
  return () => {
    done = true;
    open();
    engine.hold = null;
  };
}

for (const lanes of [0, 2]) {
  describe(`--route-threads ${lanes}`, () => {
    let serve: ServeProcess;
    beforeAll(async () => {
      serve = await startServe(serveArgs(lanes));
    });
    afterAll(async () => {
      await serve?.stop();
    });

    test(`${STREAMS} concurrent streams: all in flight at once, all answered, /healthz answering throughout`, async () => {
      const release = barrier(STREAMS);
      let probing = true;
      let probes = 0;
      const probe = (async () => {
        while (probing) {
          const response = await fetch(`${serve.url}/healthz`, {
            signal: AbortSignal.timeout(10_000),
          });
          expect(response.status).toBe(200);
          await response.arrayBuffer();
          probes++;
          await Bun.sleep(20);
        }
      })();
      try {
        const answers = await Promise.all(
          Array.from({ length: STREAMS }, (_, i) => stream(serve.url, i)),
        );
        expect(answers.filter((a) => a.status === 200).length).toBe(STREAMS);
        expect(answers.filter((a) => a.text.endsWith("data: [DONE]\n\n")).length).toBe(STREAMS);
      } finally {
        release();
        probing = false;
        await probe;
      }
      expect(probes).toBeGreaterThan(0);
      await until(async () => {
        const m = await metrics(serve.controlUrl);
        return (
          m.get('kvedge_worker_active_requests{worker_id="1",dp_rank="0"}') === 0 &&
          m.get("kvedge_proxy_in_flight") === 0 &&
          m.get("kvedge_proxy_upstream_connections") === 0 &&
          engine.open === 0
        );
      }, "everything released");
      const m = await metrics(serve.controlUrl);
      expect(m.get('kvedge_proxy_requests_total{outcome="completed"}')).toBe(STREAMS);
    }, 120_000);
  });
}

describe("past proxy.upstream_connections", () => {
  test("requests queue visibly and are served when a connection frees", async () => {
    const serve = await startServe(serveArgs(0, ["--upstream-connections", "4"]));
    try {
      const release = barrier(4);
      const answers = Promise.all(Array.from({ length: 6 }, (_, i) => stream(serve.url, i)));
      await until(
        async () => (await metrics(serve.controlUrl)).get("kvedge_proxy_upstream_queued") === 2,
        "two requests queued",
      );
      // The four holding connections may still be on their way to the engine: a condition, not a race.
      await until(() => engine.open === 4, "four streams at the engine");
      expect((await metrics(serve.controlUrl)).get("kvedge_proxy_upstream_connections")).toBe(4);
      release();
      const done = await answers;
      expect(done.every((a) => a.text.endsWith("data: [DONE]\n\n"))).toBe(true);
      expect((await metrics(serve.controlUrl)).get("kvedge_proxy_upstream_queued")).toBe(0);
    } finally {
      await serve.stop();
    }
  });

  test("a request whose wait is over gets 503 busy with Retry-After", async () => {
    const serve = await startServe(
      serveArgs(2, ["--upstream-connections", "1", "--upstream-queue-timeout-ms", "300"]),
    );
    try {
      const release = barrier(Number.POSITIVE_INFINITY);
      const first = stream(serve.url, 0);
      await until(() => engine.open === 1, "the first stream at the engine");
      const second = await fetch(`${serve.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: [9, 9, 9], stream: true }),
      });
      expect(second.status).toBe(503);
      expect(second.headers.get("retry-after")).toBe("1");
      expect(((await second.json()) as { error: { code: string } }).error.code).toBe("busy");
      release();
      expect((await first).text.endsWith("data: [DONE]\n\n")).toBe(true);
      const m = await metrics(serve.controlUrl);
      expect(m.get('kvedge_proxy_requests_total{outcome="busy"}')).toBe(1);
    } finally {
      await serve.stop();
    }
  });
});
