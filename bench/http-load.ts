/**
 * The load generator of the serving benchmark: one process per measurement, started
 * by bench/http.ts with a JSON spec, printing one JSON result line.
 *
 *   bun bench/http-load.ts '<LoadSpec as JSON>'
 *
 * Transports:
 * - `http`: keep-alive HTTP/1.1 over raw TCP (Bun.connect), one request in flight per
 *   connection (no pipelining), `POST /v1/route` with a JSON body. A purpose-built
 *   client, so that the generator spends as little of the shared CPU as it can. With
 *   `binary`, MessagePack bodies (`token_ids` as a `bin`) and MessagePack answers.
 * - `ws`: Bun's WebSocket client on `/v1/ws`, text frames; `batch` 1 sends one request
 *   per frame, otherwise frames of `batch` requests (answered with one array frame).
 *   With `binary`, MessagePack binary frames with `token_ids` as a `bin` of
 *   little-endian u32s (the form for high-rate gateways), answered in MessagePack.
 *
 * Modes:
 * - `closed`: every connection keeps `window` frames in flight (HTTP: 1 request); the
 *   result is the completion rate, the maximum throughput at that concurrency.
 * - `open`: frames are scheduled at fixed intervals (`rate` requests/s, so a frame every
 *   batch / rate s) whatever the answers do; latency is measured from the scheduled
 *   time, so queueing in the generator or the server is counted (no coordinated
 *   omission). HTTP requests wait for a free connection in a FIFO, counted the same way.
 *   Near a send the generator polls instead of sleeping (timers tick every ~1.1 ms), so
 *   its CPU reads ~100 % in this mode whatever the rate.
 *
 * Prompts: a pool of prompts of `promptTokens` tokens (bench/http-workload.ts
 * buildPrompt: mostly a cached system prompt + document, then unique blocks); each
 * request also rewrites its last block (16 six-digit tokens from a per-request counter),
 * so no two requests are the same. Request bodies are built once per pool entry as
 * bytes (HTTP) or strings (WS) and patched in place.
 *
 * Requests carry no request_id: the server generates one, and the orchestrator runs
 * the server with a short --request-ttl-secs so unfinished requests expire.
 */
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Socket } from "bun";
import { pack, unpack } from "msgpackr";
import { killWithBench, prng } from "./lib";
import { BLOCK_SIZE, buildFleet, buildPrompt, mix } from "./http-workload";

export interface LoadSpec {
  readonly host: string;
  readonly port: number;
  readonly transport: "http" | "ws";
  /** Requests per WebSocket frame (1 = one request per frame); HTTP: 1. */
  readonly batch: number;
  /** MessagePack (WebSocket binary frames, HTTP bodies and answers), token_ids as bytes; else JSON. */
  readonly binary?: boolean;
  readonly mode: "closed" | "open";
  /** Open loop: requests per second offered. */
  readonly rate: number;
  readonly connections: number;
  /** Closed loop: frames in flight per connection (HTTP: 1). */
  readonly window: number;
  readonly promptTokens: number;
  readonly poolSize: number;
  /** Candidates each route answer lists (the API's `candidates`). */
  readonly candidates: number;
  readonly warmupMs: number;
  readonly durationMs: number;
  readonly seed: number;
  readonly fleetWorkers: number;
  readonly fleetPairs: number;
  /** Distinguishes the unique blocks of this measurement from earlier ones. */
  readonly uniqueBase: number;
  /** The server's pid, to read its CPU time from /proc. */
  readonly serverPid: number;
  /** Open loop: "c" sends with bench/loadgen/open-loop.c (no GC, sleeps between sends)
   * instead of this process; HTTP and binary WebSocket only. Absent: this process. */
  readonly generator?: "bun" | "c";
}

