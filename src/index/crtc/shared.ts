/**
 * The crtc index in shared memory: one writer thread applies events, readers on other
 * threads run findMatches on the same memory without locks (README.md, "Concurrency").
 *
 * Usage:
 *
 * ```ts
 * // The writer's thread: an ordinary KvIndex (feed it as any other; e.g. as the
 * // normalizer's writer), plus a descriptor to post to reader threads.
 * const shared = createSharedIndex(16, { budgetBytes: 1 << 30, maxReaders: 8 });
 * shared.index.applyStored(...);              // every KvIndex call is one event
 * worker.postMessage(shared.descriptor);      // structured-cloneable: SABs + geometry
 *
 * // A reader's thread (a Worker), from the posted descriptor:
 * const reader = attach(descriptor, { identities: true });
 * const out = new MatchResult();
 * reader.findMatches(local, count, out);      // KvIndex.findMatches' signature
 * reader.stampOf(out.workers[0]!);             // handles are the worker table's slots
 * reader.workerIdOf(out.workers[0]!);          // (with identities) who the slot was
 * reader.close();                              // gives the reader slot back
 * ```
 *
 * An answer is the index's answer at one event boundary between the call's start and
 * end. Handles (worker slots) and their workerIdOf / dpRankOf / stampOf are those of
 * that boundary; they stay readable until the reader's next findMatches. With a writer
 * thread the slots are the main thread's (src/runtime/writer.ts adopts them), so an
 * answer needs no translation, only the stamp check (src/index/threaded-index.ts).
 */
import { LINK_STRIDE, probeSlot } from "../link-table";
import { SLOT_LIMIT } from "../workers";
import { MatchResult, type IndexOptions } from "../types";
import { defaultIndexBudgetBytes } from "../budget";
import { CrtcIndex } from "./crtc";
import { MatchScratch, type ReadGuard, TreeReads, walkMatches } from "./match";
import { RUN_ORDER_MAX } from "./blocks";
import { SharedRegions } from "./shared-memory";
import {
  CONTROL,
  controlWords,
  IDENTITY_WORDS,
  SharedWriter,
  type SharedWriterCounters,
} from "./shared-writer";

export { MatchResult };

const FORMAT = "kvedge.crtc.shared/1";

/** What a reader thread needs: the buffers and their geometry (structured-cloneable). */
export interface SharedIndexDescriptor {
  readonly format: typeof FORMAT;
  readonly blockSize: number;
  readonly maxReaders: number;
  readonly control: SharedArrayBuffer;
  readonly regions: Readonly<Record<string, SharedArrayBuffer>>;
}

export interface SharedIndexOptions extends IndexOptions {
  /** The index memory budget the regions are sized by (default: defaultIndexBudgetBytes()). */
  budgetBytes?: number;
  /** Reader threads attached at once (default 64). */
  maxReaders?: number;
}

export interface SharedIndex {
  /** The writer: an ordinary KvIndex; use it from one thread only. */
  readonly index: CrtcIndex;
  readonly descriptor: SharedIndexDescriptor;
  readonly counters: SharedWriterCounters;
  /** The buffers (and what they returned to the kernel). */
  readonly regions: SharedRegions;
  /** Gives back what waits for readers that have left (call between events). */
  settle(): void;
}

const MAX_READERS_DEFAULT = 64;
const BLOCK_IDS_MAX = 2 ** 30;
const NODE_IDS_MAX = 2 ** 30;
const ARENA_WORDS_MAX = 2 ** 30;
const LINK_SLOTS_MAX = 2 ** 28;
/** Every live node costs at least this much all in (its arrays, one block, one link). */
const NODE_BYTES_MIN = 64;

function pow2AtLeast(n: number): number {
  return 2 ** Math.ceil(Math.log2(Math.max(2, n)));
}

/**
 * Each array's largest size in bytes for an index of `budgetBytes`: as much as it could
 * take before the budget refuses stores, plus one growth step. Reserved, not touched.
 */
