/**
 * The peers as this replica knows them: for each, its process (epoch), how far its
 * stream of facts has been applied here (seq), when it was last heard, and the facts
 * held for workers not known here yet. Its requests live in the load tracker under its
 * origin number (src/route/load.ts), so the router's view is the fleet's.
 *
 * The rules (README.md in this folder says why):
 * - A new (replica, epoch) starts from the empty set at seq 0: its facts apply from
 *   seq 1 on. Facts in order apply at once; an older seq is a duplicate; a newer one,
 *   or a heartbeat whose seq is past what was applied, is a gap: the peer is asked for
 *   its set (`requestSync`) and its messages are buffered (bounded) until the snapshot
 *   comes, which replaces its whole set; buffered facts past the snapshot's seq follow.
 * - Another epoch for a known replica is a restart: its set goes at once. A message of
 *   the epoch before is stale (or two processes share a replica id) and is dropped.
 * - A peer not heard for the lease is dropped with all its requests; one that says it
 *   is leaving, at once.
 * - Facts naming a worker this process does not know are held (bounded per peer, for
 *   `holdMs`) and applied when the worker appears, or dropped.
 * - Predictions (what a peer predicted on an approximate worker) go to this process's
 *   own predictions for that worker (src/route/predictions.ts), not per origin: they are
 *   facts about the engine's cache, which every replica predicts alike.
 * - Nothing a peer sends can crash this process: bad messages are counted and dropped,
 *   and a bad facts message from a known peer is a gap (its facts are not half applied).
 */
import type { LoadTracker } from "../route/load";
import type { EndReason } from "../route/load";
import type { Predictions } from "../route/predictions";
import type { Logger } from "../util/log";
import { OnceLog } from "../util/log";
import {
  BadMessage,
  FactReader,
  type FactVisitor,
  type Header,
  KIND,
  LAST_CHUNK,
  LEAVING,
  readHeader,
  REPLICA_ID,
  type WorkerDictionary,
} from "./codec";

/** Bytes of messages buffered per peer while its snapshot is awaited. */
export const BUFFERED_BYTES_MAX = 16 * 1024 * 1024;
/** Requests held per peer for workers not known here. */
export const HELD_MAX = 4096;
/** Bytes of predictions held per peer for workers not known here. */
export const HELD_PREDICTION_BYTES = 1024 * 1024;

export interface PeerSetOptions {
  readonly replicaId: string;
  /** A peer not heard for this long is dropped. */
  readonly leaseMs: number;
  /** A sync not answered in this long is given up (asked again at the next gap seen). */
  readonly syncTimeoutMs: number;
  /** How long facts for unknown workers are held. */
  readonly holdMs: number;
  readonly load: LoadTracker;
  /** Where peers' predictions of approximate workers go (null: dropped, counted). */
  readonly predictions?: Pick<
    Predictions,
    "isApproximate" | "apply" | "applyCorrection" | "applyOlder"
  > | null;
  /** Monotonic ms (injectable: tests run on a fake clock). */
  readonly now: () => number;
  /** Wall-clock ms, to measure how late facts arrive (senders stamp them with theirs). */
  readonly wallNow?: () => number;
  /**
   * Asks `replicaId` (null: every replica) for its set, answered under `nonce`;
   * `withPredictions`: joining, this replica takes a peer's predictions too.
   */
  readonly requestSync: (replicaId: string | null, nonce: number, withPredictions: boolean) => void;
  /** Peers' facts were applied (load may have been freed: admission looks again). */
  readonly onApplied?: () => void;
  readonly onLag?: (ms: number) => void;
  readonly log: Logger;
}

/** A request held until its worker is known here. */
interface Held {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly chain: Uint32Array;
  readonly blocks: number;
  prefillTokens: number;
  readonly outputBlocks: number;
  /** Without a chain: the decode blocks its origin counted it adding. */
  readonly decodeBlocks: number | null;
  readonly heldAtMs: number;
}

/** A prediction held until its worker is known here. */
interface HeldPrediction {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly anchored: boolean;
  readonly anchorHi: number;
  readonly anchorLo: number;
  readonly local: Uint32Array;
  readonly heldAtMs: number;
}

