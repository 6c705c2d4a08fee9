/**
 * `serve --cluster-nats URL`: this process's ClusterNode (./node.ts) over core NATS.
 *
 * Subjects, all under `cluster.name` (N): `N.facts` (every replica's facts batches and
 * heartbeats; each subscribes to it), `N.sync` (sync requests), and this process's own
 * inbox `N.inbox.<replica>.<epoch>` for the snapshots answering them. The connection
 * never gives up (reconnects forever), pings every second so a dead server is seen in
 * seconds, and does not echo a replica its own messages.
 *
 * Starting (`Cluster.start`), before the port opens: connect, ask every replica for its
 * set, and wait until every replica heard of has had its set installed, bounded by
 * `cluster.join_timeout_ms`; past it, this process starts alone and says so. While NATS
 * is unreachable routing goes on with what is known (`degraded`, with since when); core
 * NATS drops what is published meanwhile, which the peers see as a gap in this
 * replica's seq at its first heartbeat after the reconnect, and fetch its set.
 */
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import {
  AuthorizationError,
  credsAuthenticator,
  type NatsConnection,
  type NodeConnectionOptions,
  nkeyAuthenticator,
  type Subscription,
  UserAuthenticationExpiredError,
} from "@nats-io/transport-node";
import type { Config } from "../config";
import type { KvedgeCore } from "../core/core";
import type { Logger } from "../util/log";
import { REPLICA_ID } from "./codec";
import { ClusterNode, type NodeTransport } from "./node";
import { onTheLoop } from "./outbox";
import { connectNats } from "./transport";

/** Unflushed bytes past which a flush is started. */
const FLUSH_BYTES = 1024 * 1024;
/** Unflushed bytes past which nothing more is published (the server is stuck): receivers see gaps. */
const UNFLUSHED_MAX = 16 * 1024 * 1024;
/** How long peers' messages are waited for after the join request when none has answered. */
const HEARD_WAIT_HEARTBEATS = 1.5;
const STOP_DRAIN_MS = 2000;
/** Between attempts of the first connection (then the client's own reconnects take over). */
const RETRY_MS = 250;

export type ClusterState = "connected" | "degraded";

/** `GET /v1/status`'s cluster part (and /v1/workers', the status page's, the metrics'). */
export interface ClusterStatus {
  readonly state: ClusterState;
  /** Wall-clock ms since when the state holds. */
  readonly since_ms: number;
  readonly name: string;
  readonly replica_id: string;
  readonly epoch: number;
  readonly seq: number;
  readonly server: string | null;
  readonly peers: readonly PeerStatus[];
}

export interface PeerStatus {
  readonly replica_id: string;
  readonly epoch: number;
  readonly state: "synced" | "syncing";
  readonly heard_ms_ago: number;
  /** Its requests applied here, and as many as it announced in its last heartbeat. */
  readonly requests: number;
  readonly announced_requests: number;
  readonly applied_seq: number;
  readonly published_seq: number;
  readonly lag_ms: number;
  /** Its requests held here for workers not known yet. */
  readonly held: number;
}

export class Cluster {
  readonly node: ClusterNode;
  readonly counters = { published: 0, publishedBytes: 0, backpressure: 0, disconnects: 0 };
  /** Told how late each applied facts batch arrived (ms); the metrics set it. */
  onLag: ((ms: number) => void) | null = null;
  private nc: NatsConnection | null = null;
  private readonly subscriptions: Subscription[] = [];
  private state: ClusterState = "degraded";
  private sinceMs = Date.now();
  private unflushed = 0;
  private flushing = false;
  private heartbeats: ReturnType<typeof setInterval> | null = null;
  /** The pause before the next first-connection attempt, and how to end it early. */
  private retry: ReturnType<typeof setTimeout> | null = null;
  private wakeRetry: () => void = () => {};
  private stopped = false;
  private readonly inbox: string;
  private readonly heartbeatMs: number;

  private constructor(
    private readonly config: Config["cluster"],
    private readonly core: KvedgeCore,
    private readonly log: Logger,
  ) {
    const replicaId = config.replica_id ?? defaultReplicaId();
    const epoch = crypto.getRandomValues(new Uint32Array(1))[0]! || 1;
    this.heartbeatMs = Math.max(100, Math.floor(config.lease_ms / 5));
    this.inbox = `${config.name}.inbox.${replicaId}.${epoch}`;
    this.node = new ClusterNode({
      replicaId,
      epoch,
      load: core.router.load,
      predictions: core.predictions,
      workers: core.workerTable,
      transport: this.transport(),
      leaseMs: config.lease_ms,
      syncTimeoutMs: Math.max(1000, config.lease_ms),
      holdMs: Math.max(30_000, 10 * config.lease_ms),
      now: () => performance.now(),
      schedule: onTheLoop,
      log,
      chains: core.router.policy === "dynamo",
      onApplied: () => core.peerLoadChanged(),
      onLag: (ms) => this.onLag?.(ms),
    });
    core.replicaRank = () => this.rank();
  }