export interface LoadResult {
  /** Requests answered 200 within the measured window. */
  readonly completed: number;
  readonly errors: number;
  readonly seconds: number;
  readonly routesPerSecond: number;
  /** Latency percentiles in ms (open loop: from the scheduled time). */
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly p999Ms: number;
  readonly maxMs: number;
  /** CPU seconds per wall second over the measured window. */
  readonly serverCpu: number;
  /** Of it, the server's main thread (the one that decides routes); absent from the C generator. */
  readonly serverMainCpu?: number;
  readonly generatorCpu: number;
  /** Open loop: requests still unanswered when the drain timeout ran out. */
  readonly unanswered: number;
  /** Open loop: p99 of how late frames left the generator after their scheduled time
   * (the generator's own share of the latency). */
  readonly sendLagP99Ms: number | null;
  readonly sampleError?: string;
}

const DRAIN_MS = 3_000;
const LAST_BLOCK_DIGITS = 6;

/** CPU seconds (user + system) of a process (or, with `tid`, of one of its threads), from /proc. */
export function processCpuSeconds(pid: number, tid?: number): number {
  const stat = readFileSync(
    tid === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`,
    "utf8",
  );
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
}

/** Writes the 6-digit tokens of a request's last block (100000..127999) into `out` at `at`. */
function writeLastBlock(out: Uint8Array, at: number, counter: number): void {
  for (let i = 0; i < BLOCK_SIZE; i++) {
    let token = 100_000 + (mix(0x4c415354, counter, i) % 28_000);
    for (let d = LAST_BLOCK_DIGITS - 1; d >= 0; d--) {
      out[at + i * (LAST_BLOCK_DIGITS + 1) + d] = 48 + (token % 10);
      token = Math.floor(token / 10);
    }
  }
}

/** The tokens `writeLastBlock` writes as digits, into `out` (the last block of a prompt). */
function lastBlockTokens(out: Uint32Array, counter: number): void {
  const at = out.length - BLOCK_SIZE;
  for (let i = 0; i < BLOCK_SIZE; i++)
    out[at + i] = 100_000 + (mix(0x4c415354, counter, i) % 28_000);
}

interface Pool {
  /** The JSON of token_ids up to the last block, which each request fills in. */
  readonly json: string[];
  /** The whole prompts (binary frames overwrite the last block per request). */
  readonly tokens: Uint32Array[];
}

function promptPool(spec: LoadSpec): Pool {
  const fleet = buildFleet(spec.seed, spec.fleetWorkers, spec.fleetPairs);
  const random = prng(spec.seed ^ 0x6c6f6164 ^ spec.promptTokens);
  const pool: Pool = { json: [], tokens: [] };
  for (let i = 0; i < spec.poolSize; i++) {
    const { tokens } = buildPrompt(
      fleet,
      random,
      spec.promptTokens / BLOCK_SIZE,
      spec.uniqueBase + i,
    );
    pool.json.push(`[${tokens.subarray(0, tokens.length - BLOCK_SIZE).join(",")},`);
    pool.tokens.push(tokens);
  }
  return pool;
}

const LAST_BLOCK_TEMPLATE = `${Array.from({ length: BLOCK_SIZE }, () => "100000").join(",")}]`;

class Latencies {
  values = new Float64Array(1 << 16);
  count = 0;
  add(ms: number): void {
    if (this.count === this.values.length) {
      const grown = new Float64Array(this.values.length * 2);
      grown.set(this.values);
      this.values = grown;
    }
    this.values[this.count++] = ms;
  }
  percentile(sorted: Float64Array, p: number): number {
    if (sorted.length === 0) return NaN;
    return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
  }
}

async function run(spec: LoadSpec): Promise<LoadResult> {
  const pool = promptPool(spec);
  const latencies = new Latencies();
  const lags = new Latencies(); // open loop: send time - scheduled time
  let counter = spec.uniqueBase * 1_000_000;
  let errors = 0;
  let sampleError: string | undefined;
  let completedInWindow = 0;
  const start = performance.now() + 200;
  const windowStart = start + spec.warmupMs;
  const windowEnd = windowStart + spec.durationMs;
  interface CpuMark {
    server: number;
    main: number;
    generator: number;
    at: number;
  }
  let cpuMarks = null as CpuMark | null;
  let cpuEnd = null as CpuMark | null;
  const generatorCpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  };

  // A request (or frame) counts if it was scheduled/sent inside the window.
  const record = (sentAt: number, now: number, ok: number, failed: number, error?: string) => {
    if (sentAt < windowStart || sentAt >= windowEnd) return;
    errors += failed;
    if (failed > 0 && sampleError === undefined) sampleError = error;
    for (let i = 0; i < ok; i++) latencies.add(now - sentAt);
    if (now < windowEnd) completedInWindow += ok;
  };

  const markCpu = () => {
    const now = performance.now();
    const mark = (): CpuMark => ({
      server: processCpuSeconds(spec.serverPid),
      main: processCpuSeconds(spec.serverPid, spec.serverPid),
      generator: generatorCpu(),
      at: now,
    });
    if (cpuMarks === null && now >= windowStart) cpuMarks = mark();
    if (cpuEnd === null && now >= windowEnd) cpuEnd = mark();
  };

  const senders =
    spec.transport === "http"
      ? await httpSenders(spec, pool, () => counter++, record)
      : await wsSenders(
          spec,
          pool,
          () => counter,
          (n) => {
            counter += n;
          },
          record,
        );

  const frameRequests = spec.transport === "http" ? 1 : spec.batch;
  let inflight = 0;
  const done = () => {
    inflight--;
  };

  if (spec.mode === "closed") {
    // Every connection keeps `window` frames in flight until the window ends.
    await new Promise<void>((resolve) => {
      const each = (sender: Sender) => {
        const loop = () => {
          if (performance.now() >= windowEnd) {
            done();
            if (inflight === 0) resolve();
            return;
          }
          sender.send(performance.now(), loop);
        };
        return loop;
      };
      const delay = Math.max(0, start - performance.now());
      setTimeout(() => {
        for (const sender of senders)
          for (let k = 0; k < spec.window; k++) {
            inflight++;
            each(sender)();
          }
      }, delay);
      const timer = setInterval(() => {
        markCpu();
        if (cpuEnd !== null) clearInterval(timer);
      }, 5);
    });
  } else {
    const interval = (1000 * frameRequests) / spec.rate;
    let scheduled = 0;
    let next = 0;
    const queue: number[] = [];
    const idle: Sender[] = spec.transport === "http" ? [...senders] : [];
    const dispatch = (at: number) => {
      if (at >= windowStart && at < windowEnd) lags.add(performance.now() - at);
      if (spec.transport === "ws") {
        const sender = senders[next++ % senders.length]!;
        inflight++;
        sender.send(at, done);
        return;
      }
      queue.push(at);
      pump();
    };
    const pump = () => {
      while (queue.length > 0 && idle.length > 0) {
        const sender = idle.pop()!;
        const at = queue.shift()!;
        inflight++;
        sender.send(at, () => {
          inflight--;
          idle.push(sender);
          pump();
        });
      }
    };
    // Timers fire every ~1.1 ms at best, which would add up to a tick of waiting to
    // every request (it is counted from the scheduled time): within 2 ms of the next
    // send the pacer polls with setImmediate (I/O still runs between polls) instead.
    await new Promise<void>((resolve) => {
      let cpuMarkedAt = 0;
      const pace = () => {
        const now = performance.now();
        if (now - cpuMarkedAt >= 5) {
          markCpu();
          cpuMarkedAt = now;
        }
        const limit = Math.min(now, windowEnd);
        while (start + scheduled * interval <= limit) dispatch(start + scheduled++ * interval);
        if (now >= windowEnd && cpuEnd !== null) return resolve();
        const wait = start + scheduled * interval - performance.now();
        if (wait > 2) setTimeout(pace, wait - 1.5);
        else setImmediate(pace);
      };
      pace();
    });
  }
  while (cpuEnd === null) {
    await Bun.sleep(1);
    markCpu();
  }
  // Drain what is still in flight (bounded).
  const drainUntil = performance.now() + DRAIN_MS;
  while (inflight > 0 && performance.now() < drainUntil) await Bun.sleep(5);
  for (const sender of senders) sender.close();
  const marks = cpuMarks!;
  const end = cpuEnd!;
  const sorted = latencies.values.slice(0, latencies.count).sort();
  const seconds = spec.durationMs / 1000;
  return {
    completed: completedInWindow,
    errors,
    seconds,
    routesPerSecond: completedInWindow / seconds,
    p50Ms: latencies.percentile(sorted, 0.5),
    p99Ms: latencies.percentile(sorted, 0.99),
    p999Ms: latencies.percentile(sorted, 0.999),
    maxMs: sorted.length === 0 ? NaN : sorted[sorted.length - 1]!,
    serverCpu: (end.server - marks.server) / ((end.at - marks.at) / 1000),
    serverMainCpu: (end.main - marks.main) / ((end.at - marks.at) / 1000),
    generatorCpu: (end.generator - marks.generator) / ((end.at - marks.at) / 1000),
    unanswered: inflight * frameRequests,
    sendLagP99Ms:
      spec.mode === "open" ? lags.percentile(lags.values.slice(0, lags.count).sort(), 0.99) : null,
    ...(sampleError === undefined ? {} : { sampleError }),
  };
}

interface Sender {
  /** Sends one frame (HTTP: one request), stamped `at`; calls `then` once it is answered. */
  send(at: number, then: () => void): void;
  close(): void;
}

type Record = (sentAt: number, now: number, ok: number, failed: number, error?: string) => void;

// ---- HTTP: keep-alive over raw TCP -------------------------------------------------------

const CRLFCRLF = new Uint8Array([13, 10, 13, 10]);

function indexOfBytes(haystack: Uint8Array, needle: Uint8Array, from: number, to: number): number {
  outer: for (let i = from; i + needle.length <= to; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

/** Whole HTTP requests (head and body) per pool entry, and where each one's last block starts. */
function httpRequests(spec: LoadSpec, pool: Pool): { bytes: Uint8Array; lastBlockAt: number }[] {
  const encoder = new TextEncoder();
  const headOf = (type: string, length: number) =>
    `POST /v1/route HTTP/1.1\r\nHost: ${spec.host}\r\nContent-Type: ${type}\r\nAccept: ${type}\r\nContent-Length: ${length}\r\n\r\n`;
  // Each request's last block is rewritten in place: digits in JSON, u32s in MessagePack
  // (token_ids is the body's last member, so its bytes end the request).
  return spec.binary
    ? pool.tokens.map((tokens) => {
        const body = pack({
          candidates: spec.candidates,
          token_ids: new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength),
        });
        const head = encoder.encode(headOf("application/msgpack", body.length));
        const bytes = new Uint8Array(head.length + body.length);
        bytes.set(head);
        bytes.set(body, head.length);
        return { bytes, lastBlockAt: bytes.length - 4 * BLOCK_SIZE };
      })
    : pool.json.map((prefix) => {
        const body = `{"candidates":${spec.candidates},"token_ids":${prefix}${LAST_BLOCK_TEMPLATE}}`;
        const bytes = encoder.encode(headOf("application/json", body.length) + body);
        return { bytes, lastBlockAt: bytes.length - LAST_BLOCK_TEMPLATE.length - 1 };
      });
}

async function httpSenders(
  spec: LoadSpec,
  pool: Pool,
  nextCounter: () => number,
  record: Record,
): Promise<Sender[]> {
  const requests = httpRequests(spec, pool);
  const lastBlock = new Uint32Array(BLOCK_SIZE);
  const lastBlockBytes = new Uint8Array(lastBlock.buffer);
  let poolNext = 0;
  const senders: Sender[] = [];
  for (let c = 0; c < spec.connections; c++) {
    let buffer = new Uint8Array(64 * 1024);
    let filled = 0;
    let pending: Uint8Array | null = null;
    let sentAt = 0;
    let then: (() => void) | null = null;
    let closing = false;
    const socket: Socket = await Bun.connect({
      hostname: spec.host,
      port: spec.port,
      socket: {
        data(_socket, chunk) {
          if (filled + chunk.length > buffer.length) {
            const grown = new Uint8Array(Math.max(buffer.length * 2, filled + chunk.length));
            grown.set(buffer.subarray(0, filled));
            buffer = grown;
          }
          buffer.set(chunk, filled);
          filled += chunk.length;
          const headEnd = indexOfBytes(buffer, CRLFCRLF, 0, filled);
          if (headEnd < 0) return;
          const head = Buffer.from(buffer.buffer, buffer.byteOffset, headEnd).toString("latin1");
          const length = /\r\ncontent-length: *(\d+)/i.exec(head);
          if (length === null) throw new Error(`response without content-length: ${head}`);
          const total = headEnd + 4 + Number(length[1]);
          if (filled < total) return;
          if (filled > total)
            throw new Error("more bytes than one response (the server answered twice?)");
          const status = Number(head.slice(9, 12));
          const now = performance.now();
          if (status === 200) record(sentAt, now, 1, 0);
          else
            record(
              sentAt,
              now,
              0,
              1,
              `${status} ${Buffer.from(buffer.subarray(headEnd + 4, total)).toString()}`,
            );
          filled = 0;
          const callback = then!;
          then = null;
          callback();
        },
        drain(socket) {
          if (pending === null) return;
          const written = socket.write(pending);
          pending = written === pending.length ? null : pending.subarray(written);
        },
        close() {
          if (then !== null && !closing)
            throw new Error("the server closed a connection with a request in flight");
        },
      },
    });
    senders.push({
      send(at, callback) {
        if (then !== null) throw new Error("one request at a time per connection");
        const request = requests[poolNext++ % requests.length]!;
        if (spec.binary) {
          lastBlockTokens(lastBlock, nextCounter());
          request.bytes.set(lastBlockBytes, request.lastBlockAt);
        } else {
          writeLastBlock(request.bytes, request.lastBlockAt, nextCounter());
        }
        sentAt = at;
        then = callback;
        const written = socket.write(request.bytes);
        if (written < request.bytes.length) pending = request.bytes.slice(written);
      },
      close() {
        closing = true;
        socket.end();
      },
    });
  }
  return senders;
}

// ---- WebSocket --------------------------------------------------------------------------

async function wsSenders(
  spec: LoadSpec,
  pool: Pool,
  counterNow: () => number,
  advance: (n: number) => void,
  record: Record,
): Promise<Sender[]> {
  let poolNext = 0;
  const senders: Sender[] = [];
  const scratch = new Uint8Array(LAST_BLOCK_TEMPLATE.length);
  const decoder = new TextDecoder();
  scratch.set(new TextEncoder().encode(LAST_BLOCK_TEMPLATE));
  const lastBlock = (counter: number) => {
    writeLastBlock(scratch, 0, counter);
    return decoder.decode(scratch);
  };
  const url = `ws://${spec.host}:${spec.port}/v1/ws`;
  // MessagePack: an answer's `"status": 200` is these bytes (fixstr "status", uint8 200).
  const statusOk = Buffer.from([0xa6, ...Buffer.from("status"), 0xcc, 200]);
  const countOk = (data: unknown): { ok: number; text: string } => {
    if (typeof data === "string") {
      let ok = 0;
      for (
        let at = data.indexOf('"status":200');
        at >= 0;
        at = data.indexOf('"status":200', at + 12)
      )
        ok++;
      return { ok, text: data };
    }
    const bytes = Buffer.from(data as ArrayBuffer);
    let ok = 0;
    for (
      let at = bytes.indexOf(statusOk);
      at >= 0;
      at = bytes.indexOf(statusOk, at + statusOk.length)
    )
      ok++;
    return {
      ok,
      text:
        ok === spec.batch
          ? ""
          : JSON.stringify(unpack(bytes), (_k, v) => (typeof v === "bigint" ? String(v) : v)),
    };
  };
  for (let c = 0; c < spec.connections; c++) {
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error(`cannot open ${url}`));
    });
    // The server answers a connection's frames in order.
    const sentAts: number[] = [];
    const callbacks: (() => void)[] = [];
    let head = 0;
    let id = 0;
    let closing = false;
    ws.onmessage = (event) => {
      const now = performance.now();
      const { ok, text } = countOk(event.data);
      const failed = spec.batch - ok;
      record(sentAts[head]!, now, ok, failed, failed > 0 ? text.slice(0, 300) : undefined);
      const callback = callbacks[head]!;
      head++;
      if (head > 1024) {
        sentAts.splice(0, head);
        callbacks.splice(0, head);
        head = 0;
      }
      callback();
    };
    ws.onclose = () => {
      if (head < callbacks.length && !closing)
        throw new Error("the server closed a WebSocket with requests in flight");
    };
    senders.push({
      send(at, then) {
        const base = counterNow();
        advance(spec.batch);
        sentAts.push(at);
        callbacks.push(then);
        if (spec.binary) {
          const requests = [];
          for (let k = 0; k < spec.batch; k++) {
            const tokens = pool.tokens[poolNext++ % pool.tokens.length]!;
            lastBlockTokens(tokens, base + k);
            requests.push({
              id: id++,
              op: "route",
              candidates: spec.candidates,
              token_ids: new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength),
            });
          }
          ws.send(pack(spec.batch === 1 ? requests[0] : requests));
          return;
        }
        let frame = spec.batch === 1 ? "" : "[";
        for (let k = 0; k < spec.batch; k++) {
          if (k > 0) frame += ",";
          frame += `{"id":${id++},"op":"route","candidates":${spec.candidates},"token_ids":${pool.json[poolNext++ % pool.json.length]!}${lastBlock(base + k)}}`;
        }
        if (spec.batch !== 1) frame += "]";
        ws.send(frame);
      },
      close() {
        closing = true;
        ws.close();
      },
    });
  }
  return senders;
}