/** A snapshot being received in chunks. */
interface Assembly {
  readonly nonce: number;
  readonly epoch: number;
  readonly seq: number;
  next: number;
  readonly chunks: Uint8Array[];
}

export class Peer {
  /** Facts seq applied here: this peer's set as of that seq. */
  applied = 0;
  lastHeardMs: number;
  /** The nonce of the sync asked for, and when it is given up; -1 = not syncing. */
  syncNonce = -1;
  syncDeadlineMs = 0;
  buffered: Uint8Array[] = [];
  bufferedBytes = 0;
  /** Buffered messages were dropped (over the bound): sync again after the snapshot. */
  overflowed = false;
  assembly: Assembly | null = null;
  previousEpoch = 0;
  /** Own active requests the peer announced in its last heartbeat. */
  announced = 0;
  /** Its last heartbeat's seq (what it has published). */
  published = 0;
  /** Wall ms between its last facts' sending and their arrival. */
  lagMs = 0;
  /** By handle: requests held for workers not known here. */
  readonly held = new Map<number, Held>();
  /** Predictions held for workers not known here, in arrival order, and their bytes. */
  heldPredictions: HeldPrediction[] = [];
  heldPredictionBytes = 0;

  constructor(
    readonly replicaId: string,
    public epoch: number,
    readonly origin: number,
    nowMs: number,
  ) {
    this.lastHeardMs = nowMs;
  }

  get syncing(): boolean {
    return this.syncNonce >= 0;
  }
}

/** What happened to the bus's messages and peers' facts, since start. */
export class PeerCounters {
  messages = 0;
  bytes = 0;
  facts = 0;
  /** Facts messages older than what was applied (seen twice). */
  duplicates = 0;
  gaps = 0;
  syncsAsked = 0;
  syncsInstalled = 0;
  syncTimeouts = 0;
  peersJoined = 0;
  peersLost = 0;
  peersRestarted = 0;
  held = 0;
  heldApplied = 0;
  heldDropped = 0;
  /**
   * Peers' predictions: applied to this replica's own; not applied because this replica
   * did not hold the block they follow (`unanchored`), the worker is not approximate
   * here (or there are no predictions here), or they were held for a worker not known
   * yet and applied later or dropped.
   */
  readonly predictions = {
    applied: 0,
    corrections: 0,
    /** Blocks taken from a peer's snapshot when this replica joined. */
    joined: 0,
    unanchored: 0,
    notApproximate: 0,
    held: 0,
    heldApplied: 0,
    heldDropped: 0,
  };
  /** Messages dropped unread (bad, stale, own id, too many peers), by reason. */
  readonly dropped = new Map<string, number>();
}

/** Wall-clock ms with sub-ms resolution (Date.now has whole ms: loopback lags read 0). */
export function wallClockMs(): number {
  return performance.timeOrigin + performance.now();
}

export class PeerSet {
  readonly peers = new Map<string, Peer>();
  readonly counters = new PeerCounters();
  /** Replica ids peers named in their snapshots (a joining replica waits for each). */
  readonly named = new Set<string>();
  private readonly reader = new FactReader();
  private readonly applier: Applier;
  private readonly bad: OnceLog;
  private nonce = 0;
  /** Syncs asked of every replica (joining): nonce -> deadline. */
  private readonly openSyncs = new Map<number, number>();

  constructor(private readonly options: PeerSetOptions) {
    this.bad = new OnceLog(options.log);
    this.applier = new Applier(
      options.load,
      options.predictions ?? null,
      this.counters,
      (peer, handle, held) => this.hold(peer, handle, held),
      (peer, held) => this.holdPrediction(peer, held),
      options.now,
    );
  }

