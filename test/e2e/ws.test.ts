// Goal: /v1/ws on the compiled `kvedge serve` answers route/match/prefill_done/done
// tagged with the client's id, single requests and batches, JSON and MessagePack, and
// turns bad requests into per-request errors without closing the connection.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { pack, unpack } from "msgpackr";
import { stored, TestEngine } from "../support/engine";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

const BS = 4;
type Json = Record<string, any>;

class Client {
  private readonly pending: ((data: unknown) => void)[] = [];
  private constructor(private readonly ws: WebSocket) {
    ws.binaryType = "arraybuffer";
    ws.onmessage = (event) => {
      const data =
        typeof event.data === "string"
          ? JSON.parse(event.data)
          : unpack(new Uint8Array(event.data));
      this.pending.shift()?.(data);
    };
  }

  static open(url: string): Promise<Client> {
    const ws = new WebSocket(`${url.replace("http://", "ws://")}/v1/ws`);
    return new Promise((resolve, reject) => {
      ws.onopen = () => resolve(new Client(ws));
      ws.onerror = () => reject(new Error("websocket failed to open"));
    });
  }

  /** Sends one frame and resolves with the next answer frame (the server answers frames in order). */
  ask(frame: unknown, binary = false): Promise<any> {
    return new Promise((resolve) => {
      this.pending.push(resolve);
      this.ws.send(
        binary ? pack(frame) : typeof frame === "string" ? frame : JSON.stringify(frame),
      );
    });
  }

  close(): void {
    this.ws.close();
  }
}

