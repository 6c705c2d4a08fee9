/**
 * Admission at saturation (`route.admission`): when every worker's predicted wait for
 * a call (its predicted TTFT there less its own prefill: the queue ahead of it and the
 * steps it shares) is past `boundMs`, the call is held here instead of being answered,
 * and released when a worker frees (a lifecycle call or an expiry brings the next held
 * call's shortest wait under the bound), in a better order than arrival. The bound is
 * on the wait, not the whole TTFT: a long prompt's own prefill is no sign of
 * saturation, and holding cannot shorten it.
 *
 * Order: a held call's key is `heldSince + prefillWeight × prefillMs` (its own
 * predicted prefill on its best worker), lowest first. Shortest prefill first, with
 * aging built in: a call that has waited `prefillWeight × Δ` longer overtakes one whose
 * prefill is Δ shorter, so nothing starves; the key never changes, so a binary heap
 * keeps the order.
 *
 * Bounds: at most `maxHeld` calls are held (one more is rejected), none longer than
 * `maxHoldMs` (then it is routed to the best worker anyway in `hold` mode, or rejected
 * in `reject` mode). A rejection carries Retry-After seconds.
 *
 * Transport-free and clock-injected: what a call is, how good its best worker is, and
 * how to answer it are the port's business (the simulator, the server).
 */

export const ADMISSION_MODES = ["off", "hold", "reject"] as const;
export type AdmissionMode = (typeof ADMISSION_MODES)[number];

export interface AdmissionSettings {
  readonly mode: AdmissionMode;
  /** Calls are held while every worker's predicted wait for them is above this (ms). */
  readonly boundMs: number;
  /** Longest a call is held (ms). */
  readonly maxHoldMs: number;
  /** Most calls held at once. */
  readonly maxHeld: number;
  /** Ms of waiting that one ms of predicted prefill is worth in the order (0 = FIFO). */
  readonly prefillWeight: number;
}

export const DEFAULT_ADMISSION: AdmissionSettings = {
  mode: "off",
  boundMs: 200,
  maxHoldMs: 10_000,
  maxHeld: 4096,
  prefillWeight: 4,
};

/** What admission needs from whoever holds the calls. */
export interface AdmissionPort<T> {
  /** The shortest predicted wait over the workers for this call, now (ms; `Router.assess`). */
  waitMs(call: T): number;
  /** Routes the call now. */
  route(call: T): void;
  /** Answers 429; `retryAfterSecs` >= 1. */
  reject(call: T, retryAfterSecs: number, reason: string): void;
}

export function checkAdmissionSettings(settings: AdmissionSettings): void {
  if (!(ADMISSION_MODES as readonly string[]).includes(settings.mode)) {
    throw new RangeError(`admission mode must be one of ${ADMISSION_MODES.join(", ")}`);
  }
  for (const name of ["boundMs", "maxHoldMs", "prefillWeight"] as const) {
    if (!(Number.isFinite(settings[name]) && settings[name] >= 0)) {
      throw new RangeError(`admission ${name} must be a finite number >= 0`);
    }
  }
  if (!(Number.isInteger(settings.maxHeld) && settings.maxHeld >= 1)) {
    throw new RangeError("admission maxHeld must be an integer >= 1");
  }
}

export class Admission<T> {
  readonly settings: AdmissionSettings;
  /**
   * Calls routed at once, held, released by a freed worker, routed past the longest
   * hold, rejected, dropped while held.
   */
  readonly counts = { immediate: 0, held: 0, released: 0, overdue: 0, rejected: 0, dropped: 0 };
  private calls: (T | undefined)[] = [];
  private key = new Float64Array(0);
  private since = new Float64Array(0);
  /** Arrival number: equal keys go in arrival order. */
  private serial = new Float64Array(0);
  private serials = 0;
  private heapPos = new Int32Array(0);
  private heap = new Int32Array(0);
  private size = 0;
  private free: number[] = [];
  private releasing = false;

  constructor(
    settings: Partial<AdmissionSettings>,
    private readonly port: AdmissionPort<T>,
    private readonly now: () => number,
  ) {
    this.settings = { ...DEFAULT_ADMISSION, ...settings };
    checkAdmissionSettings(this.settings);
  }

  get enabled(): boolean {
    return this.settings.mode !== "off";
  }

  /** Calls held now. */
  get held(): number {
    return this.size;
  }

  /** Slots allocated for held calls (grows to the most held at once, at most maxHeld). */
  get capacity(): number {
    return this.calls.length;
  }

  /**
   * A new call: routed now, held (returns its handle, for `drop`), or rejected.
   * `waitMs` is its shortest predicted wait over the workers, `prefillMs` its predicted
   * prefill on the worker it would go to (its place in the order); both `Router.assess`.
   */
  submit(call: T, waitMs: number, prefillMs: number): number {
    const s = this.settings;
    if (s.mode === "off") return this.routeNow(call);
    if (this.size === 0 && waitMs <= s.boundMs) return this.routeNow(call);
    if (s.maxHoldMs === 0 || this.size >= s.maxHeld) {
      if (s.mode === "hold" && s.maxHoldMs === 0) return this.routeNow(call);
      this.counts.rejected++;
      const full = this.size >= s.maxHeld;
      const reason = full
        ? `${s.maxHeld} calls are held already`
        : "every worker is past the wait bound";
      this.port.reject(call, this.retryAfterSecs(waitMs), reason);
      return -1;
    }
    return this.hold(call, prefillMs);
  }

  /** Forgets a held call (its client went away). False if it is not held (answered already). */
  drop(handle: number, call: T): boolean {
    if (!(handle >= 0 && handle < this.calls.length && this.calls[handle] === call)) return false;
    this.take(handle);
    this.counts.dropped++;
    return true;
  }

