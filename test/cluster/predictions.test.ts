// Goal: replicas that share their predictions predict one cache per approximate worker:
// what any replica predicts (at prefill done or at route time) and refreshes (at done)
// is in every replica's index, block for block, parent for parent, once messages are
// delivered; a shortfall one replica observes purges and shrinks on every replica; a
// replica joining mid-run takes the predictions of the first replica by id (one copy,
// newest first, in the sender's LRU order); peers' predictions of workers not known here
// are held within their bound, then applied or dropped; of workers exact here, dropped;
// following a block this replica does not hold, dropped (each counted); predictions past
// CHAIN_BLOCKS_MAX new blocks are cut to their prefix (counted); and every byte of a
// replica's predictions comes back when its workers go.
// Method: ClusterNodes over the in-memory LocalBus (no transport) on one fake clock, each
// with its own LoadTracker, crtc index and Predictions over one WorkerTable; request
// lifecycles on a seeded PRNG; indexes compared through their dumps; verify() on every
// predictor after each run.
import { describe, expect, test } from "bun:test";
import { CHAIN_BLOCKS_MAX } from "../../src/cluster/codec";
import { LocalBus } from "../../src/cluster/local-bus";
import { ClusterNode } from "../../src/cluster/node";
import { HELD_PREDICTION_BYTES } from "../../src/cluster/peers";
import { DEFAULT_SEED } from "../../src/hash";
import { createIndex, type KvIndex, MatchResult } from "../../src/index";
import { LoadTracker, promptHashes } from "../../src/route";
import { type PredictAt, Predictions } from "../../src/route/predictions";
import { silentLogger } from "../../src/util/log";
import { xorshift32 } from "../../src/util/random";

const BS = 4;
const LEASE_MS = 3000;
const HOLD_MS = 10_000;

interface Replica {
  readonly id: string;
  readonly load: LoadTracker;
  readonly index: KvIndex;
  readonly predictions: Predictions;
  readonly node: ClusterNode;
  /** Its requests routed and not done: id, slot. */
  readonly live: [string, number][];
}

interface Options {
  readonly capacity?: number | null;
  readonly predictAt?: PredictAt;
  /** Workers (ids) approximate here; the others of `workers` exact. */
  readonly approximate?: readonly bigint[];
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
  private readonly matches = new MatchResult(8);

  constructor(
    ids: string[],
    readonly options: Options = {},
    readonly workers: bigint[] = [1n, 2n, 3n],
  ) {
    for (const id of ids) this.start(id);
  }

  start(id: string, workers = this.workers, options = this.options): Replica {
    const load = new LoadTracker({ blockSize: BS, now: () => this.clock.nowMs });
    const index = createIndex("crtc", BS, { workers: load.table });
    const predictions = new Predictions(
      index,
      {
        blockSize: BS,
        predictAt: options.predictAt ?? "prefill_done",
        capacityBlocks: options.capacity ?? null,
        ttlMs: 1e12,
        maxBlocks: 1 << 20,
        requestTtlMs: 1e12,
        maxPending: 1 << 20,
      },
      () => this.clock.nowMs,
    );
    const approximate = options.approximate ?? workers;
    for (const worker of workers) {
      const slot = load.table.acquire(worker, 0);
      if (approximate.includes(worker)) predictions.enable(slot, options.capacity ?? null);
    }
    const node = new ClusterNode({
      replicaId: id,
      epoch: ++this.epochs,
      load,
      predictions,
      workers: load.table,
      transport: this.bus.transport(id),
      leaseMs: LEASE_MS,
      syncTimeoutMs: 1000,
      holdMs: HOLD_MS,
      now: () => this.clock.nowMs,
      wallNow: () => this.clock.nowMs,
      schedule: null,
      log: silentLogger,
    });
    this.bus.attach(node);
    const replica: Replica = { id, load, index, predictions, node, live: [] };
    this.replicas.push(replica);
    return replica;
  }

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

  /** Routes a prompt on `r` to `slot` as the core does: its overlap from r's own index. */
  route(r: Replica, id: string, tokens: Uint32Array, slot: number): void {
    const p = promptHashes(tokens, BS, DEFAULT_SEED);
    r.index.findMatches(p.local, p.blockCount, this.matches, p.chain);
    let overlap = 0;
    for (let i = 0; i < this.matches.count; i++)
      if (this.matches.workers[i] === slot) overlap = this.matches.blocks[i]!;
    r.predictions.routed(id, slot, p.local, p.chain, p.blockCount, tokens.length, overlap, overlap);
    r.live.push([id, slot]);
  }

