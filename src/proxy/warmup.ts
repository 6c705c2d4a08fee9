/**
 * The proxy's path warmed before `kvedge serve --proxy` listens, in every thread that
 * carries it (docs/decisions.md#proxy-warm-up): a fresh process's first burst of streams
 * runs unoptimised code while JSC's compiler threads take the same cores, and the
 * health checks answered meanwhile wait (bench/JOURNAL.md, issue 32). Each thread is a
 * VM of its own and compiles its own code, so the main thread and each route lane run
 * this themselves.
 *
 * Everything is scratch: an engine on a loopback port (./scratch-engine.ts), a core with
 * that engine as its one (approximate) worker and admission off, a proxy and preparer
 * on it, and a loopback listener in front, so nothing reaches the real core, its
 * metrics or its index. Requests go through that listener as clients' do, in waves,
 * each read to its end and checked (status 200, a stream ended with `[DONE]`); a
 * failure is a bug and throws. Two paths:
 *
 * - `local`: the listener hands each request to `OpenAiProxy.handle`, as the main
 *   thread serves its own clients (no route lanes).
 * - `lane`: a `LaneEnd` carries it, as a route lane does (the lane's own handler in
 *   front, when it gives one), and a `RemoteRequests` on the scratch proxy decides it;
 *   the two post to each other on a later turn, as thread messages arrive.
 *
 * At the end nothing is left: no request live or active, no engine request pending;
 * every listener, the engine and the core are stopped.
 */
import type { Server } from "bun";
import type { Config } from "../config";
import { KvedgeCore } from "../core/core";
import { Exchange, type Origin, originOf } from "../http/client";
import { KvedgeError } from "../domain/errors";
import { clientError } from "../http/errors";
import { errorReply, receiveBytes } from "../http/http";
import { silentLogger } from "../util/log";
import { xorshift32 } from "../util/random";
import { LaneEnd } from "./lane-end";
import {
  CHAT_PATH,
  COMPLETIONS_PATH,
  isOpenAiPath,
  type OpenAiPath,
  type PromptLimits,
  SSE_DONE,
} from "./openai";
import { Preparer } from "./preparer";
import { OpenAiProxy, prepareOptionsOf, proxyOptionsOf, servedModel } from "./proxy";
import { RemoteRequests } from "./remote";
import { ScratchEngine } from "./scratch-engine";
import type { PromptTokenizer } from "./tokenizer";

export type WarmupPath = "local" | "lane";

/** A listener's request handler, as `Bun.serve` calls it. */
export type Front = (request: Request, server: Server<undefined>) => Response | Promise<Response>;

export interface ProxyWarmupOptions {
  /** The settings the scratch core and proxy take (their workers replaced by the scratch engine). */
  readonly config: Config;
  /** Requests in all, shared by the paths (0: none). */
  readonly requests: number;
  /** The model's tokenizer (null: token-id prompts only, as the proxy then takes). */
  readonly tokenizer: PromptTokenizer | null;
  readonly paths: readonly WarmupPath[];
  /** A route lane's handler for its clients, carrying OpenAI requests on `end`. */
  readonly laneFront?: (end: LaneEnd) => Front;
  /** Tests: this engine instead of a scratch one. */
  readonly engineUrl?: string;
}

export interface ProxyWarmupResult {
  readonly requests: number;
  /** Of them, answered whole through the scratch proxy (all, or it throws). */
  readonly completed: number;
  /** Of them, with a text prompt or a chat (tokenized). */
  readonly texts: number;
  readonly ms: number;
  /** The engine's address (closed by now, when it was the scratch one). */
  readonly engineUrl: string | null;
}

/** Requests in flight at once (fewer if proxy.upstream_connections is lower). */
const WAVE = 256;
const PROMPT_TOKENS_MAX = 1024;
/** Token ids stay below this (any real vocabulary is larger). */
const VOCABULARY = 32_000;
/** How long the scratch pieces get to let go of finished requests. */
const SETTLE_MS = 5_000;
const TIMEOUTS = { connectMs: 5_000, firstByteMs: 10_000, idleMs: 10_000 };
const WORDS = ["river", "stone", "light", "paper", "cloud", "engine", "garden", "signal"];

/** Warms the proxy's `paths` in this thread with about `requests` requests. */
export async function warmUpProxy(options: ProxyWarmupOptions): Promise<ProxyWarmupResult> {
  const started = performance.now();
  const { requests, paths } = options;
  if (requests <= 0 || paths.length === 0)
    return { requests: 0, completed: 0, texts: 0, ms: 0, engineUrl: null };
  const engine = options.engineUrl === undefined ? ScratchEngine.start() : null;
  const engineUrl = options.engineUrl ?? engine!.url;
  let scratch: Scratch | null = null;
  try {
    scratch = await Scratch.start(options.config, options.tokenizer, engineUrl);
    let sent = 0;
    for (const [i, path] of paths.entries()) {
      const count = Math.ceil((requests - sent) / (paths.length - i));
      await scratch.drive(path, count, options.laneFront);
      sent += count;
    }
    const completed = await scratch.settled(engine);
    const { texts } = scratch;
    return { requests: sent, completed, texts, ms: performance.now() - started, engineUrl };
  } finally {
    await scratch?.stop();
    await engine?.stop();
  }
}