  /** This replica's place among the fleet's replica ids (0 = first): its turn, with cluster.stagger_ms. */
  rank(): number {
    const own = this.node.replicaId;
    let rank = 0;
    for (const id of this.node.peers.peers.keys()) if (id < own) rank++;
    return rank;
  }

  /**
   * Connects and joins (bounded by cluster.join_timeout_ms): returns once this replica
   * holds every peer's set, or alone (logged) when NATS or the peers did not answer in time.
   */
  static async start(config: Config["cluster"], core: KvedgeCore, log: Logger): Promise<Cluster> {
    if (config.nats_url === null) throw new Error("no cluster.nats_url");
    const cluster = new Cluster(config, core, log);
    await cluster.join();
    return cluster;
  }

  private async join(): Promise<void> {
    const started = performance.now();
    const deadline = started + this.config.join_timeout_ms;
    this.heartbeats = setInterval(() => this.node.heartbeat(), this.heartbeatMs);
    this.heartbeats.unref?.();
    const connecting = this.connectUntilUp();
    const nc = await Promise.race([
      connecting,
      sleep(this.config.join_timeout_ms).then(() => null),
    ]);
    if (nc === null) {
      this.log.warn("cluster: NATS not reachable; starting alone (degraded), joining once it is", {
        servers: this.config.nats_url,
        replica_id: this.node.replicaId,
      });
      connecting.then(
        (late) => late !== null && void this.attached(late).catch((error) => this.failed(error)),
        (error) => this.failed(error),
      );
      return;
    }
    await this.attached(nc);
    const heardBy = performance.now() + HEARD_WAIT_HEARTBEATS * this.heartbeatMs;
    while (performance.now() < deadline) {
      const peers = this.node.peers;
      if (peers.complete && (peers.peers.size > 0 || performance.now() > heardBy)) break;
      await sleep(5);
    }
    this.logJoined(performance.now() - started);
  }

  private logJoined(ms: number): void {
    const peers = this.node.peers;
    const fields = {
      replica_id: this.node.replicaId,
      peers: [...peers.peers.keys()].join(",") || null,
      peer_requests: this.core.router.load.peerRequestCount,
      ms: Math.round(ms),
    };
    if (!peers.complete)
      this.log.warn("cluster: not every peer's set came in time; starting with what came", fields);
    else if (peers.peers.size === 0)
      this.log.info("cluster: no peer answered; starting alone", fields);
    else this.log.info("cluster joined", fields);
  }

  /**
   * The first connection: tried again every RETRY_MS until it is up (the client itself
   * reconnects forever after that) or the cluster stops (null). A refused credential
   * throws: it is a configuration to fix, not an outage to wait out.
   */
  private async connectUntilUp(): Promise<NatsConnection | null> {
    for (let attempt = 1; !this.stopped; attempt++) {
      try {
        return await connectNats(this.connectOptions());
      } catch (error) {
        if (error instanceof AuthorizationError || error instanceof UserAuthenticationExpiredError)
          throw error;
        if (attempt === 1)
          this.log.debug("cluster: NATS connect failed; trying again", { error: String(error) });
      }
      await new Promise<void>((resolve) => {
        this.retry = setTimeout(resolve, RETRY_MS);
        this.wakeRetry = resolve;
      });
    }
    return null;
  }

  /** The connection is up: subscribe, watch its status, ask every replica for its set. */
  private async attached(nc: NatsConnection): Promise<void> {
    if (this.stopped) {
      await nc.close();
      return;
    }
    this.nc = nc;
    const name = this.config.name;
    const receive = (data: Uint8Array, reply: string | null) => {
      try {
        this.node.receive(data, reply);
      } catch (error) {
        this.log.error("cluster: a bus message could not be applied", { error: String(error) });
      }
    };
    this.subscriptions.push(
      nc.subscribe(`${name}.facts`, { callback: (_e, msg) => receive(msg.data, null) }),
      nc.subscribe(`${name}.sync`, { callback: (_e, msg) => receive(msg.data, msg.reply ?? null) }),
      // An empty message there is NATS's "no responders" status (no replica but this one yet).
      nc.subscribe(this.inbox, {
        callback: (_e, msg) => {
          if (msg.data.length > 0) receive(msg.data, null);
        },
      }),
    );
    await nc.flush(); // the subscriptions are in place before anyone is asked
    this.setState("connected");
    this.log.info("cluster: connected to NATS", {
      server: nc.getServer(),
      replica_id: this.node.replicaId,
    });
    void this.watch(nc);
    this.node.heartbeat();
    this.node.join();
  }

  private async watch(nc: NatsConnection): Promise<void> {
    for await (const status of nc.status()) {
      if (status.type === "disconnect") {
        this.counters.disconnects++;
        this.setState("degraded");
        this.log.warn("cluster: NATS connection lost; deciding on what is known (degraded)", {
          server: String(status.server ?? ""),
        });
      } else if (status.type === "reconnect") {
        this.unflushed = 0;
        this.setState("connected");
        this.log.info("cluster: NATS connection back", { server: String(status.server ?? "") });
        // Peers see what they missed of this replica's stream at once, and ask for its set.
        this.node.heartbeat();
      }
    }
  }