  /** One random lifecycle step on a random replica: route, prefill done, or done. */
  step(random: () => number, n: number, families: Uint32Array[]): void {
    const r = this.replicas[Math.floor(random() * this.replicas.length)]!;
    const roll = random();
    if (roll < 0.5 || r.live.length === 0) {
      const family = families[Math.floor(random() * families.length)]!;
      const shared = family.subarray(0, Math.floor(random() * (family.length + 1)));
      const tokens = new Uint32Array(shared.length + 1 + Math.floor(random() * 6 * BS));
      tokens.set(shared);
      for (let t = shared.length; t < tokens.length; t++) tokens[t] = 1_000_000 * (n + 1) + t;
      const slot = r.load.liveSlots[Math.floor(random() * r.load.liveCount)]!;
      this.route(r, `q${n}`, tokens, slot);
    } else if (roll < 0.8) {
      r.predictions.prefillDone(r.live[Math.floor(random() * r.live.length)]![0], null);
    } else {
      const [id] = r.live.splice(Math.floor(random() * r.live.length), 1)[0]!;
      r.predictions.done(id);
    }
  }
}

function families(seed: number): Uint32Array[] {
  const next = prng(seed);
  return Array.from({ length: 4 }, () =>
    Uint32Array.from({ length: 8 * BS }, () => Math.floor(next() * 1e6)),
  );
}

/** Every block an index holds, by worker, with its parent and local hash, sorted (its dump replayed). */
function held(index: KvIndex): string[] {
  const blocks = new Map<string, string>();
  for (const op of index.dump()) {
    if (op.op === "removed")
      for (const hash of op.block_hashes) blocks.delete(`${op.worker_id} ${hash}`);
    if (op.op !== "stored") continue;
    let parent = op.parent_block_hash;
    op.block_hashes.forEach((hash, i) => {
      blocks.set(
        `${op.worker_id} ${hash}`,
        `${op.worker_id} ${parent} ${hash} ${op.local_hashes![i]}`,
      );
      parent = hash;
    });
  }
  return [...blocks.values()].sort();
}

/** A slot's predictions, newest first, as the runs a joining replica would be sent. */
function runs(predictions: Predictions, slot: number): string[] {
  const out: string[] = [];
  predictions.blocks.forEachRun(slot, 1 << 20, CHAIN_BLOCKS_MAX, (anchored, hi, lo, local, n) =>
    out.push(`${anchored ? `${hi}/${lo}` : "root"} ${[...local.subarray(0, 2 * n)].join(",")}`),
  );
  return out;
}

function verify(fleet: Fleet): void {
  for (const r of fleet.replicas) {
    r.predictions.blocks.verify();
    r.index.verify?.();
  }
}

