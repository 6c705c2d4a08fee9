// Goal: request plumbing over a real Bun.serve on loopback — body limits (declared
// and streamed) give 413 JSON, malformed JSON/msgpack give 400 naming the problem,
// msgpack is accepted and returned on request, and field validation names the field.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { pack, unpack } from "msgpackr";
import { KvedgeError } from "../../src/domain/errors";
import {
  asObject,
  errorReply,
  MSGPACK,
  optionalInt,
  optionalString,
  readBody,
  reply,
  tokenIds,
  u64Field,
} from "../../src/http/http";

const LIMIT = 1024;
let server: ReturnType<typeof Bun.serve>;
let base = "";

beforeAll(() => {
  server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    maxRequestBodySize: LIMIT * 16,
    async fetch(request) {
      try {
        const body = asObject(await readBody(request, LIMIT));
        const tokens = tokenIds(body);
        return reply(request, 200, {
          tokens: Array.from(tokens),
          worker: body.worker_id === undefined ? null : u64Field(body.worker_id, "worker_id"),
          lora: optionalString(body, "lora_name"),
          n: optionalInt(body, "n", 0, 10),
        });
      } catch (error) {
        if (error instanceof KvedgeError) return errorReply(request, error);
        throw error;
      }
    },
  });
  base = `http://127.0.0.1:${server.port}`;
});

afterAll(() => server.stop(true));

const errorOf = async (response: Response): Promise<string> =>
  ((await response.json()) as { error: { message: string } }).error.message;

const post = (body: string | Uint8Array, headers: Record<string, string> = {}) =>
  fetch(base, {
    method: "POST",
    body,
    headers: { "content-type": "application/json", ...headers },
  });

