// Goal: kvedge's HTTP/1.1 client (src/http/client.ts) reads every framing a server may
// use (Content-Length, chunked split anywhere, up to the close, interim 1xx heads),
// fails each way a server can fail with the right kind (refused, first-byte and idle
// timeouts, a close or reset mid-answer, garbage), says whether the request may have
// been sent, and closes the connection whenever it gives up. Real sockets on loopback
// against a raw-TCP server that writes exactly what each test says.
import { afterEach, describe, expect, test } from "bun:test";
import {
  ABANDONED_MAX,
  abandonedConnects,
  BodyDecoder,
  Exchange,
  type ExchangeTimeouts,
  originOf,
  UpstreamError,
} from "../../src/http/client";
import { blackHole } from "../support/black-hole";
import { type RawHandler, RawHttpServer } from "../support/raw-http";
import { until } from "../support/wait";

const NO_LIMITS: ExchangeTimeouts = { connectMs: 0, firstByteMs: 0, idleMs: 0 };
const servers: RawHttpServer[] = [];
afterEach(() => {
  for (const server of servers.splice(0)) server.stop();
});

function serve(handler: RawHandler): RawHttpServer {
  const server = new RawHttpServer(handler).start();
  servers.push(server);
  return server;
}

function exchange(
  server: RawHttpServer | string,
  body: string | null = "{}",
  timeouts: ExchangeTimeouts = NO_LIMITS,
): Exchange {
  const base = typeof server === "string" ? server : server.url;
  return new Exchange(
    {
      origin: originOf(base),
      method: "POST",
      path: "/v1/completions",
      headers: [["content-type", "application/json"]],
      body: body === null ? null : new TextEncoder().encode(body),
    },
    timeouts,
  );
}

async function bodyOf(ex: Exchange): Promise<string> {
  const parts: Uint8Array[] = [];
  for (;;) {
    const step = await ex.read();
    if (step.done) break;
    parts.push(step.value);
  }
  return new TextDecoder().decode(Buffer.concat(parts));
}

async function failureOf(promise: Promise<unknown>): Promise<UpstreamError> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(UpstreamError);
    return error as UpstreamError;
  }
  throw new Error("expected a failure");
}

describe("framings", () => {
  test("Content-Length: the body, and the request as written", async () => {
    const server = serve((_request, c) => c.json(201, { ok: true }));
    const ex = exchange(server, '{"a": 18446744073709551615}');
    const head = await ex.head;
    expect(head.status).toBe(201);
    expect(head.headers).toContainEqual(["content-type", "application/json"]);
    expect(await bodyOf(ex)).toBe('{"ok":true}');
    const [request] = server.requests;
    expect(request!.text).toBe('{"a": 18446744073709551615}');
    expect(request!.headers.connection).toBe("close");
    expect(request!.headers.host).toBe(`127.0.0.1:${server.port}`);
    await until(() => server.open === 0, "the connection to close");
  });

  test("chunked, written a byte at a time", async () => {
    const server = serve(async (_request, c) => {
      const whole =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n";
      for (const byte of whole) {
        c.write(byte);
        await Bun.sleep(0);
      }
    });
    const ex = exchange(server);
    expect((await ex.head).status).toBe(200);
    expect(await bodyOf(ex)).toBe("hello world");
  });

  test("up to the close, after an interim 103", async () => {
    const server = serve((_request, c) => {
      c.write("HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 200 OK\r\n\r\nall of it");
      c.close();
    });
    const ex = exchange(server);
    expect((await ex.head).status).toBe(200);
    expect(await bodyOf(ex)).toBe("all of it");
  });

  test("a large request body is written whole", async () => {
    const server = serve((request, c) => c.json(200, { bytes: request.body.length }));
    const ex = exchange(server, `"${"x".repeat(8 << 20)}"`);
    await ex.head;
    expect(JSON.parse(await bodyOf(ex))).toEqual({ bytes: (8 << 20) + 2 });
  });

  test("the chunked decoder gives the same bytes however the input is split", () => {
    const payload = "data: a\n\ndata: é\r\n\r\n";
    const bytes = new TextEncoder().encode(payload);
    const framed = new TextEncoder().encode(
      `3\r\n${"data: a\n\n".slice(0, 3)}\r\n${(bytes.length - 3).toString(16)}\r\n`,
    );
    const whole = Buffer.concat([framed, bytes.subarray(3), Buffer.from("\r\n0\r\n\r\n")]);
    for (let cut = 0; cut <= whole.length; cut++) {
      const decoder = new BodyDecoder();
      decoder.start({ kind: "chunked" });
      const out: Uint8Array[] = [];
      expect(decoder.push(whole.subarray(0, cut), (c) => out.push(c.slice()))).toBe(true);
      expect(decoder.push(whole.subarray(cut), (c) => out.push(c.slice()))).toBe(true);
      expect(decoder.complete).toBe(true);
      expect(Buffer.concat(out).equals(Buffer.from(bytes))).toBe(true);
    }
  });
});