describe("replicas sharing predictions", () => {
  for (const predictAt of ["prefill_done", "route"] as const) {
    test(`predict one cache, block for block (predict_at = ${predictAt})`, () => {
      const fleet = new Fleet(["a", "b", "c"], { predictAt });
      const random = prng(31);
      const prompts = families(32);
      for (let n = 0; n < 800; n++) {
        fleet.clock.nowMs += 1;
        fleet.step(random, n, prompts);
        if (n % 5 === 0) fleet.settle();
      }
      fleet.settle();
      const [a, ...others] = fleet.replicas;
      const blocks = held(a!.index);
      expect(blocks.length).toBeGreaterThan(300);
      for (const r of others) expect(held(r.index)).toEqual(blocks);
      let shared = 0;
      for (const r of fleet.replicas) {
        const out = r.node.outbox.counters;
        shared += out.predictions;
        expect(out.predictionsTruncated).toBe(0);
        expect(r.node.peers.counters.predictions.unanchored).toBe(0);
        expect(r.node.peers.counters.predictions.notApproximate).toBe(0);
      }
      const applied = fleet.replicas.reduce(
        (s, r) => s + r.node.peers.counters.predictions.applied,
        0,
      );
      expect(applied).toBe(2 * shared); // each replica's, applied by both others
      verify(fleet);
    });
  }

  test("within the capacity every replica predicts a prediction made elsewhere, in the same LRU order", () => {
    const fleet = new Fleet(["a", "b"], { capacity: 64 });
    const random = prng(41);
    const prompts = families(42);
    for (let n = 0; n < 600; n++) {
      fleet.clock.nowMs += 1;
      fleet.step(random, n, prompts);
      fleet.settle(); // in this order on both: own, then the peer's
    }
    const [a, b] = fleet.replicas;
    for (const slot of [0, 1, 2]) {
      expect(a!.predictions.blocks.heldBy(slot)).toBeLessThanOrEqual(64);
      expect(runs(b!.predictions, slot)).toEqual(runs(a!.predictions, slot));
    }
    expect(held(b!.index)).toEqual(held(a!.index));
    expect(a!.predictions.blocks.counters.evicted).toBeGreaterThan(0);
    verify(fleet);
  });

  test("a shortfall one replica observes purges and shrinks on every replica", () => {
    const fleet = new Fleet(["a", "b"], { capacity: 4096 });
    const [a, b] = fleet.replicas;
    const prompts = families(51);
    // Old chains, then a newer one: the shortfall on the newer one purges everything older.
    for (let i = 0; i < 3; i++) {
      fleet.clock.nowMs += 10;
      fleet.route(a!, `old${i}`, prompts[i]!, 0);
      a!.predictions.prefillDone(`old${i}`, null);
      fleet.settle();
    }
    fleet.clock.nowMs += 10;
    const tokens = Uint32Array.of(...prompts[3]!, 7, 7, 7, 7, 7);
    fleet.route(b!, "first", tokens, 0);
    b!.predictions.prefillDone("first", null);
    fleet.settle();
    expect(a!.predictions.blocks.heldBy(0)).toBe(b!.predictions.blocks.heldBy(0));
    const before = a!.predictions.blocks.heldBy(0);
    fleet.clock.nowMs += 10;
    fleet.route(b!, "again", tokens, 0); // predicted 9 blocks: the engine says it served none
    b!.predictions.prefillDone("again", 0);
    fleet.settle();
    expect(b!.predictions.counters.shortfalls).toBe(1);
    expect(a!.node.peers.counters.predictions.corrections).toBe(1);
    expect(b!.predictions.blocks.heldBy(0)).toBeLessThan(before);
    expect(held(a!.index)).toEqual(held(b!.index));
    expect(a!.predictions.blocks.capacityOf(0)).toBe(b!.predictions.blocks.capacityOf(0));
    expect(a!.predictions.blocks.capacityOf(0)).toBeLessThan(4096);
    verify(fleet);
  });

  test("a replica joining takes the predictions of the first replica by id, newest first", () => {
    const fleet = new Fleet(["a", "b"], { capacity: 200 });
    const random = prng(61);
    const prompts = families(62);
    for (let n = 0; n < 500; n++) {
      fleet.clock.nowMs += 1;
      fleet.step(random, n, prompts);
      fleet.settle();
    }
    const [a, b] = fleet.replicas;
    const c = fleet.start("c");
    c.node.join();
    fleet.settle();
    expect(a!.node.outbox.counters.predictionsSnapshotted).toBeGreaterThan(0);
    expect(b!.node.outbox.counters.predictionsSnapshotted).toBe(0);
    for (const slot of [0, 1, 2])
      expect(runs(c.predictions, slot)).toEqual(runs(a!.predictions, slot));
    expect(held(c.index)).toEqual(held(a!.index));
    // From then on it predicts with the others.
    for (let n = 500; n < 700; n++) {
      fleet.clock.nowMs += 1;
      fleet.step(random, n, prompts);
      fleet.settle();
    }
    expect(held(c.index)).toEqual(held(a!.index));
    verify(fleet);
  });

  test("a refresh or a prediction following a block not held here is dropped, counted", () => {
    const fleet = new Fleet(["a", "b"]);
    const [a, b] = fleet.replicas;
    const tokens = Uint32Array.from({ length: 6 * BS + 1 }, (_, i) => i + 1);
    fleet.route(a!, "x", tokens.subarray(0, 3 * BS + 1), 0);
    a!.predictions.prefillDone("x", null);
    fleet.settle();
    // b forgets what it predicted (its worker switched modes and back).
    b!.predictions.disable(0);
    b!.predictions.enable(0, null);
    fleet.route(a!, "y", tokens, 0);
    a!.predictions.prefillDone("y", null); // blocks 3-5, after block 2 that b lacks
    a!.predictions.done("x"); // a refresh from block 2
    fleet.settle();
    expect(b!.node.peers.counters.predictions.unanchored).toBe(2);
    expect(b!.predictions.blocks.heldBy(0)).toBe(0);
    expect(held(b!.index)).toEqual([]);
    verify(fleet);
  });

  test("predictions of a worker exact here are dropped, counted; the index untouched", () => {
    const fleet = new Fleet(["a"]);
    const b = fleet.start("b", [1n, 2n, 3n], { approximate: [2n, 3n] });
    const [a] = fleet.replicas;
    fleet.route(
      a!,
      "x",
      Uint32Array.from({ length: 9 }, (_, i) => i),
      0,
    );
    a!.predictions.prefillDone("x", null);
    a!.predictions.done("x");
    fleet.settle();
    expect(b.node.peers.counters.predictions.notApproximate).toBe(2);
    expect(held(b.index)).toEqual([]);
  });

  test("predictions past CHAIN_BLOCKS_MAX new blocks are cut to their prefix", () => {
    const fleet = new Fleet(["a", "b"]);
    const [a, b] = fleet.replicas;
    const tokens = Uint32Array.from({ length: (CHAIN_BLOCKS_MAX + 3) * BS + 1 }, (_, i) => i);
    fleet.route(a!, "long", tokens, 1);
    a!.predictions.prefillDone("long", null);
    fleet.settle();
    expect(a!.node.outbox.counters.predictionsTruncated).toBe(1);
    expect(a!.predictions.blocks.heldBy(1)).toBe(CHAIN_BLOCKS_MAX + 3);
    expect(b!.predictions.blocks.heldBy(1)).toBe(CHAIN_BLOCKS_MAX);
    verify(fleet);
  });
});

