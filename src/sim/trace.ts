/**
 * Mooncake-format request traces (JSON lines): parse, validate and transform.
 *
 * One request per line: `timestamp` (ms; alias `created_time`), `input_length` (alias
 * `input_tokens`), `output_length` (alias `output_tokens`), `hash_ids` (one id per
 * 512-token block; equal ids at equal positions = shared prefix). Optional:
 * `session_id`, `delay` / `delay_ms` (used only when a line has no timestamp: the
 * request then arrives `delay` ms after the previous request of its session, or of
 * the trace — an open-loop reading of closed-loop multi-turn traces), `priority`,
 * `request_id` (accepted, ignored). Unknown fields are ignored.
 *
 * Transforms follow Dynamo's trace benchmark (reference §6.1): input clamped to
 * len(hash_ids) × block tokens; length factor F (id h → h·F … h·F+F−1, lengths × F);
 * duplication factor K (copy c shifts ids by c·(max_id+1), same arrival times);
 * then a time scale on arrivals and truncation to the first N requests. Not Dynamo's:
 * twins, a fraction of requests that arrive twice at once (the same prompt).
 *
 * The result is struct-of-arrays; prompts are synthesized on demand (./tokens.ts).
 */

/** Tokens per `hash_id` in the public Mooncake traces. */
export const MOONCAKE_BLOCK_TOKENS = 512;
/** Bounds on outside input (a line beyond them is an error naming the line). */
export const TRACE_LINE_BYTES_MAX = 16 << 20;
export const TRACE_HASH_IDS_MAX = 1 << 20;
export const TRACE_REQUESTS_MAX = 50_000_000;
const ID_MAX = 0xffff_ffff;

/** A parsed trace. Request i's block ids are `hashIds[hashStart[i] .. hashStart[i+1])`. */
export interface Trace {
  readonly count: number;
  /** Tokens each hash id stands for. */
  readonly blockTokens: number;
  readonly arrivalMs: Float64Array;
  readonly inputLength: Uint32Array;
  readonly outputLength: Uint32Array;
  readonly hashStart: Uint32Array;
  readonly hashIds: Uint32Array;
  /** Session of each request, or null when the trace has none. */
  readonly sessions: readonly (string | null)[] | null;
}

export class TraceError extends Error {
  override readonly name = "TraceError";
  /** 1-based line number, or 0 for an error about the whole trace. */
  readonly line: number;
  constructor(line: number, message: string) {
    super(line > 0 ? `trace line ${line}: ${message}` : `trace: ${message}`);
    this.line = line;
  }
}

export interface ParseOptions {
  /** Tokens per hash id; 512 for Mooncake traces. */
  readonly blockTokens?: number;
}

interface RawRequest {
  arrivalMs: number;
  inputLength: number;
  outputLength: number;
  ids: number[];
  session: string | null;
}

function pick(record: Record<string, unknown>, name: string, alias: string): unknown {
  return record[name] !== undefined ? record[name] : record[alias];
}

function nonNegativeInteger(value: unknown, line: number, field: string): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new TraceError(
      line,
      `${field} must be a non-negative integer, got ${JSON.stringify(value)}`,
    );
  }
  return value;
}

function nonNegativeNumber(value: unknown, line: number, field: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new TraceError(
      line,
      `${field} must be a non-negative number, got ${JSON.stringify(value)}`,
    );
  }
  return value;
}

function parseIds(value: unknown, line: number): number[] {
  if (!Array.isArray(value))
    throw new TraceError(line, "hash_ids must be an array of non-negative integers");
  if (value.length > TRACE_HASH_IDS_MAX) {
    throw new TraceError(line, `hash_ids has ${value.length} ids, more than ${TRACE_HASH_IDS_MAX}`);
  }
  for (let i = 0; i < value.length; i++) {
    const id: unknown = value[i];
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id > ID_MAX) {
      throw new TraceError(
        line,
        `hash_ids[${i}] must be an integer in [0, ${ID_MAX}], got ${JSON.stringify(id)}`,
      );
    }
  }
  return value as number[];
}

function parseSession(value: unknown, line: number): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value === "string") return value;
  if (typeof value === "number" && Number.isFinite(value)) return String(value);
  throw new TraceError(
    line,
    `session_id must be a string or a number, got ${JSON.stringify(value)}`,
  );
}

/** Arrival of a line: its timestamp, else `delay` after the session's (or trace's) previous one. */
function parseArrival(
  record: Record<string, unknown>,
  line: number,
  session: string | null,
  previous: number,
  previousBySession: Map<string, number>,
): number {
  const timestamp = pick(record, "timestamp", "created_time");
  if (timestamp !== undefined) return nonNegativeNumber(timestamp, line, "timestamp");
  const delayValue = pick(record, "delay", "delay_ms");
  const delay = delayValue === undefined ? 0 : nonNegativeNumber(delayValue, line, "delay");
  const base = session === null ? previous : (previousBySession.get(session) ?? previous);
  return base + delay;
}