export function sharedRegionLimits(budgetBytes: number): Record<string, number> {
  if (!(budgetBytes >= 2 ** 20)) {
    throw new RangeError(`shared index budget must be >= 1 MiB, got ${budgetBytes}`);
  }
  const chunk = 2 ** RUN_ORDER_MAX;
  const chunks = Math.ceil((1.25 * budgetBytes) / 12 / chunk + 1);
  const blockIds = Math.min(BLOCK_IDS_MAX, chunks * chunk);
  const nodeIds = Math.min(NODE_IDS_MAX, pow2AtLeast(budgetBytes / NODE_BYTES_MIN));
  const words = Math.min(ARENA_WORDS_MAX, pow2AtLeast(budgetBytes / 4));
  const linkSlots = Math.min(LINK_SLOTS_MAX, 2 * nodeIds);
  const limits: Record<string, number> = {
    "blocks.hi": 4 * blockIds,
    "blocks.lo": 4 * blockIds,
    "blocks.node": 4 * blockIds,
    "nodes.runOrder": nodeIds,
    "owners.words": 4 * words,
    "links.0": 4 * LINK_STRIDE * linkSlots,
    "links.1": 4 * LINK_STRIDE * linkSlots,
    "slots.identity": 4 * IDENTITY_WORDS * SLOT_LIMIT,
  };
  for (const name of ["parent", "start", "len", "spare", "kids", "version"]) {
    limits[`nodes.${name}`] = 4 * nodeIds;
  }
  limits["nodes.chain"] = 8 * nodeIds;
  for (const name of ["count", "a", "b"]) limits[`owners.${name}`] = 4 * nodeIds;
  return limits;
}

/** A crtc index whose pools live in shared memory, and the descriptor readers attach by. */
export function createSharedIndex(
  blockSize: number,
  options: SharedIndexOptions = {},
): SharedIndex {
  const maxReaders = options.maxReaders ?? MAX_READERS_DEFAULT;
  if (!Number.isInteger(maxReaders) || maxReaders < 1 || maxReaders > 4096) {
    throw new RangeError(`maxReaders must be an integer in [1, 4096], got ${maxReaders}`);
  }
  const budget = options.budgetBytes ?? defaultIndexBudgetBytes();
  const memory = new SharedRegions(sharedRegionLimits(budget));
  const control = new SharedArrayBuffer(4 * (controlWords(maxReaders) + maxReaders));
  const versions = memory.whole("nodes.version");
  const writer = new SharedWriter(new Int32Array(control), versions, maxReaders);
  const slotIdentity = memory.whole("slots.identity");
  const index = new CrtcIndex(blockSize, options, { memory, writer, slotIdentity });
  return {
    index,
    descriptor: { format: FORMAT, blockSize, maxReaders, control, regions: memory.buffers },
    counters: writer.counters,
    regions: memory,
    settle() {
      index.tree.endEvent();
    },
  };
}

/** Counters of one reader (plain numbers, only increase). */
export interface ReaderStats {
  lookups: number;
  /** Attempts thrown away: a node changed under the read, or was being changed. */
  retries: number;
  /** Link-probe spins: the link seqlock was odd (being changed) or moved under a probe. */
  linkRetries: number;
  /** Lookups that asked the writer to hold still at an event boundary (the fallback). */
  pauses: number;
}

/** Attempts before a lookup asks the writer to hold still (each waits out the change it met). */
const FAST_ATTEMPTS = 8;
/**
 * A lookup that gets no consistent read for this long means the writer is stuck
 * mid-event. Seconds, not milliseconds: on a loaded host the writer thread can wait
 * well over 100 ms for a CPU, and a slow answer is better than a refused one.
 */
const LOOKUP_LIMIT_NS = 2_000_000_000;

/**
 * A reader of the shared index. Every answer comes with its slots' generation stamps
 * (`stampOf`: what a later check of the slots needs); `identities` also copies each
 * slot's worker id and dp rank with the answer (`workerIdOf`, `dpRankOf`: for readers
 * that name workers themselves, tests and soaks; two more words per answer slot).
 */