describe("predictions of workers not known here", () => {
  test("are held until the worker appears, in order; dropped after the hold; bounded in bytes", () => {
    const fleet = new Fleet(["a"], {}, [1n]);
    const b = fleet.start("b", [1n, 9n]);
    const [a] = fleet.replicas;
    const nine = b.load.table.find(9n, 0);
    const tokens = Uint32Array.from({ length: 6 * BS + 1 }, (_, i) => i + 1);
    fleet.route(b, "x", tokens.subarray(0, 3 * BS + 1), nine);
    b.predictions.prefillDone("x", null);
    fleet.route(b, "y", tokens, nine); // after x's blocks: applied after them
    b.predictions.prefillDone("y", null);
    fleet.settle();
    const peer = a!.node.peers.peers.get("b")!;
    expect(peer.heldPredictions.length).toBe(2);
    const slot = a!.load.table.acquire(9n, 0);
    a!.predictions.enable(slot, null);
    fleet.heartbeats();
    expect(a!.node.peers.counters.predictions.heldApplied).toBe(2);
    expect(a!.predictions.blocks.heldBy(slot)).toBe(6);
    expect(held(a!.index)).toEqual(held(b.index));
    // A worker that never comes: dropped after the hold.
    const ten = b.load.table.acquire(10n, 0);
    b.predictions.enable(ten, null);
    fleet.route(b, "z", tokens, ten);
    b.predictions.prefillDone("z", null);
    fleet.settle();
    expect(peer.heldPredictions.length).toBe(1);
    for (let t = 0; t <= HOLD_MS; t += 1000) {
      fleet.clock.nowMs += 1000;
      fleet.heartbeats(); // within the lease: the peer stays
    }
    expect(peer.heldPredictions.length).toBe(0);
    expect(a!.node.peers.counters.predictions.heldDropped).toBe(1);
    // Past the bound, dropped at once.
    const big = Uint32Array.from({ length: CHAIN_BLOCKS_MAX * BS + 1 }, (_, i) => 7 + i);
    const fits = Math.floor(HELD_PREDICTION_BYTES / (8 * CHAIN_BLOCKS_MAX + 64));
    for (let i = 0; i <= fits; i++) {
      b.predictions.disable(ten); // each one new again
      b.predictions.enable(ten, null);
      fleet.route(b, `big${i}`, big, ten);
      b.predictions.prefillDone(`big${i}`, null);
      fleet.settle();
    }
    expect(peer.heldPredictions.length).toBe(fits);
    expect(peer.heldPredictionBytes).toBeLessThanOrEqual(HELD_PREDICTION_BYTES);
    expect(a!.node.peers.counters.predictions.heldDropped).toBe(2);
    verify(fleet);
  });
});

describe("memory", () => {
  test("a replica's predictions, its own and its peers', give every byte back when its workers go", () => {
    const fleet = new Fleet(["a", "b"], { capacity: 100 });
    const fresh = fleet.replicas[1]!.predictions.blocks.bytes;
    const random = prng(71);
    const prompts = families(72);
    for (let n = 0; n < 400; n++) {
      fleet.clock.nowMs += 1;
      fleet.step(random, n, prompts);
      if (n % 3 === 0) fleet.settle();
    }
    fleet.settle();
    const b = fleet.replicas[1]!;
    expect(b.predictions.blocks.size).toBeGreaterThan(100);
    for (const slot of [0, 1, 2]) b.predictions.disable(slot);
    expect(b.predictions.blocks.size).toBe(0);
    expect(b.predictions.blocks.bytes).toBe(fresh);
    expect(b.index.workers().reduce((s, w) => s + w.blocks, 0)).toBe(0);
    verify(fleet);
  });
});
