// Goal: our sockets talk to each other over real TCP and Unix sockets (PUB/SUB with
// filtering, DEALER/ROUTER with identities), behave like libzmq toward ZMTP 3.0 peers,
// and enforce every bound: message size, HWM, handshake and heartbeat deadlines,
// socket-type checks, duplicate identities. Method: real sockets on 127.0.0.1 and in a
// temp dir; misbehaving peers are raw clients built from hand-made bytes (zmtp-raw.ts).
import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { memoryLogger } from "../../src/util/log";
import {
  DealerSocket,
  parseEndpoint,
  PubSocket,
  RouterSocket,
  SubSocket,
  type PeerInfo,
  type ZmtpSocket,
} from "../../src/wire/zmtp";
import { FrameDecoder, MESSAGE_FRAME, NEED_MORE, COMMAND_FRAME } from "../../src/wire/zmtp/decoder";
import { until } from "../support/wait";
import {
  commandBytes,
  concat,
  enc,
  frameBytes,
  greetingBytes,
  messageBytes,
  RawPeer,
  readyBytes,
} from "./zmtp-raw";

// Subprocesses and real sockets on a shared, loaded machine: be generous.
setDefaultTimeout(30_000);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
function track<T extends ZmtpSocket | RawPeer>(socket: T): T {
  cleanups.push(() => socket.close());
  return socket;
}
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-zmtp-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
const str = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);

function collect(sub: SubSocket | DealerSocket): Uint8Array[][] {
  const got: Uint8Array[][] = [];
  sub.onMessage = (frames) => got.push(frames.map((frame) => frame.slice()));
  return got;
}

/** Decodes what a raw peer received after its greeting: [kind, body] per frame. */
function framesOf(bytes: Uint8Array): { command: boolean; body: Uint8Array }[] {
  const decoder = new FrameDecoder(1 << 30, 1 << 20);
  decoder.feed(bytes);
  const out: { command: boolean; body: Uint8Array }[] = [];
  for (let kind = decoder.next(); kind !== NEED_MORE; kind = decoder.next()) {
    if (kind === MESSAGE_FRAME || kind === COMMAND_FRAME)
      out.push({ command: kind === COMMAND_FRAME, body: decoder.frame.slice() });
  }
  return out;
}

async function pubSubPair(endpoint: string, subOptions = {}, pubOptions = {}) {
  const pub = track(new PubSocket(pubOptions));
  const bound = await pub.bind(endpoint);
  const sub = track(new SubSocket(subOptions));
  const got = collect(sub);
  return { pub, sub, got, bound };
}

/**
 * Sends probes until the SUB has one (its subscription reached the PUB), then forgets
 * them: a last marker on the same connection arrives after every earlier probe.
 */
async function prime(pub: PubSocket, got: Uint8Array[][], topic = "probe"): Promise<void> {
  got.length = 0;
  await until(() => {
    pub.send([enc(topic)]);
    return got.length > 0;
  }, "subscription to reach the PUB");
  const marker = `${topic}-primed`;
  pub.send([enc(marker)]);
  await until(() => got.some((m) => str(m[0]!) === marker), "the last probe");
  got.length = 0;
}

