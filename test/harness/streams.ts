/**
 * Seeded event streams for the differential harness.
 *
 * A stream has a small universe of documents (local-hash sequences that share
 * prefixes and reuse a tiny alphabet, so the same block content appears at the same
 * position after different prefixes), a pool of workers (ids small and huge, several
 * dp ranks, engine seeds shared by some workers), and a list of operations chosen
 * with the reference model's state in view: stores under held parents (including
 * blocks left unreachable by a mid-chain removal), re-stores of held blocks (each one
 * more copy, as vLLM announces a second physical copy of a chain), exact copies of a
 * held run, unknown parents, removals of tails, heads, middles and scattered sets (plus
 * unknown and repeated hashes; with copies, a removal may take one copy of several),
 * cleared, remove_worker and re-added workers. With `conflicts`, a few stores break the
 * engine-hash invariant on purpose.
 *
 * External hashes follow an engine: ext(block) = chain(engine seed, path), so one
 * local chain maps to one external chain per worker, as real engines guarantee.
 */
import { ReferenceIndex } from "../../src/index/reference/reference";
import { type KvIndex, TIER_ANY, TIER_NAMES } from "../../src/index/types";

export type HarnessOp =
  | {
      kind: "stored";
      worker: bigint;
      rank: number;
      parent: bigint | null;
      external: bigint[];
      local: bigint[];
    }
  | { kind: "removed"; worker: bigint; rank: number; external: bigint[] }
  | { kind: "cleared"; worker: bigint; rank: number }
  | { kind: "remove_worker"; worker: bigint }
  /** A lower tier's store (tier 1..3), its parent named by external hash in any tier. */
  | {
      kind: "tier_stored";
      worker: bigint;
      rank: number;
      tier: number;
      parent: bigint | null;
      external: bigint[];
      local: bigint[];
    }
  /** A lower tier's removal; TIER_ANY: a removal of unknown medium (the device's and every lower tier's). */
  | { kind: "tier_removed"; worker: bigint; rank: number; tier: number; external: bigint[] };

export interface Stream {
  readonly seed: number;
  readonly ops: HarnessOp[];
  /** Local-hash sequences to query. */
  readonly queries: bigint[][];
}

export interface StreamOptions {
  steps: number;
  /** Include stores that break the engine-hash invariant. */
  conflicts?: boolean;
  /** Most workers present at once (the index's capacity); streams may ask for more. */
  maxWorkers?: number;
  /** 8..40 worker ids instead of 1..4 (long owner lists on shared blocks). */
  manyWorkers?: boolean;
  /** Lower-tier stores and removals too (host, disk, external; removals of unknown medium). */
  tiers?: boolean;
}

const MASK64 = (1n << 64n) - 1n;

/** A small seeded PRNG (mulberry32): the same stream in every process for a seed. */
export class Random {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }

  u64(): bigint {
    return (
      (BigInt(Math.floor(this.next() * 2 ** 32)) << 32n) | BigInt(Math.floor(this.next() * 2 ** 32))
    );
  }
}

/** The next external hash of an engine's chain (vLLM-like: hash of parent and block). */
export function nextExternal(engineSeed: bigint, parent: bigint, local: bigint): bigint {
  let h = (parent ^ engineSeed ^ (local * 0x9e3779b97f4a7c15n)) & MASK64;
  h = ((h ^ (h >> 33n)) * 0xff51afd7ed558ccdn) & MASK64;
  h = ((h ^ (h >> 33n)) * 0xc4ceb9fe1a85ec53n) & MASK64;
  return (h ^ (h >> 33n)) & MASK64;
}

interface WorkerSpec {
  readonly id: bigint;
  readonly rank: number;
  readonly engine: bigint;
}

/** A document: its local hashes and the reference's key of each prefix (keys[j] = first j+1 blocks). */
interface Doc {
  readonly local: bigint[];
  readonly keys: string[];
}