/** The scratch core, proxy and listeners, and the requests sent through them. */
class Scratch {
  private readonly random = xorshift32(0x5052_4f58);
  private readonly fronts: Server<undefined>[] = [];
  private readonly lanes: { remote: RemoteRequests; end: LaneEnd }[] = [];
  private readonly kinds: readonly Kind[];
  /** Requests sent with a text prompt or a chat. */
  texts = 0;

  private constructor(
    private readonly core: KvedgeCore,
    private readonly proxy: OpenAiProxy,
    private readonly limits: PromptLimits,
    tokenizer: PromptTokenizer | null,
  ) {
    // A text prompt is up to 64 words and a chat's template adds its own: with less room,
    // token ids only.
    const room = limits.tokens >= 256 && limits.bytes >= 1024;
    this.kinds = kindsOf(room ? tokenizer : null);
  }

  static async start(
    config: Config,
    tokenizer: PromptTokenizer | null,
    engineUrl: string,
  ): Promise<Scratch> {
    // Admission and pacing off, no cluster (no replicas' turns): a warm-up request is never held.
    const core = new KvedgeCore({
      config: {
        ...config,
        workers: [
          {
            worker_id: 1n,
            dp_rank: 0,
            endpoint: null,
            replay_endpoint: null,
            topic: "",
            http_endpoint: engineUrl,
          },
        ],
        route: { ...config.route, admission: "off", pacing: "off" },
        cluster: { ...config.cluster, nats_url: null },
      },
      log: silentLogger,
    });
    await core.start();
    const adapters = core.lora.adapters.map((adapter) => adapter.name);
    const prepare = prepareOptionsOf(config, servedModel(config, tokenizer), adapters);
    const preparer = await Preparer.start(prepare, tokenizer, null, 0, silentLogger);
    const proxy = new OpenAiProxy(proxyOptionsOf(config, core, preparer, silentLogger));
    return new Scratch(core, proxy, prepare.limits, tokenizer);
  }

  /** `count` requests through `path`, in waves, each read to its end and checked. */
  async drive(path: WarmupPath, count: number, laneFront?: (end: LaneEnd) => Front) {
    const front = path === "local" ? this.localFront() : (laneFront ?? this.laneFront)(this.lane());
    const server = Bun.serve({ hostname: "127.0.0.1", port: 0, development: false, fetch: front });
    this.fronts.push(server);
    const origin = originOf(`http://127.0.0.1:${server.port}`);
    const wave = Math.min(WAVE, this.proxy.options.upstreamConnections);
    for (let done = 0; done < count; ) {
      const size = Math.min(wave, count - done);
      const answers = Array.from({ length: size }, (_, k) => this.send(origin, done + k));
      const failed = (await Promise.all(answers)).find((failure) => failure !== null);
      if (failed !== undefined) throw new Error(`a warm-up request failed (${path}: ${failed})`);
      done += size;
    }
  }

  /**
   * Waits until every request let go of what it held (throws naming what is left);
   * the requests completed.
   */
  async settled(engine: ScratchEngine | null): Promise<number> {
    const left = (): string | null => {
      const held = {
        live: this.proxy.live.size,
        active: this.core.activeRequestCount,
        slots: this.proxy.slots.inUse,
        remote: this.lanes.reduce((sum, lane) => sum + lane.remote.size, 0),
        lane: this.lanes.reduce((sum, lane) => sum + lane.end.size, 0),
        engine: engine?.pending ?? 0,
        fronts: this.fronts.reduce((sum, front) => sum + front.pendingRequests, 0),
      };
      const found = Object.entries(held).filter(([, count]) => count > 0);
      return found.length === 0 ? null : found.map(([what, n]) => `${what} ${n}`).join(", ");
    };
    const deadline = performance.now() + SETTLE_MS;
    while (left() !== null && performance.now() < deadline) await Bun.sleep(1);
    const still = left();
    if (still !== null) throw new Error(`the warm-up left requests behind (${still})`);
    return this.proxy.counters.completed;
  }

  async stop(): Promise<void> {
    await Promise.all(this.fronts.map((front) => front.stop(true)));
    for (const lane of this.lanes) lane.end.stop();
    this.proxy.stop();
    await this.proxy.preparer.stop();
    await this.core.stop();
  }

