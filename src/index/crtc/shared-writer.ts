/**
 * The writer's half of the shared index's reader protocol (README.md, "Concurrency"):
 * the control words, node versions (odd from a node's first change in an event until
 * the event ends) and the epochs that hold freed ids back until no reader can still
 * follow them. None of this exists in the private, single-threaded mode.
 */

/**
 * U32 words per worker slot in the "slots.identity" region: the slot's generation stamp
 * (WorkerTable.stampOf), then the worker id's high and low words and the dp rank. Every
 * answer copies the stamp; readers that name workers also copy the other three.
 */
export const IDENTITY_WORDS = 4;

/** Int32 words of the control buffer. */
export const CONTROL = {
  /** Events applied (wraps at 2^32); raised after an event's writes, before its versions close. */
  applied: 0,
  /** The writer's epoch, raised after every event; never 0 (0 marks an idle reader). */
  epoch: 1,
  /** The link table's seqlock: odd while an insert, remove, replace or resize runs. */
  linkVersion: 2,
  /** Which of the two link regions is the table, and its size (log2 slots). */
  linkRegion: 3,
  linkBits: 4,
  /** Worker slots handed out (the readers' per-slot scratch is sized by it). */
  slotHighWater: 5,
  /** Reader slots claimed so far (attach() takes the next). */
  readersClaimed: 6,
  /** Readers asking the writer to hold still at the next event boundary. */
  pauseRequests: 7,
  /** 1 while the writer holds still for them. */
  paused: 8,
  /** Per reader: the epoch it entered, 0 when it is not inside a lookup. */
  readerBase: 16,
} as const;

export function controlWords(maxReaders: number): number {
  return CONTROL.readerBase + maxReaders;
}

/** Counters of the writer side of the protocol (plain numbers, only increase). */
export interface SharedWriterCounters {
  /** Ids (nodes, block runs, owner lists) that waited in limbo for readers to leave. */
  retired: number;
  /** Link-table resizes that found a reader still in the old table's epoch past the wait. */
  regionWaitTimeouts: number;
  /** Event boundaries at which the writer held still for a reader, and those cut short. */
  pauses: number;
  pauseTimeouts: number;
  /** Retired ids given back while a reader stayed inside one lookup past the limbo bound. */
  forcedReleases: number;
}

const PAUSE_LIMIT_NS = 1_000_000;
const REGION_WAIT_NS = 10_000_000;
/** Limbo words (4 per id) past which the oldest half goes back regardless of readers. */
const LIMBO_WORDS_MAX = 4 * 2 ** 20;

export const RETIRED_NODE = 0;
export const RETIRED_RUN = 1;
export const RETIRED_LIST = 2;

function unitsOf(kind: number, b: number): number {
  return kind === RETIRED_NODE ? 1 : kind === RETIRED_RUN ? 2 ** b : 2 << b;
}

export type ReleaseRetired = (kind: number, a: number, b: number) => void;

/**
 * Node versions and the epoch limbo. `touch(node)` before changing anything a reader
 * reads of the node (its edge, owners, links to its children); `endEvent()` after.
 */
export class SharedWriter {
  readonly counters: SharedWriterCounters = {
    retired: 0,
    regionWaitTimeouts: 0,
    pauses: 0,
    pauseTimeouts: 0,
    forcedReleases: 0,
  };
  private dirty = new Uint32Array(64);
  private dirtyCount = 0;
  /** FIFO of retired ids: (epoch, kind, a, b) quads. */
  private limbo = new Int32Array(256);
  private limboHead = 0;
  private limboTail = 0;
  private readonly pending = [0, 0, 0];
  private release: ReleaseRetired = () => {};

  constructor(
    readonly control: Int32Array,
    readonly versions: Uint32Array,
    readonly maxReaders: number,
  ) {
    if (Atomics.load(control, CONTROL.epoch) === 0) Atomics.store(control, CONTROL.epoch, 1);
  }

  /** Where ids come back from limbo (the tree's pools). */
  onRelease(release: ReleaseRetired): void {
    this.release = release;
  }

  touch(node: number): void {
    const version = this.versions[node]!;
    if ((version & 1) !== 0) return;
    Atomics.store(this.versions, node, version + 1);
    if (this.dirtyCount === this.dirty.length) {
      const grown = new Uint32Array(2 * this.dirty.length);
      grown.set(this.dirty);
      this.dirty = grown;
    }
    this.dirty[this.dirtyCount++] = node;
  }

  /** Holds a freed id back until every reader inside a lookup now has left. */
  retire(kind: number, a: number, b: number): void {
    if (this.limboTail + 4 > this.limbo.length) this.compactLimbo();
    const limbo = this.limbo;
    limbo[this.limboTail] = Atomics.load(this.control, CONTROL.epoch);
    limbo[this.limboTail + 1] = kind;
    limbo[this.limboTail + 2] = a;
    limbo[this.limboTail + 3] = b;
    this.limboTail += 4;
    this.pending[kind]! += unitsOf(kind, b);
    this.counters.retired++;
  }

