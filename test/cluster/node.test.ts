// Goal: replicas that exchange their facts hold one load view: equal per-worker load on
// every replica once messages are delivered, whatever is lost on the way (gaps seen at
// the next batch or heartbeat, the set fetched and installed), across restarts (a new
// epoch replaces the old set), silence past the lease and leaving (requests dropped),
// joining mid-run (the set of every peer installed before it is complete), workers not
// known yet (held, then applied or dropped), and bad bytes (counted, never applied).
// Method: ClusterNodes over the in-memory LocalBus on one fake clock; lifecycles on a
// seeded PRNG; load compared by worker identity; verify() after each run.
import { describe, expect, test } from "bun:test";
import { DEFAULT_SEED } from "../../src/hash";
import { LocalBus } from "../../src/cluster/local-bus";
import { ClusterNode } from "../../src/cluster/node";
import { LoadTracker, promptHashes } from "../../src/route";
import { silentLogger } from "../../src/util/log";
import { xorshift32 } from "../../src/util/random";

const BS = 4;
const LEASE_MS = 3000;

interface Replica {
  readonly id: string;
  readonly load: LoadTracker;
  node: ClusterNode;
  readonly live: string[];
}

function prng(seed: number): () => number {
  const next = xorshift32(seed);
  return () => next() / 2 ** 32;
}

class Fleet {
  readonly clock = { nowMs: 0 };
  readonly bus = new LocalBus(0);
  readonly replicas: Replica[] = [];
  private epochs = 0;

  constructor(
    ids: string[],
    readonly workers: bigint[] = [1n, 2n, 3n],
  ) {
    for (const id of ids) this.start(id);
  }

  start(id: string, workers = this.workers): Replica {
    const load = new LoadTracker({ blockSize: BS, now: () => this.clock.nowMs });
    for (const worker of workers) load.table.acquire(worker, 0);
    const replica: Replica = { id, load, node: this.node(id, load), live: [] };
    const at = this.replicas.findIndex((r) => r.id === id);
    if (at >= 0) this.replicas[at] = replica;
    else this.replicas.push(replica);
    return replica;
  }

  node(id: string, load: LoadTracker): ClusterNode {
    const node = new ClusterNode({
      replicaId: id,
      epoch: ++this.epochs,
      load,
      workers: load.table,
      transport: this.bus.transport(id),
      leaseMs: LEASE_MS,
      syncTimeoutMs: 1000,
      holdMs: 10_000,
      now: () => this.clock.nowMs,
      wallNow: () => this.clock.nowMs,
      schedule: null,
      log: silentLogger,
    });
    this.bus.attach(node);
    return node;
  }

  /** Flushes every node and delivers until nothing moves. */
  settle(): void {
    this.bus.nowMs = this.clock.nowMs;
    for (let round = 0; round < 100; round++) {
      for (const r of this.replicas) r.node.flush();
      if (this.bus.deliver(Infinity) === 0) return;
    }
    throw new Error("the bus never settled");
  }

  heartbeats(): void {
    for (const r of this.replicas) r.node.heartbeat();
    this.settle();
  }

  /** One random lifecycle step on a random replica. */
  step(random: () => number, n: number): void {
    const r = this.replicas[Math.floor(random() * this.replicas.length)]!;
    const roll = random();
    if (roll < 0.5 || r.live.length === 0) {
      const tokens = Array.from({ length: 1 + Math.floor(random() * 12) }, () =>
        Math.floor(random() * 3),
      );
      const p = promptHashes(Uint32Array.from(tokens), BS, DEFAULT_SEED);
      const slot = r.load.liveSlots[Math.floor(random() * r.load.liveCount)]!;
      const id = `q${n}`;
      r.load.admit(id, slot, p.chain, p.blockCount, tokens.length, Math.floor(random() * 5), 0);
      r.live.push(id);
    } else if (roll < 0.75) {
      r.load.prefillDone(r.live[Math.floor(random() * r.live.length)]!);
    } else {
      r.load.done(r.live.splice(Math.floor(random() * r.live.length), 1)[0]!);
    }
  }
}

function view(load: LoadTracker): string[] {
  return load
    .workers()
    .map(
      (w) =>
        `${w.workerId}:${w.dpRank} ${w.activeRequests} ${w.activePrefillTokens} ${w.activeDecodeBlocks}`,
    )
    .sort();
}

function expectOneView(fleet: Fleet): void {
  const first = view(fleet.replicas[0]!.load);
  for (const r of fleet.replicas) {
    expect(view(r.load)).toEqual(first);
    r.load.verify();
  }
}

