/**
 * The untimed half of the indexer replay (bench/indexer-replay.ts): a Mooncake trace,
 * transformed as Dynamo's indexer bench does, played through one mock vLLM-like
 * engine cache per worker (src/sim/engine-cache.ts: LRU eviction, exact Stored /
 * Removed events), into a schedule of operations:
 *
 * - a query per request: the prompt's tokens (the router hashes and matches them);
 * - a KV-event batch per engine step, msgpack-encoded as engines send it.
 *
 * Cadence: `vllm` publishes one batch per scheduler step (a prefill chunk, then one
 * block per decode step once a block fills); `sglang` one store for the prompt and one
 * for the output, as SGLang's radix cache announces inserts (its default page size
 * is 1). Evictions go with the first batch of the request that caused them.
 *
 * Each worker's timeline is shifted to 0 and rescaled to the window; operations are
 * sorted by (deadline, class: queries first, worker, source order).
 */
import { DEFAULT_SEED } from "../src/hash";
import { PromptHasher } from "../src/route";
import { EngineCache, type KvEvent } from "../src/sim/engine-cache";
import { toWireEvent } from "../src/sim/networked-engine";
import { createRng, randomInt, randomU64 } from "../src/sim/random";
import { writeOutputTokens, writePromptTokens, DEFAULT_VOCAB_SIZE } from "../src/sim/tokens";
import { requestIds, type Trace } from "../src/sim/trace";
import { encodeKvBatch } from "../src/wire/kv-events";

export const OP_QUERY = 0;
export const OP_BATCH = 1;

export type Cadence = "vllm" | "sglang";

export interface CorpusOptions {
  readonly workers: number;
  readonly engineBlocks: number;
  readonly blockSize: number;
  readonly windowMs: number;
  readonly seed: number;
  readonly cadence: Cadence;
  /** vLLM cadence: tokens per prefill step. */
  readonly prefillChunk: number;
}

/** Append-only u32 / u8 storage in fixed chunks, addressed by a global offset. */
class Slab<T extends Uint8Array | Uint32Array> {
  readonly chunks: T[] = [];
  private used = 0;
  constructor(
    private readonly make: (n: number) => T,
    private readonly chunkSize: number,
  ) {}

  /** Copies `data` in; returns its (chunk, offset) packed as chunk * chunkSize + offset. */
  push(data: ArrayLike<number>): number {
    if (data.length > this.chunkSize)
      throw new RangeError(`item of ${data.length} over the slab chunk ${this.chunkSize}`);
    if (this.chunks.length === 0 || this.used + data.length > this.chunkSize) {
      this.chunks.push(this.make(this.chunkSize));
      this.used = 0;
    }
    const chunk = this.chunks.length - 1;
    this.chunks[chunk]!.set(data, this.used);
    const at = chunk * this.chunkSize + this.used;
    this.used += data.length;
    return at;
  }

  view(at: number, length: number): T {
    const chunk = Math.floor(at / this.chunkSize);
    const offset = at - chunk * this.chunkSize;
    return this.chunks[chunk]!.subarray(offset, offset + length) as T;
  }

  get bytes(): number {
    let total = 0;
    for (const chunk of this.chunks) total += chunk.byteLength;
    return total;
  }
}

/** Growable columns of the operations, in creation (source) order. */
class OpColumns {
  count = 0;
  time = new Float64Array(1 << 16);
  kind = new Uint8Array(1 << 16);
  worker = new Uint32Array(1 << 16);
  at = new Float64Array(1 << 16);
  length = new Uint32Array(1 << 16);
  blocks = new Uint32Array(1 << 16);

  add(
    time: number,
    kind: number,
    worker: number,
    at: number,
    length: number,
    blocks: number,
  ): void {
    if (this.count === this.time.length) this.grow();
    const i = this.count++;
    this.time[i] = time;
    this.kind[i] = kind;
    this.worker[i] = worker;
    this.at[i] = at;
    this.length[i] = length;
    this.blocks[i] = blocks;
  }

  private grow(): void {
    const size = 2 * this.time.length;
    const widen = <A extends Float64Array | Uint8Array | Uint32Array>(from: A, to: A): A => {
      to.set(from);
      return to;
    };
    this.time = widen(this.time, new Float64Array(size));
    this.kind = widen(this.kind, new Uint8Array(size));
    this.worker = widen(this.worker, new Uint32Array(size));
    this.at = widen(this.at, new Float64Array(size));
    this.length = widen(this.length, new Uint32Array(size));
    this.blocks = widen(this.blocks, new Uint32Array(size));
  }
}

export interface Totals {
  requests: number;
  /** Requests whose prompt and output did not fit the engine (queried, no events). */
  requestsSkipped: number;
  queryBlocks: number;
  batches: number;
  storedEvents: number;
  removedEvents: number;
  storedBlocks: number;
  removedBlocks: number;
  payloadBytes: number;
  queryTokenBytes: number;
}