  /** One message from the bus (facts, heartbeat, or a snapshot chunk). */
  receive(bytes: Uint8Array): void {
    this.counters.messages++;
    this.counters.bytes += bytes.length;
    let header: Header;
    try {
      header = readHeader(bytes);
    } catch (error) {
      this.drop(error instanceof BadMessage ? error.message : "unreadable", bytes);
      return;
    }
    if (header.replicaId === this.options.replicaId) {
      this.drop("own_replica_id", bytes, { replica_id: header.replicaId });
      return;
    }
    if (header.kind === KIND.snapshot) this.snapshotChunk(header, bytes);
    else if (header.kind === KIND.facts || header.kind === KIND.heartbeat)
      this.stream(header, bytes);
    else this.drop("unexpected_kind", bytes);
  }

  /** Asks every replica for its set (joining, or after this replica's own outage). */
  syncAll(): number {
    const nonce = this.nextNonce();
    this.openSyncs.set(nonce, this.options.now() + this.options.syncTimeoutMs);
    this.counters.syncsAsked++;
    this.options.requestSync(null, nonce, true);
    return nonce;
  }

  /**
   * Every replica heard of (by a message or named in a peer's snapshot) has had its set
   * installed here: this replica's view is the fleet's.
   */
  get complete(): boolean {
    for (const id of this.named) {
      const peer = this.peers.get(id);
      if (peer === undefined || peer.syncing) return false;
    }
    for (const peer of this.peers.values()) if (peer.syncing) return false;
    return true;
  }

  /** Leases, sync deadlines and held facts; call every heartbeat interval. */
  tick(): void {
    const now = this.options.now();
    for (const peer of [...this.peers.values()]) {
      if (now - peer.lastHeardMs > this.options.leaseMs) {
        this.lose(peer, "lease ran out");
        continue;
      }
      if (peer.syncing && now > peer.syncDeadlineMs) {
        this.counters.syncTimeouts++;
        this.options.log.warn("peer did not send its set in time; asking again at the next gap", {
          peer: peer.replicaId,
        });
        this.endSync(peer);
      }
      if (peer.held.size > 0) this.retryHeld(peer, now);
      if (peer.heldPredictions.length > 0) this.retryHeldPredictions(peer, now);
    }
    for (const [nonce, deadline] of this.openSyncs)
      if (now > deadline) this.openSyncs.delete(nonce);
    // Named by a snapshot but never heard: not waited for past a lease.
    if (this.named.size > 0)
      for (const id of this.named) if (!this.peers.has(id)) this.named.delete(id);
  }

  /** Drops every peer (this replica stops, or leaves the bus). */
  clear(): void {
    for (const peer of [...this.peers.values()]) this.lose(peer, null);
    this.named.clear();
  }

  // ---- Facts and heartbeats ----

  private stream(header: Header, bytes: Uint8Array): void {
    const leaving = header.kind === KIND.heartbeat && (header.flags & LEAVING) !== 0;
    if (leaving && this.peers.get(header.replicaId)?.epoch !== header.epoch) return;
    const peer = this.peerOf(header, bytes);
    if (peer === null) return;
    peer.lastHeardMs = this.options.now();
    if (header.kind === KIND.heartbeat) {
      this.heartbeat(peer, header, bytes);
      return;
    }
    try {
      this.reader.read(bytes, header.bodyAt, null);
    } catch (error) {
      this.drop((error as BadMessage).message, bytes, { peer: peer.replicaId });
      this.gap(peer); // its facts are lost here: get its set
      return;
    }
    if (peer.syncing) this.buffer(peer, bytes);
    else if (header.seq <= peer.applied) this.counters.duplicates++;
    else if (header.seq === peer.applied + 1) {
      this.applyFacts(peer, bytes, header.bodyAt);
      peer.applied = header.seq;
      this.noteLag(peer, header);
      this.options.onApplied?.();
    } else {
      this.gap(peer);
      this.buffer(peer, bytes);
    }
  }

  private heartbeat(peer: Peer, header: Header, bytes: Uint8Array): void {
    if (header.flags & LEAVING) {
      this.lose(peer, "it is shutting down");
      return;
    }
    if (bytes.length >= header.bodyAt + 4)
      peer.announced = new DataView(bytes.buffer, bytes.byteOffset).getUint32(header.bodyAt, true);
    peer.published = header.seq;
    if (header.seq > peer.applied && !peer.syncing) this.gap(peer);
  }