export function generateStream(seed: number, options: StreamOptions): Stream {
  const random = new Random(seed);
  const alphabet = [1n, 2n, 3n, 4n, 5n];
  if (random.chance(0.3)) alphabet.push(random.u64(), random.u64());
  const docs = makeDocuments(random, alphabet).map((local) => {
    const keys: string[] = [];
    let key = "";
    for (const block of local) keys.push((key += `/${block}`));
    return { local, keys };
  });
  const workers = makeWorkers(random, options.manyWorkers ?? false);
  const oracle = new ReferenceIndex(1, { maxWorkers: options.maxWorkers ?? 65_536 });
  const ops: HarnessOp[] = [];
  const cache = new Map<string, bigint>();
  /** The worker's engine hash of the document's first `length` blocks. */
  const externalOf = (worker: WorkerSpec, doc: Doc, length: number): bigint => {
    const key = `${worker.engine}${doc.keys[length - 1]}`;
    let hash = cache.get(key);
    if (hash === undefined) {
      hash = nextExternal(
        worker.engine,
        length === 1 ? 0n : externalOf(worker, doc, length - 1),
        doc.local[length - 1]!,
      );
      cache.set(key, hash);
    }
    return hash;
  };
  for (let step = 0; step < options.steps; step++) {
    const worker = random.pick(workers);
    const roll = random.next();
    let op: HarnessOp;
    if (roll < 0.45) op = storeOp(random, worker, docs, oracle, externalOf);
    else if (roll < 0.5) op = copyOp(random, worker, docs, oracle, externalOf);
    else if (roll < 0.84) op = removeOp(random, worker, docs, oracle, externalOf);
    else if (roll < 0.89) op = { kind: "cleared", worker: worker.id, rank: worker.rank };
    else if (roll < 0.93) op = { kind: "remove_worker", worker: worker.id };
    else if (options.conflicts && roll < 0.97)
      op = conflictOp(random, worker, docs, oracle, externalOf);
    else op = storeOp(random, worker, docs, oracle, externalOf);
    if (options.tiers && random.chance(0.4)) {
      op = tierOp(random, worker, docs, oracle, externalOf);
      if (options.conflicts && op.kind === "tier_stored" && random.chance(0.15)) {
        // A hash this tier already names another block with, or a renamed block.
        const held = oracle.tierHashes(worker.id, worker.rank, op.tier);
        const at = random.int(op.external.length);
        op.external[at] = held.length > 0 && random.chance(0.5) ? random.pick(held) : random.u64();
      }
    }
    applyHarnessOp(oracle, op);
    ops.push(op);
  }
  return {
    seed,
    ops,
    queries: makeQueries(
      random,
      docs.map((doc) => doc.local),
      alphabet,
    ),
  };
}

function makeDocuments(random: Random, alphabet: readonly bigint[]): bigint[][] {
  const docs: bigint[][] = [];
  const count = 3 + random.int(6);
  for (let d = 0; d < count; d++) {
    let doc: bigint[] = [];
    if (docs.length > 0 && random.chance(0.7)) {
      const base = random.pick(docs);
      doc = base.slice(0, 1 + random.int(base.length));
    }
    const extra = 1 + random.int(10);
    for (let i = 0; i < extra; i++) doc.push(random.pick(alphabet));
    docs.push(doc);
  }
  return docs;
}

function makeWorkers(random: Random, many: boolean): WorkerSpec[] {
  const ids = many ? 8 + random.int(33) : 1 + random.int(4);
  const engines = [random.u64(), random.u64()];
  const workers: WorkerSpec[] = [];
  for (let w = 0; w < ids; w++) {
    const id = random.chance(0.3) ? (1n << 63n) + BigInt(w) : BigInt(w + 1);
    const engine = random.chance(0.5) ? engines[0]! : random.pick(engines);
    const ranks = 1 + random.int(3);
    for (let rank = 0; rank < ranks; rank++)
      workers.push({ id, rank: rank === 0 ? 0 : rank * 7, engine });
  }
  return workers;
}

type ExternalOf = (worker: WorkerSpec, doc: Doc, length: number) => bigint;

function storeOp(
  random: Random,
  worker: WorkerSpec,
  docs: Doc[],
  oracle: ReferenceIndex,
  externalOf: ExternalOf,
): HarnessOp {
  const doc = random.pick(docs);
  const length = doc.local.length;
  const held = oracle.heldPaths(worker.id, worker.rank);
  // Start under a block the worker holds (or the root); sometimes under one it does not.
  const starts = [0];
  for (let j = 1; j < length; j++) if (held.has(doc.keys[j - 1]!)) starts.push(j);
  const start = random.chance(0.85) ? random.pick(starts) : random.int(length);
  const end = random.chance(0.6) ? length : start + 1 + random.int(length - start);
  let parent: bigint | null = start === 0 ? null : externalOf(worker, doc, start);
  if (parent !== null && random.chance(0.05)) parent = random.u64(); // unknown parent
  const local = doc.local.slice(start, end);
  const external: bigint[] = [];
  for (let j = start + 1; j <= end; j++) external.push(externalOf(worker, doc, j));
  return { kind: "stored", worker: worker.id, rank: worker.rank, parent, external, local };
}