/** The prepared schedule, sorted; op i's fields are at sorted position i. */
export interface Corpus {
  readonly count: number;
  /** Deadline in ns from the start of the run. */
  readonly deadline: Float64Array;
  readonly kind: Uint8Array;
  readonly worker: Uint32Array;
  /** Batches: payload; queries: prompt tokens (valid views into the slabs). */
  payload(i: number): Uint8Array;
  tokens(i: number): Uint32Array;
  /** Blocks the op carries: query hashes (full prompt blocks) or stored + removed hashes. */
  readonly blocks: Uint32Array;
  /** Per worker: cached blocks in its engine at the end (what the index must hold). */
  readonly engineBlocks: Uint32Array;
  /** Per worker: batches (sequence numbers 0..n-1). */
  readonly workerBatches: Uint32Array;
  readonly totals: Totals;
  readonly totalBlockOps: number;
}

const SLAB_CHUNK = 1 << 24;

/** Generates the whole corpus (untimed). */
export function buildCorpus(trace: Trace, options: CorpusOptions): Corpus {
  const rng = createRng(options.seed);
  const owner = new Uint32Array(trace.count);
  for (let r = 0; r < trace.count; r++) owner[r] = randomInt(rng, options.workers);
  const engines: EngineCache[] = [];
  for (let w = 0; w < options.workers; w++) {
    engines.push(
      new EngineCache({
        capacityBlocks: options.engineBlocks,
        blockSize: options.blockSize,
        hashSeed: randomU64(rng),
        // One copy per hash, as every result in bench/RESULTS.md was measured: the corpus
        // stays the same event stream from build to build.
        keepDuplicates: false,
      }),
    );
  }
  const ops = new OpColumns();
  const payloads = new Slab((n) => new Uint8Array(n), SLAB_CHUNK);
  const queryTokens = new Slab((n) => new Uint32Array(n), SLAB_CHUNK);
  const totals: Totals = {
    requests: trace.count,
    requestsSkipped: 0,
    queryBlocks: 0,
    batches: 0,
    storedEvents: 0,
    removedEvents: 0,
    storedBlocks: 0,
    removedBlocks: 0,
    payloadBytes: 0,
    queryTokenBytes: 0,
  };
  const workerBatches = new Uint32Array(options.workers);
  let scratch = new Uint32Array(1 << 16);
  const emit = (worker: number, time: number, events: KvEvent[]): void => {
    if (events.length === 0) return;
    const payload = encodeKvBatch(
      { ts: time / 1000, events: events.map(toWireEvent) },
      { form: "array" },
    );
    let blocks = 0;
    for (const event of events) {
      if (event.type === "AllBlocksCleared") continue;
      blocks += event.block_hashes.length;
      if (event.type === "BlockStored") {
        totals.storedEvents++;
        totals.storedBlocks += event.block_hashes.length;
      } else {
        totals.removedEvents++;
        totals.removedBlocks += event.block_hashes.length;
      }
    }
    ops.add(time, OP_BATCH, worker, payloads.push(payload), payload.length, blocks);
    totals.batches++;
    totals.payloadBytes += payload.length;
    workerBatches[worker]!++;
  };
  for (let r = 0; r < trace.count; r++) {
    const worker = owner[r]!;
    const time = trace.arrivalMs[r]!;
    const prompt = trace.inputLength[r]!;
    const total = prompt + trace.outputLength[r]!;
    if (scratch.length < total) scratch = new Uint32Array(2 * total);
    const tokens = scratch.subarray(0, total);
    writePromptTokens(requestIds(trace, r), trace.blockTokens, prompt, DEFAULT_VOCAB_SIZE, tokens);
    writeOutputTokens(r, total - prompt, DEFAULT_VOCAB_SIZE, tokens, prompt);
    const promptTokens = tokens.subarray(0, prompt);
    ops.add(
      time,
      OP_QUERY,
      worker,
      queryTokens.push(promptTokens),
      prompt,
      Math.floor(prompt / options.blockSize),
    );
    totals.queryBlocks += Math.floor(prompt / options.blockSize);
    totals.queryTokenBytes += 4 * prompt;
    const engine = engines[worker]!;
    const sequence = engine.prepare(tokens, prompt);
    if (!engine.allocate(sequence)) {
      totals.requestsSkipped++;
      continue;
    }
    const step = (upTo: number): void => {
      engine.commit(sequence, upTo);
      engine.publish(); // each step's events go out as one batch, as the engine's would
      emit(worker, time, engine.takeEvents());
    };
    if (options.cadence === "sglang") {
      step(prompt);
      step(total);
    } else {
      for (
        let end = Math.min(options.prefillChunk, prompt);
        ;
        end = Math.min(end + options.prefillChunk, prompt)
      ) {
        step(end);
        if (end === prompt) break;
      }
      const size = options.blockSize;
      for (let block = Math.floor(prompt / size) + 1; block * size <= total; block++)
        step(block * size);
    }
    engine.release(sequence);
  }
  const engineBlocks = new Uint32Array(options.workers);
  for (let w = 0; w < options.workers; w++) engineBlocks[w] = engines[w]!.cachedBlocks;
  return schedule(ops, options, payloads, queryTokens, engineBlocks, workerBatches, totals);
}

