/**
 * kvedge's router as N replicas in virtual time: request i is routed by replica
 * i mod N and its lifecycle calls go to the same replica, as behind a plain load
 * balancer. Synced, each replica's own facts travel to the others through the real
 * cluster code (src/cluster: outbox, codec, peer set) on an in-memory bus that delivers
 * them `syncDelayMs` later in model time; unsynced, each decides on its own load only.
 * With `staggerMs`, replica k answers each route k × staggerMs late (cluster.stagger_ms),
 * the delay counted in the request's TTFT.
 */
import { LocalBus } from "../cluster/local-bus";
import { ClusterNode } from "../cluster/node";
import { CONTESTED_MARGIN } from "../core/core";
import { silentLogger } from "../util/log";
import type { HeldAnswer, KvAwareModel, RouteQuery, RoutingPolicy } from "./policies";

/** Never reached in a replay: peers are never dropped for silence. */
const FOREVER_MS = 1e15;

export interface ReplicaOptions {
  /** How late each replica applies its peers' facts (model ms); null: never (no bus). */
  readonly syncDelayMs: number | null;
  /** Replica k answers each route k × this late (model ms); 0: at once. */
  readonly staggerMs?: number;
}

interface Staggered {
  readonly query: RouteQuery;
  readonly dueMs: number;
}

export class ReplicatedKvAware implements RoutingPolicy {
  readonly name = "kv_aware_model";
  readonly nodes: ClusterNode[] = [];
  private readonly bus: LocalBus | null;
  private readonly staggerMs: number;
  /** Routes waiting for their replica's turn, earliest due first. */
  private staggered: Staggered[] = [];
  private answers: HeldAnswer[] = [];

  constructor(
    readonly replicas: readonly KvAwareModel[],
    options: ReplicaOptions,
  ) {
    if (replicas.length < 1) throw new RangeError("at least one replica");
    this.staggerMs = options.staggerMs ?? 0;
    const delay = options.syncDelayMs;
    this.bus = delay === null ? null : new LocalBus(delay);
    const bus = this.bus;
    if (bus === null) return;
    replicas.forEach((replica, i) => {
      const load = replica.router.load;
      const node = new ClusterNode({
        replicaId: `r${i}`,
        epoch: i + 1,
        load,
        predictions: replica.fleet?.predictions ?? null,
        workers: load.table,
        transport: bus.transport(`r${i}`),
        leaseMs: FOREVER_MS,
        syncTimeoutMs: FOREVER_MS,
        holdMs: FOREVER_MS,
        now: () => bus.nowMs,
        wallNow: () => bus.nowMs,
        schedule: null,
        log: silentLogger,
        chains: replica.router.policy === "dynamo",
        onApplied: () => replica.admission?.release(),
      });
      bus.attach(node);
      this.nodes.push(node);
    });
  }

  /** Bytes and messages the replicas sent each other (null: no bus). */
  get busCounters(): { messages: number; bytes: number } | null {
    return this.bus?.counters ?? null;
  }

  route(query: RouteQuery, nowMs: number): number {
    this.sync(nowMs);
    const replica = this.replicaOf(query.id);
    const rank = query.id % this.replicas.length;
    // As KvedgeCore.submitRoute: only a contested decision waits for its replica's turn.
    const delay =
      rank > 0 && this.staggerMs > 0 && replica.margin(query, nowMs) <= CONTESTED_MARGIN
        ? rank * this.staggerMs
        : 0;
    if (delay > 0) {
      const dueMs = nowMs + delay;
      let at = this.staggered.length;
      while (at > 0 && this.staggered[at - 1]!.dueMs > dueMs) at--;
      this.staggered.splice(at, 0, { query, dueMs });
      return -1;
    }
    const worker = replica.route(query, nowMs);
    this.flush();
    return worker;
  }

  prefillDone(id: number, nowMs: number, cachedTokens?: number): void {
    this.sync(nowMs);
    this.replicaOf(id).prefillDone(id, nowMs, cachedTokens);
    this.flush();
  }

  finished(id: number, nowMs: number): void {
    this.sync(nowMs);
    this.replicaOf(id).finished(id, nowMs);
    this.flush();
  }

  takeAnswers(): HeldAnswer[] {
    const answers = this.answers;
    this.answers = [];
    for (const replica of this.replicas) answers.push(...replica.takeAnswers());
    return answers;
  }

  nextDueMs(): number {
    let due = Math.min(this.bus?.nextDueMs() ?? Infinity, this.staggered[0]?.dueMs ?? Infinity);
    for (const replica of this.replicas) due = Math.min(due, replica.nextDueMs());
    return due;
  }

  advance(nowMs: number): void {
    this.sync(nowMs);
    while (this.staggered.length > 0 && this.staggered[0]!.dueMs <= nowMs) {
      const { query } = this.staggered.shift()!;
      const worker = this.replicaOf(query.id).route(query, nowMs);
      // Routed at once, or held by admission (answered through its replica's answers).
      if (worker >= 0) this.answers.push({ query, worker });
      this.flush();
      this.sync(nowMs);
    }
    this.flush();
  }

  private replicaOf(id: number): KvAwareModel {
    return this.replicas[id % this.replicas.length]!;
  }

  /** Every replica's clock to `nowMs`, then the facts due by then are applied. */
  private sync(nowMs: number): void {
    for (const replica of this.replicas) replica.advance(nowMs);
    const bus = this.bus;
    if (bus === null) return;
    bus.nowMs = nowMs;
    bus.deliver(nowMs);
  }

  private flush(): void {
    for (const node of this.nodes) node.flush();
  }
}
