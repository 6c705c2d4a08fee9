// Goal: the NATS connection a replica makes (connectNats) runs on Bun's own sockets and
// carries what the client sends, every byte in order, also frames larger than the
// socket takes at once (the rest written on drain), and request/reply; it reconnects
// after nats-server restarts; TLS, configured or asked for by the server, is carried by
// the client's node transport, encrypted; a server that is not there is refused, not
// waited for.
// Method: a real nats-server on 127.0.0.1 (TLS with a throwaway CA from openssl); two
// connections, one publishing and one subscribed; the client's status stream.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection, Transport } from "@nats-io/transport-node";
import { BunTransport, connectNats } from "../../src/cluster/transport";
import { freePort, NatsServer } from "../../src/sim/nats-server";
import { makeTestCertificates, type TestCertificates } from "../support/tls";
import { until } from "../support/wait";

/** The transport under the client (its own field: what the test checks it chose). */
function transportOf(nc: NatsConnection): Transport {
  return (nc as unknown as { protocol: { transport: Transport } }).protocol.transport;
}

/** `count` messages of `size(i)` bytes, each filled with its own index (mod 251). */
function messages(count: number, size: (i: number) => number): Uint8Array[] {
  return Array.from({ length: count }, (_, i) => new Uint8Array(size(i)).fill(i % 251));
}

async function roundTrip(
  publisher: NatsConnection,
  subscriber: NatsConnection,
  subject: string,
  sent: Uint8Array[],
): Promise<void> {
  const got: Uint8Array[] = [];
  const sub = subscriber.subscribe(subject, {
    callback: (_e, msg) => {
      got.push(msg.data);
    },
  });
  await subscriber.flush();
  for (const message of sent) publisher.publish(subject, message);
  await publisher.flush();
  await until(() => got.length >= sent.length, `${sent.length} messages on ${subject}`);
  sub.unsubscribe();
  expect(got.length).toBe(sent.length);
  for (let i = 0; i < sent.length; i++) {
    expect(got[i]!.length).toBe(sent[i]!.length);
    expect(got[i]!.every((byte) => byte === i % 251)).toBe(true);
  }
}

describe("connectNats over a plain connection", () => {
  let server: NatsServer;
  const open: NatsConnection[] = [];
  const connection = async (options = {}) => {
    const nc = await connectNats({ servers: server.url, ...options });
    open.push(nc);
    return nc;
  };

  beforeAll(async () => {
    server = await NatsServer.start();
  });

  afterAll(async () => {
    await Promise.all(open.map((nc) => nc.close()));
    await server?.close();
  });

  test("runs on Bun's sockets and carries every byte in order, small frames and large", async () => {
    const [publisher, subscriber] = [await connection(), await connection()];
    expect(transportOf(publisher)).toBeInstanceOf(BunTransport);
    expect(transportOf(publisher).isEncrypted()).toBe(false);
    await roundTrip(
      publisher,
      subscriber,
      "small",
      messages(2000, (i) => 1 + (i % 97)),
    );
    // 24 MiB published in one turn: one frame far past what the socket takes at once.
    await roundTrip(
      publisher,
      subscriber,
      "large",
      messages(24, () => 1024 * 1024 - 64),
    );
  });

  test("answers requests (the sync of a joining replica rides on them)", async () => {
    const [asker, answerer] = [await connection(), await connection()];
    answerer.subscribe("ask", {
      callback: (_e, msg) => {
        msg.respond(msg.data.slice().reverse());
      },
    });
    await answerer.flush();
    const reply = await asker.request("ask", new Uint8Array([1, 2, 3]), { timeout: 5000 });
    expect([...reply.data]).toEqual([3, 2, 1]);
  });

  test("comes back after nats-server restarts, on a new transport, and carries again", async () => {
    const [publisher, subscriber] = [
      await connection({ reconnectTimeWait: 100, maxReconnectAttempts: -1 }),
      await connection({ reconnectTimeWait: 100, maxReconnectAttempts: -1 }),
    ];
    const before = transportOf(publisher);
    const seen: string[] = [];
    void (async () => {
      for await (const status of publisher.status()) seen.push(status.type);
    })();
    await server.restart(200);
    await until(() => seen.includes("reconnect"), "the publisher to reconnect");
    expect(seen).toContain("disconnect");
    expect(transportOf(publisher)).not.toBe(before);
    expect(transportOf(publisher)).toBeInstanceOf(BunTransport);
    await until(() => !subscriber.isClosed() && subscriber.info !== undefined, "the subscriber");
    await roundTrip(
      publisher,
      subscriber,
      "after",
      messages(100, (i) => 10 + i),
    );
  });

  test("a server that is not NATS is refused, not read without end", async () => {
    // A line of 2 MiB with no end (written on as the socket drains), then held open.
    const line = new Uint8Array(2 * 1024 * 1024).fill(120);
    let sent = 0;
    const writeOn = (socket: { write: (data: Uint8Array) => number }) => {
      sent += Math.max(0, socket.write(line.subarray(sent)));
    };
    const silent = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: { open: writeOn, drain: writeOn, data: () => {} },
    });
    try {
      await expect(
        connectNats({
          servers: `nats://127.0.0.1:${silent.port}`,
          timeout: 20_000,
          reconnect: false,
        }),
      ).rejects.toThrow(/unexpected response/);
    } finally {
      silent.stop(true);
    }
  });

  test("a server that is not there is refused at once", async () => {
    const port = await freePort();
    await expect(
      connectNats({ servers: `nats://127.0.0.1:${port}`, timeout: 5000 }),
    ).rejects.toThrow(/refused/);
  });
});

describe("connectNats with TLS", () => {
  let dir: string;
  let certificates: TestCertificates;
  let secure: NatsServer;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "kvedge-transport-tls-"));
    certificates = makeTestCertificates(dir);
    secure = await NatsServer.start({
      args: ["--tls", "--tlscert", certificates.cert, "--tlskey", certificates.key],
    });
  });

  afterAll(async () => {
    await secure?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("configured: the node transport carries it, encrypted", async () => {
    const tls = { caFile: certificates.ca };
    const url = `tls://127.0.0.1:${secure.port}`;
    const [publisher, subscriber] = [
      await connectNats({ servers: url, tls }),
      await connectNats({ servers: url, tls }),
    ];
    try {
      expect(transportOf(publisher)).toBeInstanceOf(BunTransport);
      expect(transportOf(publisher).isEncrypted()).toBe(true);
      await roundTrip(
        publisher,
        subscriber,
        "secure",
        messages(50, (i) => 100 * (i + 1)),
      );
    } finally {
      await Promise.all([publisher.close(), subscriber.close()]);
    }
  });

  test("asked for by the server on a plain URL: handed to the node transport's TLS", async () => {
    // The throwaway CA is not trusted by default: the node transport's handshake refuses
    // the certificate (not a hang, not a protocol error on a plain socket).
    await expect(
      connectNats({ servers: `nats://127.0.0.1:${secure.port}`, timeout: 5000 }),
    ).rejects.toThrow(/certificate|self.signed|verify/i);
  });
});
