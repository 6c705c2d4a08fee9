/**
 * Pacing (`route.pacing`): a routed request reaches its engine only while fewer than
 * `perWorker` requests sent there are still prefilling, or while those have a full step
 * or more left to prefill (then it would share none of their steps); the rest wait
 * here, in arrival order per worker, and go one by one as those reach their first token.
 *
 * Why: an engine running vLLM V1's loop (FCFS, chunked prefill) plans every waiting
 * prompt into its next step, up to `max_num_batched_tokens`. Ten fan-out siblings of
 * ~900 new tokens each that arrive together are planned into the same full steps and all
 * get their first token at the end, ~600 ms later; sent a few at a time they finish
 * one after another, tens of ms apart, and the engine does the same work (prefill is
 * compute-bound: a step's cost is linear in its tokens). So the median wait halves and
 * nothing is recomputed: the worker is chosen, and counted as its load, when the
 * request arrives; only the moment it is sent moves (docs/decisions.md#pacing).
 *
 * Spill: a request whose cheapest worker already has `SPILL_BACKLOG` requests waiting
 * here is costed again with half the recompute weight (./router.ts `evaluate`), so the
 * tail of a large fan-out may move to a worker that must compute the shared context
 * but is free now, instead of queueing behind its siblings.
 *
 * Bounds: a request waits at most `maxHoldMs` (then it is sent anyway: a client that
 * never reports prefill_done stalls nothing for long), and at most `maxHeld` wait at
 * once (past that, requests are sent at once). "Prefilling" is the load tracker's view
 * (`prefillTokens`): a request that ended, expired or lost its worker frees its place.
 *
 * Transport-free and clock-injected, like ./admission.ts: what a call is and how it is
 * answered are the owner's business (the server's core, the simulator).
 */

export const PACING_MODES = ["off", "on"] as const;
export type PacingMode = (typeof PACING_MODES)[number];

export interface PacingSettings {
  readonly mode: PacingMode;
  /** Requests sent to a worker and still prefilling, at most (more wait here). */
  readonly perWorker: number;
  /** Longest a request waits here (ms). */
  readonly maxHoldMs: number;
  /** Most requests waiting here at once. */
  readonly maxHeld: number;
  /**
   * The engine's step budget (route.max_batched_tokens): when the requests sent to a
   * worker still have this much to prefill, its next step is full with them and a
   * newcomer would share none of theirs, so it is sent at once.
   */
  readonly stepTokens: number;
}

/**
 * Three, measured in virtual time (bench/JOURNAL.md, "Pacing"): one at a time leaves the
 * engine a step's gap at every release (the next is sent only after a first token);
 * two moved the conversation trace's hit rate at 2× without events (−0.5 points); three
 * keeps the fan-outs' gain. The longest hold is a backstop for clients that never
 * report prefill_done.
 */
export const DEFAULT_PACING: PacingSettings = {
  mode: "off",
  perWorker: 3,
  maxHoldMs: 2_000,
  maxHeld: 4096,
  stepTokens: 8192,
};

/** Requests waiting for one worker from which its cheapest request is costed at the spill weight. */
export const SPILL_BACKLOG = 4;
/** The recompute weight a spilled request is costed with, as a fraction of route.recompute_weight. */
export const SPILL_WEIGHT_FRACTION = 0.5;

export function checkPacingSettings(settings: PacingSettings): void {
  if (!(PACING_MODES as readonly string[]).includes(settings.mode))
    throw new RangeError(`pacing mode must be one of ${PACING_MODES.join(", ")}`);
  if (!(Number.isInteger(settings.perWorker) && settings.perWorker >= 1))
    throw new RangeError("pacing perWorker must be an integer >= 1");
  if (!(Number.isFinite(settings.maxHoldMs) && settings.maxHoldMs >= 0))
    throw new RangeError("pacing maxHoldMs must be a finite number >= 0");
  if (!(Number.isInteger(settings.maxHeld) && settings.maxHeld >= 1))
    throw new RangeError("pacing maxHeld must be an integer >= 1");
  if (!(settings.stepTokens >= 1)) throw new RangeError("pacing stepTokens must be >= 1");
}

/** What pacing needs from its owner. */
export interface PacingPort<T> {
  /** The request's prompt tokens still to prefill; 0 once done or ended (the load tracker says). */
  prefillTokens(requestId: string): number;
  /** Sends a call that waited: its decision is answered now. */
  send(call: T): void;
}

interface Waiting<T> {
  readonly call: T;
  readonly requestId: string;
  readonly slot: number;
  readonly since: number;
}

export class Pacing<T> {
  readonly settings: PacingSettings;
  /** Sent at once, made to wait, sent as a place freed, sent past the longest hold, dropped while waiting. */
  readonly counts = { immediate: 0, paced: 0, released: 0, overdue: 0, dropped: 0 };
  /** Per slot, requests waiting here (read by the router's spill; grown on demand). */
  backlog = new Uint32Array(0);
  /** Per slot with requests waiting: them, oldest first. */
  private readonly queues = new Map<number, Waiting<T>[]>();
  /** Per slot: ids sent and perhaps still prefilling (pruned when looked at). */
  private readonly sent = new Map<number, string[]>();
  private readonly waiting = new Map<T, Waiting<T>>();
  private releasing = false;