export function attach(
  descriptor: SharedIndexDescriptor,
  options: { readonly identities?: boolean } = {},
): SharedIndexReader {
  if (descriptor?.format !== FORMAT) throw new Error("not a shared crtc index descriptor");
  return new SharedIndexReader(descriptor, options.identities === true);
}

/** A read-only view of a shared crtc index for one thread. */
export class SharedIndexReader implements ReadGuard {
  readonly stats: ReaderStats = { lookups: 0, retries: 0, linkRetries: 0, pauses: 0 };
  readonly blockSize: number;
  private readonly control: Int32Array;
  private readonly reader: number;
  private readonly maxReaders: number;
  private readonly epochSlot: number;
  /** When the current lookup gives up on a writer stuck mid-event. */
  private deadline = 0;
  private readonly version: Uint32Array;
  /** The tree's arrays (fixed views of the shared regions), read through this reader. */
  private readonly reads = new TreeReads();
  private readonly links: [Uint32Array, Uint32Array];
  private readonly identity: Uint32Array;
  private readonly scratch = new MatchScratch();
  private readNodes = new Uint32Array(64);
  private readVersions = new Uint32Array(64);
  private readCount = 0;
  /** The node whose odd version ended the last attempt (0: none). */
  private conflict = 0;
  /** Identities and generation stamps of the last answer's slots, as read inside it. */
  private idHi = new Uint32Array(64);
  private idLo = new Uint32Array(64);
  private rank = new Uint32Array(64);
  private stamp = new Uint32Array(64);
  /** workerIdOf's bigints, made once per slot identity seen. */
  private readonly ids: bigint[] = [];
  private cachedHi = new Uint32Array(64);
  private cachedLo = new Uint32Array(64);
  private closed = false;

  constructor(
    descriptor: SharedIndexDescriptor,
    private readonly identities: boolean,
  ) {
    const r = descriptor.regions;
    const u32 = (name: string) => {
      const buffer = r[name];
      if (!(buffer instanceof SharedArrayBuffer)) {
        throw new Error(`shared index descriptor lacks region ${name}`);
      }
      return new Uint32Array(buffer);
    };
    this.blockSize = descriptor.blockSize;
    this.control = new Int32Array(descriptor.control);
    this.version = u32("nodes.version");
    const arrays = this.reads;
    arrays.guard = this;
    arrays.start = u32("nodes.start");
    arrays.len = u32("nodes.len");
    arrays.chain = u32("nodes.chain");
    arrays.ownerCount = u32("owners.count");
    arrays.ownerA = u32("owners.a");
    arrays.ownerB = u32("owners.b");
    arrays.words = u32("owners.words");
    arrays.hi = u32("blocks.hi");
    arrays.lo = u32("blocks.lo");
    this.links = [u32("links.0"), u32("links.1")];
    this.identity = u32("slots.identity");
    this.maxReaders = descriptor.maxReaders;
    this.reader = claimReader(this.control, descriptor.maxReaders);
    this.epochSlot = CONTROL.readerBase + this.reader;
  }

  /** The writer's applied-event count now (wraps at 2^32). */
  applied(): number {
    return Atomics.load(this.control, CONTROL.applied) >>> 0;
  }

  /** KvIndex.findMatches on the shared index (module comment: one event boundary's answer). */
  findMatches(local: Uint32Array, count: number, out: MatchResult, given?: Uint32Array): void {
    if (this.closed) throw new Error("findMatches on a closed shared index reader");
    if (local.length < 2 * count) throw new RangeError("query array too short");
    if (given !== undefined && given.length < 2 * count) {
      throw new RangeError("query chain array too short");
    }
    const chain = given ?? this.scratch.chain.of(local, count);
    this.stats.lookups++;
    this.enter();
    try {
      this.deadline = Bun.nanoseconds() + LOOKUP_LIMIT_NS;
      for (let attempt = 1; !this.tryMatch(local, chain, count, out); attempt++) {
        this.stats.retries++;
        if (attempt >= FAST_ATTEMPTS) {
          this.matchWithWriterStill(local, chain, count, out);
          return;
        }
        this.waitOutConflict();
      }
    } finally {
      Atomics.store(this.control, this.epochSlot, 0);
    }
  }