  /**
   * The peer a stream message is from: known, new (from its empty set at seq 0), or
   * restarted (its old set dropped). Null when the message must be dropped.
   */
  private peerOf(header: Header, bytes: Uint8Array): Peer | null {
    const known = this.peers.get(header.replicaId);
    if (known !== undefined && known.epoch === header.epoch) return known;
    if (known !== undefined && known.previousEpoch === header.epoch) {
      this.drop("stale_epoch", bytes, {
        peer: header.replicaId,
        note: "an earlier process of this replica, or two processes with one replica id",
      });
      return null;
    }
    if (known !== undefined) {
      this.counters.peersRestarted++;
      this.options.log.info("peer restarted: its requests are dropped", {
        peer: header.replicaId,
        dropped: this.options.load.originCount(known.origin),
      });
      this.restart(known, header.epoch);
      return known;
    }
    return this.join(header.replicaId, header.epoch, bytes);
  }

  private join(replicaId: string, epoch: number, bytes: Uint8Array): Peer | null {
    const origin = this.options.load.openOrigin();
    if (origin < 0) {
      this.drop("too_many_peers", bytes, { peer: replicaId });
      return null;
    }
    const peer = new Peer(replicaId, epoch, origin, this.options.now());
    this.peers.set(replicaId, peer);
    this.counters.peersJoined++;
    this.options.log.info("peer joined", { peer: replicaId });
    return peer;
  }

  private restart(peer: Peer, epoch: number): void {
    this.options.load.clearOrigin(peer.origin);
    this.counters.heldDropped += peer.held.size;
    peer.held.clear();
    peer.previousEpoch = peer.epoch;
    peer.epoch = epoch;
    peer.applied = 0;
    peer.published = 0;
    peer.assembly = null;
    this.endSync(peer);
  }

  private lose(peer: Peer, why: string | null): void {
    const dropped = this.options.load.closeOrigin(peer.origin);
    this.counters.heldDropped += peer.held.size;
    this.counters.predictions.heldDropped += peer.heldPredictions.length;
    this.peers.delete(peer.replicaId);
    this.named.delete(peer.replicaId);
    if (why === null) return;
    this.counters.peersLost++;
    this.options.log.warn("peer dropped with its requests", {
      peer: peer.replicaId,
      why,
      dropped,
    });
    this.options.onApplied?.();
  }

  private gap(peer: Peer): void {
    if (peer.syncing) return;
    this.counters.gaps++;
    peer.syncNonce = this.nextNonce();
    peer.syncDeadlineMs = this.options.now() + this.options.syncTimeoutMs;
    this.counters.syncsAsked++;
    this.options.requestSync(peer.replicaId, peer.syncNonce, false);
  }

  private endSync(peer: Peer): void {
    peer.syncNonce = -1;
    peer.buffered = [];
    peer.bufferedBytes = 0;
    peer.overflowed = false;
    peer.assembly = null;
  }

  private buffer(peer: Peer, bytes: Uint8Array): void {
    if (peer.bufferedBytes + bytes.length > BUFFERED_BYTES_MAX) {
      peer.overflowed = true;
      peer.buffered = [];
      peer.bufferedBytes = 0;
      return;
    }
    peer.buffered.push(bytes.slice());
    peer.bufferedBytes += bytes.length;
  }

  private noteLag(peer: Peer, header: Header): void {
    const wall = this.options.wallNow ?? wallClockMs;
    peer.lagMs = Math.max(0, wall() - header.sentAtMs);
    this.options.onLag?.(peer.lagMs);
  }

  // ---- Snapshots ----

