/**
 * Warm restart glue between the router service and its snapshot file: what goes into
 * a snapshot (the index, each source's sequence position and trust), what a loaded one
 * gives back, and the writer that runs every `state.snapshot_interval_secs` and at
 * shutdown.
 */
import type { KvedgeCore } from "../core/core";
import { positionKey } from "../core/core";
import type { Logger } from "../util/log";
import { forEachOp, readSnapshotFile, type Snapshot, SnapshotError, encodeOps, writeSnapshotFile } from "./snapshot";

/** The service's state now, consistent (taken in one synchronous step). */
export function takeSnapshot(service: KvedgeCore): Snapshot {
  const { words, workerIds } = encodeOps(service.index.dump());
  return {
    blockSize: service.blockSize,
    createdAt: new Date().toISOString(),
    workerIds,
    words,
    positions: service.engineSources.map((source) => ({
      workerId: source.config.workerId,
      dpRank: source.config.dpRank,
      lastSeq: source.sequencer.lastSeq,
      fingerprint: source.sequencer.lastFingerprint,
      degraded: source.sequencer.isDegraded,
    })),
  };
}

/**
 * Loads the snapshot in `dir` into a service that has not started: the blocks of the
 * configured workers go into the index, their positions wait for their sources (whose
 * connect probe then continues from them, or rebuilds). Any problem: one log line,
 * nothing loaded.
 */
export function loadSnapshot(service: KvedgeCore, dir: string, configured: readonly bigint[], log: Logger): boolean {
  let snapshot: Snapshot | null;
  const started = performance.now();
  try {
    snapshot = readSnapshotFile(dir, service.blockSize);
  } catch (error) {
    const reason = error instanceof SnapshotError ? error.message : (error as Error).message;
    log.warn("snapshot refused; starting empty", { dir, reason });
    return false;
  }
  if (snapshot === null) {
    log.info("no snapshot; starting empty", { dir });
    return false;
  }
  const keep = new Set(configured);
  const index = service.index;
  try {
    forEachOp(snapshot, {
      stored: (workerId, dpRank, hasParent, parentHi, parentLo, external, local, count) => {
        if (keep.has(workerId)) index.applyStored(workerId, dpRank, hasParent, parentHi, parentLo, external, local, count);
      },
      removed: (workerId, dpRank, external, count) => {
        if (keep.has(workerId)) index.applyRemoved(workerId, dpRank, external, count);
      },
    });
  } catch (error) {
    for (const workerId of keep) index.removeWorker(workerId);
    log.warn("snapshot refused; starting empty", { dir, reason: (error as Error).message });
    return false;
  }
  for (const position of snapshot.positions) {
    if (keep.has(position.workerId)) service.restoredPositions.set(positionKey(position.workerId, position.dpRank), position);
  }
  log.info("snapshot loaded", {
    dir, created_at: snapshot.createdAt, blocks: index.stats().blocks, sources: service.restoredPositions.size,
    ms: Math.round(performance.now() - started),
  });
  return true;
}

/** Writes a snapshot now; logs and returns false on failure (the previous file stays). */
export function saveSnapshot(service: KvedgeCore, dir: string, log: Logger): boolean {
  const started = performance.now();
  try {
    const bytes = writeSnapshotFile(dir, takeSnapshot(service));
    log.debug("snapshot written", { dir, bytes, ms: Math.round(performance.now() - started) });
    return true;
  } catch (error) {
    log.error("snapshot write failed", { dir, error: (error as Error).message });
    return false;
  }
}
