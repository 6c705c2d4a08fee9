// Goal: our ZMTP sockets interoperate with real libzmq (the `zeromq` addon, run under
// node as a subprocess): PUB/SUB both directions and both bind/connect sides, topic
// filtering, vLLM's DEALER/ROUTER replay exchange, multi-frame and large messages, peer
// restarts and heartbeats. Method: each test starts test/interop/peer.mjs with a role,
// drives it over stdin and compares what it prints with what we sent or received.
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  DealerSocket,
  PubSocket,
  RouterSocket,
  SubSocket,
  type PeerInfo,
  type ZmtpSocket,
} from "../../src/wire/zmtp";
import { until } from "../support/wait";
import { describeMessage, NodePeer, seqBytes, str, text } from "./libzmq";

// Subprocesses and real sockets on a shared, loaded machine: be generous.
setDefaultTimeout(30_000);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function track<T extends ZmtpSocket>(socket: T): T {
  cleanups.push(() => socket.close());
  return socket;
}

async function peer(config: Parameters<typeof NodePeer.start>[0]): Promise<NodePeer> {
  const started = await NodePeer.start(config);
  cleanups.push(() => started.kill());
  return started;
}

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-zmtp-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

interface Received {
  readonly frames: Uint8Array[];
  readonly peer: PeerInfo;
}

/** A SUB that keeps copies of what it receives. */
function collectingSub(options: ConstructorParameters<typeof SubSocket>[0] = {}): {
  sub: SubSocket;
  got: Received[];
} {
  const sub = track(new SubSocket(options));
  const got: Received[] = [];
  sub.onMessage = (frames, peer) =>
    got.push({ frames: frames.map((frame) => frame.slice()), peer });
  return { sub, got };
}

/**
 * libzmq PUB drops until our subscription reaches it: publish probes until one arrives.
 * A peer slowed by load has more probes queued behind that one; a fence sent after it
 * arrives after all of them, so once it is here no probe can land among what the test counts.
 */
async function primeFromLibzmq(pub: NodePeer, got: Received[], topic = "probe"): Promise<void> {
  got.length = 0; // only a probe that arrives from now on proves the subscription
  await until(() => {
    if (got.some((m) => str(m.frames[0]!) === topic)) return true;
    pub.send([text(topic)]); // not yet subscribed: probe again
    return false;
  }, "a probe from the libzmq PUB");
  pub.send([text(topic), text("fence")]);
  const fenced = () => got.some((m) => m.frames.length === 2 && str(m.frames[1]!) === "fence");
  await until(fenced, "the probes' fence");
  got.length = 0;
}

/** Our PUB to a libzmq SUB: send probes until the SUB prints one. */
async function primeToLibzmq(pub: PubSocket, sub: NodePeer, topic: string): Promise<void> {
  const probe = describeMessage([text(topic)]);
  await until(() => {
    if (sub.messages.includes(probe)) return true;
    pub.send([text(topic)]); // not yet subscribed: probe again
    return false;
  }, "the libzmq SUB to print a probe");
}

const vllmMessage = (topic: string, seq: number, payload: Uint8Array): Uint8Array[] => [
  text(topic),
  seqBytes(BigInt(seq)),
  payload,
];

