/**
 * Warm restart glue between the router core and its snapshot file: what goes into
 * a snapshot (the index, each source's sequence position and trust, the active
 * requests), what a loaded one gives back, and the writer that runs every
 * `state.snapshot_interval_secs` and at shutdown.
 *
 * The periodic write does not stall routing: the index is copied in slices with its
 * writes paused meanwhile (src/index/write-pause.ts: the copy is the state at the
 * copy's start), the positions and active requests are taken in the turn the copy
 * starts, so all of it is one consistent view; the copy is then packed in slices of
 * SLICE_MS between turns of the event loop (src/index/pack.ts), and the file is
 * written with asynchronous I/O. At shutdown it is done in one go.
 */
import type { ActiveRequest, KvedgeCore } from "../core/core";
import { PackJob } from "../index/write-pause";
import type { Logger } from "../util/log";
import {
  forEachOp,
  putActive,
  readSnapshotFile,
  type Snapshot,
  SnapshotError,
  writeSnapshotFile,
} from "./snapshot";
import type { SourcePosition } from "../ingest/source";

/** Work per turn of the event loop. */
export const SLICE_MS = 1;

/**
 * A (worker, dp rank) as this file's sets of the snapshot's pairs key it (a load runs
 * once, before any slot: the pairs it keeps then take their slots in the core).
 */
const pairKey = (workerId: bigint, dpRank: number): string => `${workerId}:${dpRank}`;

/** A snapshot being taken: the consistent copy, packed on demand. */
interface Taking {
  readonly job: PackJob;
  /** Worker ids by active-request ref (renumbered after the index's at the end). */
  readonly activeIds: bigint[];
  readonly active: Uint32Array;
  readonly positions: SourcePosition[];
  readonly createdAt: string;
}

/** Copies everything a snapshot holds, now, in one synchronous step. */
function begin(core: KvedgeCore): Taking {
  const job = new PackJob(core.index, core.writes);
  // Refs of the active requests' workers follow the index's (known once packed).
  const activeIds: bigint[] = [];
  const refs = new Map<bigint, number>();
  const out = { words: new Uint32Array(1024) };
  let at = 0;
  core.forEachActiveRequest((workerId, dpRank, id, prefill, output, idleMs, chain, blocks) => {
    let ref = refs.get(workerId);
    if (ref === undefined) {
      refs.set(workerId, (ref = activeIds.length));
      activeIds.push(workerId);
    }
    at = putActive(out, at, ref, dpRank, id, prefill, output, idleMs, chain, blocks);
  });
  return {
    job,
    activeIds,
    active: out.words.subarray(0, at),
    createdAt: new Date().toISOString(),
    positions: core.engineSources.map((source) => ({
      workerId: source.config.workerId,
      dpRank: source.config.dpRank,
      lastSeq: source.sequencer.lastSeq,
      fingerprint: source.sequencer.lastFingerprint,
      degraded: source.sequencer.isDegraded,
      ranks: source.ranks,
    })),
  };
}

function finish(taking: Taking, blockSize: number): Snapshot {
  // The active requests go after the index's words, in the packer's output (no copy of the index).
  const packed = taking.job.result(taking.active);
  const workerIds = [...packed.workerIds];
  const refs = new Map(workerIds.map((id, ref) => [id, ref]));
  const renumber = taking.activeIds.map((id) => {
    let ref = refs.get(id);
    if (ref === undefined) {
      refs.set(id, (ref = workerIds.length));
      workerIds.push(id);
    }
    return ref;
  });
  const words = packed.words;
  const from = words.length - taking.active.length;
  forEachActiveRef(words, from, (at) => {
    words[at] = renumber[words[at]!]!;
  });
  return { blockSize, createdAt: taking.createdAt, positions: taking.positions, workerIds, words };
}

/** The core's state now, consistent, packed in one synchronous step (shutdown, tests). */
export function takeSnapshot(core: KvedgeCore): Snapshot {
  const taking = begin(core);
  while (!taking.job.step(Infinity));
  return finish(taking, core.blockSize);
}