describe("PUB -> SUB", () => {
  for (const transport of ["tcp", "ipc"] as const) {
    test(`${transport}: multi-frame, > 255 B and > 1 MiB frames, topic filtering at the PUB`, async () => {
      const endpoint =
        transport === "tcp" ? "tcp://127.0.0.1:0" : `ipc://${join(tempDir(), "pub.sock")}`;
      const { pub, sub, got, bound } = await pubSubPair(endpoint);
      sub.subscribe("kv@");
      sub.subscribe("probe");
      sub.connect(bound);
      await prime(pub, got);
      const unroutableBefore = pub.counters.unroutable;
      const big = new Uint8Array(3 * 1024 * 1024 + 5).map((_, i) => i % 251);
      const messages = [
        [enc("kv@a"), Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 1), enc("payload")],
        [enc("kv@b"), new Uint8Array(256).fill(1)],
        [enc("kv@c"), new Uint8Array(0), big],
        [enc("kv@d")],
      ];
      for (const message of messages) {
        expect(pub.send(message)).toBe(true);
        expect(pub.send([enc("unwanted"), enc("x")])).toBe(true);
      }
      await until(() => got.length === messages.length, "4 messages");
      expect(got).toEqual(messages);
      expect(sub.counters.messagesFiltered).toBe(0); // the PUB filtered already
      expect(pub.counters.unroutable - unroutableBefore).toBe(4);
      expect(sub.counters.protocolErrorsTotal + pub.counters.protocolErrorsTotal).toBe(0);
      expect(sub.counters.bytesIn).toBeGreaterThan(big.length);
      expect(pub.counters.bytesOut).toBe(sub.counters.bytesIn);
    });
  }

  test("onFrames: frame locations without views; copies survive later messages", async () => {
    const { pub, sub, got, bound } = await pubSubPair("tcp://127.0.0.1:0");
    sub.subscribe("");
    sub.connect(bound);
    await prime(pub, got);
    const kept: Uint8Array[][] = [];
    const sizes: number[][] = [];
    let heldWhileReceiving = 0;
    sub.onFrames = (frames) => {
      heldWhileReceiving = Math.max(heldWhileReceiving, sub.sizes.receiveBytes);
      sizes.push(Array.from({ length: frames.count }, (_, i) => frames.end(i) - frames.start(i)));
      expect(frames.startsWith(0, enc("kv"))).toBe(true);
      expect(frames.size(1)).toBe(frames.frame(1).length);
      expect(() => frames.buffer(frames.count)).toThrow(RangeError);
      kept.push(frames.copy());
    };
    const big = new Uint8Array(600_000).map((_, i) => i & 0xff); // spans receive chunks
    for (let i = 0; i < 20; i++)
      pub.send([enc(`kv${i}`), Uint8Array.of(i), i % 5 === 0 ? big : new Uint8Array(i)]);
    await until(() => kept.length + sub.counters.callbackErrors >= 20, "20 messages");
    expect(sub.counters.callbackErrors).toBe(0); // the expects inside the callback held
    expect(got).toHaveLength(0); // onMessage is not called while onFrames is set
    for (let i = 0; i < 20; i++) {
      expect(str(kept[i]![0]!)).toBe(`kv${i}`);
      expect(kept[i]![1]![0]).toBe(i);
      expect(sizes[i]).toEqual([i < 10 ? 3 : 4, 1, i % 5 === 0 ? big.length : i]);
      if (i % 5 === 0) expect(Buffer.from(kept[i]![2]!).equals(Buffer.from(big))).toBe(true);
    }
    // Once quiet, the connection lets go of its receive chunk and reassembly arena.
    expect(heldWhileReceiving).toBeGreaterThan(0);
    await until(() => sub.sizes.receiveBytes === 0, "receive buffers released", 5_000);
    expect(sub.peers).toHaveLength(1);
  });

  test("a SUB that connects before the PUB exists retries with backoff, then receives", async () => {
    const probe = new PubSocket();
    const bound = await probe.bind("tcp://127.0.0.1:0");
    await probe.close(); // a free port nobody listens on
    const sub = track(new SubSocket({ reconnectMinMs: 20, reconnectMaxMs: 80 }));
    const got = collect(sub);
    sub.subscribe("");
    sub.connect(bound);
    await until(() => sub.counters.connectFailures >= 3, "failed attempts");
    const pub = track(new PubSocket());
    await pub.bind(bound);
    await prime(pub, got);
    pub.send([enc("hello")]);
    await until(() => got.length === 1, "message");
    expect(sub.counters.reconnects).toBeGreaterThanOrEqual(3);
  });

  test("unsubscribe sends CANCEL; counted subscriptions need as many unsubscribes", async () => {
    const { pub, sub, got, bound } = await pubSubPair("tcp://127.0.0.1:0");
    sub.subscribe("a");
    sub.subscribe("a");
    sub.connect(bound);
    await prime(pub, got, "a-probe");
    sub.unsubscribe("a");
    // A SUBSCRIBE sent after it reaches the PUB after any CANCEL the first unsubscribe sent.
    sub.subscribe("barrier");
    await until(() => {
      pub.send([enc("barrier")]);
      return got.some((m) => str(m[0]!) === "barrier");
    }, "the subscription sent after the first unsubscribe");
    pub.send([enc("barrier-done")]);
    await until(() => got.some((m) => str(m[0]!) === "barrier-done"), "the last barrier message");
    got.length = 0;
    pub.send([enc("a1")]);
    await until(() => got.length === 1, "still subscribed once");
    sub.unsubscribe("a");
    await until(() => {
      const before = pub.counters.unroutable;
      pub.send([enc("a2")]);
      return pub.counters.unroutable > before;
    }, "CANCEL to reach the PUB");
    expect(got.map((m) => str(m[0]!))).toEqual(["a1"]);
  });

  test("a PUB fans out to several SUBs, each by its own subscriptions; PeerInfo says who sent", async () => {
    const pub = track(new PubSocket());
    const bound = await pub.bind("tcp://127.0.0.1:0");
    const subs = ["x", "y", ""].map((prefix) => {
      const sub = track(new SubSocket());
      const got: { topic: string; peer: PeerInfo }[] = [];
      sub.onMessage = (frames, peer) => got.push({ topic: str(frames[0]!), peer });
      sub.subscribe(prefix);
      sub.connect(bound);
      return got;
    });
    await until(() => {
      pub.send([enc("x0")]);
      pub.send([enc("y0")]);
      return subs.every((got) => got.length > 0) && subs[2]!.some((m) => m.topic === "y0");
    }, "all subscribed");
    pub.send([enc("x1")]);
    pub.send([enc("y1")]);
    pub.send([enc("z1")]);
    // One marker per SUB, after the messages: once each has its marker, it has the rest.
    pub.send([enc("x-end")]);
    pub.send([enc("y-end")]);
    const marker = (i: number) => (i === 1 ? "y-end" : "x-end");
    const marked = () => subs.every((got, i) => got.some((m) => m.topic === marker(i)));
    await until(marked, "the markers");
    const round1 = (got: { topic: string }[]) =>
      got.map((m) => m.topic).filter((topic) => topic.endsWith("1"));
    expect(round1(subs[0]!)).toEqual(["x1"]);
    expect(round1(subs[1]!)).toEqual(["y1"]);
    expect(round1(subs[2]!)).toEqual(["x1", "y1", "z1"]);
    expect(subs[2]![0]!.peer.socketType).toBe("PUB");
    expect(subs[2]![0]!.peer.endpoint).toBe(bound);
    expect(pub.peers).toHaveLength(3);
  });

  test("application callback exceptions are counted and logged once; the stream goes on", async () => {
    const log = memoryLogger();
    const { pub, sub, got, bound } = await pubSubPair("tcp://127.0.0.1:0", { logger: log });
    sub.subscribe("");
    sub.connect(bound);
    await prime(pub, got);
    let calls = 0;
    sub.onMessage = () => {
      calls++;
      throw new Error("consumer bug");
    };
    for (let i = 0; i < 5; i++) pub.send([enc(`m${i}`)]);
    await until(() => calls === 5, "5 callbacks");
    expect(sub.counters.callbackErrors).toBe(5);
    expect(log.records.filter((r) => r.message.includes("callback threw"))).toHaveLength(1);
    expect(sub.peers).toHaveLength(1);
  });

  test("PUB with no peers: send() drops silently (counted as unroutable)", async () => {
    const pub = track(new PubSocket());
    await pub.bind("tcp://127.0.0.1:0");
    expect(pub.send([enc("t"), enc("x")])).toBe(true);
    expect(pub.counters.unroutable).toBe(1);
    expect(() => pub.send([])).toThrow(RangeError);
  });
});