describe("libzmq PUB -> our SUB", () => {
  test("connect side: vLLM 3-frame messages, > 255 B and > 1 MiB frames, SUB-side filtering", async () => {
    const pub = await peer({ role: "pub", bind: "tcp://127.0.0.1:*" });
    const { sub, got } = collectingSub();
    sub.subscribe("probe");
    sub.subscribe("kv@");
    sub.connect(pub.endpoint);
    await primeFromLibzmq(pub, got);

    const payloads = [
      new Uint8Array(10),
      new Uint8Array(300).fill(7),
      new Uint8Array(2 * 1024 * 1024 + 3),
    ];
    payloads[2]!.forEach((_, i, a) => {
      a[i] = (i * 31) & 0xff;
    });
    for (let seq = 0; seq < payloads.length; seq++)
      pub.send(vllmMessage("kv@pod-1@model", seq, payloads[seq]!));
    pub.send([text("other-topic"), text("dropped by the publisher's filter")]);
    pub.command({ op: "burst", count: 200, topic: "kv@burst", size: 100, from: 1000 });
    await until(() => got.length === 3 + 200, "3 + 200 messages");

    for (let seq = 0; seq < payloads.length; seq++) {
      const { frames } = got[seq]!;
      expect(frames).toHaveLength(3);
      expect(str(frames[0]!)).toBe("kv@pod-1@model");
      expect(new DataView(frames[1]!.buffer, frames[1]!.byteOffset).getBigUint64(0)).toBe(
        BigInt(seq),
      );
      expect(Buffer.from(frames[2]!).equals(Buffer.from(payloads[seq]!))).toBe(true);
    }
    const burstSeqs = got
      .slice(3)
      .map((m) => Number(new DataView(m.frames[1]!.buffer).getBigUint64(0)));
    expect(burstSeqs).toEqual(Array.from({ length: 200 }, (_, i) => 1000 + i));
    expect(got.every((m) => m.peer.socketType === "PUB" && m.peer.direction === "connect")).toBe(
      true,
    );
    expect(sub.counters.messagesIn).toBeGreaterThanOrEqual(203);
    expect(sub.counters.protocolErrorsTotal).toBe(0);
  });

  test("bind side: libzmq PUB connects to our SUB (tcp and ipc)", async () => {
    const dir = tempDir();
    for (const endpoint of ["tcp://127.0.0.1:0", `ipc://${join(dir, "sub.sock")}`]) {
      const { sub, got } = collectingSub();
      sub.subscribe("");
      const bound = await sub.bind(endpoint);
      const pub = await peer({ role: "pub", connect: bound });
      await primeFromLibzmq(pub, got);
      pub.send([text("a"), text("b"), text("c"), new Uint8Array(70_000).fill(1)]);
      await until(() => got.length === 1, "one multi-frame message");
      expect(got[0]!.frames.map((f) => f.length)).toEqual([1, 1, 1, 70_000]);
      expect(got[0]!.peer.direction).toBe("bind");
      expect(got[0]!.peer.endpoint).toBe(bound);
      await sub.close();
      pub.kill();
    }
  });
});

describe("our PUB -> libzmq SUB", () => {
  test("topic filtering by libzmq's SUBSCRIBE, multi-frame and large messages", async () => {
    const pub = track(new PubSocket());
    const endpoint = await pub.bind("tcp://127.0.0.1:0");
    const sub = await peer({ role: "sub", connect: endpoint, subscribe: ["kv@", "probe"] });
    await primeToLibzmq(pub, sub, "probe");
    const before = sub.messages.length;

    const big = new Uint8Array(1_500_000).map((_, i) => (i * 7) & 0xff);
    const sent = [
      vllmMessage("kv@a", 0, text("first")),
      vllmMessage("kv@a", 1, new Uint8Array(256).fill(9)),
      vllmMessage("kv@b", 2, big),
    ];
    pub.send([text("ignored"), text("x")]);
    for (const message of sent) {
      pub.send(message);
      pub.send([text("other"), text("not subscribed")]);
    }
    // A last subscribed message: once it is printed, anything unwanted sent before it would be too.
    const marker = [text("probe"), text("end")];
    pub.send(marker);
    await until(() => sub.messages.includes(describeMessage(marker)), "the end marker");
    const probes = [describeMessage([text("probe")]), describeMessage(marker)];
    const received = sub.messages.slice(before).filter((line) => !probes.includes(line));
    expect(received).toEqual(sent.map(describeMessage));
    expect(pub.counters.unroutable).toBeGreaterThanOrEqual(4); // "ignored" and "other" matched nobody
  });

  test("libzmq SUB over ipc: SUBSCRIBE and CANCEL change what our PUB sends it", async () => {
    const pub = track(new PubSocket());
    const endpoint = await pub.bind(`ipc://${join(tempDir(), "pub.sock")}`);
    const sub = await peer({ role: "sub", connect: endpoint, subscribe: ["probe"] });
    await primeToLibzmq(pub, sub, "probe");
    sub.command({ op: "subscribe", prefix: "kv" });
    await sub.waitFor((line) => line === "done subscribe");
    await primeToLibzmq(pub, sub, "kv-probe");
    pub.send([text("kv"), text("1")]);
    await sub.waitFor((line) => line === `msg ${describeMessage([text("kv"), text("1")])}`);

    sub.command({ op: "unsubscribe", prefix: "kv" });
    await sub.waitFor((line) => line === "done unsubscribe");
    await until(() => {
      const before = pub.counters.unroutable;
      pub.send([text("kv"), text("2")]);
      return pub.counters.unroutable === before + 1;
    }, "our PUB to see the CANCEL");
    pub.send([text("probe"), text("end")]);
    await sub.waitFor((line) => line === `msg ${describeMessage([text("probe"), text("end")])}`);
    expect(sub.messages).not.toContain(describeMessage([text("kv"), text("2")]));
    expect(pub.counters.protocolErrorsTotal).toBe(0);
  });
});

