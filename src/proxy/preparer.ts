/**
 * Where proxied requests are prepared (./prepare.ts): a small body on the thread that
 * received it, a large one on a tokenizer thread, so rendering a chat template and
 * tokenizing megabytes never stalls the thread that answers routes and health checks
 * (docs/decisions.md#tokenizer-threads). Each tokenizer thread loads the model's
 * tokenizer itself; bodies and results cross threads as transferred buffers.
 */
import { type ErrorCode, KvedgeError } from "../domain/errors";
import { type KvedgeThread, startThread } from "../runtime/threads";
import type { Logger } from "../util/log";
import { ownBuffer } from "../util/transfer";
import type { OpenAiPath } from "./openai";
import { type PrepareOptions, type Prepared, prepareRequest } from "./prepare";
import { loadTokenizer, type PromptTokenizer } from "./tokenizer";

/** Bodies up to this many bytes are prepared inline (a few hundred microseconds at most). */
export const INLINE_PREPARE_BYTES = 16 * 1024;

/** What a tokenizer thread is started with. */
export interface TokenizerThreadStart {
  readonly tokenizer: string | null;
  readonly options: PrepareOptions;
}

export interface PrepareCall {
  readonly id: number;
  readonly path: OpenAiPath;
  readonly bytes: Uint8Array;
}

export type PrepareAnswer =
  | { readonly id: number; readonly prepared: Prepared }
  | {
      readonly id: number;
      readonly error: { code: ErrorCode; message: string; param: string | null } | string;
    };

interface Worker {
  readonly thread: KvedgeThread;
  readonly pending: Map<number, (answer: PrepareAnswer) => void>;
  alive: boolean;
}

export class Preparer {
  /** Requests prepared on the receiving thread, and on a tokenizer thread. */
  readonly counts = { inline: 0, thread: 0 };
  private nextId = 0;

  private constructor(
    private readonly options: PrepareOptions,
    private readonly tokenizer: PromptTokenizer | null,
    private readonly workers: Worker[],
    private readonly log: Logger,
  ) {}

  /**
   * Starts `threads` tokenizer threads (0: everything inline), each loading the tokenizer
   * from `tokenizerDir`; `tokenizer` is the same, loaded on this thread.
   */
  static async start(
    options: PrepareOptions,
    tokenizer: PromptTokenizer | null,
    tokenizerDir: string | null,
    threads: number,
    log: Logger,
  ): Promise<Preparer> {
    const workers: Worker[] = [];
    try {
      for (let i = 0; i < threads; i++) {
        const data: TokenizerThreadStart = { tokenizer: tokenizerDir, options };
        const thread = await startThread({ role: "tokenizer", cpus: null, data });
        workers.push({ thread, pending: new Map(), alive: true });
      }
    } catch (error) {
      await Promise.all(workers.map((worker) => worker.thread.stop()));
      throw error;
    }
    const preparer = new Preparer(options, tokenizer, workers, log);
    for (const worker of workers) preparer.listen(worker);
    return preparer;
  }

  /** The model served (requests naming another are refused). */
  get model(): string {
    return this.options.model;
  }

  get threads(): number {
    return this.workers.filter((worker) => worker.alive).length;
  }

  prepare(bytes: Uint8Array, path: OpenAiPath): Promise<Prepared> {
    const worker = bytes.length > INLINE_PREPARE_BYTES ? this.leastBusy() : null;
    if (worker === null) {
      this.counts.inline++;
      return prepareRequest(bytes, path, this.options, this.tokenizer);
    }
    this.counts.thread++;
    const id = this.nextId++;
    const own = ownBuffer(bytes); // transferred, not copied
    return new Promise<Prepared>((resolve, reject) => {
      worker.pending.set(id, (answer) => {
        if ("prepared" in answer) resolve(answer.prepared);
        else reject(errorOf(answer.error));
      });
      const call: PrepareCall = { id, path, bytes: own };
      worker.thread.worker.postMessage(call, [own.buffer as ArrayBuffer]);
    });
  }

  async stop(): Promise<void> {
    for (const worker of this.workers) this.failAll(worker, "kvedge is stopping");
    await Promise.all(this.workers.map((worker) => worker.thread.stop()));
  }

  private leastBusy(): Worker | null {
    let best: Worker | null = null;
    for (const worker of this.workers) {
      if (worker.alive && (best === null || worker.pending.size < best.pending.size)) best = worker;
    }
    return best;
  }

  private listen(worker: Worker): void {
    worker.thread.onMessage = (body) => {
      const answer = body as PrepareAnswer;
      const settle = worker.pending.get(answer.id);
      worker.pending.delete(answer.id);
      settle?.(answer);
    };
    worker.thread.onFailure = (error) => {
      this.log.error("a tokenizer thread failed; large prompts are tokenized inline now", {
        error,
      });
      worker.alive = false;
      this.failAll(worker, "the tokenizer thread failed");
    };
  }

  private failAll(worker: Worker, why: string): void {
    for (const [id, settle] of worker.pending) settle({ id, error: why });
    worker.pending.clear();
  }
}

function errorOf(error: Extract<PrepareAnswer, { error: unknown }>["error"]): Error {
  if (typeof error === "string") return new Error(error);
  return new KvedgeError(error.code, error.message, { param: error.param });
}

/** A tokenizer thread's role (src/cli/thread-main.ts): prepares what it is sent. */
export function runTokenizerThread(
  start: TokenizerThreadStart,
  send: (answer: PrepareAnswer, transfer: ArrayBuffer[]) => void,
  listen: (handler: (call: PrepareCall) => void) => void,
): void {
  const tokenizer = start.tokenizer === null ? null : loadTokenizer(start.tokenizer);
  listen((call) => {
    prepareRequest(call.bytes, call.path, start.options, tokenizer).then(
      (prepared) => {
        const transfer = [prepared.tokens.buffer as ArrayBuffer];
        const forwarded = prepared.forwarded.buffer as ArrayBuffer;
        if (forwarded !== transfer[0]) transfer.push(forwarded);
        send({ id: call.id, prepared }, transfer);
      },
      (error: unknown) => {
        const answer =
          error instanceof KvedgeError
            ? { code: error.code, message: error.message, param: error.param }
            : error instanceof Error
              ? (error.stack ?? error.message)
              : String(error);
        send({ id: call.id, error: answer }, []);
      },
    );
  });
}