describe("DEALER <-> ROUTER", () => {
  for (const transport of ["tcp", "ipc"] as const) {
    test(`${transport}: generated and announced identities, replies routed back, multi-frame`, async () => {
      const router = track(new RouterSocket());
      const endpoint = await router.bind(
        transport === "tcp" ? "tcp://127.0.0.1:0" : `ipc://${join(tempDir(), "r.sock")}`,
      );
      const seen: { identity: Uint8Array; frames: Uint8Array[] }[] = [];
      router.onMessage = (identity, frames) => {
        seen.push({ identity: identity.slice(), frames: frames.map((f) => f.slice()) });
        router.send(identity, [new Uint8Array(0), enc("reply"), ...frames.slice(1)]);
      };
      const anonymous = track(new DealerSocket());
      const named = track(new DealerSocket({ routingId: enc("worker-1") }));
      const anonymousGot = collect(anonymous);
      const namedGot = collect(named);
      anonymous.connect(endpoint);
      named.connect(endpoint);
      anonymous.send([new Uint8Array(0), enc("a"), new Uint8Array(2_000_000).fill(5)]);
      named.send([new Uint8Array(0), enc("n")]);
      await until(() => anonymousGot.length === 1 && namedGot.length === 1, "both replies");
      expect(namedGot[0]!.map(str)).toEqual(["", "reply", "n"]);
      expect(anonymousGot[0]!.map((f) => f.length)).toEqual([0, 5, 1, 2_000_000]);
      const generated = seen.find((m) => str(m.frames[1]!) === "a")!.identity;
      expect(generated).toHaveLength(5);
      expect(generated[0]).toBe(0);
      expect(str(seen.find((m) => str(m.frames[1]!) === "n")!.identity)).toBe("worker-1");
      expect(router.send(enc("nobody"), [enc("x")])).toBe(false);
      expect(router.counters.unroutable).toBe(1);
    });
  }

  test("a second peer announcing a connected identity is refused (ERROR sent, counted)", async () => {
    const router = track(new RouterSocket());
    const endpoint = await router.bind("tcp://127.0.0.1:0");
    const first = track(new DealerSocket({ routingId: enc("same") }));
    first.connect(endpoint);
    await until(() => router.peers.length === 1, "first peer");
    const second = track(new DealerSocket({ routingId: enc("same"), reconnectMinMs: 1000 }));
    const events: string[] = [];
    second.onPeer = (event, _peer, reason) => events.push(`${event}: ${reason}`);
    second.connect(endpoint);
    await until(() => router.counters.protocolErrors.duplicate_identity === 1, "refusal");
    await until(() => second.counters.protocolErrors.peer_error === 1, "ERROR at the dealer");
    expect(router.peers).toHaveLength(1);
    // The ROUTER's READY reached the dealer first, so it saw a handshake, then the ERROR.
    expect(events.some((e) => e.includes("peer sent ERROR") || e.includes("refused"))).toBe(true);
    expect(second.peers).toHaveLength(0);
  });

  test("a DEALER holds messages while unconnected, bounded by the HWM", async () => {
    const dealer = track(new DealerSocket({ hwm: 3 }));
    for (let i = 0; i < 3; i++) expect(dealer.send([enc(`m${i}`)])).toBe(true);
    expect(dealer.send([enc("m3")])).toBe(false);
    expect(dealer.counters.hwmDrops).toBe(1);
    expect(dealer.waitingMessages).toBe(3);
    const router = track(new RouterSocket());
    const got: string[] = [];
    router.onMessage = (_id, frames) => got.push(str(frames[0]!));
    dealer.connect(await router.bind("tcp://127.0.0.1:0"));
    await until(() => got.length === 3, "held messages");
    expect(got).toEqual(["m0", "m1", "m2"]);
    expect(dealer.waitingMessages).toBe(0);
  });
});