function removeOp(
  random: Random,
  worker: WorkerSpec,
  docs: Doc[],
  oracle: ReferenceIndex,
  externalOf: ExternalOf,
): HarnessOp {
  const held = [...oracle.heldPaths(worker.id, worker.rank).values()];
  let external: bigint[] = [];
  const mode = random.int(5);
  if (held.length > 0 && mode === 0) {
    external = [random.pick(held)]; // one block, often mid-chain
  } else if (held.length > 0 && mode === 1) {
    const count = 1 + random.int(held.length);
    for (let i = 0; i < count; i++) external.push(random.pick(held)); // scattered (repeats are unknown the 2nd time)
  } else {
    // A run of one document's held blocks: from the head, from the tail, or all.
    const doc = random.pick(docs);
    const heldPaths = oracle.heldPaths(worker.id, worker.rank);
    const onDoc: bigint[] = [];
    for (let j = 1; j <= doc.local.length; j++)
      if (heldPaths.has(doc.keys[j - 1]!)) onDoc.push(externalOf(worker, doc, j));
    const count = onDoc.length === 0 ? 0 : 1 + random.int(onDoc.length);
    external =
      mode === 2 ? onDoc.slice(0, count) : mode === 3 ? onDoc.slice(onDoc.length - count) : onDoc;
    if (random.chance(0.5)) external.reverse();
  }
  if (external.length === 0 || random.chance(0.15)) external.push(random.u64()); // unknown hash
  return { kind: "removed", worker: worker.id, rank: worker.rank, external };
}

/**
 * A second copy of a run the worker holds, stored as vLLM announces it when two
 * requests compute the same blocks: the same parent, the same blocks (a plain store when
 * the worker holds nothing of the document).
 */
function copyOp(
  random: Random,
  worker: WorkerSpec,
  docs: Doc[],
  oracle: ReferenceIndex,
  externalOf: ExternalOf,
): HarnessOp {
  const doc = random.pick(docs);
  const held = oracle.heldPaths(worker.id, worker.rank);
  // Starts: a held block whose parent (if any) is held too; the run goes on while held.
  const starts: number[] = [];
  for (let j = 0; j < doc.local.length; j++)
    if (held.has(doc.keys[j]!) && (j === 0 || held.has(doc.keys[j - 1]!))) starts.push(j);
  if (starts.length === 0) return storeOp(random, worker, docs, oracle, externalOf);
  const start = random.pick(starts);
  let end = start + 1;
  while (end < doc.local.length && held.has(doc.keys[end]!) && random.chance(0.8)) end++;
  const parent = start === 0 ? null : externalOf(worker, doc, start);
  const external: bigint[] = [];
  for (let j = start + 1; j <= end; j++) external.push(externalOf(worker, doc, j));
  return {
    kind: "stored",
    worker: worker.id,
    rank: worker.rank,
    parent,
    external,
    local: doc.local.slice(start, end),
  };
}

/**
 * A lower tier's event: mostly a store below a block the worker holds in some tier
 * (offloaded after its parent, which stays on the device or went down before it), or
 * a removal of blocks a tier holds; a few removals of unknown medium (every tier).
 */
function tierOp(
  random: Random,
  worker: WorkerSpec,
  docs: Doc[],
  oracle: ReferenceIndex,
  externalOf: ExternalOf,
): HarnessOp {
  const tier = 1 + random.int(3);
  const doc = random.pick(docs);
  const heldAnywhere = (j: number): boolean => {
    const hash = externalOf(worker, doc, j);
    if (oracle.heldPaths(worker.id, worker.rank).has(doc.keys[j - 1]!)) return true;
    return [1, 2, 3].some((t) => oracle.tierHolds(worker.id, worker.rank, t, hash));
  };
  if (random.chance(0.6)) {
    const starts = [0];
    for (let j = 1; j < doc.local.length; j++) if (heldAnywhere(j)) starts.push(j);
    const start = random.chance(0.9) ? random.pick(starts) : random.int(doc.local.length);
    const end = start + 1 + random.int(Math.min(4, doc.local.length - start));
    const external: bigint[] = [];
    for (let j = start + 1; j <= end; j++) external.push(externalOf(worker, doc, j));
    let parent: bigint | null = start === 0 ? null : externalOf(worker, doc, start);
    if (parent !== null && random.chance(0.05)) parent = random.u64();
    const local = doc.local.slice(start, end);
    return {
      kind: "tier_stored",
      worker: worker.id,
      rank: worker.rank,
      tier,
      parent,
      external,
      local,
    };
  }
  const held = oracle.tierHashes(worker.id, worker.rank, tier);
  const external: bigint[] = [];
  for (let n = 1 + random.int(3); n > 0 && held.length > 0; n--) external.push(random.pick(held));
  if (random.chance(0.3)) {
    // Unknown medium: the device's blocks and the tiers' alike.
    const device = [...oracle.heldPaths(worker.id, worker.rank).values()];
    if (device.length > 0) external.push(random.pick(device));
    if (external.length === 0 || random.chance(0.2)) external.push(random.u64());
    return { kind: "tier_removed", worker: worker.id, rank: worker.rank, tier: TIER_ANY, external };
  }
  if (external.length === 0 || random.chance(0.15)) external.push(random.u64());
  return { kind: "tier_removed", worker: worker.id, rank: worker.rank, tier, external };
}