/** The same snapshot as `takeSnapshot`, copied and packed in slices with turns between them. */
export async function takeSnapshotSliced(core: KvedgeCore, ms = SLICE_MS): Promise<Snapshot> {
  const taking = begin(core);
  await taking.job.run(ms);
  return finish(taking, core.blockSize);
}

/**
 * An active request read from a snapshot, waiting for its worker's slot: idle for what
 * it was at the snapshot plus the time since it was written, its chain a copy.
 */
export type SavedRequest = ActiveRequest;

/** A (worker, dp rank) a configured source is for. */
export interface ConfiguredSource {
  readonly worker_id: bigint;
  readonly dp_rank: number;
}

/**
 * Loads the snapshot in `dir` into a core that has not started: the blocks of the
 * (worker, dp rank) pairs a configured source serves go into the index, their positions
 * wait for their sources (whose connect probe then continues from them, or rebuilds;
 * until then they are not exact). Blocks of any other pair (a worker or rank the
 * configuration no longer has) are dropped: no stream would ever confirm or clear them.
 * Returns the saved active requests of served pairs (for `restoreRequests` once the
 * workers are added), or null when nothing was loaded. Any problem: one log line,
 * nothing loaded.
 */
export function loadSnapshot(
  core: KvedgeCore,
  dir: string,
  configured: readonly ConfiguredSource[],
  log: Logger,
): SavedRequest[] | null {
  const started = performance.now();
  const snapshot = readOrRefuse(dir, core.blockSize, log);
  if (snapshot === null) return null;
  const served = servedPairs(configured, snapshot.positions);
  const loaded = applyServed(core, snapshot, served);
  if (loaded instanceof Error) {
    log.warn("snapshot refused; starting empty", { dir, reason: loaded.message });
    return null;
  }
  let positions = 0;
  for (const position of snapshot.positions) {
    if (!served.has(pairKey(position.workerId, position.dpRank))) continue;
    core.restorePosition(position);
    positions++;
  }
  if (loaded.dropped.size > 0)
    log.warn("snapshot blocks dropped: no configured source serves their worker and dp rank", {
      dir,
      blocks: [...loaded.dropped.values()].reduce((sum, blocks) => sum + blocks, 0),
      ranks: [...loaded.dropped.keys()].join(","),
    });
  log.info("snapshot loaded", {
    dir,
    created_at: snapshot.createdAt,
    blocks: core.index.stats().blocks,
    sources: positions,
    active_requests: loaded.requests.length,
    ms: Math.round(performance.now() - started),
  });
  return loaded.requests;
}

function readOrRefuse(dir: string, blockSize: number, log: Logger): Snapshot | null {
  let snapshot: Snapshot | null;
  try {
    snapshot = readSnapshotFile(dir, blockSize);
  } catch (error) {
    const reason = error instanceof SnapshotError ? error.message : (error as Error).message;
    log.warn("snapshot refused; starting empty", { dir, reason });
    return null;
  }
  if (snapshot === null) log.info("no snapshot; starting empty", { dir });
  return snapshot;
}

/**
 * The (worker, dp rank) keys some configured source serves: its own, and every rank its
 * stream had published for when the snapshot was taken (a vLLM publisher names its rank
 * in each batch, which may differ from the configured one).
 */
function servedPairs(
  configured: readonly ConfiguredSource[],
  positions: readonly SourcePosition[],
): Set<string> {
  const own = new Set(configured.map((entry) => pairKey(entry.worker_id, entry.dp_rank)));
  const served = new Set(own);
  for (const position of positions) {
    if (!own.has(pairKey(position.workerId, position.dpRank))) continue;
    for (const rank of position.ranks) served.add(pairKey(position.workerId, rank));
  }
  return served;
}

interface Loaded {
  readonly requests: SavedRequest[];
  /** Blocks not loaded, per (worker, dp rank) key no configured source serves. */
  readonly dropped: Map<string, number>;
}