  private snapshotChunk(header: Header, bytes: Uint8Array): void {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    if (bytes.length < header.bodyAt + 8) {
      this.drop("truncated", bytes);
      return;
    }
    const nonce = view.getUint32(header.bodyAt, true);
    const chunk = view.getUint32(header.bodyAt + 4, true);
    let peer = this.peers.get(header.replicaId);
    const asked = peer?.syncNonce === nonce || this.openSyncs.has(nonce);
    if (!asked) {
      this.drop("unasked_snapshot", bytes, { peer: header.replicaId });
      return;
    }
    if (peer === undefined || peer.epoch !== header.epoch) {
      peer = this.peerOf(header, bytes) ?? undefined;
      if (peer === undefined) return;
      if (!peer.syncing) peer.syncNonce = nonce; // joined by its snapshot: buffer its stream
      peer.syncDeadlineMs = this.options.now() + this.options.syncTimeoutMs;
    }
    peer.lastHeardMs = this.options.now();
    this.assemble(peer, header, bytes, nonce, chunk);
  }

  private assemble(peer: Peer, header: Header, bytes: Uint8Array, nonce: number, chunk: number) {
    if (chunk === 0) {
      peer.assembly = { nonce, epoch: header.epoch, seq: header.seq, next: 0, chunks: [] };
      if (peer.syncNonce < 0) peer.syncNonce = nonce;
    }
    const assembly = peer.assembly;
    if (assembly === null || assembly.nonce !== nonce || assembly.next !== chunk) {
      this.drop("snapshot_out_of_order", bytes, { peer: peer.replicaId });
      peer.assembly = null;
      return;
    }
    let factsAt: number;
    try {
      factsAt = this.snapshotPeers(bytes, header.bodyAt + 8, chunk === 0);
      this.reader.read(bytes, factsAt, null);
    } catch (error) {
      this.drop(error instanceof BadMessage ? error.message : "unreadable", bytes);
      peer.assembly = null;
      return;
    }
    assembly.chunks.push(bytes.slice());
    assembly.next++;
    if (header.flags & LAST_CHUNK) this.install(peer, assembly);
  }

  /** Reads (or, `record` false, skips) the peer list of a snapshot chunk; returns where its facts start. */
  private snapshotPeers(bytes: Uint8Array, at: number, record: boolean): number {
    if (at + 2 > bytes.length) throw new BadMessage("truncated");
    const count = bytes[at]! | (bytes[at + 1]! << 8);
    let p = at + 2;
    for (let i = 0; i < count; i++) {
      const length = bytes[p] ?? 0;
      if (p + 1 + length > bytes.length) throw new BadMessage("truncated");
      const id = String.fromCharCode(...bytes.subarray(p + 1, p + 1 + length));
      if (!REPLICA_ID.test(id)) throw new BadMessage("replica_id");
      if (record && id !== this.options.replicaId) this.named.add(id);
      p += 1 + length;
    }
    return p;
  }

  /** A whole snapshot arrived: it replaces the peer's set; buffered facts past it follow. */
  private install(peer: Peer, assembly: Assembly): void {
    const load = this.options.load;
    load.clearOrigin(peer.origin);
    this.counters.heldDropped += peer.held.size;
    peer.held.clear();
    for (const chunk of assembly.chunks) {
      const header = readHeader(chunk);
      this.applyFacts(peer, chunk, this.snapshotPeers(chunk, header.bodyAt + 8, false));
    }
    peer.applied = assembly.seq;
    const buffered = peer.buffered;
    const overflowed = peer.overflowed;
    this.endSync(peer);
    this.counters.syncsInstalled++;
    this.options.log.info("peer's set installed", {
      peer: peer.replicaId,
      seq: assembly.seq,
      requests: load.originCount(peer.origin),
    });
    for (const bytes of buffered) {
      const header = readHeader(bytes);
      if (header.epoch !== peer.epoch || header.seq <= peer.applied) continue;
      if (header.seq !== peer.applied + 1 || peer.syncing) {
        this.gap(peer);
        this.buffer(peer, bytes);
        continue;
      }
      this.applyFacts(peer, bytes, header.bodyAt);
      peer.applied = header.seq;
    }
    if (overflowed) this.gap(peer);
    this.options.onApplied?.();
  }

  // ---- Applying facts ----

  /** Applies a checked facts section (at `at`) of `peer`'s message. */
  private applyFacts(peer: Peer, bytes: Uint8Array, at: number): void {
    this.applier.peer = peer;
    this.reader.read(bytes, at, this.applier);
  }

