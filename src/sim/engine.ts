/**
 * A mock inference engine: a KV cache (./engine-cache.ts) run by vLLM V1's scheduler
 * loop (continuous batching, chunked prefill, FCFS) with step durations from the time
 * model (./time-model.ts). Clock-agnostic: the caller passes "now" in model ms and
 * calls `step()` whenever `nextEventMs()` is due, so the same engine runs in the
 * virtual-time simulator and, in real time, behind a ZMQ publisher.
 *
 * A step is planned when it starts and takes effect when it ends:
 *
 * - start: every running request gets its tokens in admission order (a decoding one
 *   1, a prefilling one the next chunk of its uncached prompt, at most
 *   `longPrefillTokens` when set) until the step's budget is spent; then queued requests
 *   are admitted FCFS while budget and `maxRunning` allow. Admission looks up the
 *   longest cached prefix (device, then CPU tier), pins it and allocates blocks for the
 *   rest of the prompt and the whole output (evicting LRU); if they do not fit, the head
 *   waits and blocks those behind it (vLLM's FCFS does the same). The full prompt blocks
 *   a step will compute are cached as it is planned, as vLLM V1's allocate_slots caches
 *   them: requests sharing a prefix that arrive while the first one's prefill runs, even
 *   those admitted into the same step, reuse it. A running request does not look the
 *   cache up again: a chunk another request computed first is computed again, and kept
 *   as another copy.
 * - end (start + step_ms): the step's KV events are published (BlockStored of the
 *   blocks it cached, BlockRemoved of its evictions, the CPU tier's too: vLLM publishes
 *   them after the step ran), requests whose prompt is complete get their first token
 *   (`prefillDone`), decoding requests get one token each, full output blocks are
 *   cached, finished requests release their blocks (`finished`); the next step starts
 *   at once if anything is left.
 *
 * See docs/decisions.md#engine-publishes-after-step.
 *
 * A request submitted while a step runs joins at the next step's start; one submitted
 * to an idle engine starts a step at once. A request larger than the whole cache is
 * rejected at submit.
 */
import type { EngineCache, CacheSequence, KvEventBatch } from "./engine-cache";
import { prefillChunkMax, reloadMs, stepMs, type TimeModel } from "./time-model";

export interface EngineRequest {
  readonly id: number;
  /** Prompt tokens, then the tokens the engine will "generate". */
  readonly tokens: Uint32Array;
  readonly promptLength: number;
}

export interface EngineListener {
  /** First token: the request's last prompt token was computed in the step ending now. */
  prefillDone(request: EngineRequest, nowMs: number, cachedTokens: number): void;
  finished(request: EngineRequest, nowMs: number): void;
}

interface Active {
  readonly request: EngineRequest;
  readonly sequence: CacheSequence;
  readonly cachedTokens: number;
  /** Prompt tokens whose KV exists (cached prefix + computed chunks). */
  promptDone: number;
  generated: number;
  /** Tokens scheduled in the step in flight (0: not in it). */
  scheduled: number;
}

interface Waiting {
  readonly request: EngineRequest;
  /** Hashed on the first admission attempt, kept while blocked. */
  sequence: CacheSequence | null;
}

export interface EngineCounters {
  submitted: number;
  rejected: number;
  finished: number;
  /** Prompt tokens served from cache / computed by prefill. */
  cachedTokens: number;
  computedTokens: number;
  decodeTokens: number;
  steps: number;
  /** Model ms spent in steps. */
  busyMs: number;
  /** Steps whose queue head found too few free blocks. */
  blockedAdmissions: number;
  waitingPeak: number;
  runningPeak: number;
}

export class MockEngine {
  readonly index: number;
  readonly cache: EngineCache;
  readonly counters: EngineCounters = {
    submitted: 0,
    rejected: 0,
    finished: 0,
    cachedTokens: 0,
    computedTokens: 0,
    decodeTokens: 0,
    steps: 0,
    busyMs: 0,
    blockedAdmissions: 0,
    waitingPeak: 0,
    runningPeak: 0,
  };

  private readonly time: TimeModel;
  private readonly listener: EngineListener;
  private waiting: Waiting[] = [];
  private waitingHead = 0;
  /** Admitted, unfinished requests in admission order. */
  private running: Active[] = [];
  /** End of the step in flight, or Infinity when idle. */
  private stepEndMs = Infinity;

  constructor(index: number, cache: EngineCache, time: TimeModel, listener: EngineListener) {
    this.index = index;
    this.cache = cache;
    this.time = time;
    this.listener = listener;
  }

  get waitingCount(): number {
    return this.waiting.length - this.waitingHead;
  }

  /** Requests admitted and not finished (prefilling or decoding). */
  get runningCount(): number {
    return this.running.length;
  }

  get idle(): boolean {
    return this.stepEndMs === Infinity;
  }

  /** Queues a request; false (rejected) if it could never fit in the cache. */
  submit(request: EngineRequest, nowMs: number): boolean {
    this.counters.submitted++;
    if (this.cache.blocksFor(request.tokens.length) > this.cache.capacityBlocks) {
      this.counters.rejected++;
      return false;
    }
    this.waiting.push({ request, sequence: null });
    this.counters.waitingPeak = Math.max(this.counters.waitingPeak, this.waitingCount);
    if (this.stepEndMs === Infinity) this.startStep(nowMs);
    return true;
  }

