/**
 * Online calibration of the engine time model from the lifecycle calls the router
 * already gets: a request's time from route to prefill_done is its observed TTFT, and
 * at routing time the router knew what that TTFT depends on (./ttft.ts):
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
 * by multiplicative steps toward each one: observed TTFTs are skewed (a request that
 * arrives while a long prefill step is already running waits for it, which the router
 * cannot see; at the trace's rate 10% of samples are 1.6× their prediction and 1% are
 * 17×), and a least-squares fit chased those outliers to its bounds.
 *
 * **One fleet value, per-worker factors only past a dead band.** Every sample, from any
 * worker, moves one fleet-wide `a` and `b`; each worker also tracks its own ratio to the
 * fleet, and its predictions use that ratio only once it is more than 25% off. Decisions
 * compare workers, so what matters is that their constants are right *relative to each
 * other*: per-worker trackers jitter by a step or two around the truth (±3–6%), and on a
 * fleet of equal engines that jitter alone reordered near-tied workers (in virtual time
 * only 36% of calibrated decisions were those of the true constants; a 2×-off constant
 * shared by all workers keeps 99.6%). A worker believed slow also gets little traffic,
 * so it learns little and stays believed slow. A truly different engine (≥ 25% slower
 * or faster) still gets its own factor. The step size is 25% for a tracker's first
 * samples, shrinking to 3% (`max(3%, 25% / (1 + n/8))`): from constants 2× off the fleet
 * value is within a few percent after ~40 samples instead of ~25 per worker. Learned
 * values stay within [1/16, 16] × the configured ones; a slot given to a new worker
 * starts from the fleet's values, with no samples of its own.
 */
import type { LoadTracker } from "./load";

/** Smallest multiplicative step toward each sample (a median tracker: up or down by this much). */
const STEP = 0.03;
/** A tracker's first step; steps shrink as `FIRST_STEP / (1 + samples / STEP_SAMPLES)`. */
const FIRST_STEP = 0.25;
const STEP_SAMPLES = 8;
const PREFILL_SHARE = 0.8;
const STEP_SHARE = 0.5;
const RANGE = 16;
/** A worker's own factor is used once its ratio to the fleet is past this (either way). */
const DEAD_BAND = 1.25;
/** ...and once it has this many samples of its own. */
const OWN_SAMPLES_MIN = 32;

export interface LearnedTimes {
  readonly prefillTokensPerSecond: number;
  readonly stepBaseMs: number;
  /** Samples from this worker (the fleet's values are learned from every worker's). */
  readonly samples: number;
}