  constructor(
    settings: PacingSettings,
    private readonly port: PacingPort<T>,
    private readonly now: () => number,
  ) {
    checkPacingSettings(settings);
    this.settings = settings;
  }

  get enabled(): boolean {
    return this.settings.mode === "on";
  }

  /** Requests waiting now. */
  get held(): number {
    return this.waiting.size;
  }

  /** Slots with sent requests tracked (tests: memory comes back). */
  get trackedSlots(): number {
    return this.sent.size;
  }

  /**
   * A request just routed to `slot`: true if it goes now (the caller answers it), false
   * if it waits (answered later through the port's `send`).
   */
  submit(call: T, requestId: string, slot: number): boolean {
    if (!this.enabled) return true;
    const queued = this.queues.get(slot);
    const full = this.waiting.size >= this.settings.maxHeld;
    if (full || (queued === undefined && this.hasRoom(slot))) {
      this.counts.immediate++;
      this.markSent(slot, requestId);
      return true;
    }
    const entry: Waiting<T> = { call, requestId, slot, since: this.now() };
    if (queued === undefined) this.queues.set(slot, [entry]);
    else queued.push(entry);
    this.waiting.set(call, entry);
    this.grow(slot);
    this.backlog[slot]!++;
    this.counts.paced++;
    return false;
  }

  /** Sends what may go now: places freed on its worker, or past the longest hold. */
  release(): void {
    // A port's send may end a request and come back here: the outer loop sees it.
    if (this.waiting.size === 0 || this.releasing) return;
    this.releasing = true;
    try {
      this.releaseDue(this.now());
    } finally {
      this.releasing = false;
    }
  }

  private releaseDue(now: number): void {
    const hold = this.settings.maxHoldMs;
    for (const [slot, queue] of [...this.queues]) {
      while (queue.length > 0) {
        // The sum nextDueMs reports, so a release at that time finds it due (no rounding).
        const overdue = queue[0]!.since + hold <= now;
        if (!overdue && !this.hasRoom(slot)) break;
        const entry = queue.shift()!;
        this.forget(entry);
        if (overdue) this.counts.overdue++;
        else this.counts.released++;
        this.markSent(slot, entry.requestId);
        this.port.send(entry.call);
      }
      if (queue.length === 0 && this.queues.get(slot) === queue) this.queues.delete(slot);
    }
  }

  /** A waiting call whose client went away: never sent. False if it is not waiting. */
  drop(call: T): boolean {
    const entry = this.waiting.get(call);
    if (entry === undefined) return false;
    const queue = this.queues.get(entry.slot)!;
    queue.splice(queue.indexOf(entry), 1);
    if (queue.length === 0) this.queues.delete(entry.slot);
    this.forget(entry);
    this.counts.dropped++;
    return true;
  }

  /** When the oldest waiting request reaches the longest hold (Infinity: none waits). */
  nextDueMs(): number {
    let due = Infinity;
    for (const queue of this.queues.values())
      due = Math.min(due, queue[0]!.since + this.settings.maxHoldMs);
    return due;
  }

  /** Every waiting call, removed (kvedge stops). */
  takeAll(): T[] {
    const calls = [...this.waiting.keys()];
    for (const entry of [...this.waiting.values()]) this.forget(entry);
    this.queues.clear();
    this.sent.clear();
    return calls;
  }

  /** Fewer than perWorker still prefilling there, or so much that its next step is full anyway. */
  private hasRoom(slot: number): boolean {
    const ids = this.sent.get(slot);
    if (ids === undefined) return true;
    let kept = 0;
    let ahead = 0;
    for (const id of ids) {
      const tokens = this.port.prefillTokens(id);
      if (tokens === 0) continue;
      ids[kept++] = id;
      ahead += tokens;
    }
    ids.length = kept;
    if (kept === 0) this.sent.delete(slot);
    return kept < this.settings.perWorker || ahead >= this.settings.stepTokens;
  }

  /**
   * Forgets every sent request no longer prefilling. Not needed for bounds (a slot's list
   * is pruned whenever it is looked at, so it holds at most its prefilling requests and
   * those that ended since); the periodic sweep and tests call it.
   */
  sweep(): void {
    for (const slot of [...this.sent.keys()]) this.hasRoom(slot);
  }

  private markSent(slot: number, requestId: string): void {
    if (this.port.prefillTokens(requestId) === 0) return; // nothing to compute: it takes no place
    const ids = this.sent.get(slot);
    if (ids === undefined) this.sent.set(slot, [requestId]);
    else ids.push(requestId);
  }

  private forget(entry: Waiting<T>): void {
    this.waiting.delete(entry.call);
    this.backlog[entry.slot]!--;
  }

  private grow(slot: number): void {
    if (slot < this.backlog.length) return;
    const grown = new Uint32Array(Math.max(slot + 1, 2 * this.backlog.length));
    grown.set(this.backlog);
    this.backlog = grown;
  }
}