describe("failures", () => {
  test("refused: nothing sent", async () => {
    const server = serve(() => {});
    const url = server.url;
    server.stop();
    const error = await failureOf(exchange(url).head);
    expect(error.failure).toBe("refused");
    expect(error.sent).toBe(false);
  });

  test("not connected in time: a connect timeout, nothing sent", async () => {
    const hole = await blackHole();
    try {
      const error = await failureOf(
        exchange(hole.url, "{}", { ...NO_LIMITS, connectMs: 200 }).head,
      );
      expect(error.failure).toBe("connect_timeout");
      expect(error.sent).toBe(false);
    } finally {
      hole.close();
    }
  });

  test("connects given up on are bounded per origin until the kernel settles them", async () => {
    const hole = await blackHole();
    const origin = originOf(hole.url);
    try {
      const given = Array.from({ length: ABANDONED_MAX }, () => exchange(hole.url));
      for (const ex of given) ex.abort();
      expect(abandonedConnects(origin)).toBe(ABANDONED_MAX);
      const error = await failureOf(exchange(hole.url).head);
      expect(error.failure).toBe("refused");
      expect(error.sent).toBe(false);
      expect(error.message).toContain("have not completed");
    } finally {
      hole.close();
    }
    // The listener gone, the kernel's next SYN is refused: every pending connect settles.
    await until(() => abandonedConnects(origin) === 0, "the pending connects to settle", 20_000);
  }, 30_000);

  test("no answer in time: a first-byte timeout, and the connection closed", async () => {
    const server = serve(() => {});
    const ex = exchange(server, "{}", { ...NO_LIMITS, firstByteMs: 200 });
    await until(() => server.requests.length === 1, "the request");
    const error = await failureOf(ex.head);
    expect(error.failure).toBe("first_byte_timeout");
    expect(error.sent).toBe(true);
    await until(() => server.open === 0, "the connection to close");
  });

  test("a body that pauses: an idle timeout, and the connection closed", async () => {
    const server = serve((_request, c) => {
      c.streamHead();
      c.chunk("data: 1\n\n");
    });
    const ex = exchange(server, "{}", { ...NO_LIMITS, idleMs: 200 });
    await ex.head;
    const first = await ex.read();
    expect(first.done).toBe(false);
    const error = await failureOf(ex.read());
    expect(error.failure).toBe("idle_timeout");
    await until(() => server.open === 0, "the connection to close");
  });

  test("a close mid-answer, and a reset mid-answer", async () => {
    for (const how of ["close", "reset"] as const) {
      const server = serve((_request, c) => {
        c.streamHead();
        c.chunk("data: 1\n\n");
        c.write("5\r\nab");
        if (how === "close") c.close();
        else c.reset();
      });
      const ex = exchange(server);
      await ex.head;
      const error = await failureOf(bodyOf(ex));
      expect(["closed", "reset"]).toContain(error.failure);
      expect(error.sent).toBe(true);
    }
  });

  test("garbage instead of an answer, and broken chunk framing", async () => {
    const garbage = serve((_request, c) => c.write("SSH-2.0-OpenSSH_9.6\r\n\r\n"));
    expect((await failureOf(exchange(garbage).head)).failure).toBe("malformed");
    const broken = serve((_request, c) => {
      c.streamHead();
      c.write("zz\r\nhello\r\n");
    });
    const ex = exchange(broken);
    await ex.head;
    expect((await failureOf(bodyOf(ex))).failure).toBe("malformed");
    await until(() => garbage.open === 0 && broken.open === 0, "the connections to close");
  });

  test("abort before the answer and mid-body: the server sees the connection close", async () => {
    const server = serve((request, c) => {
      if (request.text === '"mid"') {
        c.streamHead();
        c.chunk("data: 1\n\n");
      }
    });
    const before = exchange(server, '"before"');
    await until(() => server.requests.length === 1, "the first request");
    before.abort();
    expect((await failureOf(before.head)).failure).toBe("aborted");
    await until(() => server.open === 0, "the first connection to close");
    const mid = exchange(server, '"mid"');
    await mid.head;
    await mid.read();
    mid.abort();
    expect((await failureOf(mid.read())).failure).toBe("aborted");
    await until(() => server.open === 0, "the second connection to close");
  });
});
