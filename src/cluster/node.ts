/**
 * One replica's part in the cluster, with the transport left out: its outbox (own facts
 * out, heartbeats, snapshots), its peers (their facts in), and the answers to sync
 * requests. `Cluster` (./cluster.ts) runs it over NATS; the simulator over a delayed
 * in-memory bus (src/sim); tests over a bus of their own.
 */
import type { LoadTracker } from "../route/load";
import type { Predictions } from "../route/predictions";
import type { Logger } from "../util/log";
import {
  BadMessage,
  bodyOffset,
  KIND,
  readHeader,
  REPLICA_ID,
  WITH_PREDICTIONS,
  type WorkerIdentity,
} from "./codec";
import { Outbox } from "./outbox";
import { PeerSet } from "./peers";

/** Sync requests arriving this close together are answered from one snapshot. */
export const SYNC_COALESCE_MS = 5;

/** How a node's messages travel. */
export interface NodeTransport {
  /** To every other replica: facts batches and heartbeats. False if it could not be sent. */
  broadcast(message: Uint8Array): boolean;
  /** A sync request to every other replica (the answers come back to `receive`). */
  ask(message: Uint8Array): void;
  /** The answer to a sync request, to whoever asked (`replyTo` as `receive` was given it). */
  answer(replyTo: string, chunks: readonly Uint8Array[]): void;
}

export interface NodeOptions {
  readonly replicaId: string;
  /** This process's start: a random non-zero u32. */
  readonly epoch: number;
  readonly load: LoadTracker;
  /**
   * This process's predictions of approximate workers: what it predicts is shared, and
   * what peers predict is applied to them (null: none here; peers' are dropped, counted).
   */
  readonly predictions?: Predictions | null;
  readonly workers: WorkerIdentity;
  readonly transport: NodeTransport;
  readonly leaseMs: number;
  readonly syncTimeoutMs: number;
  readonly holdMs: number;
  /** Monotonic ms. */
  readonly now: () => number;
  readonly wallNow?: () => number;
  /** Runs a function later (0 ms: at the end of this turn); null: the owner flushes and answers itself (`flush`). */
  readonly schedule: ((run: () => void, ms: number) => void) | null;
  readonly log: Logger;
  /** Ship routed requests' chains (the `dynamo` policy needs them; see Outbox). */
  readonly chains?: boolean;
  readonly onApplied?: () => void;
  readonly onLag?: (ms: number) => void;
}

interface SyncAsked {
  readonly replyTo: string;
  readonly nonce: number;
  /** The asker's replica id, and whether it is joining (takes predictions). */
  readonly replicaId: string;
  readonly withPredictions: boolean;
}

export class ClusterNode {
  readonly outbox: Outbox;
  readonly peers: PeerSet;
  readonly counters = { syncsAnswered: 0, snapshotsBuilt: 0, snapshotBytes: 0 };
  private asked: SyncAsked[] = [];
  private answerArmed = false;

  constructor(private readonly options: NodeOptions) {
    if (!REPLICA_ID.test(options.replicaId))
      throw new RangeError(`bad replica id '${options.replicaId}'`);
    const { transport } = options;
    this.outbox = new Outbox({
      replicaId: options.replicaId,
      epoch: options.epoch,
      workers: options.workers,
      publish: (message) => transport.broadcast(message),
      schedule: options.schedule,
      now: options.now,
      chains: options.chains === true,
      ...(options.wallNow === undefined ? {} : { wallNow: options.wallNow }),
    });
    this.peers = new PeerSet({
      replicaId: options.replicaId,
      leaseMs: options.leaseMs,
      syncTimeoutMs: options.syncTimeoutMs,
      holdMs: options.holdMs,
      load: options.load,
      predictions: options.predictions ?? null,
      now: options.now,
      ...(options.wallNow === undefined ? {} : { wallNow: options.wallNow }),
      requestSync: (target, nonce, withPredictions) =>
        transport.ask(this.outbox.syncRequest(target, nonce, withPredictions)),
      ...(options.onApplied === undefined ? {} : { onApplied: options.onApplied }),
      ...(options.onLag === undefined ? {} : { onLag: options.onLag }),
      log: options.log,
    });
    options.load.facts = this.outbox;
    if (options.predictions != null) options.predictions.share = this.outbox;
  }