/** A store that breaks the engine-hash invariant: a reused hash or a renamed block. */
function conflictOp(
  random: Random,
  worker: WorkerSpec,
  docs: Doc[],
  oracle: ReferenceIndex,
  externalOf: ExternalOf,
): HarnessOp {
  const op = storeOp(random, worker, docs, oracle, externalOf);
  if (op.kind !== "stored") return op;
  const held = [...oracle.heldPaths(worker.id, worker.rank).values()];
  const at = random.int(op.external.length);
  op.external[at] = held.length > 0 && random.chance(0.5) ? random.pick(held) : random.u64();
  return op;
}

function makeQueries(random: Random, docs: bigint[][], alphabet: readonly bigint[]): bigint[][] {
  const queries: bigint[][] = [];
  for (const doc of docs) {
    queries.push(doc);
    queries.push(doc.slice(0, 1 + random.int(doc.length)));
    const changed = [...doc];
    changed[random.int(changed.length)] = random.pick(alphabet);
    queries.push(changed);
  }
  return queries;
}

const pairsCache = new WeakMap<readonly bigint[], Uint32Array>();

/** The values as (hi, lo) pairs (cached per array: streams replay many times). */
export function pairs(values: readonly bigint[]): Uint32Array {
  const cached = pairsCache.get(values);
  if (cached !== undefined) return cached;
  const out = new Uint32Array(2 * values.length);
  pairsCache.set(values, out);
  for (let i = 0; i < values.length; i++) {
    out[2 * i] = Number(values[i]! >> 32n);
    out[2 * i + 1] = Number(values[i]! & 0xffff_ffffn);
  }
  return out;
}

/** Applies one op; returns the StoreStatus (stored), the unknown-hash count (removed) or 0. */
export function applyHarnessOp(index: KvIndex, op: HarnessOp): number {
  switch (op.kind) {
    case "stored": {
      const parent = op.parent ?? 0n;
      return index.applyStored(
        op.worker,
        op.rank,
        op.parent !== null,
        Number(parent >> 32n),
        Number(parent & 0xffff_ffffn),
        pairs(op.external),
        pairs(op.local),
        op.local.length,
      );
    }
    case "removed":
      return index.applyRemoved(op.worker, op.rank, pairs(op.external), op.external.length);
    case "cleared":
      index.applyCleared(op.worker, op.rank);
      return 0;
    case "remove_worker":
      index.removeWorker(op.worker);
      return 0;
    case "tier_stored": {
      const parent = op.parent ?? 0n;
      return index.applyStoredTier(
        op.worker,
        op.rank,
        op.tier,
        op.parent !== null,
        Number(parent >> 32n),
        Number(parent & 0xffff_ffffn),
        pairs(op.external),
        pairs(op.local),
        op.local.length,
      );
    }
    case "tier_removed": {
      const hashes = pairs(op.external);
      const unknown = index.applyRemovedTier(
        op.worker,
        op.rank,
        op.tier,
        hashes,
        op.external.length,
      );
      if (op.tier !== TIER_ANY) return unknown;
      return index.applyRemoved(op.worker, op.rank, hashes, op.external.length);
    }
  }
}

/** The op as a `kvedge apply` JSON line (block size 1, local hashes given). */
export function applyLine(op: HarnessOp): string {
  switch (op.kind) {
    case "stored":
      return JSON.stringify({
        op: "stored",
        worker_id: String(op.worker),
        dp_rank: op.rank,
        parent_block_hash: op.parent === null ? null : String(op.parent),
        block_hashes: op.external.map(String),
        local_hashes: op.local.map(String),
        block_size: 1,
      });
    case "removed":
      return JSON.stringify({
        op: "removed",
        worker_id: String(op.worker),
        dp_rank: op.rank,
        block_hashes: op.external.map(String),
      });
    case "cleared":
      return JSON.stringify({ op: "cleared", worker_id: String(op.worker), dp_rank: op.rank });
    case "remove_worker":
      return JSON.stringify({ op: "remove_worker", worker_id: String(op.worker) });
    case "tier_stored":
      return JSON.stringify({
        op: "stored",
        worker_id: String(op.worker),
        dp_rank: op.rank,
        tier: TIER_NAMES[op.tier],
        parent_block_hash: op.parent === null ? null : String(op.parent),
        block_hashes: op.external.map(String),
        local_hashes: op.local.map(String),
        block_size: 1,
      });
    case "tier_removed":
      return JSON.stringify({
        op: "removed",
        worker_id: String(op.worker),
        dp_rank: op.rank,
        tier: op.tier === TIER_ANY ? "any" : TIER_NAMES[op.tier],
        block_hashes: op.external.map(String),
      });
  }
}

export function matchLine(query: readonly bigint[]): string {
  return JSON.stringify({ op: "match", local_hashes: query.map(String) });
}