  get limboEmpty(): boolean {
    return this.limboHead === this.limboTail;
  }

  /** What waits in limbo: node ids, block ids in runs, or arena words in lists. */
  retiredUnits(kind: number): number {
    return this.pending[kind]!;
  }

  /**
   * The event boundary: publish the applied count, close every version opened in the
   * event, advance the epoch, give back what no reader can reach, and hold still if a
   * reader asked to.
   */
  endEvent(): void {
    const control = this.control;
    Atomics.add(control, CONTROL.applied, 1);
    const versions = this.versions;
    const dirty = this.dirty;
    for (let k = 0; k < this.dirtyCount; k++) {
      const node = dirty[k]!;
      Atomics.store(versions, node, versions[node]! + 1);
    }
    this.dirtyCount = 0;
    this.advanceEpoch();
    if (this.limboHead !== this.limboTail) this.drain();
    if (Atomics.load(control, CONTROL.pauseRequests) > 0) this.holdStill();
  }

  /** Everything in limbo that no reader can reach goes back; true if limbo is empty. */
  drain(): boolean {
    const oldest = this.oldestReader();
    const limbo = this.limbo;
    let end = this.limboHead;
    while (end !== this.limboTail && (oldest === 0 || ((oldest - limbo[end]!) | 0) > 0)) end += 4;
    this.drainUpTo(end);
    return this.limboHead === this.limboTail;
  }

  private drainUpTo(end: number): void {
    const limbo = this.limbo;
    while (this.limboHead < end) {
      const kind = limbo[this.limboHead + 1]!;
      const b = limbo[this.limboHead + 3]!;
      this.pending[kind]! -= unitsOf(kind, b);
      this.release(kind, limbo[this.limboHead + 2]!, b);
      this.limboHead += 4;
    }
    if (this.limboHead === this.limboTail) this.limboHead = this.limboTail = 0;
  }

  /**
   * Moves the epoch on and returns the one that ended: what was retired in it is safe
   * once every reader inside a lookup entered later. Any moment will do (readers that
   * enter after it cannot reach what was unlinked before it).
   */
  advanceEpoch(): number {
    const ended = Atomics.add(this.control, CONTROL.epoch, 1);
    if (ended === -1) Atomics.store(this.control, CONTROL.epoch, 1); // 0 marks an idle reader
    return ended;
  }

  /**
   * Waits (bounded) until no reader is inside a lookup that entered at `epoch` or
   * before. Past the bound the caller goes on: readers still validate what they read.
   */
  waitForReaders(epoch: number): void {
    const until = Bun.nanoseconds() + REGION_WAIT_NS;
    for (;;) {
      const oldest = this.oldestReader();
      if (oldest === 0 || ((oldest - epoch) | 0) > 0) return;
      if (Bun.nanoseconds() > until) {
        this.counters.regionWaitTimeouts++;
        return;
      }
    }
  }

  /** The epoch of the longest-running reader inside a lookup (wrap-aware), 0 if none. */
  private oldestReader(): number {
    const control = this.control;
    const readers = Math.min(Atomics.load(control, CONTROL.readersClaimed), this.maxReaders);
    let oldest = 0;
    for (let r = 0; r < readers; r++) {
      const entered = Atomics.load(control, CONTROL.readerBase + r);
      if (entered !== 0 && (oldest === 0 || ((entered - oldest) | 0) < 0)) oldest = entered;
    }
    return oldest;
  }

  /** A reader that keeps losing its retries gets one event boundary with the writer still. */
  private holdStill(): void {
    const control = this.control;
    this.counters.pauses++;
    Atomics.store(control, CONTROL.paused, 1);
    const until = Bun.nanoseconds() + PAUSE_LIMIT_NS;
    while (Atomics.load(control, CONTROL.pauseRequests) > 0) {
      if (Bun.nanoseconds() > until) {
        this.counters.pauseTimeouts++;
        break;
      }
    }
    Atomics.store(control, CONTROL.paused, 0);
  }

  private compactLimbo(): void {
    const live = this.limboTail - this.limboHead;
    if (live >= LIMBO_WORDS_MAX) {
      // A reader stuck inside one lookup must not hold memory forever: give the oldest
      // half back anyway (readers still validate every version they read).
      this.counters.forcedReleases += live / 8;
      this.drainUpTo(this.limboHead + live / 2);
      return;
    }
    if (live + 4 > this.limbo.length / 2) {
      const next = new Int32Array(2 * this.limbo.length);
      next.set(this.limbo.subarray(this.limboHead, this.limboTail));
      this.limbo = next;
    } else {
      this.limbo.copyWithin(0, this.limboHead, this.limboTail);
    }
    this.limboHead = 0;
    this.limboTail = live;
  }
}