describe("replicas exchanging facts", () => {
  test("hold one view after every delivery", () => {
    const fleet = new Fleet(["a", "b", "c"]);
    const random = prng(7);
    for (let n = 0; n < 600; n++) {
      fleet.step(random, n);
      if (n % 7 === 0) {
        fleet.settle();
        expectOneView(fleet);
      }
    }
    fleet.settle();
    expectOneView(fleet);
    const total = fleet.replicas.reduce((sum, r) => sum + r.live.length, 0);
    for (const r of fleet.replicas)
      expect(r.load.activeRequestCount + r.load.peerRequestCount).toBe(total);
    for (const r of fleet.replicas) expect(r.node.peers.counters.gaps).toBe(0);
  });

  test("lost batches are seen as gaps, the set is fetched, and views converge", () => {
    const fleet = new Fleet(["a", "b", "c"]);
    const random = prng(11);
    const losing = prng(12);
    fleet.bus.lose = (_from, _to, bytes) => bytes[2] === 1 && losing() < 0.2; // facts only
    for (let n = 0; n < 800; n++) {
      fleet.step(random, n);
      if (n % 5 === 0) fleet.settle();
      if (n % 50 === 0) fleet.heartbeats();
    }
    fleet.bus.lose = null;
    fleet.heartbeats();
    fleet.heartbeats();
    expectOneView(fleet);
    const gaps = fleet.replicas.reduce((sum, r) => sum + r.node.peers.counters.gaps, 0);
    const installed = fleet.replicas.reduce((s, r) => s + r.node.peers.counters.syncsInstalled, 0);
    expect(gaps).toBeGreaterThan(0);
    expect(installed).toBeGreaterThan(0);
  });

  test("a lost tail is seen at the next heartbeat", () => {
    const fleet = new Fleet(["a", "b"]);
    const [a, b] = fleet.replicas;
    const p = promptHashes(Uint32Array.of(1, 2, 3, 4), BS, DEFAULT_SEED);
    fleet.bus.lose = () => true;
    a!.load.admit("x", 0, p.chain, 1, 4, 0, 0);
    fleet.settle();
    fleet.bus.lose = null;
    expect(b!.load.peerRequestCount).toBe(0);
    fleet.heartbeats();
    expect(b!.load.peerRequestCount).toBe(1);
    expectOneView(fleet);
  });
});

describe("peers coming and going", () => {
  test("a restarted replica's old set goes, its new one comes", () => {
    const fleet = new Fleet(["a", "b"]);
    const random = prng(3);
    for (let n = 0; n < 200; n++) fleet.step(random, n);
    fleet.settle();
    const before = fleet.replicas[0]!.load.peerRequestCount;
    expect(before).toBeGreaterThan(0);
    fleet.start("b"); // a new process: new epoch, nothing active
    fleet.heartbeats();
    expectOneView(fleet);
    expect(fleet.replicas[0]!.load.peerRequestCount).toBe(0);
    expect(fleet.replicas[0]!.node.peers.counters.peersRestarted).toBe(1);
    for (let n = 200; n < 300; n++) fleet.step(random, n);
    fleet.settle();
    expectOneView(fleet);
  });

  test("silence past the lease drops a peer's requests; leaving drops them at once", () => {
    const fleet = new Fleet(["a", "b", "c"]);
    const random = prng(5);
    for (let n = 0; n < 200; n++) fleet.step(random, n);
    fleet.heartbeats();
    const [a, b, c] = fleet.replicas;
    const fromC = c!.load.activeRequestCount;
    expect(a!.load.peerRequestCount).toBe(b!.load.activeRequestCount + fromC);
    fleet.bus.detach("c"); // c goes silent
    fleet.replicas.pop();
    fleet.clock.nowMs += LEASE_MS / 2;
    fleet.heartbeats();
    expect(a!.load.peerRequestCount).toBe(b!.load.activeRequestCount + fromC);
    fleet.clock.nowMs += LEASE_MS;
    fleet.heartbeats();
    expect(a!.load.peerRequestCount).toBe(b!.load.activeRequestCount);
    expect(a!.node.peers.counters.peersLost).toBe(1);
    b!.node.leave();
    fleet.settle();
    expect(a!.load.peerRequestCount).toBe(0);
    expect(a!.node.peers.peers.size).toBe(0);
    a!.load.verify();
  });

  test("a replica joining mid-run has every peer's set before it is complete", () => {
    const fleet = new Fleet(["a", "b"]);
    const random = prng(9);
    for (let n = 0; n < 300; n++) fleet.step(random, n);
    fleet.settle();
    const c = fleet.start("c");
    expect(c.node.peers.complete).toBe(true); // heard of nobody yet
    c.node.join();
    fleet.bus.deliver(Infinity); // the sync requests arrive
    expect(c.load.peerRequestCount).toBe(0);
    fleet.settle(); // answered and installed
    expect(c.node.peers.complete).toBe(true);
    expect(c.node.peers.peers.size).toBe(2);
    expectOneView(fleet);
    for (let n = 300; n < 400; n++) fleet.step(random, n);
    fleet.settle();
    expectOneView(fleet);
  });
});

