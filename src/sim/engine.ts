/**
 * A mock inference engine: a KV cache (./engine-cache.ts) plus a scheduler that follows
 * the time model (./time-model.ts). Clock-agnostic: the caller passes "now" in model
 * ms and calls `step()` whenever `nextEventMs()` is due, so the same engine runs in
 * the virtual-time simulator and, in real time, behind a ZMQ publisher.
 *
 * Request life: submit → waiting (FIFO) → admitted when the prefill server is free
 * and its blocks fit (prefix lookup, pin, allocate prompt + output blocks, evicting
 * LRU) → prefill done (prompt blocks cached, BlockStored; first token) → decode →
 * finished (output blocks cached, all blocks unpinned). The head of the queue blocks
 * those behind it when its blocks do not fit (vLLM's FCFS does the same). A request
 * larger than the whole cache is rejected at submit.
 */
import { EngineCache, type CacheSequence, type KvEventBatch } from "./engine-cache";
import { decodeMs, prefillMs, type TimeModel } from "./time-model";

export interface EngineRequest {
  readonly id: number;
  /** Prompt tokens, then the tokens the engine will "generate". */
  readonly tokens: Uint32Array;
  readonly promptLength: number;
}

export interface EngineListener {
  /** First token: prefill of the request's uncached prompt tokens is done. */
  prefillDone(request: EngineRequest, nowMs: number, cachedTokens: number): void;
  finished(request: EngineRequest, nowMs: number): void;
}

interface Running {
  readonly request: EngineRequest;
  readonly sequence: CacheSequence;
  readonly endMs: number;
  readonly order: number;
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
  /** Model ms the prefill server was busy. */
  prefillBusyMs: number;
  /** Admission attempts that found too few free blocks. */
  blockedAdmissions: number;
  waitingPeak: number;
}

export class MockEngine {
  readonly index: number;
  readonly cache: EngineCache;
  readonly counters: EngineCounters = {
    submitted: 0, rejected: 0, finished: 0, cachedTokens: 0, computedTokens: 0, prefillBusyMs: 0,
    blockedAdmissions: 0, waitingPeak: 0,
  };

  private readonly time: TimeModel;
  private readonly listener: EngineListener;
  private waiting: Waiting[] = [];
  private waitingHead = 0;
  private prefilling: Running | null = null;
  /** Decoding requests, a binary min-heap on (endMs, order). */
  private readonly decoding: Running[] = [];
  private order = 0;

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
    return this.decoding.length + (this.prefilling === null ? 0 : 1);
  }

  get idle(): boolean {
    return this.waitingCount === 0 && this.runningCount === 0;
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
    if (this.prefilling === null) this.admit(nowMs);
    return true;
  }

  /** When the next internal event is due (Infinity when none is pending). */
  nextEventMs(): number {
    const decodeEnd = this.decoding.length > 0 ? this.decoding[0]!.endMs : Infinity;
    const prefillEnd = this.prefilling === null ? Infinity : this.prefilling.endMs;
    return Math.min(decodeEnd, prefillEnd);
  }

  /** Processes the next internal event (a finish before a prefill end at equal times). */
  step(): number {
    const decodeEnd = this.decoding.length > 0 ? this.decoding[0]!.endMs : Infinity;
    const prefillEnd = this.prefilling === null ? Infinity : this.prefilling.endMs;
    if (decodeEnd === Infinity && prefillEnd === Infinity) throw new Error(`engine ${this.index} has nothing to do`);
    if (decodeEnd <= prefillEnd) {
      this.finish(this.popDecoding());
      return decodeEnd;
    }
    this.endPrefill(this.prefilling!);
    return prefillEnd;
  }

  /** The KV events since the last call as one batch stamped `nowMs`, or null. */
  takeBatch(nowMs: number): KvEventBatch | null {
    const events = this.cache.takeEvents();
    return events.length === 0 ? null : { ts: nowMs / 1000, events };
  }

  private admit(nowMs: number): void {
    if (this.waitingCount === 0) return;
    const head = this.waiting[this.waitingHead]!;
    const request = head.request;
    head.sequence ??= this.cache.prepare(request.tokens, request.promptLength);
    const sequence = head.sequence;
    if (!this.cache.allocate(sequence)) {
      this.counters.blockedAdmissions++;
      return;
    }
    this.shiftWaiting();
    const cachedTokens = sequence.hitBlocks * this.cache.blockSize;
    const computed = request.promptLength - cachedTokens;
    const duration = prefillMs(this.time, computed);
    this.counters.cachedTokens += cachedTokens;
    this.counters.computedTokens += computed;
    this.counters.prefillBusyMs += duration;
    this.prefilling = { request, sequence, endMs: nowMs + duration, order: this.order++ };
  }

  private endPrefill(running: Running): void {
    this.prefilling = null;
    const { request, sequence, endMs } = running;
    this.cache.commit(sequence, request.promptLength);
    this.listener.prefillDone(request, endMs, sequence.hitBlocks * this.cache.blockSize);
    const outputLength = request.tokens.length - request.promptLength;
    this.pushDecoding({ request, sequence, endMs: endMs + decodeMs(this.time, outputLength), order: this.order++ });
    this.admit(endMs);
  }

  private finish(running: Running): void {
    const { request, sequence, endMs } = running;
    this.cache.commit(sequence, request.tokens.length);
    this.cache.release(sequence);
    this.counters.finished++;
    this.listener.finished(request, endMs);
    if (this.prefilling === null) this.admit(endMs);
  }

  private shiftWaiting(): void {
    this.waitingHead++;
    if (this.waitingHead > 1024 && this.waitingHead * 2 > this.waiting.length) {
      this.waiting = this.waiting.slice(this.waitingHead);
      this.waitingHead = 0;
    }
  }

  private pushDecoding(entry: Running): void {
    const heap = this.decoding;
    let i = heap.length;
    heap.push(entry);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!before(heap[i]!, heap[parent]!)) break;
      [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
      i = parent;
    }
  }

  private popDecoding(): Running {
    const heap = this.decoding;
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length > 0) {
      heap[0] = last;
      for (let i = 0; ;) {
        const left = 2 * i + 1;
        const right = left + 1;
        let smallest = i;
        if (left < heap.length && before(heap[left]!, heap[smallest]!)) smallest = left;
        if (right < heap.length && before(heap[right]!, heap[smallest]!)) smallest = right;
        if (smallest === i) break;
        [heap[i], heap[smallest]] = [heap[smallest]!, heap[i]!];
        i = smallest;
      }
    }
    return top;
  }
}

function before(a: Running, b: Running): boolean {
  return a.endMs < b.endMs || (a.endMs === b.endMs && a.order < b.order);
}