export class Calibration {
  /** Fleet-wide prefill speed, tokens per ms, and step base, ms: what predictions use. */
  prefillPerMs: number;
  stepBaseMs: number;
  /** Per slot: factors on the fleet's speed and step base (1 inside the dead band). */
  speedFactor = new Float64Array(0);
  stepFactor = new Float64Array(0);
  samples = new Float64Array(0);
  // Fleet: ms per 1000 prefill tokens and step base ms, with their sample counts.
  private a: number;
  private b: number;
  private aSamples = 0;
  private bSamples = 0;
  // Per slot: the worker's own a and b, tracked like the fleet's, with sample counts.
  private aOwn = new Float64Array(0);
  private bOwn = new Float64Array(0);
  private aOwnSamples = new Float64Array(0);
  private bOwnSamples = new Float64Array(0);
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
    this.a = this.a0;
    this.b = this.b0;
    this.prefillPerMs = 1000 / this.a0;
    this.stepBaseMs = this.b0;
  }

  /** Resets slots given to a new worker since the last call (the worker table's generation changed). */
  sync(load: LoadTracker): void {
    const capacity = load.slotCapacity;
    if (this.speedFactor.length < capacity) this.grow(capacity);
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
  admitted(
    record: number,
    tokens: number,
    steps: number,
    kvMs: number,
    recordCapacity: number,
  ): void {
    if (this.recordTokens.length <= record || this.recordTokens.length > 4 * recordCapacity) {
      this.resizeRecords(Math.max(record + 1, recordCapacity));
    }
    this.recordTokens[record] = tokens;
    this.recordSteps[record] = steps;
    this.recordKvMs[record] = kvMs;
  }

  /** Request `record` on `slot` got its first token `elapsedMs` after it was routed. */
  observe(record: number, slot: number, elapsedMs: number): void {
    if (!(Number.isFinite(elapsedMs) && elapsedMs >= 0)) return;
    if (record >= this.recordTokens.length) return;
    if (slot >= this.speedFactor.length) return;
    const x = this.recordTokens[record]! / 1000;
    const s = this.recordSteps[record]!;
    const kvMs = this.recordKvMs[record]!;
    // What the prediction used on this worker.
    const a = this.a / this.speedFactor[slot]!;
    const b = this.b * this.stepFactor[slot]!;
    const prefillMs = a * x;
    const stepsMs = b * s;
    const predicted = prefillMs + stepsMs + kvMs;
    if (!(predicted > 0)) return;
    if (prefillMs >= PREFILL_SHARE * predicted) {
      const sample = (elapsedMs - stepsMs - kvMs) / x;
      this.a = clamp(towards(this.a, sample, this.aSamples++), this.a0);
      const own = towards(this.aOwn[slot]!, sample, this.aOwnSamples[slot]!++);
      this.aOwn[slot] = clamp(own, this.a0);
    } else if (stepsMs >= STEP_SHARE * predicted && s > 0) {
      const sample = (elapsedMs - prefillMs - kvMs) / s;
      this.b = clamp(towards(this.b, sample, this.bSamples++), this.b0);
      const own = towards(this.bOwn[slot]!, sample, this.bOwnSamples[slot]!++);
      this.bOwn[slot] = clamp(own, this.b0);
    } else {
      return;
    }
    this.prefillPerMs = 1000 / this.a;
    this.stepBaseMs = this.b;
    this.speedFactor[slot] = 1 / banded(this.aOwn[slot]! / this.a, this.aOwnSamples[slot]!);
    this.stepFactor[slot] = banded(this.bOwn[slot]! / this.b, this.bOwnSamples[slot]!);
    this.samples[slot]!++;
  }

  learned(slot: number): LearnedTimes {
    return {
      prefillTokensPerSecond: this.prefillPerMs * this.speedFactor[slot]! * 1000,
      stepBaseMs: this.stepBaseMs * this.stepFactor[slot]!,
      samples: this.samples[slot]!,
    };
  }

  private reset(slot: number): void {
    this.speedFactor[slot] = 1;
    this.stepFactor[slot] = 1;
    this.aOwn[slot] = this.a;
    this.bOwn[slot] = this.b;
    this.aOwnSamples[slot] = 0;
    this.bOwnSamples[slot] = 0;
    this.samples[slot] = 0;
  }

  private grow(capacity: number): void {
    const copy = (from: Float64Array): Float64Array<ArrayBuffer> => {
      const to = new Float64Array(capacity);
      to.set(from);
      return to;
    };
    this.speedFactor = copy(this.speedFactor);
    this.stepFactor = copy(this.stepFactor);
    this.samples = copy(this.samples);
    this.aOwn = copy(this.aOwn);
    this.bOwn = copy(this.bOwn);
    this.aOwnSamples = copy(this.aOwnSamples);
    this.bOwnSamples = copy(this.bOwnSamples);
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

/** One median-tracking step from `value` toward `sample`, the `n`-th of its tracker. */
function towards(value: number, sample: number, n: number): number {
  const step = Math.max(STEP, FIRST_STEP / (1 + n / STEP_SAMPLES));
  return sample > value ? value * (1 + step) : sample < value ? value * (1 - step) : value;
}

/** A worker's ratio to the fleet as its predictions use it: 1 unless past the dead band. */
function banded(ratio: number, samples: number): number {
  return samples >= OWN_SAMPLES_MIN && (ratio > DEAD_BAND || ratio < 1 / DEAD_BAND) ? ratio : 1;
}

function clamp(value: number, configured: number): number {
  if (!Number.isFinite(value)) return configured;
  return Math.min(configured * RANGE, Math.max(configured / RANGE, value));
}