  workerIdOf(handle: number): bigint {
    this.assertIdentities();
    const hi = this.idHi[handle]!;
    const lo = this.idLo[handle]!;
    const known = this.cachedHi[handle] === hi && this.cachedLo[handle] === lo;
    if (!known || this.ids[handle] === undefined) {
      this.cachedHi[handle] = hi;
      this.cachedLo[handle] = lo;
      this.ids[handle] = (BigInt(hi) << 32n) | BigInt(lo);
    }
    return this.ids[handle]!;
  }

  dpRankOf(handle: number): number {
    this.assertIdentities();
    return this.rank[handle]!;
  }

  private assertIdentities(): void {
    if (!this.identities) throw new Error("a reader attached without identities names no workers");
  }

  /**
   * The generation stamp (WorkerTable.stampOf) the slot had in the last answer: with it,
   * a thread that uses the answer later checks the slot still names the same worker.
   */
  stampOf(handle: number): number {
    return this.stamp[handle]!;
  }

  /** Gives the reader slot back; the reader cannot be used after. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    Atomics.store(this.control, this.epochSlot, 0);
    Atomics.store(this.control, claimWord(this.maxReaders, this.reader), 0);
  }

  /** Publishes the epoch this lookup runs in (re-read until stable: the writer may advance it). */
  private enter(): void {
    const control = this.control;
    let epoch = Atomics.load(control, CONTROL.epoch);
    for (;;) {
      Atomics.store(control, this.epochSlot, epoch);
      const now = Atomics.load(control, CONTROL.epoch);
      if (now === epoch) return;
      epoch = now;
    }
  }

  /** The fallback: the writer holds still at its next event boundary until this lookup is done. */
  private matchWithWriterStill(
    local: Uint32Array,
    chain: Uint32Array,
    count: number,
    out: MatchResult,
  ): void {
    this.stats.pauses++;
    Atomics.add(this.control, CONTROL.pauseRequests, 1);
    try {
      while (!this.tryMatch(local, chain, count, out)) {
        this.stats.retries++;
        this.waitOutConflict();
      }
    } finally {
      Atomics.sub(this.control, CONTROL.pauseRequests, 1);
    }
  }

  /**
   * Spins until the node that was changing is not (its event ended), within the
   * deadline. Outside the epoch meanwhile: the next attempt starts over, and the writer
   * may be waiting for old readers to leave before it can end that event.
   */
  private waitOutConflict(): void {
    const node = this.conflict;
    this.checkDeadline();
    if (node === 0) return;
    Atomics.store(this.control, this.epochSlot, 0);
    while ((Atomics.load(this.version, node) & 1) !== 0) this.checkDeadline();
    this.enter();
  }

  private checkDeadline(): void {
    if (Bun.nanoseconds() > this.deadline) {
      const applied = this.applied();
      throw new Error(`shared index: no consistent read in 2 s (applied ${applied})`);
    }
  }

  /** Whether every node read so far still has the version it was read at. */
  private validate(): boolean {
    const version = this.version;
    for (let k = 0; k < this.readCount; k++) {
      if (Atomics.load(version, this.readNodes[k]!) !== this.readVersions[k]) return false;
    }
    return true;
  }

  private ensureSlots(): number {
    const slots = Math.min(SLOT_LIMIT, Atomics.load(this.control, CONTROL.slotHighWater));
    if (this.idHi.length < slots) {
      const size = pow2AtLeast(slots);
      this.scratch.ensure(size);
      this.idHi = new Uint32Array(size);
      this.idLo = new Uint32Array(size);
      this.rank = new Uint32Array(size);
      this.stamp = new Uint32Array(size);
      this.cachedHi = new Uint32Array(size);
      this.cachedLo = new Uint32Array(size);
      this.ids.length = 0;
    }
    return slots;
  }