/** Rescales each worker's timeline to the window and sorts the operations. */
function schedule(
  ops: OpColumns,
  options: CorpusOptions,
  payloads: Slab<Uint8Array>,
  queryTokens: Slab<Uint32Array>,
  engineBlocks: Uint32Array,
  workerBatches: Uint32Array,
  totals: Totals,
): Corpus {
  const n = ops.count;
  const first = new Float64Array(options.workers).fill(Infinity);
  const last = new Float64Array(options.workers).fill(-Infinity);
  for (let i = 0; i < n; i++) {
    const w = ops.worker[i]!;
    first[w] = Math.min(first[w]!, ops.time[i]!);
    last[w] = Math.max(last[w]!, ops.time[i]!);
  }
  const windowNs = options.windowMs * 1e6;
  const deadlineOf = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const w = ops.worker[i]!;
    const span = last[w]! - first[w]!;
    deadlineOf[i] = span > 0 ? Math.round(((ops.time[i]! - first[w]!) / span) * windowNs) : 0;
  }
  const order = Array.from({ length: n }, (_, i) => i);
  order.sort(
    (a, b) =>
      deadlineOf[a]! - deadlineOf[b]! ||
      ops.kind[a]! - ops.kind[b]! ||
      ops.worker[a]! - ops.worker[b]! ||
      a - b,
  );
  const deadline = new Float64Array(n);
  const kind = new Uint8Array(n);
  const worker = new Uint32Array(n);
  const at = new Float64Array(n);
  const length = new Uint32Array(n);
  const blocks = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const from = order[i]!;
    deadline[i] = deadlineOf[from]!;
    kind[i] = ops.kind[from]!;
    worker[i] = ops.worker[from]!;
    at[i] = ops.at[from]!;
    length[i] = ops.length[from]!;
    blocks[i] = ops.blocks[from]!;
  }
  const totalBlockOps = totals.queryBlocks + totals.storedBlocks + totals.removedBlocks;
  return {
    count: n,
    deadline,
    kind,
    worker,
    blocks,
    engineBlocks,
    workerBatches,
    totals,
    totalBlockOps,
    payload: (i) => payloads.view(at[i]!, length[i]!),
    tokens: (i) => queryTokens.view(at[i]!, length[i]!),
  };
}

/**
 * A query's hashes as `findMatches` takes them: local block hashes and their sequence
 * hashes (a route computes both: src/route/input.ts). `words` is the two arrays
 * back to back (local, then chain), one view for handing a query to a lane.
 */
export interface QueryHashes {
  readonly local: Uint32Array;
  readonly chain: Uint32Array;
  readonly count: number;
  readonly words: Uint32Array;
}

/** `words` (local then chain, as QueryHashes.words) as a query's hashes. */
export function queryHashesOf(words: Uint32Array): QueryHashes {
  const half = words.length >> 1;
  return {
    local: words.subarray(0, half),
    chain: words.subarray(half),
    count: half >> 1,
    words,
  };
}

/**
 * `--query-hashes pre`: every query's hashes, computed before the clock (Dynamo's
 * bench hashes its trace's hash ids up front and times the lookup on hashes).
 * Indexed by op; batches share one empty entry. One slab, views into it.
 */
export function hashQueries(corpus: Corpus, blockSize: number): QueryHashes[] {
  const hasher = new PromptHasher();
  const slab = new Uint32Array(4 * corpus.totals.queryBlocks);
  const none = queryHashesOf(slab.subarray(0, 0));
  const out: QueryHashes[] = [];
  let at = 0;
  for (let i = 0; i < corpus.count; i++) {
    if (corpus.kind[i] !== OP_QUERY) {
      out.push(none);
      continue;
    }
    const hashes = hasher.hash(corpus.tokens(i), blockSize, DEFAULT_SEED);
    const words = 2 * hashes.blockCount;
    slab.set(hashes.local.subarray(0, words), at);
    slab.set(hashes.chain.subarray(0, words), at + words);
    out.push(queryHashesOf(slab.subarray(at, at + 2 * words)));
    at += 2 * words;
  }
  return out;
}