describe("facts about workers not known here", () => {
  test("are held until the worker appears, then applied; or dropped after the hold", () => {
    const fleet = new Fleet(["a"]);
    const b = fleet.start("b", [1n, 2n, 3n, 9n]);
    const [a] = fleet.replicas;
    const p = promptHashes(Uint32Array.of(1, 2, 3, 4, 5), BS, DEFAULT_SEED);
    const nine = b.load.table.find(9n, 0);
    b.load.admit("x", nine, p.chain, 1, 5, 0, 0);
    b.load.admit("y", nine, p.chain, 1, 5, 0, 0);
    b.load.admit("z", nine, p.chain, 1, 5, 0, 0);
    b.load.done("z");
    b.load.prefillDone("y");
    fleet.settle();
    expect(a!.load.peerRequestCount).toBe(0);
    expect(a!.node.peers.peers.get("b")!.held.size).toBe(2);
    a!.load.table.acquire(9n, 0);
    fleet.heartbeats();
    expect(a!.node.peers.counters.heldApplied).toBe(2);
    expectOneView(fleet);
    const ten = b.load.table.acquire(10n, 0);
    b.load.admit("w", ten, p.chain, 1, 5, 0, 0);
    fleet.settle();
    for (let t = 0; t <= 10_000; t += 1000) {
      expect(a!.node.peers.peers.get("b")!.held.size).toBe(1);
      fleet.clock.nowMs += 1000;
      fleet.heartbeats();
    }
    expect(a!.node.peers.peers.get("b")!.held.size).toBe(0);
    expect(a!.node.peers.counters.heldDropped).toBe(1);
    a!.load.verify();
  });
});

describe("bad bytes on the bus", () => {
  test("are counted and dropped; a damaged batch from a peer is a gap, then repaired", () => {
    const fleet = new Fleet(["a", "b"]);
    const [a, b] = fleet.replicas;
    const random = prng(21);
    const sent: Uint8Array[] = [];
    fleet.bus.lose = (from, _to, bytes) => {
      if (from === "b") sent.push(bytes.slice());
      return false;
    };
    for (let n = 0; n < 300; n++) {
      fleet.step(random, n);
      if (n % 10 === 0) fleet.settle();
    }
    fleet.heartbeats();
    fleet.bus.lose = null;
    expectOneView(fleet);
    const mutate = prng(22);
    for (let i = 0; i < 3000; i++) {
      const original = sent[Math.floor(mutate() * sent.length)]!;
      const bytes = original.slice(0, 1 + Math.floor(mutate() * original.length));
      for (let k = 0; k < 1 + Math.floor(mutate() * 4); k++)
        bytes[Math.floor(mutate() * bytes.length)] = Math.floor(mutate() * 256);
      a!.node.receive(bytes);
      a!.load.verify();
    }
    a!.node.receive(new Uint8Array(2 * 1024 * 1024));
    a!.node.receive(new Uint8Array(0));
    const dropped = [...a!.node.peers.counters.dropped.values()].reduce((s, n) => s + n, 0);
    expect(dropped).toBeGreaterThan(100);
    expect(a!.node.peers.counters.dropped.get("oversized")).toBe(1);
    // Whatever the damage did here (b's stream broken, phantom peers named by damaged
    // headers, b taken for restarted), heartbeats and the lease repair it.
    for (let t = 0; t <= 2 * LEASE_MS; t += 500) {
      fleet.clock.nowMs += 500;
      fleet.heartbeats();
    }
    expect(a!.node.peers.peers.size).toBe(1);
    expectOneView(fleet);
    expect(b!.load.peerRequestCount).toBe(a!.load.activeRequestCount);
  });

  test("own replica id and an earlier epoch are dropped", () => {
    const fleet = new Fleet(["a", "b"]);
    const [a, b] = fleet.replicas;
    const p = promptHashes(Uint32Array.of(1, 2, 3, 4), BS, DEFAULT_SEED);
    const old: Uint8Array[] = [];
    fleet.bus.lose = (from, _to, bytes) => {
      if (from === "b") old.push(bytes.slice());
      return false;
    };
    b!.load.admit("x", 0, p.chain, 1, 4, 0, 0);
    fleet.settle();
    fleet.bus.lose = null;
    fleet.start("b");
    fleet.heartbeats();
    for (const bytes of old) a!.node.receive(bytes);
    expect(a!.node.peers.counters.dropped.get("stale_epoch")).toBe(old.length);
    expect(a!.load.peerRequestCount).toBe(0);
    // A message under a's own id (another process configured with it).
    const twin = new Fleet(["a", "z"]);
    twin.replicas[0]!.load.admit("y", 0, p.chain, 1, 4, 0, 0);
    twin.replicas[0]!.node.flush();
    const stray: Uint8Array[] = [];
    twin.bus.lose = (_f, _t, bytes) => {
      stray.push(bytes);
      return true;
    };
    twin.heartbeats();
    for (const bytes of stray) a!.node.receive(bytes);
    expect(a!.node.peers.counters.dropped.get("own_replica_id")).toBeGreaterThan(0);
    expect(a!.load.peerRequestCount).toBe(0);
  });
});
