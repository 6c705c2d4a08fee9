// Goal: every way a proxied request can end, ends it once and gives everything back,
// on one thread and behind two route lanes: the request's load (the workers' active
// requests back to 0), its place in kvedge (nothing in flight, no engine connection
// held) and the engine's connection (closed). The table drives the compiled `kvedge
// serve --proxy` against a real HTTP engine on raw TCP (test/support/faulty-engine.ts)
// that answers as vLLM writes (usage chunk and [DONE] apart) or fails: an error status,
// garbage, a close or a reset before or in the answer, broken chunk framing, a hang
// (first-byte and idle timeouts); a second worker's endpoint never accepts (connect
// timeout: the next candidate is tried). The client leaves while held by admission,
// while kvedge connects, while the engine thinks, mid-stream; kvedge stops mid-stream.
// Requests are routed by what each worker caches (real KV events), so every case knows
// its worker. No timing assertions: each waits on a condition.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadTokenizer } from "../../src/proxy/tokenizer";
import { type BlackHole, blackHole } from "../support/black-hole";
import { stored, TestEngine } from "../support/engine";
import { type Fault, FaultyEngine } from "../support/faulty-engine";
import { metricsOf as metrics, type ServeProcess, startServe } from "../support/serve";
import { QWEN3_DIR } from "../support/tokenizers";
import { until } from "../support/wait";

type Json = Record<string, any>;
const BLOCK = 16;
const range = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i);
/** Prompts cached on worker 1 (the faulty engine) and on worker 2 (the black hole). */
const ON_1 = range(1000, 4 * BLOCK);
const ON_2 = range(5000, 4 * BLOCK);
const CHAT = [{ role: "user", content: "Tell me about the sea, at length and in detail please." }];

let faulty: FaultyEngine;
let hole: BlackHole;
let events1: TestEngine;
let events2: TestEngine;
let chatTokens: number[];

beforeAll(async () => {
  faulty = new FaultyEngine().start();
  hole = await blackHole();
  events1 = await new TestEngine().start();
  events2 = await new TestEngine().start();
  const tokenizer = loadTokenizer(QWEN3_DIR);
  const text = tokenizer.renderChat(CHAT, { addGenerationPrompt: true });
  chatTokens = Array.from(await tokenizer.encode(text, false));
});

afterAll(async () => {
  faulty?.stop();
  hole?.close();
  await events1?.stop();
  await events2?.stop();
});

const sumOf = (values: Map<string, number>, prefix: string) =>
  [...values].filter(([key]) => key.startsWith(prefix)).reduce((sum, [, v]) => sum + v, 0);

/** kvedge processes running: each engine must see them all subscribed before it publishes. */
let running = 0;

/** A kvedge in front of worker 1 (the faulty engine) and worker 2 (the black hole). */
class Kvedge {
  serve!: ServeProcess;

  constructor(private readonly flags: string[]) {}

  async start(): Promise<void> {
    const workers = `1=${events1.endpoint};http=${faulty.url},2=${events2.endpoint};http=${hole.url}`;
    this.serve = await startServe([
      "--proxy",
      "--tokenizer",
      QWEN3_DIR,
      "--model",
      "m",
      "--warmup-routes",
      "0",
      "--warmup-streams",
      "0",
      "--workers",
      workers,
      ...this.flags,
    ]);
    running++;
    const all = () =>
      events1.pub.subscribedPeers >= running && events2.pub.subscribedPeers >= running;
    await until(all, "kvedge to subscribe to both engines");
  }

  /** Stops it (SIGTERM); its exit code. */
  async stop(): Promise<number | undefined> {
    if (this.serve === undefined || this.stopped) return undefined;
    this.stopped = true;
    running--;
    return await this.serve.stop();
  }

  private stopped = false;

  get url(): string {
    return this.serve.url;
  }

