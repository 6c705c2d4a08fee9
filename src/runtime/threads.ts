/**
 * kvedge's threads: which ones run (runtime.index_threads, runtime.route_threads),
 * on which CPUs, and how one is started.
 *
 * Every thread is a Bun Worker running `thread-main.ts`, which pins itself, reports
 * ready, and runs its role. In the compiled binary the Worker's entry is a second
 * entrypoint of the build (build.ts), found at its path relative to the bundle's root.
 */
import type { Config } from "../config";
import { getAffinity } from "./affinity";

/** With fewer CPUs than this, the defaults keep everything on the main thread. */
export const THREADED_MIN_CPUS = 4;
/**
 * Default lanes at most: the main thread decides every route (~25 µs of its CPU each,
 * bench/RESULTS.md), a lane does ~57 µs of the rest, so past ~3 lanes the main thread
 * is the limit and more lanes only add hand-offs.
 */
export const LANES_DEFAULT_MAX = 3;

export type ThreadRole = "probe" | "lane" | "writer" | "tokenizer";

export interface ThreadPlan {
  readonly indexThreads: number;
  readonly routeThreads: number;
  /** CPUs of the writer thread (null = not pinned). */
  readonly writerCpus: readonly number[] | null;
  /** Per lane, its CPUs (null = not pinned). */
  readonly laneCpus: readonly (readonly number[] | null)[];
  /** Whether some threads share a CPU (more threads than CPUs). */
  readonly shared: boolean;
}

/**
 * The threads to run and their CPUs. `pinned` is the pinned CPU set (runtime.cpus or
 * the NUMA node's), null when not pinning; `available` the CPUs the process may use.
 * Dedicated threads take CPUs from the end of the set, one each (the writer first),
 * and are pinned only when the process is; the main thread keeps the whole set.
 */
export function planThreads(
  runtime: Config["runtime"],
  pinned: readonly number[] | null,
  available: readonly number[] = pinned ?? getAffinity(),
): ThreadPlan {
  const cpus = pinned ?? available;
  const many = cpus.length >= THREADED_MIN_CPUS;
  // The writer thread needs the shared index (not in this build): off unless asked for.
  const indexThreads = runtime.index_threads ?? 0;
  const lanes = many ? Math.min(LANES_DEFAULT_MAX, cpus.length - 2) : 0;
  const routeThreads = runtime.route_threads ?? lanes;
  const dedicated = indexThreads + routeThreads;
  const cpuOf = (i: number): readonly number[] | null =>
    pinned === null ? null : [pinned[pinned.length - 1 - (i % pinned.length)]!];
  return {
    indexThreads,
    routeThreads,
    writerCpus: indexThreads > 0 ? cpuOf(0) : null,
    laneCpus: Array.from({ length: routeThreads }, (_, lane) => cpuOf(indexThreads + lane)),
    shared: dedicated + 1 > cpus.length,
  };
}

/** What a thread reports once it runs: its role and the CPUs it may run on. */
export interface ThreadReady {
  readonly role: ThreadRole;
  readonly cpus: readonly number[];
}

/** The first message to a thread. */
export interface ThreadStart<T = unknown> {
  readonly role: ThreadRole;
  readonly cpus: readonly number[] | null;
  readonly data: T;
}

/** Messages from a thread: ready, a role's own, or a failure (the role stopped). */
export type ThreadMessage =
  | { readonly kind: "ready"; readonly ready: ThreadReady }
  | { readonly kind: "failed"; readonly error: string }
  | { readonly kind: "role"; readonly body: unknown };

/** The Worker entry (src/cli/thread-main.ts) from source; in the binary, where build.ts put it. */
function entryUrl(): string {
  if (import.meta.url.includes("/$bunfs/")) return "./cli/thread-main.ts";
  return new URL("../cli/thread-main.ts", import.meta.url).href;
}

export interface KvedgeThread {
  readonly worker: Worker;
  readonly ready: ThreadReady;
  /** Role messages from the thread. */
  onMessage: (body: unknown) => void;
  /** Called once if the thread fails or exits unasked. */
  onFailure: (error: string) => void;
  post(body: unknown): void;
  /** Terminates the thread (its role should have stopped already). */
  stop(): Promise<void>;
}

/** Starts a thread and resolves once it has pinned itself and reported ready. */
export function startThread<T>(
  start: ThreadStart<T>,
  readyTimeoutMs = 10_000,
): Promise<KvedgeThread> {
  const worker = new Worker(entryUrl());
  return new Promise<KvedgeThread>((resolve, reject) => {
    let thread: KvedgeThread | null = null;
    let stopping = false;
    const late = `the ${start.role} thread did not start in ${readyTimeoutMs} ms`;
    const timer = setTimeout(() => fail(late), readyTimeoutMs);
    const fail = (error: string): void => {
      clearTimeout(timer);
      if (thread === null) {
        void worker.terminate();
        reject(new Error(error));
      } else if (!stopping) {
        stopping = true;
        thread.onFailure(error);
      }
    };
    worker.onmessage = (event: MessageEvent<ThreadMessage>) => {
      const message = event.data;
      if (message.kind === "failed") fail(message.error);
      else if (message.kind === "role") thread?.onMessage(message.body);
      else if (thread === null) {
        clearTimeout(timer);
        thread = {
          worker,
          ready: message.ready,
          onMessage: () => {},
          onFailure: () => {},
          post: (body) => worker.postMessage(body),
          stop: async () => {
            stopping = true;
            worker.terminate();
          },
        };
        resolve(thread);
      }
    };
    worker.onerror = (event) => fail(`the ${start.role} thread failed: ${event.message}`);
    worker.addEventListener("close", () => fail(`the ${start.role} thread exited`));
    worker.postMessage(start);
  });
}