  private failed(error: unknown): void {
    if (this.stopped) return;
    this.log.error("cluster: NATS connection failed for good", { error: String(error) });
  }

  private setState(state: ClusterState): void {
    if (this.state === state) return;
    this.state = state;
    this.sinceMs = Date.now();
  }

  /** How this replica's messages go out: published while connected, never past the bound. */
  private transport(): NodeTransport {
    const name = this.config.name;
    return {
      broadcast: (message) => this.publish(`${name}.facts`, message),
      ask: (message) => void this.publish(`${name}.sync`, message, this.inbox),
      answer: (replyTo, chunks) => {
        for (const chunk of chunks) this.publish(replyTo, chunk);
      },
    };
  }

  private publish(subject: string, message: Uint8Array, reply?: string): boolean {
    const nc = this.nc;
    if (nc === null || this.state !== "connected" || nc.isClosed()) return false;
    if (this.unflushed > UNFLUSHED_MAX) {
      this.counters.backpressure++;
      return false;
    }
    try {
      nc.publish(subject, message, reply === undefined ? undefined : { reply });
    } catch (error) {
      this.log.warn("cluster: publish refused", { subject, error: String(error) });
      return false;
    }
    this.counters.published++;
    this.counters.publishedBytes += message.length;
    this.unflushed += message.length;
    if (this.unflushed >= FLUSH_BYTES && !this.flushing) this.flushSoon(nc);
    return true;
  }

  private flushSoon(nc: NatsConnection): void {
    this.flushing = true;
    const sent = this.unflushed;
    nc.flush().then(
      () => {
        this.unflushed = Math.max(0, this.unflushed - sent);
        this.flushing = false;
      },
      () => {
        this.flushing = false;
      },
    );
  }

  status(): ClusterStatus {
    const now = performance.now();
    const load = this.core.router.load;
    return {
      state: this.state,
      since_ms: this.sinceMs,
      name: this.config.name,
      replica_id: this.node.replicaId,
      epoch: this.node.epoch,
      seq: this.node.outbox.seq,
      server: this.state === "connected" ? (this.nc?.getServer() ?? null) : null,
      peers: [...this.node.peers.peers.values()]
        .map((peer) => ({
          replica_id: peer.replicaId,
          epoch: peer.epoch,
          state: peer.syncing ? ("syncing" as const) : ("synced" as const),
          heard_ms_ago: Math.round(now - peer.lastHeardMs),
          requests: load.originCount(peer.origin),
          announced_requests: peer.announced,
          applied_seq: peer.applied,
          published_seq: peer.published,
          lag_ms: peer.lagMs,
          held: peer.held.size,
        }))
        .sort((a, b) => (a.replica_id < b.replica_id ? -1 : 1)),
    };
  }

  /** Leaves: the last facts and a heartbeat that says so go out; the connection drains. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    if (this.heartbeats !== null) clearInterval(this.heartbeats);
    if (this.retry !== null) clearTimeout(this.retry);
    this.wakeRetry();
    this.node.leave();
    this.core.peerLoadChanged();
    const nc = this.nc;
    if (nc === null) return;
    await Promise.race([nc.drain().catch(() => {}), sleep(STOP_DRAIN_MS)]);
    if (!nc.isClosed()) await nc.close();
  }

  private connectOptions(): NodeConnectionOptions {
    const c = this.config;
    const options: NodeConnectionOptions = {
      servers: c.nats_url!.split(","),
      name: `kvedge ${this.node.replicaId}`,
      noEcho: true,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      pingInterval: 1000,
      maxPingOut: 2,
      timeout: 2000,
    };
    if (c.token !== null) options.token = c.token;
    if (c.user !== null) {
      options.user = c.user;
      options.pass = c.password ?? "";
    }
    if (c.credentials_file !== null)
      options.authenticator = credsAuthenticator(readFileSync(c.credentials_file));
    if (c.nkey_seed_file !== null)
      options.authenticator = nkeyAuthenticator(
        new TextEncoder().encode(readFileSync(c.nkey_seed_file, "utf8").trim()),
      );
    if (c.tls_ca_file !== null || c.tls_cert_file !== null || c.nats_url!.startsWith("tls://")) {
      options.tls = {
        ...(c.tls_ca_file === null ? {} : { caFile: c.tls_ca_file }),
        ...(c.tls_cert_file === null ? {} : { certFile: c.tls_cert_file }),
        ...(c.tls_key_file === null ? {} : { keyFile: c.tls_key_file }),
      };
    }
    return options;
  }
}

/** Host name, process id and a random suffix, within what a replica id may hold. */
function defaultReplicaId(): string {
  const host =
    hostname()
      .replace(/[^A-Za-z0-9._-]/g, "-")
      .slice(0, 40) || "kvedge";
  const suffix = crypto.getRandomValues(new Uint32Array(1))[0]!.toString(36);
  const id = `${host}-${process.pid}-${suffix}`;
  return REPLICA_ID.test(id) ? id : `kvedge-${process.pid}-${suffix}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