describe("vLLM replay: our DEALER <-> libzmq ROUTER", () => {
  for (const withTopic of [true, false]) {
    test(`replies of ${withTopic ? 4 : 3} frames (after the DEALER's empty delimiter) end with seq -1`, async () => {
      const router = await peer({
        role: "router",
        bind: "tcp://127.0.0.1:*",
        replay: { topic: "kv@pod", count: 8, withTopic },
      });
      const dealer = track(new DealerSocket());
      const replies: Uint8Array[][] = [];
      dealer.onMessage = (frames) => replies.push(frames.map((frame) => frame.slice()));
      // Sent before the connection exists: held, then delivered on connect (libzmq semantics).
      expect(dealer.send([new Uint8Array(0), seqBytes(5n)])).toBe(true);
      dealer.connect(router.endpoint);
      await until(() => replies.length === 4, "3 replayed batches and the end marker");

      const width = withTopic ? 4 : 3;
      for (const reply of replies) {
        expect(reply).toHaveLength(width);
        expect(reply[0]!.length).toBe(0);
        if (withTopic) expect(str(reply[1]!)).toBe("kv@pod");
      }
      const seqs = replies.map((r) => new DataView(r[width - 2]!.buffer).getBigInt64(0));
      expect(seqs).toEqual([5n, 6n, 7n, -1n]);
      expect(Array.from(replies[3]![width - 2]!)).toEqual(new Array(8).fill(0xff));
      expect(replies[3]![width - 1]!.length).toBe(0);
      expect(str(replies[0]![width - 1]!)).toBe("payload-5");

      // A second request on the same connection.
      dealer.send([new Uint8Array(0), seqBytes(7n)]);
      await until(() => replies.length === 6, "second replay");
      expect(new DataView(replies[4]![width - 2]!.buffer).getBigInt64(0)).toBe(7n);
    });
  }

  test("libzmq DEALER with a routing id <-> our ROUTER", async () => {
    const router = track(new RouterSocket());
    const endpoint = await router.bind("tcp://127.0.0.1:0");
    const seen: string[] = [];
    router.onMessage = (identity, frames) => {
      seen.push(str(identity));
      router.send(identity, [
        new Uint8Array(0),
        text(`echo:${str(frames[1]!)}`),
        new Uint8Array(400_000),
      ]);
    };
    const dealer = await peer({
      role: "dealer",
      connect: endpoint,
      options: { routingId: "engine-7" },
    });
    dealer.send([new Uint8Array(0), text("hello")]);
    const [reply] = await dealer.waitForMessages(1);
    expect(seen).toEqual(["engine-7"]);
    expect(reply).toBe(
      describeMessage([new Uint8Array(0), text("echo:hello"), new Uint8Array(400_000)]),
    );
    expect(router.peers[0]!.identity).toEqual(text("engine-7"));
  });
});