  /** When the step in flight ends (Infinity when idle). */
  nextEventMs(): number {
    return this.stepEndMs;
  }

  /** Ends the step in flight and starts the next one if there is work; returns the time. */
  step(): number {
    const now = this.stepEndMs;
    if (now === Infinity) throw new Error(`engine ${this.index} has nothing to do`);
    this.endStep(now);
    // The step ran: its cached blocks and evictions are published (vLLM's update_from_output).
    this.cache.publish();
    if (this.running.length > 0 || this.waitingCount > 0) this.startStep(now);
    else this.stepEndMs = Infinity;
    return now;
  }

  /** The KV events published since the last call (at step ends) as one batch stamped `nowMs`, or null. */
  takeBatch(nowMs: number): KvEventBatch | null {
    const events = this.cache.takeEvents();
    return events.length === 0 ? null : { ts: nowMs / 1000, events };
  }

  private startStep(nowMs: number): void {
    const time = this.time;
    let budget = time.maxBatchedTokens;
    let prefillTokens = 0;
    let kvTokens = 0;
    let loadedTokens = 0;
    const chunkMax = prefillChunkMax(time);
    const running = this.running;
    for (let i = 0; i < running.length && budget > 0; i++) {
      const active = running[i]!;
      const left = active.request.promptLength - active.promptDone;
      if (left > 0) {
        const chunk = Math.min(left, budget, chunkMax);
        this.schedulePrefill(active, chunk);
        prefillTokens += chunk;
        budget -= chunk;
      } else {
        active.scheduled = 1;
        kvTokens += active.promptDone + active.generated;
        budget--;
      }
    }
    while (budget > 0 && running.length < time.maxRunning && this.waitingCount > 0) {
      const active = this.admit();
      if (active === null) break;
      loadedTokens += active.sequence.loadedBlocks * this.cache.blockSize;
      const chunk = Math.min(active.request.promptLength - active.promptDone, budget, chunkMax);
      this.schedulePrefill(active, chunk);
      prefillTokens += chunk;
      budget -= chunk;
    }
    const duration = stepMs(time, prefillTokens, kvTokens) + reloadMs(time, loadedTokens);
    this.counters.steps++;
    this.counters.busyMs += duration;
    this.counters.computedTokens += prefillTokens;
    this.counters.runningPeak = Math.max(this.counters.runningPeak, running.length);
    this.stepEndMs = nowMs + duration;
  }

  /**
   * Schedules the next `chunk` prompt tokens of a request in the step being planned, and
   * caches the full blocks they complete at once, as vLLM V1 does (allocate_slots caches
   * the blocks of the tokens it schedules): a request admitted after it, in this step or
   * a later one, reuses them instead of computing them again.
   */
  private schedulePrefill(active: Active, chunk: number): void {
    active.scheduled = chunk;
    this.cache.commit(active.sequence, active.promptDone + chunk);
  }

  /** Admits the head of the queue, or returns null if its blocks do not fit. */
  private admit(): Active | null {
    const head = this.waiting[this.waitingHead]!;
    const request = head.request;
    head.sequence ??= this.cache.prepare(request.tokens, request.promptLength);
    const sequence = head.sequence;
    if (!this.cache.allocate(sequence)) {
      this.counters.blockedAdmissions++;
      return null;
    }
    this.shiftWaiting();
    // Blocks loaded back from the CPU tier are not computed either.
    const cachedTokens = (sequence.hitBlocks + sequence.loadedBlocks) * this.cache.blockSize;
    this.counters.cachedTokens += cachedTokens;
    const active: Active = {
      request,
      sequence,
      cachedTokens,
      promptDone: cachedTokens,
      generated: 0,
      scheduled: 0,
    };
    this.running.push(active);
    return active;
  }

  private endStep(nowMs: number): void {
    const running = this.running;
    let kept = 0;
    for (let i = 0; i < running.length; i++) {
      const active = running[i]!;
      if (active.scheduled > 0 && this.advance(active, nowMs)) continue;
      running[kept++] = active;
    }
    running.length = kept;
  }

  /** Applies the step's tokens to one request; true if it finished. */
  private advance(active: Active, nowMs: number): boolean {
    const { request, sequence } = active;
    const outputLength = request.tokens.length - request.promptLength;
    const tokens = active.scheduled;
    active.scheduled = 0;
    if (active.promptDone < request.promptLength) {
      // Its blocks were cached when the step was scheduled (schedulePrefill).
      active.promptDone += tokens;
      if (active.promptDone < request.promptLength) return false;
      // The step that computes the last prompt token samples the first output token.
      active.generated = Math.min(1, outputLength);
      this.counters.decodeTokens += active.generated;
      this.listener.prefillDone(request, nowMs, active.cachedTokens);
    } else {
      active.generated++;
      this.counters.decodeTokens++;
    }
    this.cache.commit(sequence, request.promptLength + active.generated);
    if (active.generated < outputLength) return false;
    this.cache.release(sequence);
    this.counters.finished++;
    this.listener.finished(request, nowMs);
    return true;
  }

  private shiftWaiting(): void {
    this.waitingHead++;
    if (this.waitingHead > 1024 && this.waitingHead * 2 > this.waiting.length) {
      this.waiting = this.waiting.slice(this.waitingHead);
      this.waitingHead = 0;
    }
  }
}