function parseLine(
  text: string,
  line: number,
  blockTokens: number,
  previous: number,
  previousBySession: Map<string, number>,
): RawRequest {
  if (text.length > TRACE_LINE_BYTES_MAX)
    throw new TraceError(line, `longer than ${TRACE_LINE_BYTES_MAX} bytes`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new TraceError(line, `not JSON (${(error as Error).message})`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TraceError(line, "must be a JSON object");
  }
  const record = value as Record<string, unknown>;
  const ids = parseIds(record.hash_ids, line);
  const inputValue = pick(record, "input_length", "input_tokens");
  if (inputValue === undefined) throw new TraceError(line, "input_length is missing");
  const outputValue = pick(record, "output_length", "output_tokens");
  if (outputValue === undefined) throw new TraceError(line, "output_length is missing");
  // Dynamo's rule: a prompt never runs past the blocks that describe it.
  const inputLength = Math.min(
    nonNegativeInteger(inputValue, line, "input_length"),
    ids.length * blockTokens,
  );
  if (inputLength === 0) throw new TraceError(line, "empty prompt (input_length 0 or no hash_ids)");
  const outputLength = nonNegativeInteger(outputValue, line, "output_length");
  const session = parseSession(record.session_id, line);
  const arrivalMs = parseArrival(record, line, session, previous, previousBySession);
  return { arrivalMs, inputLength, outputLength, ids, session };
}

/** Parses a whole JSONL trace. Blank lines are skipped; any bad line throws a TraceError naming it. */
export function parseTrace(text: string, options: ParseOptions = {}): Trace {
  const blockTokens = options.blockTokens ?? MOONCAKE_BLOCK_TOKENS;
  if (!Number.isSafeInteger(blockTokens) || blockTokens <= 0)
    throw new TraceError(0, `bad block size ${blockTokens}`);
  const requests: RawRequest[] = [];
  const previousBySession = new Map<string, number>();
  let previous = 0;
  let start = 0;
  for (let line = 1; start <= text.length; line++) {
    let end = text.indexOf("\n", start);
    if (end < 0) end = text.length;
    const body = text.slice(start, end).trim();
    start = end + 1;
    if (body === "") continue;
    if (requests.length >= TRACE_REQUESTS_MAX)
      throw new TraceError(line, `more than ${TRACE_REQUESTS_MAX} requests`);
    const request = parseLine(body, line, blockTokens, previous, previousBySession);
    previous = request.arrivalMs;
    if (request.session !== null) previousBySession.set(request.session, request.arrivalMs);
    requests.push(request);
  }
  if (requests.length === 0) throw new TraceError(0, "no requests");
  // Delay-based arrivals may come out of order; replay needs them sorted (stable).
  const order = requests.map((_, i) => i);
  order.sort((a, b) => requests[a]!.arrivalMs - requests[b]!.arrivalMs || a - b);
  return build(
    order.map((i) => requests[i]!),
    blockTokens,
  );
}

function build(requests: readonly RawRequest[], blockTokens: number): Trace {
  const count = requests.length;
  const arrivalMs = new Float64Array(count);
  const inputLength = new Uint32Array(count);
  const outputLength = new Uint32Array(count);
  const hashStart = new Uint32Array(count + 1);
  let total = 0;
  for (const request of requests) total += request.ids.length;
  const hashIds = new Uint32Array(total);
  let hasSessions = false;
  for (let i = 0, at = 0; i < count; i++) {
    const request = requests[i]!;
    arrivalMs[i] = request.arrivalMs;
    inputLength[i] = request.inputLength;
    outputLength[i] = request.outputLength;
    hashStart[i] = at;
    hashIds.set(request.ids, at);
    at += request.ids.length;
    hashStart[i + 1] = at;
    if (request.session !== null) hasSessions = true;
  }
  const sessions = hasSessions ? requests.map((request) => request.session) : null;
  return { count, blockTokens, arrivalMs, inputLength, outputLength, hashStart, hashIds, sessions };
}

/** The block ids of request i (a view, not a copy). */
export function requestIds(trace: Trace, i: number): Uint32Array {
  return trace.hashIds.subarray(trace.hashStart[i]!, trace.hashStart[i + 1]!);
}

export interface TraceTransform {
  /** Length factor F ≥ 1: every id becomes F ids, prompts F times longer. */
  readonly lengthFactor?: number;
  /** Duplication factor K ≥ 1: K copies of the trace with disjoint ids, same arrival times. */
  readonly duplicationFactor?: number;
  /** Multiplies arrival times (< 1 packs the trace tighter: more load). */
  readonly timeScale?: number;
  /** Skip the first N requests (after duplication); the rest arrive N requests' span earlier. */
  readonly start?: number;
  /** Keep only the first N requests (after duplication and the skip; twins count). */
  readonly requests?: number;
  /**
   * A fraction in [0, 1] of the requests arrive twice at the same moment, with the same
   * prompt (parallel sampling with n = 2, a client's retry). On one engine the second
   * reuses the blocks the first has scheduled (vLLM V1 caches them at scheduling); when
   * both prefill side by side (a long-prefill cap, ./time-model.ts), each computes chunks
   * the other computed first, and vLLM holds two copies of them. Which requests is fixed
   * by their place, not drawn.
   */
  readonly twins?: number;
}

/** Whether kept request k gets a twin under fraction `twins` (a fixed scramble of k). */
function twinned(k: number, twins: number): boolean {
  return twins > 0 && (Math.imul(k + 1, 0x9e3779b1) >>> 0) / 2 ** 32 < twins;
}

/** The transform's numbers, checked against the trace. */
function transformOf(trace: Trace, transform: TraceTransform) {
  const factor = transform.lengthFactor ?? 1;
  const copies = transform.duplicationFactor ?? 1;
  const timeScale = transform.timeScale ?? 1;
  const start = transform.start ?? 0;
  const twins = transform.twins ?? 0;
  if (!(twins >= 0 && twins <= 1)) throw new TraceError(0, `twins must be in [0, 1], got ${twins}`);
  if (!Number.isSafeInteger(start) || start < 0 || start >= trace.count * copies) {
    throw new TraceError(
      0,
      `start must be an integer in [0, ${trace.count * copies}), got ${start}`,
    );
  }
  const limit = Math.min(transform.requests ?? trace.count * copies, trace.count * copies - start);
  if (!Number.isSafeInteger(factor) || factor < 1) {
    throw new TraceError(0, `length factor must be an integer ≥ 1, got ${factor}`);
  }
  if (!Number.isSafeInteger(copies) || copies < 1) {
    throw new TraceError(0, `duplication factor must be an integer ≥ 1, got ${copies}`);
  }
  if (!Number.isFinite(timeScale) || timeScale <= 0) {
    throw new TraceError(0, `time scale must be > 0, got ${timeScale}`);
  }
  if (!Number.isSafeInteger(limit) || limit < 1)
    throw new TraceError(0, `request count must be ≥ 1, got ${limit}`);
  return { factor, copies, timeScale, start, twins, limit };
}

/** Applies Dynamo's trace transforms (F, then K, then time scale, then the skip and truncation). */
export function transformTrace(trace: Trace, transform: TraceTransform): Trace {
  const { factor, copies, timeScale, start, twins, limit } = transformOf(trace, transform);
  let maxId = 0;
  for (let i = 0; i < trace.hashIds.length; i++) maxId = Math.max(maxId, trace.hashIds[i]!);
  const span = (maxId + 1) * factor; // ids of one copy after the length factor: [0, span)
  if (span * copies - 1 > ID_MAX) {
    throw new TraceError(
      0,
      `ids overflow u32 with length factor ${factor} and duplication ${copies}`,
    );
  }
  let longest = 0;
  for (let i = 0; i < trace.count; i++) longest = Math.max(longest, trace.inputLength[i]!);
  if (longest * factor > ID_MAX)
    throw new TraceError(0, `prompts overflow u32 with length factor ${factor}`);
  // Copies of one request stay adjacent, so truncation keeps whole time ranges.
  const requests: RawRequest[] = [];
  let skipped = 0;
  let offsetMs = 0;
  for (let i = 0; i < trace.count && requests.length < limit; i++) {
    const ids = requestIds(trace, i);
    for (let c = 0; c < copies && requests.length < limit; c++) {
      if (skipped < start) {
        skipped++;
        continue;
      }
      const out = new Array<number>(ids.length * factor);
      for (let k = 0; k < ids.length; k++) {
        for (let j = 0; j < factor; j++) out[k * factor + j] = c * span + ids[k]! * factor + j;
      }
      const session = trace.sessions?.[i] ?? null;
      if (requests.length === 0) offsetMs = trace.arrivalMs[i]! - trace.arrivalMs[0]!;
      const request = {
        arrivalMs: (trace.arrivalMs[i]! - offsetMs) * timeScale,
        inputLength: trace.inputLength[i]! * factor,
        outputLength: trace.outputLength[i]!,
        ids: out,
        session: session === null ? null : copies > 1 ? `${session}:copy_${c}` : session,
      };
      requests.push(request);
      if (requests.length < limit && twinned(requests.length - 1, twins)) requests.push(request);
    }
  }
  return build(requests, trace.blockTokens);
}

/** Summary numbers of a trace (for reports and sanity checks). */
export function traceStats(trace: Trace): {
  requests: number;
  spanMs: number;
  promptTokens: number;
  outputTokens: number;
  distinctIds: number;
} {
  let promptTokens = 0;
  let outputTokens = 0;
  for (let i = 0; i < trace.count; i++) {
    promptTokens += trace.inputLength[i]!;
    outputTokens += trace.outputLength[i]!;
  }
  const distinctIds = new Set(trace.hashIds).size;
  const spanMs = trace.arrivalMs[trace.count - 1]! - trace.arrivalMs[0]!;
  return { requests: trace.count, spanMs, promptTokens, outputTokens, distinctIds };
}