describe("restarts and heartbeats", () => {
  test("a libzmq PUB killed and restarted on the same port: our SUB reconnects with a new connection id", async () => {
    const first = await peer({ role: "pub", bind: "tcp://127.0.0.1:*" });
    const events: { event: string; peer: PeerInfo }[] = [];
    const { sub, got } = collectingSub({ reconnectMinMs: 50, reconnectMaxMs: 400 });
    sub.onPeer = (event, p) => events.push({ event, peer: p });
    sub.subscribe("");
    sub.connect(first.endpoint);
    await primeFromLibzmq(first, got);
    const firstId = events.find((e) => e.event === "connected")!.peer.id;

    first.signal("SIGKILL");
    await first.exited();
    await until(() => events.some((e) => e.event === "disconnected"), "disconnect after kill");
    const failures = sub.counters.connectFailures;
    await until(
      () => sub.counters.connectFailures >= failures + 2,
      "reconnects to fail against the closed port",
    );

    const second = await peer({ role: "pub", bind: first.endpoint });
    await primeFromLibzmq(second, got);
    second.send(vllmMessage("kv", 0, text("after restart")));
    await until(() => got.length === 1, "a message from the restarted publisher");
    const connected = events.filter((e) => e.event === "connected");
    expect(connected).toHaveLength(2);
    expect(connected[1]!.peer.id).not.toBe(firstId);
    expect(connected[1]!.peer.previousId).toBe(firstId);
    expect(got[0]!.peer.id).toBe(connected[1]!.peer.id);
    expect(sub.counters.reconnects).toBeGreaterThanOrEqual(1);
    expect(sub.counters.connectFailures).toBeGreaterThanOrEqual(1);
  });

  test("a frozen libzmq PUB is detected by our PINGs within the heartbeat timeout, then reconnected", async () => {
    const pub = await peer({ role: "pub", bind: "tcp://127.0.0.1:*" });
    const events: { event: string; reason: string }[] = [];
    const { sub, got } = collectingSub({
      heartbeatIntervalMs: 100,
      heartbeatTimeoutMs: 400,
      reconnectMinMs: 50,
      reconnectMaxMs: 200,
    });
    sub.onPeer = (event, _p, reason) => events.push({ event, reason });
    sub.subscribe("");
    sub.connect(pub.endpoint);
    await primeFromLibzmq(pub, got);
    // PINGs over more than one heartbeat timeout (400 ms) with a live peer: no timeout.
    const pings = sub.counters.pingsSent;
    await until(() => sub.counters.pingsSent >= pings + 6, "six PING/PONG rounds");
    expect(sub.counters.heartbeatTimeouts).toBe(0);

    pub.signal("SIGSTOP");
    await until(
      () => events.some((e) => e.event === "disconnected"),
      "heartbeat disconnect",
      5_000,
    );
    const lost = events.find((e) => e.event === "disconnected")!;
    expect(lost.reason).toContain("PING");
    expect(sub.counters.heartbeatTimeouts).toBe(1);

    pub.signal("SIGCONT");
    await primeFromLibzmq(pub, got);
    expect(events.filter((e) => e.event === "connected")).toHaveLength(2);
  });

  test("libzmq's PINGs get PONGs (it keeps the connection), and its TTL is honoured", async () => {
    // Our PUB sends no PINGs of its own: only the peer's TTL can detect the freeze.
    const pub = track(new PubSocket({ heartbeatIntervalMs: 0 }));
    const endpoint = await pub.bind("tcp://127.0.0.1:0");
    const sub = await peer({
      role: "sub",
      connect: endpoint,
      subscribe: [""],
      options: { heartbeatInterval: 100, heartbeatTimeout: 400, heartbeatTimeToLive: 600 },
    });
    await primeToLibzmq(pub, sub, "probe");
    // The peer's PINGs over more than its TTL (600 ms): each answered, so it stays.
    const commands = pub.counters.commandsIn;
    await until(() => pub.counters.commandsIn >= commands + 8, "eight PINGs from libzmq");
    expect(sub.lines.filter((line) => line === "event disconnect")).toHaveLength(0);
    expect(pub.peers).toHaveLength(1);

    sub.signal("SIGSTOP");
    await until(() => pub.counters.heartbeatTimeouts === 1, "TTL expiry", 5_000);
    expect(pub.peers).toHaveLength(0);
  });
});
