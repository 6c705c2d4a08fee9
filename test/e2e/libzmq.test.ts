// Goal: `kvedge serve` and `kvedge capture` ingest from a real libzmq PUB socket (the
// zeromq addon under node), in both directions: kvedge connects to a bound engine
// (vLLM's default), and the engine connects to a kvedge that binds.
import { afterEach, describe, expect, test } from "bun:test";
import { freePort } from "../support/net";
import { encodeKvBatch, type KvEvent } from "../../src/wire/kv-events";
import { NodePeer } from "../interop/libzmq";
import { stored } from "../support/engine";
import { kvedgeBinary } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";
import { eventually } from "../support/wait";

const BS = 4;
type Json = Record<string, any>;

function seqFrame(seq: number): Uint8Array {
  const frame = new Uint8Array(8);
  new DataView(frame.buffer).setBigUint64(0, BigInt(seq));
  return frame;
}

const batch = (events: readonly KvEvent[]) =>
  encodeKvBatch({ ts: Date.now() / 1000, events }, { form: "array" });

async function lastSeq(serve: ServeProcess): Promise<number> {
  const body = (await (await fetch(`${serve.url}/v1/workers`)).json()) as Json;
  return body.workers[0]?.last_seq ?? -1;
}

/** Sends seq 0 until kvedge applied it (libzmq's slow joiner drops what precedes the subscription). */
async function sendFirst(peer: NodePeer, serve: ServeProcess, payload: Uint8Array): Promise<void> {
  await eventually(
    async () => {
      if ((await lastSeq(serve)) >= 0) return true;
      peer.send([new Uint8Array(0), seqFrame(0), payload]);
      return undefined;
    },
    15_000,
    "first batch through libzmq",
  );
}

describe("libzmq publishers", () => {
  const cleanups: (() => Promise<unknown> | unknown)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  test("serve connects to a libzmq PUB that binds; events index; duplicates of seq 0 are skipped", async () => {
    const peer = await NodePeer.start({ role: "pub", bind: "tcp://127.0.0.1:*" });
    cleanups.push(() => peer.kill());
    const serve = await startServe(["--block-size", String(BS), "--workers", `5=${peer.endpoint}`]);
    cleanups.push(() => serve.stop());
    await sendFirst(peer, serve, batch([stored([10n, 11n], [1, 2, 3, 4, 5, 6, 7, 8], BS)]));
    peer.send([new Uint8Array(0), seqFrame(1), batch([stored([12n], [9, 10, 11, 12], BS, 11n)])]);
    const scores = await eventually(
      async () => {
        const response = await fetch(`${serve.url}/v1/match`, {
          method: "POST",
          body: JSON.stringify({ token_ids: [...Array(12).keys()].map((i) => i + 1) }),
          headers: { "content-type": "application/json" },
        });
        const body = (await response.json()) as Json;
        return body.scores[0]?.blocks === 3 ? body.scores : undefined;
      },
      10_000,
      "three blocks from libzmq",
    );
    expect(scores).toEqual([{ worker_id: "5", dp_rank: 0, blocks: 3 }]);
    const worker = ((await (await fetch(`${serve.url}/v1/workers`)).json()) as Json).workers[0];
    expect(worker).toMatchObject({
      state: "connected",
      degraded: false,
      lost_batches: 0,
      last_seq: 1,
    });
  });

  // `tcp://*:PORT` binds every interface: that runs only in a network namespace of the
  // test's own (unshare -rn, loopback up), where this file runs itself again for it.
  test("serve binds tcp://*:PORT and a libzmq PUB connects to it", async () => {
    if (process.env.KVEDGE_TEST_NETNS !== "1") {
      const inside = 'ip link set lo up && exec "$0" test "$1" -t "serve binds tcp"';
      const child = Bun.spawn(
        ["unshare", "-rn", "sh", "-c", inside, process.execPath, import.meta.path],
        { env: { ...process.env, KVEDGE_TEST_NETNS: "1" }, stdout: "pipe", stderr: "pipe" },
      );
      const [code, output] = await Promise.all([child.exited, new Response(child.stderr).text()]);
      const verdict = code === 0 && /\b1 pass\b/.test(output) ? "passed in its namespace" : output;
      expect(verdict).toBe("passed in its namespace");
      return;
    }
    const port = await freePort();
    const serve = await startServe([
      "--block-size",
      String(BS),
      "--allow-wildcard-endpoints",
      "--workers",
      `6=tcp://*:${port}`,
    ]);
    cleanups.push(() => serve.stop());
    const peer = await NodePeer.start({ role: "pub", connect: `tcp://127.0.0.1:${port}` });
    cleanups.push(() => peer.kill());
    await sendFirst(peer, serve, batch([stored([20n], [4, 3, 2, 1], BS)]));
    const body = (await (
      await fetch(`${serve.url}/v1/match`, {
        method: "POST",
        body: JSON.stringify({ token_ids: [4, 3, 2, 1] }),
        headers: { "content-type": "application/json" },
      })
    ).json()) as Json;
    expect(body.scores).toEqual([{ worker_id: "6", dp_rank: 0, blocks: 1 }]);
  });

  test("capture records a libzmq publisher's events", async () => {
    const peer = await NodePeer.start({ role: "pub", bind: "tcp://127.0.0.1:*" });
    cleanups.push(() => peer.kill());
    const proc = Bun.spawn(
      [
        kvedgeBinary(),
        "capture",
        "--endpoint",
        peer.endpoint,
        "--block-size",
        String(BS),
        "--count",
        "1",
      ],
      {
        stdout: "pipe",
        stderr: "pipe",
      },
    );
    cleanups.push(() => proc.kill());
    const payload = batch([stored([30n], [7, 7, 7, 7], BS)]);
    // Until the subscription lands, repeat seq 0 (capture skips the duplicates).
    const sender = setInterval(() => peer.send([new Uint8Array(0), seqFrame(0), payload]), 50);
    cleanups.push(() => clearInterval(sender));
    expect(await proc.exited).toBe(0);
    const line = JSON.parse((await new Response(proc.stdout).text()).trim());
    expect(line).toMatchObject({
      op: "stored",
      worker_id: "0",
      block_hashes: ["30"],
      token_ids: [7, 7, 7, 7],
    });
  });
});