  /** The main thread's own clients: the proxy carries them. */
  private localFront(): Front {
    return (request, server) => {
      server.timeout(request, 0);
      const path = new URL(request.url).pathname;
      if (!isOpenAiPath(path)) return new Response(null, { status: 404 });
      return this.proxy.handle(request, path).catch((error) => failure(request, error));
    };
  }

  /** A lane's clients when the lane gives no handler: the body read, then the LaneEnd. */
  private readonly laneFront = (end: LaneEnd): Front => {
    const limit = this.proxy.options.bodyLimitBytes;
    return async (request) => {
      const path = new URL(request.url).pathname as OpenAiPath;
      try {
        return await end.handle(request, path, await receiveBytes(request, limit));
      } catch (error) {
        return failure(request, error);
      }
    };
  };

  /** A lane's end and the main thread's, posting to each other a turn later. */
  private lane(): LaneEnd {
    let remote: RemoteRequests | null = null;
    const end = new LaneEnd((events) => setImmediate(() => remote!.events(events)));
    remote = new RemoteRequests(
      this.proxy,
      (orders) => setImmediate(() => end.orders(orders)),
      () => {},
    );
    this.lanes.push({ remote, end });
    return end;
  }

  /** One request of kind `k` (of `kinds`), read to its end: null, or what went wrong. */
  private async send(origin: Origin, k: number): Promise<string | null> {
    const kind = this.kinds[k % this.kinds.length]!;
    if (kind.text) this.texts++;
    const body = new TextEncoder().encode(JSON.stringify(this.bodyOf(kind)));
    const headers: [string, string][] = [["content-type", "application/json"]];
    const exchange = new Exchange(
      { origin, method: "POST", path: kind.path, headers, body },
      TIMEOUTS,
    );
    try {
      const head = await exchange.head;
      const decoder = new TextDecoder();
      let text = "";
      for (let step = await exchange.read(); !step.done; step = await exchange.read())
        text += decoder.decode(step.value, { stream: true });
      if (head.status !== 200) return `${kind.path}: ${head.status} ${text.slice(0, 200)}`;
      const whole = kind.stream ? text.endsWith(SSE_DONE) : text.includes('"usage"');
      return whole ? null : `${kind.path}: the answer did not end whole`;
    } catch (error) {
      exchange.abort();
      return `${kind.path}: ${error instanceof Error ? error.message : String(error)}`;
    }
  }

  private bodyOf(kind: Kind): Record<string, unknown> {
    const { options } = this.proxy;
    const body: Record<string, unknown> = {
      model: options.model,
      max_tokens: 2,
      stream: kind.stream,
      ...(kind.usage === null ? {} : { stream_options: { include_usage: kind.usage } }),
    };
    if (kind.path === CHAT_PATH) {
      body.messages = [
        { role: "system", content: this.words(16) },
        { role: "user", content: this.words(48) },
      ];
    } else if (kind.text) body.prompt = this.words(64);
    else {
      // Within the prompt and body limits (a token id takes at most 6 bytes of JSON).
      const most = Math.min(PROMPT_TOKENS_MAX, Math.floor((options.bodyLimitBytes - 256) / 6));
      const length = 1 + (this.random() % Math.max(1, Math.min(most, this.limits.tokens)));
      body.prompt = Array.from({ length }, () => this.random() % VOCABULARY);
    }
    return body;
  }

  private words(count: number): string {
    const most = Math.max(1, Math.floor(this.limits.bytes / 8));
    return Array.from({ length: Math.min(count, most) }, () => WORDS[this.random() % 8]).join(" ");
  }
}

/** The answer to a request that failed here: its error, or the unexpected one's text. */
function failure(request: Request, error: unknown): Response {
  const known = clientError(error);
  return errorReply(request, known ?? new KvedgeError("internal", String(error)));
}

/** A kind of request: its path, streamed or not, `stream_options.include_usage` if sent. */
interface Kind {
  readonly path: OpenAiPath;
  readonly stream: boolean;
  readonly usage: boolean | null;
  /** A text prompt (completions), else token ids. */
  readonly text: boolean;
}

/** What the proxy takes: token-id completions, and text and chats with a tokenizer. */
function kindsOf(tokenizer: PromptTokenizer | null): Kind[] {
  const ids = (stream: boolean, usage: boolean | null): Kind => ({
    path: COMPLETIONS_PATH,
    stream,
    usage,
    text: false,
  });
  // Mostly streams without stream_options: kvedge asks for the usage and drops it.
  const kinds = [
    ids(true, null),
    ids(true, null),
    ids(true, true),
    ids(true, false),
    ids(false, null),
  ];
  if (tokenizer === null) return kinds;
  kinds.push({ path: COMPLETIONS_PATH, stream: true, usage: null, text: true });
  if (!tokenizer.hasChatTemplate) return kinds;
  for (const [stream, usage] of [
    [true, null],
    [true, true],
    [false, null],
  ] as const)
    kinds.push({ path: CHAT_PATH, stream, usage, text: true });
  return kinds;
}