/** Applies the served pairs' operations to the index; an Error (index emptied of them) if one is malformed. */
function applyServed(core: KvedgeCore, snapshot: Snapshot, served: Set<string>): Loaded | Error {
  const index = core.index;
  const sinceWritten = Math.max(0, Date.now() - Date.parse(snapshot.createdAt)) || 0;
  const loaded: Loaded = { requests: [], dropped: new Map() };
  const keep = (workerId: bigint, dpRank: number, blocks: number): boolean => {
    const key = pairKey(workerId, dpRank);
    if (served.has(key)) return true;
    loaded.dropped.set(key, (loaded.dropped.get(key) ?? 0) + blocks);
    return false;
  };
  try {
    forEachOp(snapshot, {
      stored: (workerId, dpRank, hasParent, parentHi, parentLo, external, local, count) => {
        if (keep(workerId, dpRank, count))
          index.applyStored(
            workerId,
            dpRank,
            hasParent,
            parentHi,
            parentLo,
            external,
            local,
            count,
          );
      },
      removed: (workerId, dpRank, external, count) => {
        if (keep(workerId, dpRank, 0)) index.applyRemoved(workerId, dpRank, external, count);
      },
      tierStored: (workerId, dpRank, ...op) => {
        if (keep(workerId, dpRank, op[op.length - 1] as number))
          index.applyStoredTierUnder(workerId, dpRank, ...op);
      },
      active: (workerId, dpRank, id, prefillTokens, outputBlocks, idleMs, chain, blocks) => {
        if (!keep(workerId, dpRank, 0)) return;
        const idle = idleMs + sinceWritten;
        const saved: SavedRequest = [
          workerId,
          dpRank,
          id,
          prefillTokens,
          outputBlocks,
          idle,
          chain.slice(),
          blocks,
        ];
        loaded.requests.push(saved);
      },
    });
  } catch (error) {
    for (const workerId of new Set(snapshot.workerIds)) index.removeWorker(workerId);
    return error as Error;
  }
  return loaded;
}

/**
 * Puts saved active requests back into the load tracker (after the workers were added):
 * their load counts again until they finish or the rest of their TTL runs out. Ones
 * past the TTL, or whose worker is gone, are dropped (counted in the log line).
 */
export function restoreRequests(
  core: KvedgeCore,
  requests: readonly SavedRequest[],
  log: Logger,
): number {
  let restored = 0;
  for (const request of requests) if (core.restoreRequest(...request)) restored++;
  log.info("active requests restored", { restored, dropped: requests.length - restored });
  return restored;
}

/** Writes a snapshot now, packed in one go (shutdown); logs and resolves false on failure (the previous file stays). */
export function saveSnapshot(core: KvedgeCore, dir: string, log: Logger): Promise<boolean> {
  return write(() => Promise.resolve(takeSnapshot(core)), dir, log);
}

/** The periodic write: packed in slices. One at a time: a tick while one runs is skipped. */
export class PeriodicSnapshots {
  private running: Promise<boolean> | null = null;

  constructor(
    private readonly core: KvedgeCore,
    private readonly dir: string,
    private readonly log: Logger,
  ) {}

  /** Starts a write unless one is running; resolves true once the file is in place. */
  tick(): Promise<boolean> {
    this.running ??= write(() => takeSnapshotSliced(this.core), this.dir, this.log).finally(() => {
      this.running = null;
    });
    return this.running;
  }

  /** Waits for a running write (shutdown, before the final one). */
  async idle(): Promise<void> {
    await this.running;
  }
}

async function write(take: () => Promise<Snapshot>, dir: string, log: Logger): Promise<boolean> {
  const started = performance.now();
  try {
    const bytes = await writeSnapshotFile(dir, await take());
    log.debug("snapshot written", { dir, bytes, ms: Math.round(performance.now() - started) });
    return true;
  } catch (error) {
    log.error("snapshot write failed", { dir, error: (error as Error).message });
    return false;
  }
}

/** Calls `visit` with the word index of each active request's worker ref, from `at` (operations 3 only). */
function forEachActiveRef(words: Uint32Array, at: number, visit: (refAt: number) => void): void {
  while (at < words.length) {
    visit(at + 1);
    at += 8 + ((words[at + 3]! + 1) >>> 1) + 2 * words[at + 7]!;
  }
}