describe("bounds and misbehaving peers", () => {
  test("an oversize message is read past and skipped (counted, logged once); the connection goes on", async () => {
    const log = memoryLogger();
    const { pub, sub, got, bound } = await pubSubPair("tcp://127.0.0.1:0", {
      maxMessageBytes: 1000,
      logger: log,
      reconnectMinMs: 20,
    });
    const events: string[] = [];
    sub.onPeer = (event) => events.push(event);
    sub.subscribe("");
    sub.connect(bound);
    await prime(pub, got);
    pub.send([enc("small"), new Uint8Array(500)]);
    pub.send([enc("big"), new Uint8Array(600), new Uint8Array(600)]); // over in its second frame
    pub.send([enc("huge"), new Uint8Array(1 << 20)]); // over in its first, spanning many chunks
    pub.send([enc("after"), new Uint8Array(900)]);
    await until(() => got.length === 2, "the messages around the skipped ones");
    expect(got.map((m) => str(m[0]!))).toEqual(["small", "after"]);
    expect(got[1]![1]!.length).toBe(900);
    expect(sub.counters.oversizeSkipped).toBe(2);
    expect(sub.counters.protocolErrorsTotal).toBe(0);
    expect(log.records.filter((r) => r.fields.kind === "oversize_skipped")).toHaveLength(1);
    expect(events).toEqual(["connected"]);
    expect(sub.counters.disconnects).toBe(0);
    expect(sub.sizes.receiveBytes).toBeLessThan(1 << 20);
  });

  test("a frame begun and not ended within frameTimeoutMs drops a trickling peer", async () => {
    const sub = track(
      new SubSocket({ frameTimeoutMs: 300, heartbeatIntervalMs: 50, heartbeatTimeoutMs: 10_000 }),
    );
    sub.subscribe("");
    const bound = await sub.bind("tcp://127.0.0.1:0");
    const peer = track(await RawPeer.connect(bound));
    await peer.write(concat(greetingBytes(), readyBytes({ "Socket-Type": "PUB" })));
    await until(() => sub.peers.length === 1, "handshake");
    // Whole messages, slowly: never a stall.
    const got = collect(sub);
    for (let i = 0; i < 4; i++) {
      await peer.write(messageBytes([enc(`m${i}`)]));
      await Bun.sleep(150);
    }
    expect(got).toHaveLength(4);
    expect(peer.closed).toBe(false);
    // One frame of 100 bytes, a byte every 50 ms: alive to the heartbeat, never complete.
    await peer.write(Uint8Array.of(0x00, 100));
    for (let i = 0; i < 40 && !peer.closed; i++) {
      await peer.write(Uint8Array.of(1));
      await Bun.sleep(50);
    }
    expect(peer.closed).toBe(true);
    expect(sub.counters.frameTimeouts).toBe(1);
    expect(sub.counters.heartbeatTimeouts).toBe(0);
  });

  test("PUB high-water mark: a peer that stops reading loses messages (counted); others are unaffected", async () => {
    const pub = track(new PubSocket({ hwm: 50 }));
    const bound = await pub.bind("tcp://127.0.0.1:0");
    const stalled = track(await RawPeer.connect(bound));
    await stalled.write(
      concat(greetingBytes(), readyBytes({ "Socket-Type": "SUB" }), commandBytes("SUBSCRIBE")),
    );
    await until(() => pub.peers.length === 1, "raw subscriber");
    stalled.pause();
    const healthy = track(new SubSocket());
    const got = collect(healthy);
    healthy.subscribe("");
    healthy.connect(bound);
    await until(() => pub.peers.length === 2, "healthy subscriber");
    await prime(pub, got);

    const body = new Uint8Array(64 * 1024);
    let refused = 0;
    for (let round = 0; round < 40; round++) {
      for (let i = 0; i < 50; i++) if (!pub.send([enc("t"), body])) refused++;
      await until(() => got.length >= (round + 1) * 50, "healthy subscriber keeps up", 20_000);
    }
    expect(refused).toBeGreaterThan(0);
    expect(pub.counters.hwmDrops).toBe(refused);
    expect(got.length).toBe(2000);
  });

  test("a peer that completes READY and then refuses (ERROR, close) does not reset the reconnect backoff", async () => {
    let accepts = 0;
    const refusing = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open(socket) {
          accepts++;
          socket.write(
            concat(
              greetingBytes(),
              readyBytes({ "Socket-Type": "PUB" }),
              commandBytes("ERROR", concat(Uint8Array.of(2), enc("no"))),
            ),
          );
          setTimeout(() => socket.end(), 5);
        },
        data() {},
      },
    });
    cleanups.push(() => refusing.stop(true));
    const sub = track(new SubSocket({ reconnectMinMs: 50, reconnectMaxMs: 60_000 }));
    sub.subscribe("");
    const endpoint = `tcp://127.0.0.1:${refusing.port}`;
    sub.connect(endpoint);
    // Each refused connection adds a failure (the backoff doubles: 50, 100, 200, 400 ms);
    // a reset at every READY would keep it at 1 and the wait would never end.
    await until(() => sub.dialFailures(endpoint) >= 4, "four refusals in a row", 20_000);
    expect(sub.counters.handshakes).toBeGreaterThanOrEqual(4);
    expect(accepts).toBeGreaterThanOrEqual(4);
  });

  test("a peer that never greets is dropped at the handshake timeout", async () => {
    const sub = track(new SubSocket({ handshakeTimeoutMs: 150 }));
    const bound = await sub.bind("tcp://127.0.0.1:0");
    const silent = track(await RawPeer.connect(bound));
    await until(() => silent.closed, "handshake timeout", 5_000);
    expect(sub.counters.handshakeTimeouts).toBe(1);
    expect(sub.counters.handshakeFailures).toBe(1);
  });

  test("a peer that stops answering PINGs is dropped within the heartbeat timeout", async () => {
    const sub = track(new SubSocket({ heartbeatIntervalMs: 50, heartbeatTimeoutMs: 200 }));
    const bound = await sub.bind("tcp://127.0.0.1:0");
    const peer = track(await RawPeer.connect(bound));
    await peer.write(concat(greetingBytes(), readyBytes({ "Socket-Type": "PUB" })));
    await until(() => sub.peers.length === 1, "handshake");
    await until(() => peer.closed, "heartbeat timeout", 5_000);
    expect(sub.counters.heartbeatTimeouts).toBe(1);
    // It did send PINGs with our TTL (15 s = 150 deciseconds by default).
    const pings = framesOf(peer.received).filter(
      (f) => f.command && str(f.body.subarray(1, 5)) === "PING",
    );
    expect(pings.length).toBeGreaterThanOrEqual(1);
    expect(Array.from(pings[0]!.body.subarray(5, 7))).toEqual([0, 150]);
  });

  test("PING is answered with PONG echoing the context; the peer's TTL drops a silent peer", async () => {
    const pub = track(new PubSocket({ heartbeatIntervalMs: 0 }));
    const bound = await pub.bind("tcp://127.0.0.1:0");
    const peer = track(await RawPeer.connect(bound));
    await peer.write(
      concat(
        greetingBytes(),
        readyBytes({ "Socket-Type": "SUB" }),
        commandBytes("PING", concat(Uint8Array.of(0, 2), enc("ctx"))),
      ),
    );
    await until(
      () => framesOf(peer.received).some((f) => f.command && str(f.body).includes("PONG")),
      "PONG",
    );
    const pong = framesOf(peer.received).find((f) => f.command && str(f.body).includes("PONG"))!;
    expect(str(pong.body)).toBe("\x04PONGctx");
    // TTL 2 deciseconds: silence for 200 ms drops us.
    await until(() => peer.closed, "TTL expiry", 5_000);
    expect(pub.counters.heartbeatTimeouts).toBe(1);
  });

  test("a SUB talking to a ROUTER: socket-type mismatch, ERROR sent, counted on both sides", async () => {
    const router = track(new RouterSocket());
    const bound = await router.bind("tcp://127.0.0.1:0");
    const sub = track(new SubSocket({ reconnectMinMs: 1000 }));
    sub.connect(bound);
    await until(
      () => sub.counters.protocolErrors.socket_type_mismatch === 1,
      "mismatch at the SUB",
    );
    await until(
      () =>
        router.counters.protocolErrors.socket_type_mismatch +
          router.counters.protocolErrors.peer_error >=
        1,
      "router side",
    );
    expect(sub.counters.handshakes).toBe(0);
  });

  test("ZMTP 3.0 peers: our SUB subscribes with a 0x01 message; our PUB accepts 0x01/0x00 messages", async () => {
    // A 3.0 publisher: we must send the subscription as a message, not a command.
    const sub = track(new SubSocket());
    sub.subscribe("kv");
    const subBound = await sub.bind("tcp://127.0.0.1:0");
    const got = collect(sub);
    const oldPub = track(await RawPeer.connect(subBound));
    await oldPub.write(concat(greetingBytes(0), readyBytes({ "Socket-Type": "PUB" })));
    await until(() => framesOf(oldPub.received).some((f) => !f.command), "subscription message");
    const subscription = framesOf(oldPub.received).find((f) => !f.command)!;
    expect(Array.from(subscription.body)).toEqual([1, ...enc("kv")]);
    await oldPub.write(
      concat(
        messageBytes([enc("kv1"), enc("x")]),
        messageBytes([enc("zz"), enc("filtered by the SUB")]),
      ),
    );
    await until(
      () => got.length === 1 && sub.counters.messagesFiltered === 1,
      "one delivered, one filtered",
    );
    expect(got[0]!.map(str)).toEqual(["kv1", "x"]);

    // A 3.0 subscriber talking to our PUB.
    const pub = track(new PubSocket());
    const pubBound = await pub.bind("tcp://127.0.0.1:0");
    const oldSub = track(await RawPeer.connect(pubBound));
    await oldSub.write(
      concat(
        greetingBytes(0),
        readyBytes({ "Socket-Type": "SUB" }),
        messageBytes([concat(Uint8Array.of(1), enc("kv"))]),
      ),
    );
    await until(() => {
      pub.send([enc("kv-probe")]);
      return framesOf(oldSub.received).some((f) => !f.command);
    }, "messages to the 3.0 subscriber");
    await oldSub.write(messageBytes([concat(Uint8Array.of(0), enc("kv"))]));
    await until(() => {
      const before = pub.counters.unroutable;
      pub.send([enc("kv-after-cancel")]);
      return pub.counters.unroutable > before;
    }, "cancel");
    // Something that is not a subscription is counted and ignored (connection kept).
    await oldSub.write(messageBytes([enc("hello"), enc("pub")]));
    await until(() => pub.counters.protocolErrors.unexpected_message === 1, "unexpected message");
    expect(pub.peers).toHaveLength(1);
  });

  test("unknown commands are ignored (counted); a message before READY is fatal", async () => {
    const pub = track(new PubSocket());
    const bound = await pub.bind("tcp://127.0.0.1:0");
    const peer = track(await RawPeer.connect(bound));
    await peer.write(
      concat(
        greetingBytes(),
        readyBytes({ "Socket-Type": "SUB" }),
        commandBytes("JOIN", enc("group")),
      ),
    );
    await until(() => pub.counters.protocolErrors.unknown_command === 1, "unknown command");
    expect(pub.peers).toHaveLength(1);

    const early = track(await RawPeer.connect(bound));
    await early.write(concat(greetingBytes(), frameBytes(0, enc("too early"))));
    await until(() => early.closed, "drop");
    expect(pub.counters.protocolErrors.unexpected_frame).toBe(1);
  });
});