  /** Caches each worker's prompts in its engine, as KV events, and waits for the index. */
  async cache(): Promise<void> {
    const blocks = (tokens: number[], first: bigint) => {
      const count = Math.floor(tokens.length / BLOCK);
      const hashes = range(0, count).map((i) => first + BigInt(i));
      return stored(hashes, tokens.slice(0, count * BLOCK), BLOCK);
    };
    events1.publish([blocks(ON_1, 100n), blocks(chatTokens, 200n)]);
    events2.publish([blocks(ON_2, 300n)]);
    const want1 = 4 + Math.floor(chatTokens.length / BLOCK);
    await until(async () => {
      const m = await metrics(this.serve.controlUrl);
      return (
        (m.get('kvedge_worker_blocks{worker_id="1",dp_rank="0"}') ?? 0) >= want1 &&
        (m.get('kvedge_worker_blocks{worker_id="2",dp_rank="0"}') ?? 0) >= 4
      );
    }, "the index to hold both workers' prompts");
  }

  complete(prompt: number[], fault: Fault, extra: Json = {}, signal?: AbortSignal) {
    const body = { model: "m", prompt, max_tokens: 2, x_fault: fault, ...extra };
    return this.post("/v1/completions", body, signal);
  }

  chat(fault: Fault, extra: Json = {}, signal?: AbortSignal) {
    const body = { model: "m", messages: CHAT, max_tokens: 2, x_fault: fault, ...extra };
    return this.post("/v1/chat/completions", body, signal);
  }