describe("bodies", () => {
  test("a JSON body round-trips; u64 ids come back as decimal strings", async () => {
    const response = await post(
      JSON.stringify({ token_ids: [1, 2, 4294967295], worker_id: "18446744073709551615" }),
    );
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({
      tokens: [1, 2, 4294967295],
      worker: "18446744073709551615",
      lora: null,
      n: null,
    });
  });

  test("MessagePack in and out", async () => {
    const response = await post(
      pack({ token_ids: [7, 8], worker_id: 18446744073709551615n, n: 3 }),
      {
        "content-type": MSGPACK,
        accept: MSGPACK,
      },
    );
    expect(response.headers.get("content-type")).toBe(MSGPACK);
    expect(unpack(new Uint8Array(await response.arrayBuffer()))).toEqual({
      tokens: [7, 8],
      worker: 18446744073709551615n,
      lora: null,
      n: 3,
    });
  });

  test("MessagePack token_ids as bin: little-endian u32s, aligned or not, same tokens as an array", async () => {
    const tokens = [0, 1, 65_536, 4_294_967_295, 128_000];
    const words = new Uint32Array(tokens);
    // Keys of different lengths put the bin at different offsets of the body.
    for (const key of ["a", "ab", "abc", "abcd"]) {
      const response = await post(pack({ [key]: 1, token_ids: new Uint8Array(words.buffer) }), {
        "content-type": MSGPACK,
      });
      expect(response.status).toBe(200);
      expect(((await response.json()) as { tokens: number[] }).tokens).toEqual(tokens);
    }
    const direct = tokenIds({
      token_ids: new Uint8Array(new Uint8Array([9, 1, 0, 0, 0, 2, 0, 0, 0]).buffer, 1, 8),
    }); // misaligned: copied
    expect(Array.from(direct)).toEqual([1, 2]);
    // A Buffer (what msgpackr decodes to) whose slice() would be a view, not a copy.
    const buffer = Buffer.from([9, 9, 9, 1, 0, 0, 0, 2, 0, 0, 0]).subarray(3);
    expect(Array.from(tokenIds({ token_ids: buffer }))).toEqual([1, 2]);
  });

  test("MessagePack token_ids bytes that are not whole u32s → 400", async () => {
    const response = await post(pack({ token_ids: new Uint8Array(6) }), {
      "content-type": MSGPACK,
    });
    expect(response.status).toBe(400);
    expect(await errorOf(response)).toBe(
      "token_ids as bytes must be little-endian u32s (a multiple of 4 bytes), got 6 bytes",
    );
    expect(Array.from(tokenIds({ token_ids: new Uint8Array(0) }))).toEqual([]);
  });

  test("a declared body over the limit is 413 with a JSON error", async () => {
    const response = await post(JSON.stringify({ token_ids: Array(600).fill(1) }));
    expect(response.status).toBe(413);
    expect(await errorOf(response)).toContain("over the limit of 1024");
  });

  test("a streamed (chunked) body over the limit is 413 too", async () => {
    const stream = new ReadableStream({
      start(controller) {
        for (let i = 0; i < 8; i++) controller.enqueue(new TextEncoder().encode(" ".repeat(300)));
        controller.close();
      },
    });
    const response = await fetch(base, {
      method: "POST",
      body: stream,
      duplex: "half",
      headers: { "content-type": "application/json" },
    } as RequestInit);
    expect(response.status).toBe(413);
    expect(await errorOf(response)).toContain("over the limit");
  });

  test.each([
    ["{", "malformed JSON body"],
    ["", "request body is empty"],
    ["[1,2]", "request body must be a JSON object"],
    ["null", "request body must be a JSON object"],
  ])("body %p → 400 %p", async (body, message) => {
    const response = await post(body);
    expect(response.status).toBe(400);
    expect(await errorOf(response)).toContain(message);
  });

  test("a UTF-8 BOM before the JSON is skipped; a body of only a BOM is malformed, not empty", async () => {
    const bom = [0xef, 0xbb, 0xbf];
    const ok = await post(
      new Uint8Array([...bom, ...new TextEncoder().encode('{"token_ids":[3]}')]),
    );
    expect(await ok.json()).toEqual({ tokens: [3], worker: null, lora: null, n: null });
    const only = await post(new Uint8Array(bom));
    expect(only.status).toBe(400);
    expect(await errorOf(only)).toContain("malformed JSON body");
  });

  test("a chunked JSON body (no Content-Length) is read and parsed the same way", async () => {
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"token_ids":[1,'));
        controller.enqueue(new TextEncoder().encode('2],"n":4}'));
        controller.close();
      },
    });
    const response = await fetch(base, {
      method: "POST",
      body: stream,
      duplex: "half",
      headers: { "content-type": "application/json" },
    } as RequestInit);
    expect(await response.json()).toEqual({ tokens: [1, 2], worker: null, lora: null, n: 4 });
  });

  test.each([
    [2n ** 32n, "got 4294967296"],
    [2n ** 64n - 1n, "got 18446744073709551615"],
    [-(2n ** 40n), "got -1099511627776"],
  ])(
    "a MessagePack token %p (64-bit, read as a bigint) → 400 naming it",
    async (token, message) => {
      const response = await post(pack({ token_ids: [1, token] }), { "content-type": MSGPACK });
      expect(response.status).toBe(400);
      expect(await errorOf(response)).toBe(
        `token_ids[1] must be an integer in [0, 2^32), ${message}`,
      );
    },
  );

  test("malformed MessagePack → 400", async () => {
    const response = await post(new Uint8Array([0xdc, 0xff]), { "content-type": MSGPACK });
    expect(response.status).toBe(400);
    expect(await errorOf(response)).toContain("malformed MessagePack body");
  });
});

describe("fields", () => {
  test.each([
    [{ token_ids: "1 2" }, "token_ids must be an array of integers"],
    [{ token_ids: [1, -1] }, "token_ids[1] must be an integer in [0, 2^32), got -1"],
    [{ token_ids: [4294967296] }, "token_ids[0] must be an integer in [0, 2^32)"],
    [{ token_ids: [1.5] }, "token_ids[0] must be an integer"],
    [{ token_ids: ["1"] }, "token_ids[0] must be an integer"],
    [
      { token_ids: [1], worker_id: "18446744073709551616" },
      "worker_id must be an unsigned 64-bit integer",
    ],
    [{ token_ids: [1], worker_id: "-1" }, "worker_id must be an unsigned 64-bit integer"],
    [{ token_ids: [1], worker_id: 2 ** 60 }, "worker_id must be an unsigned 64-bit integer"],
    [{ token_ids: [1], worker_id: "007" }, "worker_id must be an unsigned 64-bit integer"],
    [{ token_ids: [1], lora_name: 5 }, "lora_name must be a string"],
    [{ token_ids: [1], n: 11 }, "n must be a number in [0, 10]"],
    [{ token_ids: [1], n: 1.5 }, "n must be an integer"],
  ])("%p → 400 %p", async (body, message) => {
    const response = await post(JSON.stringify(body));
    expect(response.status).toBe(400);
    expect(await errorOf(response)).toContain(message);
  });
});