  private hold(peer: Peer, id: number, held: Held): void {
    if (peer.held.size >= HELD_MAX) {
      this.counters.heldDropped++;
      this.bad.report("held_full", "too many facts held for workers not known here; dropped", {
        peer: peer.replicaId,
      });
      return;
    }
    this.counters.held++;
    peer.held.set(id, held);
  }

  /** Held facts whose worker is now known are applied; those held too long are dropped. */
  private retryHeld(peer: Peer, now: number): void {
    const load = this.options.load;
    let applied = 0;
    for (const [id, held] of peer.held) {
      const slot = load.table.find(held.workerId, held.dpRank);
      if (slot >= 0) {
        load.peerRouted(
          peer.origin,
          requestKey(id),
          slot,
          held.chain,
          held.blocks,
          held.prefillTokens,
          held.outputBlocks,
          held.decodeBlocks,
        );
        applied++;
      } else if (now - held.heldAtMs <= this.options.holdMs) continue;
      else this.counters.heldDropped++;
      peer.held.delete(id);
    }
    this.counters.heldApplied += applied;
    if (applied > 0) this.options.onApplied?.();
  }

  private holdPrediction(peer: Peer, held: HeldPrediction): void {
    const bytes = held.local.byteLength + 64;
    if (peer.heldPredictionBytes + bytes > HELD_PREDICTION_BYTES) {
      this.counters.predictions.heldDropped++;
      this.bad.report(
        "held_full",
        "too many predictions held for workers not known here; dropped",
        {
          peer: peer.replicaId,
        },
      );
      return;
    }
    this.counters.predictions.held++;
    peer.heldPredictions.push(held);
    peer.heldPredictionBytes += bytes;
  }

  /**
   * Held predictions whose worker is now known are applied, in the order they came;
   * those held too long are dropped; the rest stay.
   */
  private retryHeldPredictions(peer: Peer, now: number): void {
    const kept: HeldPrediction[] = [];
    let bytes = 0;
    for (const held of peer.heldPredictions) {
      const slot = this.options.load.table.find(held.workerId, held.dpRank);
      if (slot >= 0) {
        this.counters.predictions.heldApplied++;
        const { anchored, anchorHi, anchorLo, local } = held;
        this.applier.predict(slot, anchored, anchorHi, anchorLo, local, local.length >>> 1);
      } else if (now - held.heldAtMs > this.options.holdMs) this.counters.predictions.heldDropped++;
      else {
        kept.push(held);
        bytes += held.local.byteLength + 64;
      }
    }
    peer.heldPredictions = kept;
    peer.heldPredictionBytes = bytes;
  }

  private nextNonce(): number {
    this.nonce = (this.nonce + 1) >>> 0 || 1;
    return this.nonce;
  }

  private drop(reason: string, bytes: Uint8Array, fields: Record<string, unknown> = {}): void {
    this.counters.dropped.set(reason, (this.counters.dropped.get(reason) ?? 0) + 1);
    this.bad.report(reason, "bus message dropped", { bytes: bytes.length, ...fields });
  }
}

/**
 * A peer's request as the load tracker keys it: its handle's two 16-bit halves as a
 * two-unit string (peers' requests are named by handle on the bus, their ids not sent).
 */
export function requestKey(handle: number): string {
  return String.fromCharCode(handle >>> 16, handle & 0xffff);
}

/**
 * Applies one peer's facts to the load tracker (one object, reused: `peer` is set per
 * message). The message's workers are resolved to this process's slots once, before
 * its facts; a fact naming a worker not known here is held (`hold`).
 */
class Applier implements FactVisitor {
  peer!: Peer;
  private readonly slots: number[] = [];
  private workers: WorkerDictionary = { ids: [], ranks: [] };

  constructor(
    private readonly load: LoadTracker,
    private readonly predictions: Pick<
      Predictions,
      "isApproximate" | "apply" | "applyCorrection" | "applyOlder"
    > | null,
    private readonly counters: PeerCounters,
    private readonly hold: (peer: Peer, handle: number, held: Held) => void,
    private readonly holdPrediction: (peer: Peer, held: HeldPrediction) => void,
    private readonly now: () => number,
  ) {}