// ---- the C open-loop generator ------------------------------------------------------------

const LOADGEN_SOURCE = join(import.meta.dir, "loadgen", "open-loop.c");
const LOADGEN_BINARY = join(import.meta.dir, "loadgen", "build", "open-loop");

/**
 * The generator for open-loop scenarios: "c" (the default) when bench/loadgen/open-loop.c
 * compiles, else "bun" with a note on stderr; asking for "c" without a compiler fails.
 */
export function openLoopGenerator(requested: string | undefined): "bun" | "c" {
  if (requested !== undefined && requested !== "bun" && requested !== "c")
    throw new Error(`--generator must be bun or c, got ${requested}`);
  if (requested === "bun") return "bun";
  try {
    openLoopBinary();
    return "c";
  } catch (error) {
    if (requested === "c") throw error;
    console.error(`open-loop scenarios use the Bun generator: ${(error as Error).message}`);
    return "bun";
  }
}

/** Compiles bench/loadgen/open-loop.c with the system C compiler when its binary is missing or older. */
function openLoopBinary(): string {
  let fresh = false;
  try {
    fresh = statSync(LOADGEN_BINARY).mtimeMs >= statSync(LOADGEN_SOURCE).mtimeMs;
  } catch {}
  if (!fresh) {
    mkdirSync(join(import.meta.dir, "loadgen", "build"), { recursive: true });
    const cc = Bun.spawnSync(
      [process.env.CC ?? "cc", "-O2", "-Wall", "-o", LOADGEN_BINARY, LOADGEN_SOURCE],
      { stderr: "pipe" },
    );
    if (cc.exitCode !== 0)
      throw new Error(`cannot compile ${LOADGEN_SOURCE}: ${cc.stderr.toString()}`);
  }
  return LOADGEN_BINARY;
}