  /**
   * One attempt of the walk (./match.ts) on shared memory: every node is read between
   * two loads of its version, and at the end every version read must be unchanged (then
   * all of them held at once, at one event boundary). False: retry.
   */
  private tryMatch(
    query: Uint32Array,
    chain: Uint32Array,
    count: number,
    out: MatchResult,
  ): boolean {
    this.readCount = 0;
    this.conflict = 0;
    const slots = this.ensureSlots();
    out.ensure(slots);
    this.reads.slotLimit = slots;
    if (!walkMatches(this.reads, query, chain, count, out, this.scratch)) return false;
    // The slots' stamps (and names) while their coverage is still validated below.
    const identity = this.identity;
    const stamp = this.stamp;
    const stride = IDENTITY_WORDS;
    for (let k = 0; k < out.count; k++) {
      const slot = out.workers[k]!;
      stamp[slot] = identity[stride * slot]!;
    }
    if (this.identities) this.copyIdentities(out);
    return this.validate();
  }

  private copyIdentities(out: MatchResult): void {
    const identity = this.identity;
    for (let k = 0; k < out.count; k++) {
      const slot = out.workers[k]!;
      const at = IDENTITY_WORDS * slot;
      this.idHi[slot] = identity[at + 1]!;
      this.idLo[slot] = identity[at + 2]!;
      this.rank[slot] = identity[at + 3]!;
    }
  }

  /** ReadGuard.open: records `node`'s version before it is read; -1 while it is being changed. */
  open(node: number): number {
    const version = Atomics.load(this.version, node);
    if ((version & 1) !== 0) {
      this.conflict = node;
      return -1;
    }
    if (this.readCount === this.readNodes.length) {
      const nodes = new Uint32Array(2 * this.readCount);
      nodes.set(this.readNodes);
      this.readNodes = nodes;
      const versions = new Uint32Array(2 * this.readCount);
      versions.set(this.readVersions);
      this.readVersions = versions;
    }
    this.readNodes[this.readCount] = node;
    this.readVersions[this.readCount++] = version;
    return version;
  }

  /** ReadGuard.versionOf. */
  versionOf(node: number): number {
    return Atomics.load(this.version, node);
  }

  /** ReadGuard.link: the child of `node` for a first block (hi, lo), or 0, inside the link seqlock. */
  link(node: number, hi: number, lo: number): number {
    const control = this.control;
    for (;;) {
      const before = Atomics.load(control, CONTROL.linkVersion);
      if ((before & 1) === 0) {
        const table = this.links[Atomics.load(control, CONTROL.linkRegion) & 1]!;
        const shift = 32 - Atomics.load(control, CONTROL.linkBits);
        const slot = probeSlot(table, shift, node, hi, lo);
        const value = slot < 0 ? 0 : table[slot * LINK_STRIDE + 3]!;
        if (Atomics.load(control, CONTROL.linkVersion) === before) return value;
      }
      if ((++this.stats.linkRetries & 1023) === 0) this.checkDeadline();
    }
  }
}

/** Reader r's claim word: after the epoch words of all readers. */
function claimWord(maxReaders: number, reader: number): number {
  return controlWords(maxReaders) + reader;
}

/** Takes a free reader slot; its epoch word and claim word live in the control buffer. */
function claimReader(control: Int32Array, maxReaders: number): number {
  for (let r = 0; r < maxReaders; r++) {
    if (Atomics.compareExchange(control, claimWord(maxReaders, r), 0, 1) !== 0) continue;
    for (;;) {
      const claimed = Atomics.load(control, CONTROL.readersClaimed);
      if (claimed > r) break;
      const seen = Atomics.compareExchange(control, CONTROL.readersClaimed, claimed, r + 1);
      if (seen === claimed) break;
    }
    return r;
  }
  throw new Error(`shared index: all ${maxReaders} reader slots are taken`);
}
