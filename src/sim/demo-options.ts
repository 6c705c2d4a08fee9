/** What `kvedge demo` runs: its options and the policies it can compare. */
import type { StreamCut } from "./lost-streams";
import type { KvAwareConfig } from "./policies";
import type { TimeModel } from "./time-model";
import type { Trace } from "./trace";

export const DEMO_POLICIES = [
  "kv_aware",
  "kv_aware_unsynced",
  "round_robin",
  "random",
  "least_loaded",
  "approx_prefix",
  "kv_aware_model",
] as const;
export type DemoPolicy = (typeof DEMO_POLICIES)[number];
export const DEFAULT_DEMO_POLICIES: readonly DemoPolicy[] = [
  "kv_aware",
  "round_robin",
  "random",
  "least_loaded",
  "approx_prefix",
];

/** Which mock engines publish KV events: all (exact), half (odd engines approximate), none. */
export const DEMO_EVENTS = ["all", "mixed", "none"] as const;
export type DemoEvents = (typeof DEMO_EVENTS)[number];

/** The engines that publish no events under `events` (kvedge predicts their caches). */
export function approximateEngines(events: DemoEvents, workers: number): number[] {
  if (events === "all") return [];
  const all = Array.from({ length: workers }, (_, w) => w);
  return events === "none" ? all : all.filter((w) => w % 2 === 1);
}

export function isDemoPolicy(name: string): name is DemoPolicy {
  return (DEMO_POLICIES as readonly string[]).includes(name);
}

export interface DemoOptions {
  /** The trace to replay (already cut to the requests and time scale wanted). */
  readonly trace: Trace;
  readonly workers: number;
  readonly capacityBlocks: number;
  /** Each engine's CPU offload tier in blocks (0: none); with kv_aware, also a tier comparison. */
  readonly cpuCapacityBlocks: number;
  readonly blockSize: number;
  readonly speedup: number;
  readonly policies: readonly DemoPolicy[];
  readonly seed: number;
  readonly time: TimeModel;
  readonly vocabSize: number;
  readonly form: "array" | "map";
  readonly realtimeBaselines: boolean;
  /**
   * Everything in virtual time: kv_aware is kvedge's router in-process (the real
   * `Router`, told each engine's true cache as its overlaps), no kvedge serve.
   */
  readonly virtual?: boolean;
  /** kv_aware's router settings in virtual time (default: route policy ttft, the engines' constants). */
  readonly kvAware?: KvAwareConfig;
  /** Extra `kvedge serve` arguments (e.g. --cpus). */
  readonly serveArgs: readonly string[];
  /** How to start kvedge (default: this executable). */
  readonly kvedgeCommand?: readonly string[];
  /** Progress lines ("" when a phase ends); null: silent. */
  readonly progress: ((line: string) => void) | null;
  /** kv_aware through `kvedge serve --proxy` (OpenAI API) instead of the routing API (./proxy-replay.ts). */
  readonly proxy?: boolean;
  /** Which engines publish KV events (default all); the others are kvedge's approximate workers. */
  readonly events?: DemoEvents;
  /** The capacity kvedge is told for approximate workers, blocks (default: the engines' real one). */
  readonly predictedCapacityBlocks?: number;
  /**
   * kvedge hears the cached tokens each engine served (prefill_done's cached_tokens; the
   * proxy reads usage) and corrects its predictions (default true).
   */
  readonly correct?: boolean;
  /**
   * kvedge as this many replicas (default 1), request i to replica i mod N: kv_aware
   * shares their facts over a local nats-server, kv_aware_unsynced runs them without it.
   */
  readonly replicas?: number;
  /** Virtual time, kv_aware with replicas: how late each replica applies its peers' facts (ms). */
  readonly syncDelayMs?: number;
  /** kv_aware with replicas: cluster.stagger_ms (model ms in virtual time, wall ms in real time). */
  readonly staggerMs?: number;
  /**
   * Virtual time: engines whose event streams are cut, kvedge's index of them losing
   * what they published during the cut (./lost-streams.ts); degraded from then on.
   */
  readonly streamCut?: StreamCut;
}

/** The policies a replicated demo runs by default: synced, unsynced, then the baselines. */
export function defaultDemoPolicies(replicas: number): DemoPolicy[] {
  return replicas > 1
    ? ["kv_aware", "kv_aware_unsynced", ...DEFAULT_DEMO_POLICIES.slice(1)]
    : [...DEFAULT_DEMO_POLICIES];
}