  begin(workers: WorkerDictionary): void {
    this.workers = workers;
    this.slots.length = 0;
    for (let i = 0; i < workers.ids.length; i++)
      this.slots.push(this.load.table.find(workers.ids[i]!, workers.ranks[i]!));
  }

  routed(
    id: number,
    worker: number,
    chain: Uint32Array,
    blocks: number,
    prefillTokens: number,
    outputBlocks: number,
    decodeBlocks: number | null,
  ): void {
    const peer = this.peer;
    this.counters.facts++;
    peer.held.delete(id);
    const slot = this.slots[worker]!;
    if (slot >= 0) {
      const load = this.load;
      load.peerRouted(
        peer.origin,
        requestKey(id),
        slot,
        chain,
        blocks,
        prefillTokens,
        outputBlocks,
        decodeBlocks,
      );
      return;
    }
    this.hold(peer, id, {
      workerId: this.workers.ids[worker]!,
      dpRank: this.workers.ranks[worker]!,
      chain: chain.slice(0, 2 * blocks),
      blocks,
      prefillTokens,
      outputBlocks,
      decodeBlocks,
      heldAtMs: this.now(),
    });
  }

  prefillDone(id: number): void {
    this.counters.facts++;
    const held = this.peer.held.get(id);
    if (held !== undefined) held.prefillTokens = 0;
    else this.load.peerPrefillDone(this.peer.origin, requestKey(id));
  }

  ended(id: number, _reason: EndReason, freed: number): void {
    this.counters.facts++;
    if (!this.peer.held.delete(id)) this.load.peerEnded(this.peer.origin, requestKey(id), freed);
  }

  decodeTotal(worker: number, blocks: number): void {
    const slot = this.slots[worker]!;
    if (slot >= 0) this.load.peerDecodeTotal(this.peer.origin, slot, blocks);
  }

  predicted(
    worker: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): void {
    this.counters.facts++;
    const slot = this.slots[worker]!;
    if (slot >= 0) {
      this.predict(slot, anchored, anchorHi, anchorLo, local, count);
      return;
    }
    this.holdPrediction(this.peer, {
      workerId: this.workers.ids[worker]!,
      dpRank: this.workers.ranks[worker]!,
      anchored,
      anchorHi,
      anchorLo,
      local: local.slice(0, 2 * count),
      heldAtMs: this.now(),
    });
  }

  predictedOlder(
    worker: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
    ageMs: number,
  ): void {
    this.counters.facts++;
    const slot = this.slots[worker]!;
    const counts = this.counters.predictions;
    const predictions = this.predictions;
    // A snapshot's predictions of a worker not known here are not held: the set comes once.
    if (slot < 0 || predictions === null || !predictions.isApproximate(slot))
      counts.notApproximate++;
    else if (predictions.applyOlder(slot, anchored, anchorHi, anchorLo, local, count, ageMs))
      counts.joined += count;
    else counts.unanchored++;
  }

  corrected(worker: number, shortfall: boolean, named: boolean, hi: number, lo: number): void {
    this.counters.facts++;
    const slot = this.slots[worker]!;
    const counts = this.counters.predictions;
    // A worker not known here has no predictions to correct: not held.
    if (slot >= 0 && this.predictions?.applyCorrection(slot, shortfall, named, hi, lo) === true)
      counts.corrections++;
    else counts.notApproximate++;
  }

  /** A peer's prediction on a slot known here: into this replica's predictions, counted by outcome. */
  predict(
    slot: number,
    anchored: boolean,
    anchorHi: number,
    anchorLo: number,
    local: Uint32Array,
    count: number,
  ): void {
    const counts = this.counters.predictions;
    const predictions = this.predictions;
    if (predictions === null || !predictions.isApproximate(slot)) counts.notApproximate++;
    else if (predictions.apply(slot, anchored, anchorHi, anchorLo, local, count)) counts.applied++;
    else counts.unanchored++;
  }
}