  get replicaId(): string {
    return this.options.replicaId;
  }

  get epoch(): number {
    return this.options.epoch;
  }

  /** A message from the bus; `replyTo` is where a sync request's answer goes. */
  receive(bytes: Uint8Array, replyTo: string | null = null): void {
    if (bytes.length > 2 && bytes[2] === KIND.sync) this.syncAsked(bytes, replyTo);
    else this.peers.receive(bytes);
  }

  /** Every heartbeat interval: tell the peers where this replica's stream is, then leases. */
  heartbeat(): void {
    this.options.transport.broadcast(this.outbox.heartbeat(this.options.load.activeRequestCount));
    this.peers.tick();
  }

  /** Asks every replica for its set (joining; or after this replica's own outage). */
  join(): void {
    this.peers.syncAll();
  }

  /** Sends the pending batch and answers the sync requests waiting (without timers). */
  flush(): void {
    this.outbox.flush();
    if (this.asked.length > 0) this.answerSyncs();
  }

  /**
   * This replica's predictions, when a joining replica asked and this replica is the
   * first by id of those it knows besides the askers (one copy per join, not one per
   * peer); else null.
   */
  private predictionsFor(asked: readonly SyncAsked[]): Predictions | null {
    const predictions = this.options.predictions ?? null;
    if (predictions === null || !asked.some((a) => a.withPredictions)) return null;
    const askers = new Set(asked.map((a) => a.replicaId));
    for (const id of this.peers.peers.keys())
      if (!askers.has(id) && id < this.options.replicaId) return null;
    return predictions;
  }

  /** Shutting down: the last facts, a heartbeat that says so, and no more reports. */
  leave(): void {
    this.outbox.flush();
    this.options.transport.broadcast(
      this.outbox.heartbeat(this.options.load.activeRequestCount, true),
    );
    this.options.load.facts = null;
    if (this.options.predictions != null) this.options.predictions.share = null;
    this.peers.clear();
  }

  private syncAsked(bytes: Uint8Array, replyTo: string | null): void {
    let target: string;
    let nonce: number;
    let header: ReturnType<typeof readHeader>;
    try {
      header = readHeader(bytes);
      if (header.replicaId === this.options.replicaId) return;
      const at = header.bodyAt;
      if (bytes.length < at + 5 || at + 5 + bytes[at + 4]! > bytes.length)
        throw new BadMessage("truncated");
      nonce = new DataView(bytes.buffer, bytes.byteOffset).getUint32(at, true);
      target = String.fromCharCode(...bytes.subarray(at + 5, at + 5 + bytes[at + 4]!));
    } catch (error) {
      const reason = error instanceof BadMessage ? error.message : "unreadable";
      this.peers.counters.dropped.set(reason, (this.peers.counters.dropped.get(reason) ?? 0) + 1);
      return;
    }
    if (replyTo === null || (target !== "" && target !== this.options.replicaId)) return;
    const withPredictions = (header.flags & WITH_PREDICTIONS) !== 0;
    this.asked.push({ replyTo, nonce, replicaId: header.replicaId, withPredictions });
    const schedule = this.options.schedule;
    if (schedule === null || this.answerArmed) return;
    this.answerArmed = true;
    schedule(() => {
      this.answerArmed = false;
      this.answerSyncs();
    }, SYNC_COALESCE_MS);
  }

  /** One snapshot for every sync asked since the last: each asker gets it under its nonce. */
  private answerSyncs(): void {
    const asked = this.asked;
    this.asked = [];
    const predictions = this.predictionsFor(asked);
    const peers = [...this.peers.peers.keys()];
    const chunks = this.outbox.snapshot(this.options.load, 0, peers, predictions);
    this.counters.snapshotsBuilt++;
    const at = bodyOffset(this.options.replicaId);
    for (const { replyTo, nonce } of asked) {
      const mine = chunks.map((chunk) => {
        const copy = chunk.slice();
        new DataView(copy.buffer).setUint32(at, nonce, true);
        return copy;
      });
      for (const chunk of mine) this.counters.snapshotBytes += chunk.length;
      this.counters.syncsAnswered++;
      this.options.transport.answer(replyTo, mine);
    }
  }
}