/**
 * The payloads open-loop.c sends, in its file format: HTTP requests, or binary
 * WebSocket frames of `batch` requests (a MessagePack array written as its header and
 * the packed requests, so each request's token bytes end its element).
 */
function openLoopPayloads(spec: LoadSpec, pool: Pool): Uint8Array {
  const entries: { bytes: Uint8Array; patches: number[] }[] = [];
  if (spec.transport === "http") {
    for (const request of httpRequests(spec, pool))
      entries.push({ bytes: request.bytes, patches: [request.lastBlockAt] });
  } else {
    if (!spec.binary) throw new Error("the C generator sends binary WebSocket frames only");
    for (let f = 0; f < pool.tokens.length; f++) {
      // One request per frame is the request itself; more are a fixarray or array16 header first.
      const header =
        spec.batch === 1
          ? []
          : spec.batch < 16
            ? [0x90 | spec.batch]
            : [0xdc, spec.batch >> 8, spec.batch & 0xff];
      const parts: Uint8Array[] = [new Uint8Array(header)];
      const patches: number[] = [];
      let length = parts[0]!.length;
      for (let k = 0; k < spec.batch; k++) {
        const tokens = pool.tokens[(f + k) % pool.tokens.length]!;
        const element = pack({
          id: k,
          op: "route",
          candidates: spec.candidates,
          token_ids: new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength),
        });
        length += element.length;
        patches.push(length - 4 * BLOCK_SIZE);
        parts.push(element);
      }
      entries.push({ bytes: Buffer.concat(parts), patches });
    }
  }
  const size = 4 + entries.reduce((sum, e) => sum + 8 + 4 * e.patches.length + e.bytes.length, 0);
  const out = Buffer.alloc(size);
  let at = out.writeUInt32LE(entries.length, 0);
  for (const entry of entries) {
    at = out.writeUInt32LE(entry.bytes.length, at);
    at = out.writeUInt32LE(entry.patches.length, at);
    for (const patch of entry.patches) at = out.writeUInt32LE(patch, at);
    out.set(entry.bytes, at);
    at += entry.bytes.length;
  }
  return out;
}