describe("lifecycle", () => {
  test("disconnect() stops reconnecting; unbind() and close() release ports and ipc files", async () => {
    const dir = tempDir();
    const path = join(dir, "s.sock");
    const pub = new PubSocket();
    const bound = await pub.bind(`ipc://${path}`);
    const tcp = await pub.bind("tcp://127.0.0.1:0");
    expect(existsSync(path)).toBe(true);
    const sub = track(new SubSocket({ reconnectMinMs: 10, reconnectMaxMs: 20 }));
    sub.connect(bound);
    await until(() => sub.peers.length === 1, "connected");
    sub.disconnect(bound);
    expect(sub.peers).toHaveLength(0);
    const attempts = sub.counters.connectAttempts;
    // A control socket with the same backoff, dialing a closed port: by the time it has
    // retried three times, a SUB that kept reconnecting would have too.
    const control = track(new SubSocket({ reconnectMinMs: 10, reconnectMaxMs: 20 }));
    control.connect("tcp://127.0.0.1:1");
    await until(() => control.counters.connectFailures >= 3, "the control socket's retries");
    expect(sub.counters.connectAttempts).toBe(attempts);
    pub.unbind(tcp);
    await pub.close();
    expect(existsSync(path)).toBe(false);
    // The port and the path can be bound again.
    const again = track(new PubSocket());
    await again.bind(tcp);
    await again.bind(`ipc://${path}`);
    expect(() => again.connect("tcp://127.0.0.1:1")).not.toThrow();
    await again.close();
    expect(() => again.connect("tcp://127.0.0.1:1")).toThrow("closed");
  });

  test("churn: peers come and go 100 times; every table returns to empty", async () => {
    const router = track(new RouterSocket());
    const endpoint = await router.bind("tcp://127.0.0.1:0");
    const sub = track(new SubSocket({ reconnectMinMs: 10 }));
    for (let i = 0; i < 100; i++) {
      // Identities repeat every 10 rounds: each must have been released by then.
      const dealer = new DealerSocket(i % 2 === 0 ? { routingId: enc(`d${i % 10}`) } : {});
      dealer.connect(endpoint);
      const pub = new PubSocket();
      const pubEndpoint = await pub.bind("tcp://127.0.0.1:0");
      sub.connect(pubEndpoint);
      await until(() => router.peers.length === 1 && pub.peers.length === 1, "both connected");
      await dealer.close();
      await until(() => router.peers.length === 0, "router saw the dealer leave");
      if (i % 2 === 0) sub.disconnect(pubEndpoint); // we leave first...
      await pub.close();
      if (i % 2 === 1) sub.disconnect(pubEndpoint); // ...or they do (the SUB was redialing)
    }
    await until(() => router.sizes.connections === 0 && sub.sizes.connections === 0, "all closed");
    expect(router.sizes).toEqual({
      connections: 0,
      active: 0,
      dialers: 0,
      bound: 1,
      links: 0,
      routes: 0,
      receiveBytes: 0,
    });
    expect(sub.sizes).toEqual({
      connections: 0,
      active: 0,
      dialers: 0,
      bound: 0,
      links: 0,
      routes: 0,
      receiveBytes: 0,
    });
    expect(router.counters.handshakes).toBe(100);
    expect(router.counters.protocolErrors.duplicate_identity).toBe(0);
    expect(router.counters.connectionsActive + sub.counters.connectionsActive).toBe(0);
  });

  test("flushed() waits for a peer that is not reading, then resolves", async () => {
    const { pub, sub, got, bound } = await pubSubPair("tcp://127.0.0.1:0", {}, { hwm: 1000 });
    sub.subscribe("");
    sub.connect(bound);
    await prime(pub, got);
    // A second subscriber that stops reading: 40 MB is more than the loopback buffers hold.
    let stalledBytes = 0;
    const { port } = parseEndpoint(bound, false) as { port: number };
    const stalled = await Bun.connect({
      hostname: "127.0.0.1",
      port,
      socket: {
        binaryType: "uint8array",
        data: (_s, chunk: Uint8Array) => {
          stalledBytes += chunk.length;
        },
      },
    });
    cleanups.push(() => stalled.end());
    const subscribe = commandBytes("SUBSCRIBE");
    stalled.write(concat(greetingBytes(), readyBytes({ "Socket-Type": "SUB" }), subscribe));
    await until(() => pub.peers.length === 2, "the second subscriber");
    stalled.pause();
    const total = 400;
    const body = new Uint8Array(100_000);
    for (let i = 0; i < total; i++) expect(pub.send([enc("t"), body])).toBe(true);
    let flushed = false;
    const done = pub.flushed().then(() => {
      flushed = true;
    });
    // Once the reading subscriber has everything, the PUB has written all it could.
    await until(() => got.length === total, "the reading subscriber's messages");
    expect(flushed).toBe(false);
    stalled.resume();
    await done;
    await until(() => stalledBytes >= total * 100_000, "the stalled subscriber's bytes");
  });

  test("endpoints: parsing and errors", () => {
    expect(parseEndpoint("tcp://*:5557", true)).toEqual({
      transport: "tcp",
      host: "0.0.0.0",
      port: 5557,
    });
    expect(parseEndpoint("tcp://[::1]:*", true)).toEqual({
      transport: "tcp",
      host: "::1",
      port: 0,
    });
    expect(parseEndpoint("tcp://engine-0.svc:5557", false)).toEqual({
      transport: "tcp",
      host: "engine-0.svc",
      port: 5557,
    });
    expect(parseEndpoint("ipc:///tmp/x.sock", false)).toEqual({
      transport: "ipc",
      path: "/tmp/x.sock",
    });
    for (const bad of [
      "tcp://*:5557",
      "tcp://h:0",
      "udp://h:1",
      "tcp://h",
      "tcp://h:99999",
      "tcp://::1:5",
      "ipc://",
      "tcp://h:x",
    ]) {
      expect(() => parseEndpoint(bad, false)).toThrow("invalid ZeroMQ endpoint");
    }
    expect(() => new SubSocket({ maxMessageBytes: 0 })).toThrow(RangeError);
    expect(() => new SubSocket({ reconnectMinMs: 10, reconnectMaxMs: 5 })).toThrow(RangeError);
  });
});