  /**
   * Answers what is due: calls past the longest hold, then, in order, every call whose
   * shortest predicted wait is under the bound. Call after anything that frees a worker,
   * and at `nextDueMs()`.
   */
  release(): void {
    if (this.releasing) return; // a port's route may free a worker and come back here
    this.releasing = true;
    try {
      this.releaseOverdue();
      while (this.size > 0) {
        const slot = this.heap[0]!;
        if (this.port.waitMs(this.calls[slot]!) > this.settings.boundMs) break;
        this.counts.released++;
        this.port.route(this.take(slot));
      }
    } finally {
      this.releasing = false;
    }
  }

  /** Removes and returns every held call (shutting down). */
  takeAll(): T[] {
    const calls: T[] = [];
    while (this.size > 0) calls.push(this.take(this.heap[0]!));
    return calls;
  }

  /** When the oldest held call reaches the longest hold (Infinity when none is held); O(held). */
  nextDueMs(): number {
    let oldest = Infinity;
    for (let i = 0; i < this.size; i++) oldest = Math.min(oldest, this.since[this.heap[i]!]!);
    return oldest + this.settings.maxHoldMs;
  }

  /** Answers, oldest first, every call held for the longest hold (one pass finds them). */
  private releaseOverdue(): void {
    const now = this.now();
    const maxHold = this.settings.maxHoldMs;
    const due: number[] = [];
    // The same sum as nextDueMs, so a release at that time finds the call due.
    for (let i = 0; i < this.size; i++) {
      if (this.since[this.heap[i]!]! + maxHold <= now) due.push(this.heap[i]!);
    }
    if (due.length === 0) return;
    due.sort((a, b) => this.serial[a]! - this.serial[b]!);
    const calls = due.map((slot) => this.take(slot));
    for (const call of calls) {
      if (this.settings.mode === "hold") {
        this.counts.overdue++;
        this.port.route(call);
      } else {
        this.counts.rejected++;
        const reason = `held ${maxHold} ms without a worker under the wait bound`;
        this.port.reject(call, this.retryAfterSecs(this.port.waitMs(call)), reason);
      }
    }
  }

  private routeNow(call: T): number {
    this.counts.immediate++;
    this.port.route(call);
    return -1;
  }

  private retryAfterSecs(waitMs: number): number {
    const over = Number.isFinite(waitMs) ? waitMs - this.settings.boundMs : this.settings.maxHoldMs;
    return Math.max(1, Math.ceil(over / 1000));
  }

  private hold(call: T, prefillMs: number): number {
    const slot = this.allocate();
    const now = this.now();
    this.calls[slot] = call;
    this.since[slot] = now;
    this.key[slot] = now + this.settings.prefillWeight * prefillMs;
    this.serial[slot] = this.serials++;
    this.heap[this.size] = slot;
    this.heapPos[slot] = this.size;
    this.size++;
    this.siftUp(this.size - 1);
    this.counts.held++;
    return slot;
  }

  private allocate(): number {
    const reused = this.free.pop();
    if (reused !== undefined) return reused;
    const slot = this.calls.length;
    if (slot >= this.key.length) {
      const capacity = Math.min(this.settings.maxHeld, Math.max(16, 2 * this.key.length));
      this.key = grow(this.key, new Float64Array(capacity));
      this.since = grow(this.since, new Float64Array(capacity));
      this.serial = grow(this.serial, new Float64Array(capacity));
      this.heapPos = grow(this.heapPos, new Int32Array(capacity));
      this.heap = grow(this.heap, new Int32Array(capacity));
    }
    this.calls.push(undefined);
    return slot;
  }

  /** Removes a held call from the heap and returns it; when none is left, the slots go back. */
  private take(slot: number): T {
    const call = this.calls[slot]!;
    const at = this.heapPos[slot]!;
    const last = this.heap[--this.size]!;
    if (at < this.size) {
      this.heap[at] = last;
      this.heapPos[last] = at;
      this.siftDown(at);
      this.siftUp(this.heapPos[last]!);
    }
    this.calls[slot] = undefined;
    this.free.push(slot);
    if (this.size === 0) this.reset();
    return call;
  }

  private reset(): void {
    this.calls = [];
    this.free = [];
    this.key = new Float64Array(0);
    this.since = new Float64Array(0);
    this.serial = new Float64Array(0);
    this.heapPos = new Int32Array(0);
    this.heap = new Int32Array(0);
  }

  private less(a: number, b: number): boolean {
    const ka = this.key[a]!;
    const kb = this.key[b]!;
    return ka < kb || (ka === kb && this.serial[a]! < this.serial[b]!);
  }

  private siftUp(at: number): void {
    const heap = this.heap;
    while (at > 0) {
      const parent = (at - 1) >> 1;
      if (!this.less(heap[at]!, heap[parent]!)) break;
      this.swap(at, parent);
      at = parent;
    }
  }

  private siftDown(at: number): void {
    const heap = this.heap;
    for (;;) {
      const left = 2 * at + 1;
      if (left >= this.size) break;
      const right = left + 1;
      const child = right < this.size && this.less(heap[right]!, heap[left]!) ? right : left;
      if (!this.less(heap[child]!, heap[at]!)) break;
      this.swap(at, child);
      at = child;
    }
  }

  private swap(i: number, j: number): void {
    const heap = this.heap;
    const a = heap[i]!;
    const b = heap[j]!;
    heap[i] = b;
    heap[j] = a;
    this.heapPos[b] = i;
    this.heapPos[a] = j;
  }
}

function grow<A extends Float64Array | Int32Array>(old: A, fresh: A): A {
  fresh.set(old);
  return fresh;
}