  post(path: string, body: Json, signal?: AbortSignal) {
    return fetch(`${this.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      ...(signal === undefined ? {} : { signal }),
    });
  }

  async outcome(name: string): Promise<number> {
    return (
      (await metrics(this.serve.controlUrl)).get(
        `kvedge_proxy_requests_total{outcome="${name}"}`,
      ) ?? 0
    );
  }

  /** Nothing held anywhere: no load, nothing in flight, no engine connection on either side. */
  async settled(): Promise<void> {
    await until(async () => {
      const m = await metrics(this.serve.controlUrl);
      return (
        sumOf(m, "kvedge_worker_active_requests") === 0 &&
        m.get("kvedge_proxy_in_flight") === 0 &&
        m.get("kvedge_proxy_upstream_connections") === 0 &&
        m.get("kvedge_proxy_upstream_queued") === 0 &&
        faulty.open === 0
      );
    }, "the request's load, slot and engine connection to be released");
  }

  /** Runs `body`, then checks the request ended as `outcome` (once) and released everything. */
  async expectEnds(outcome: string, body: () => Promise<void>): Promise<void> {
    const before = await this.outcome(outcome);
    await body();
    await this.settled();
    expect(await this.outcome(outcome)).toBe(before + 1);
  }
}

interface Answer {
  /** 0: the connection was cut before the answer's head reached the client. */
  readonly status: number;
  readonly text: string;
  /** Reading it failed: the stream was cut. */
  readonly cut: boolean;
}

/** The client's view of an answer. */
async function read(pending: Promise<Response>): Promise<Answer> {
  const parts: Uint8Array[] = [];
  let response: Response;
  try {
    response = await pending;
  } catch {
    return { status: 0, text: "", cut: true };
  }
  let cut = false;
  try {
    for await (const chunk of response.body!) parts.push(chunk);
  } catch {
    cut = true;
  }
  return { status: response.status, text: Buffer.concat(parts).toString(), cut };
}

const errorCode = (text: string) => (JSON.parse(text) as Json).error.code;

for (const lanes of [0, 2]) {
  describe(`kvedge serve --proxy with --route-threads ${lanes}`, () => {
    const patient = new Kvedge([
      "--route-threads",
      String(lanes),
      "--connect-timeout-ms",
      "60000",
      "--first-byte-timeout-ms",
      "60000",
      "--idle-timeout-ms",
      "60000",
      "--admission",
      "hold",
      "--admission-bound-ms",
      "200",
      "--admission-max-hold-ms",
      "600000",
    ]);
    const hasty = new Kvedge([
      "--route-threads",
      String(lanes),
      "--connect-timeout-ms",
      "400",
      "--first-byte-timeout-ms",
      "400",
      "--idle-timeout-ms",
      "400",
    ]);
    beforeAll(async () => {
      await Promise.all([patient.start(), hasty.start()]);
      await Promise.all([patient.cache(), hasty.cache()]);
    });
    afterAll(async () => {
      await Promise.all([patient.stop(), hasty.stop()]);
    });

    test("success: streams (completions and chat) end with [DONE], the unasked usage chunk dropped; a plain answer whole", async () => {
      for (const send of [
        () => patient.complete(ON_1, "ok", { stream: true }),
        () => patient.chat("ok", { stream: true }),
      ]) {
        await patient.expectEnds("completed", async () => {
          const answer = await read(send());
          expect(answer).toMatchObject({ status: 200, cut: false });
          expect(answer.text.endsWith("data: [DONE]\n\n")).toBe(true);
          expect(answer.text).not.toContain('"usage":{');
        });
      }
      await patient.expectEnds("completed", async () => {
        const answer = await read(patient.complete(ON_1, "ok"));
        expect(answer.status).toBe(200);
        expect(JSON.parse(answer.text).object).toBe("text_completion");
      });
    });

    test("the engine's error status is relayed as it is", async () => {
      await patient.expectEnds("error_answer", async () => {
        const answer = await read(patient.complete(ON_1, "status", { stream: true }));
        expect(answer.status).toBe(500);
        expect(JSON.parse(answer.text).error.message).toBe("the engine broke");
      });
    });

    test("garbage, a close or a reset before the answer: 502 engine_failed, never sent elsewhere", async () => {
      for (const fault of ["garbage", "close-before", "reset-before"] as const) {
        const before = faulty.requests.length;
        await patient.expectEnds("engine_error", async () => {
          const answer = await read(patient.complete(ON_1, fault, { stream: true }));
          expect(answer.status).toBe(502);
          expect(errorCode(answer.text)).toBe("engine_failed");
        });
        expect(faulty.requests.length).toBe(before + 1);
      }
    });

    test("a close, a reset or broken framing mid-stream: the client's stream is cut", async () => {
      for (const fault of ["close-mid", "reset-mid", "garble-mid"] as const) {
        await patient.expectEnds("engine_error", async () => {
          // Cut mid-stream; the head may not have left kvedge yet (then the client sees a reset).
          const answer = await read(patient.chat(fault, { stream: true }));
          expect([0, 200]).toContain(answer.status);
          expect(answer.text).not.toContain("[DONE]");
          expect(answer.cut).toBe(true);
        });
      }
    });

    test("no answer in time: 504 engine_timeout; an answer that pauses too long: cut", async () => {
      await hasty.expectEnds("engine_timeout", async () => {
        const answer = await read(hasty.complete(ON_1, "hang-before", { stream: true }));
        expect(answer.status).toBe(504);
        expect(errorCode(answer.text)).toBe("engine_timeout");
      });
      await hasty.expectEnds("stall", async () => {
        const answer = await read(hasty.complete(ON_1, "hang-mid", { stream: true }));
        expect(answer).toMatchObject({ status: 200, cut: true });
        expect(answer.text).toContain('"text":" Hello"');
      });
    });

    test("a worker that cannot be connected to in time: the next candidate answers", async () => {
      const failovers =
        (await metrics(hasty.serve.controlUrl)).get("kvedge_proxy_failovers_total") ?? 0;
      await hasty.expectEnds("completed", async () => {
        const response = await hasty.complete(ON_2, "ok", { stream: true });
        expect(response.headers.get("x-kvedge-worker-id")).toBe("1");
        const answer = await read(Promise.resolve(response));
        expect(answer.text.endsWith("data: [DONE]\n\n")).toBe(true);
      });
      expect((await metrics(hasty.serve.controlUrl)).get("kvedge_proxy_failovers_total")).toBe(
        failovers + 1,
      );
      const routed = await metrics(hasty.serve.controlUrl);
      expect(routed.get('kvedge_routed_requests_total{worker_id="2",dp_rank="0"}')).toBe(1);
    });

    test("the client leaves while kvedge connects, while the engine thinks, mid-stream", async () => {
      const leave = async (
        send: (signal: AbortSignal) => Promise<Response>,
        ready: () => Promise<boolean>,
        reading: boolean,
      ) => {
        const abort = new AbortController();
        const answer = reading
          ? read(send(abort.signal))
          : send(abort.signal).catch((e: Error) => e);
        await until(ready, "the request to reach the phase");
        abort.abort();
        await answer;
      };
      const connections = async () =>
        (await metrics(patient.serve.controlUrl)).get("kvedge_proxy_upstream_connections") === 1;
      await patient.expectEnds("client_abort", () =>
        leave((signal) => patient.complete(ON_2, "ok", {}, signal), connections, false),
      );
      const asked = faulty.requests.length;
      await patient.expectEnds("client_abort", () =>
        leave(
          (signal) => patient.complete(ON_1, "hang-before", { stream: true }, signal),
          async () => faulty.requests.length > asked && faulty.open === 1,
          false,
        ),
      );
      let firstEvent = false;
      await patient.expectEnds("client_abort", async () => {
        const abort = new AbortController();
        const response = await patient.complete(ON_1, "hang-mid", { stream: true }, abort.signal);
        const reader = response.body!.getReader();
        firstEvent = (await reader.read()).done === false;
        abort.abort();
        await reader.read().catch(() => null);
      });
      expect(firstEvent).toBe(true);
    });

    test("the client leaves while held by admission: dropped, never sent to an engine", async () => {
      // Two hogs, one per worker, each past the admission bound: the first (cached on
      // worker 1) hangs at the engine, the second goes to the worker left, the black hole.
      const hogs = new AbortController();
      const asked0 = faulty.requests.length;
      const first = patient
        .complete([...ON_1, ...range(20_000, 6000)], "hang-before", {}, hogs.signal)
        .catch(() => null);
      try {
        await until(async () => faulty.requests.length > asked0, "the first hog at the engine");
        const second = patient
          .complete(range(40_000, 6000), "hang-before", {}, hogs.signal)
          .catch(() => null);
        const control = patient.serve.controlUrl;
        await until(
          async () => sumOf(await metrics(control), "kvedge_worker_active_requests") === 2,
          "both workers busy",
        );
        const asked = faulty.requests.length;
        const before = await metrics(control);
        const abort = new AbortController();
        const held = patient.complete(ON_1, "ok", {}, abort.signal).catch((error: Error) => error);
        const heldIs = (count: number) => async () =>
          (await metrics(control)).get("kvedge_admission_held") === count;
        await until(heldIs(1), "the request to be held");
        abort.abort();
        expect(await held).toBeInstanceOf(Error);
        await until(heldIs(0), "the held request to be dropped");
        hogs.abort();
        await Promise.all([first, second]);
        await patient.settled();
        const after = await metrics(control);
        const delta = (key: string) => (after.get(key) ?? 0) - (before.get(key) ?? 0);
        expect(delta('kvedge_proxy_requests_total{outcome="client_abort"}')).toBe(3);
        expect(delta('kvedge_admission_total{outcome="dropped"}')).toBe(1);
        expect(faulty.requests.length).toBe(asked);
        expect(sumOf(after, "kvedge_routed_requests_total")).toBe(
          sumOf(before, "kvedge_routed_requests_total"),
        );
      } finally {
        hogs.abort();
      }
    });

    test("kvedge stops mid-stream: the engine connection is closed and the client's stream ends", async () => {
      const response = await patient.complete(ON_1, "hang-mid", { stream: true });
      const reader = response.body!.getReader();
      expect((await reader.read()).done).toBe(false);
      const code = await patient.stop();
      expect(code).toBe(0);
      await until(() => faulty.open === 0, "the engine connection to close");
      let rest = "";
      const end = await (async () => {
        for (;;) {
          const step = await reader.read();
          if (step.done) return "ended";
          rest += new TextDecoder().decode(step.value);
        }
      })().catch(() => "cut");
      expect(["ended", "cut"]).toContain(end);
      expect(rest).not.toContain("[DONE]");
      const line = patient.serve.logs.find((l) => l.msg === "ended proxied requests still running");
      expect(line?.requests).toBe(1);
    });
  });
}
