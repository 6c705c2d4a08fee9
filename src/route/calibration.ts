/**
 * Online calibration of each worker's engine time model from the lifecycle calls the
 * router already gets: a request's time from route to prefill_done is its observed
 * TTFT, and at routing time the router knew what that TTFT depends on (./ttft.ts):
 *
 *   observed ≈ a × tokens / 1000 + b × steps + kv_ms
 *
 * with tokens = prefill ahead + its own uncached prefill, steps = scheduler steps until
 * its first token, kv_ms = those steps' KV reads (from the configured KV-read cost);
 * `a` is ms per 1000 prefill tokens, `b` the step base (ms).
 *
 * Each sample says mostly one thing: where the prefill term is most of the prediction
 * (≥ 80%) it measures `a` (b taken as known), where the step term is (≥ 50%) it
 * measures `b`. Each parameter follows the running *median* of what its samples say,
 * by multiplicative steps of 3% toward each one: observed TTFTs are skewed (a request
 * that arrives while a long prefill step is already running waits for it, which the
 * router cannot see; at the trace's rate 10% of samples are 1.6× their prediction and
 * 1% are 17×), and a least-squares fit chased those outliers (tried: it swung both
 * constants to their bounds and doubled TTFT p50). From constants 2× off, ~25 samples
 * halve the error. Learned values stay within [1/16, 16] × the configured ones, and a
 * slot given to a new worker starts over.
 */
import type { LoadTracker } from "./load";

/** Multiplicative step toward each sample (a median tracker: up or down by this much). */
const STEP = 0.03;
const PREFILL_SHARE = 0.8;
const STEP_SHARE = 0.5;
const RANGE = 16;

export interface LearnedTimes {
  readonly prefillTokensPerSecond: number;
  readonly stepBaseMs: number;
  readonly samples: number;
}

export class Calibration {
  /** Per slot: what predictions use (configured until samples say otherwise). */
  prefillPerMs = new Float64Array(0);
  stepBaseMs = new Float64Array(0);
  samples = new Float64Array(0);
  // Per slot: ms per 1000 prefill tokens, and step base ms.
  private a = new Float64Array(0);
  private b = new Float64Array(0);
  /** The worker table's generation of each slot when it was last reset. */
  private generationOfSlot = new Float64Array(0);
  // Per active-request record: what its TTFT was predicted from.
  private recordTokens = new Float64Array(0);
  private recordSteps = new Float64Array(0);
  private recordKvMs = new Float64Array(0);
  private readonly a0: number;
  private readonly b0: number;

  constructor(prefillTokensPerSecond: number, stepBaseMs: number) {
    this.a0 = 1e6 / prefillTokensPerSecond;
    this.b0 = stepBaseMs;
  }

  /** Resets slots given to a new worker since the last call (the worker table's generation changed). */
  sync(load: LoadTracker): void {
    const capacity = load.slotCapacity;
    if (this.a.length < capacity) this.grow(capacity);
    const generation = load.table.generation;
    const slots = load.liveSlots;
    for (let i = 0; i < load.liveCount; i++) {
      const slot = slots[i]!;
      if (this.generationOfSlot[slot] === generation[slot]) continue;
      this.generationOfSlot[slot] = generation[slot]!;
      this.reset(slot);
    }
  }

  /** Remembers what request `record`'s predicted TTFT on its worker was made of. */
  admitted(record: number, tokens: number, steps: number, kvMs: number, recordCapacity: number): void {
    if (this.recordTokens.length <= record || this.recordTokens.length > 4 * recordCapacity) {
      this.resizeRecords(Math.max(record + 1, recordCapacity));
    }
    this.recordTokens[record] = tokens;
    this.recordSteps[record] = steps;
    this.recordKvMs[record] = kvMs;
  }

  /** Request `record` on `slot` got its first token `elapsedMs` after it was routed. */
  observe(record: number, slot: number, elapsedMs: number): void {
    if (!(Number.isFinite(elapsedMs) && elapsedMs >= 0) || record >= this.recordTokens.length || slot >= this.a.length) return;
    const x = this.recordTokens[record]! / 1000;
    const s = this.recordSteps[record]!;
    const kvMs = this.recordKvMs[record]!;
    const a = this.a[slot]!;
    const b = this.b[slot]!;
    const prefillMs = a * x;
    const stepsMs = b * s;
    const predicted = prefillMs + stepsMs + kvMs;
    if (!(predicted > 0)) return;
    if (prefillMs >= PREFILL_SHARE * predicted) {
      this.a[slot] = clamp(towards(a, (elapsedMs - stepsMs - kvMs) / x), this.a0);
    } else if (stepsMs >= STEP_SHARE * predicted && s > 0) {
      this.b[slot] = clamp(towards(b, (elapsedMs - prefillMs - kvMs) / s), this.b0);
    } else {
      return;
    }
    this.prefillPerMs[slot] = 1000 / this.a[slot]!;
    this.stepBaseMs[slot] = this.b[slot]!;
    this.samples[slot]!++;
  }

  learned(slot: number): LearnedTimes {
    return {
      prefillTokensPerSecond: this.prefillPerMs[slot]! * 1000,
      stepBaseMs: this.stepBaseMs[slot]!,
      samples: this.samples[slot]!,
    };
  }

  private reset(slot: number): void {
    this.a[slot] = this.a0;
    this.b[slot] = this.b0;
    this.prefillPerMs[slot] = 1000 / this.a0;
    this.stepBaseMs[slot] = this.b0;
    this.samples[slot] = 0;
  }

  private grow(capacity: number): void {
    const copy = (from: Float64Array): Float64Array<ArrayBuffer> => {
      const to = new Float64Array(capacity);
      to.set(from);
      return to;
    };
    this.prefillPerMs = copy(this.prefillPerMs);
    this.stepBaseMs = copy(this.stepBaseMs);
    this.samples = copy(this.samples);
    this.a = copy(this.a);
    this.b = copy(this.b);
    const seen = this.generationOfSlot.length;
    this.generationOfSlot = copy(this.generationOfSlot);
    this.generationOfSlot.fill(-1, seen); // never reset yet
  }

  private resizeRecords(capacity: number): void {
    const resize = (from: Float64Array): Float64Array<ArrayBuffer> => {
      const to = new Float64Array(capacity);
      to.set(from.subarray(0, Math.min(from.length, capacity)));
      return to;
    };
    this.recordTokens = resize(this.recordTokens);
    this.recordSteps = resize(this.recordSteps);
    this.recordKvMs = resize(this.recordKvMs);
  }
}

/** One median-tracking step from `value` toward `sample`. */
function towards(value: number, sample: number): number {
  return sample > value ? value * (1 + STEP) : sample < value ? value * (1 - STEP) : value;
}

function clamp(value: number, configured: number): number {
  if (!Number.isFinite(value)) return configured;
  return Math.min(configured * RANGE, Math.max(configured / RANGE, value));
}