describe("/v1/ws", () => {
  let engine: TestEngine;
  let serve: ServeProcess;
  let client: Client;

  beforeAll(async () => {
    engine = await new TestEngine().start();
    serve = await startServe(["--block-size", String(BS), "--workers", `1=${engine.endpoint}`]);
    await engine.waitForSubscriber();
    engine.publish([stored([11n, 12n], [1, 2, 3, 4, 5, 6, 7, 8], BS)]);
    await eventually(
      async () => {
        const response = await fetch(`${serve.url}/v1/match`, {
          method: "POST",
          body: JSON.stringify({ token_ids: [1, 2, 3, 4] }),
          headers: { "content-type": "application/json" },
        });
        return ((await response.json()) as Json).scores.length === 1 ? true : undefined;
      },
      10_000,
      "engine block indexed",
    );
    client = await Client.open(serve.url);
  });

  afterAll(async () => {
    client.close();
    await serve.stop();
    await engine.stop();
  });

  test("route, then the lifecycle, tagged by id", async () => {
    const routed = await client.ask({
      id: 1,
      op: "route",
      token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9],
      request_id: "w1",
    });
    expect(routed).toMatchObject({
      id: 1,
      status: 200,
      result: { request_id: "w1", worker_id: "1", overlap_blocks: 2 },
    });
    expect(await client.ask({ id: "p", op: "prefill_done", request_id: "w1" })).toEqual({
      id: "p",
      status: 200,
      result: { request_id: "w1", status: "ok" },
    });
    expect(await client.ask({ id: 2, op: "done", request_id: "w1" })).toMatchObject({
      id: 2,
      status: 200,
    });
  });

  test("a batch frame gets one answer per request, in one frame, errors included", async () => {
    const answers = await client.ask([
      { id: "a", op: "match", token_ids: [1, 2, 3, 4] },
      { id: "b", op: "done", request_id: "never-routed" },
      { id: "c", op: "route", token_ids: [1, -1] },
      { id: "d", op: "frobnicate" },
      42,
    ]);
    expect(answers).toHaveLength(5);
    expect(answers[0]).toEqual({
      id: "a",
      status: 200,
      result: {
        block_size: BS,
        query_blocks: 1,
        scores: [{ worker_id: "1", dp_rank: 0, blocks: 1 }],
      },
    });
    expect(answers[1]).toMatchObject({ id: "b", status: 404 });
    expect(answers[2]).toMatchObject({ id: "c", status: 400 });
    expect(answers[2].error.message).toContain("token_ids[1]");
    expect(answers[3]).toMatchObject({ id: "d", status: 400 });
    expect(answers[4]).toMatchObject({ id: null, status: 400 });
  });

  test("MessagePack frames get MessagePack answers", async () => {
    const answer = await client.ask(
      { id: 9, op: "match", token_ids: [1, 2, 3, 4, 5, 6, 7, 8] },
      true,
    );
    expect(answer).toEqual({
      id: 9,
      status: 200,
      result: {
        block_size: BS,
        query_blocks: 2,
        scores: [{ worker_id: "1", dp_rank: 0, blocks: 2 }],
      },
    });
  });

  test("MessagePack token_ids as bin (little-endian u32s) route like the array form", async () => {
    const tokens = new Uint32Array([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    const routed = await client.ask(
      { id: 10, op: "route", token_ids: new Uint8Array(tokens.buffer), request_id: "b1" },
      true,
    );
    expect(routed).toMatchObject({
      id: 10,
      status: 200,
      result: { request_id: "b1", worker_id: "1", query_blocks: 2, overlap_blocks: 2 },
    });
    expect(await client.ask({ id: 11, op: "done", request_id: "b1" }, true)).toMatchObject({
      id: 11,
      status: 200,
    });
    const bad = await client.ask(
      [
        { id: 12, op: "match", token_ids: new Uint8Array(5) },
        { id: 13, op: "match", token_ids: new Uint8Array(tokens.buffer, 0, 16) },
      ],
      true,
    );
    expect(bad[0]).toMatchObject({
      id: 12,
      status: 400,
      error: {
        message:
          "token_ids as bytes must be little-endian u32s (a multiple of 4 bytes), got 5 bytes",
        type: "invalid_request_error",
        param: "token_ids",
        code: "bad_request",
      },
    });
    expect(bad[1]).toEqual({
      id: 13,
      status: 200,
      result: {
        block_size: BS,
        query_blocks: 1,
        scores: [{ worker_id: "1", dp_rank: 0, blocks: 1 }],
      },
    });
  });

  test("HTTP MessagePack bodies with token_ids as bin route and match like the JSON ones", async () => {
    const tokens = new Uint32Array([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    const post = async (path: string, body: unknown) => {
      const response = await fetch(`${serve.url}${path}`, {
        method: "POST",
        body: pack(body),
        headers: { "content-type": "application/msgpack", accept: "application/msgpack" },
      });
      return {
        status: response.status,
        body: unpack(new Uint8Array(await response.arrayBuffer())) as Json,
      };
    };
    const routed = await post("/v1/route", {
      token_ids: new Uint8Array(tokens.buffer),
      request_id: "h1",
      candidates: 1,
    });
    expect(routed.status).toBe(200);
    expect(routed.body).toMatchObject({
      request_id: "h1",
      worker_id: "1",
      query_blocks: 2,
      overlap_blocks: 2,
    });
    expect(routed.body.candidates).toHaveLength(1);
    expect(
      (await post("/v1/route", { token_ids: new Uint8Array(tokens.buffer), request_id: "h1" }))
        .status,
    ).toBe(409);
    expect((await fetch(`${serve.url}/v1/requests/h1/done`, { method: "POST" })).status).toBe(200);
    const matched = await post("/v1/match", { token_ids: new Uint8Array(tokens.buffer, 0, 16) });
    expect(matched).toEqual({
      status: 200,
      body: {
        block_size: BS,
        query_blocks: 1,
        scores: [{ worker_id: "1", dp_rank: 0, blocks: 1 }],
      },
    });
    const bad = await post("/v1/route", { token_ids: new Uint8Array(6) });
    expect(bad).toEqual({
      status: 400,
      body: {
        error: {
          message:
            "token_ids as bytes must be little-endian u32s (a multiple of 4 bytes), got 6 bytes",
          type: "invalid_request_error",
          param: "token_ids",
          code: "bad_request",
        },
      },
    });
  });

  test("malformed frames are answered with an error and the connection stays open", async () => {
    const answer = await client.ask("{not json");
    expect(answer).toMatchObject({ id: null, status: 400 });
    expect(await client.ask({ id: 3, op: "match", token_ids: [] })).toMatchObject({
      id: 3,
      status: 200,
    });
  });
});