async function runOpenLoopC(spec: LoadSpec): Promise<LoadResult> {
  const binary = openLoopBinary();
  const path = join(tmpdir(), `kvedge-open-loop-${process.pid}.bin`);
  writeFileSync(path, openLoopPayloads(spec, promptPool(spec)));
  const frameRequests = spec.transport === "http" ? 1 : spec.batch;
  const proc = killWithBench(
    Bun.spawn(
      [
        binary,
        path,
        spec.host,
        String(spec.port),
        spec.transport,
        String(spec.rate),
        String(frameRequests),
        String(spec.connections),
        String(spec.warmupMs),
        String(spec.durationMs),
        String(spec.serverPid),
        spec.binary ? "u32" : "json",
      ],
      { stdout: "pipe", stderr: "inherit" },
    ),
  );
  const text = await new Response(proc.stdout).text();
  const status = await proc.exited;
  rmSync(path, { force: true });
  if (status !== 0) throw new Error("bench/loadgen/open-loop failed");
  const result = JSON.parse(text.trim().split("\n").pop()!) as LoadResult;
  return {
    ...result,
    ...(result.errors > 0
      ? { sampleError: "answers without status 200 (the C generator does not keep their text)" }
      : {}),
  };
}

if (import.meta.main) {
  const spec = JSON.parse(process.argv[2]!) as LoadSpec;
  const result =
    spec.mode === "open" && spec.generator === "c" ? await runOpenLoopC(spec) : await run(spec);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0);
}
