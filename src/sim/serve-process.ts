/**
 * Runs `kvedge serve` as a child process of this same executable: the compiled binary
 * runs `<binary> serve …`; from source under Bun, `<bun> src/cli/main.ts serve …`.
 * Waits for its "listening" log line (JSON logs on stderr) and keeps the last lines for
 * error messages.
 */
import type { Subprocess } from "bun";
import { join } from "node:path";
import type { NetworkedEngine } from "./networked-engine";

/** The argv that starts `kvedge` the way this process was started. */
export function kvedgeCommand(): string[] {
  const compiled = import.meta.path.startsWith("/$bunfs/");
  return compiled
    ? [process.execPath]
    : [process.execPath, join(import.meta.dir, "..", "cli", "main.ts")];
}

/** Children still running: killed if this process is stopped by a signal or exits. */
const children = new Set<Subprocess>();
let handlersInstalled = false;

function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  const killAll = (): void => {
    for (const child of children) child.kill("SIGTERM");
  };
  process.on("exit", killAll);
  for (const [signal, code] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["SIGHUP", 129],
  ] as const) {
    process.once(signal, () => {
      killAll();
      process.exit(code);
    });
  }
}

/** Both listeners on ports the system picks (the control listener is `--proxy`'s). */
const EPHEMERAL_PORTS = ["--port", "0", "--control-port", "0"];

/** Log lines kept for error messages. */
const TAIL_LINES = 40;

type StopSignal = "SIGTERM" | "SIGINT";

export interface ServeChild {
  readonly url: string;
  /** Where its control plane is served: the control listener with `--proxy`, else `url`. */
  readonly controlUrl: string;
  readonly pid: number;
  /** The last log lines (JSON text), oldest first. */
  tail(): string[];
  /** `signal` (SIGTERM), then SIGKILL after `graceMs`; resolves with the exit code. */
  stop(graceMs?: number, signal?: StopSignal): Promise<number>;
  /** Sends a signal and returns at once. */
  kill(signal: NodeJS.Signals): void;
  /** Resolves with the exit code when the process has exited. */
  readonly exited: Promise<number>;
}

export interface ServeChildOptions {
  /** Arguments after `serve`. `--port 0 --control-port 0 --log-format json` are added. */
  readonly args: readonly string[];
  readonly command?: readonly string[];
  readonly startTimeoutMs?: number;
  /** The child's environment (default: this process's). */
  readonly env?: Record<string, string>;
  /** Called with every log line (stderr), in order. */
  readonly onLine?: (line: string) => void;
}

export async function startServeChild(options: ServeChildOptions): Promise<ServeChild> {
  const command = options.command ?? kvedgeCommand();
  const proc: Subprocess<"ignore", "ignore", "pipe"> = Bun.spawn(
    [...command, "serve", ...EPHEMERAL_PORTS, "--log-format", "json", ...options.args],
    { stdin: "ignore", stdout: "ignore", stderr: "pipe", env: options.env ?? process.env },
  );
  installHandlers();
  children.add(proc);
  void proc.exited.then(() => children.delete(proc));
  const lines: string[] = [];
  type Urls = { url: string; controlUrl: string };
  const listener: { resolve: ((urls: Urls) => void) | null } = { resolve: null };
  const url = new Promise<Urls>((resolve) => {
    listener.resolve = resolve;
  });
  void forEachLine(proc.stderr, (line) => {
    lines.push(line);
    if (lines.length > TAIL_LINES) lines.shift();
    options.onLine?.(line);
    const urls = listener.resolve === null ? null : listeningUrls(line);
    if (urls !== null) {
      listener.resolve!(urls);
      listener.resolve = null;
    }
  });
  const timeoutMs = options.startTimeoutMs ?? 30_000;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const failed = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`kvedge serve did not listen within ${timeoutMs} ms`)),
      timeoutMs,
    );
    void proc.exited.then((code) =>
      reject(new Error(`kvedge serve exited with code ${code} before listening`)),
    );
  });
  failed.catch(() => {}); // it loses the race when serve starts; later exits are not errors here
  const stop = async (graceMs = 5_000, signal: StopSignal = "SIGTERM"): Promise<number> => {
    if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode ?? 1;
    proc.kill(signal);
    const killer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
    const code = await proc.exited;
    clearTimeout(killer);
    return code;
  };
  try {
    const urls = await Promise.race([url, failed]);
    const kill = (signal: NodeJS.Signals) => proc.kill(signal);
    return { ...urls, pid: proc.pid, tail: () => [...lines], stop, kill, exited: proc.exited };
  } catch (error) {
    await stop(1_000);
    const detail = lines.slice(-10).join("\n");
    throw new Error(
      `${(error as Error).message}${detail === "" ? "" : `; its last log lines:\n${detail}`}`,
    );
  } finally {
    clearTimeout(timer);
  }
}

/** The URLs of a `listening` log line (null for any other line). */
function listeningUrls(line: string): { url: string; controlUrl: string } | null {
  if (!line.includes('"listening"')) return null;
  try {
    const record = JSON.parse(line) as Record<string, unknown>;
    if (record.msg !== "listening" || typeof record.url !== "string") return null;
    const control = typeof record.control_url === "string" ? record.control_url : record.url;
    return { url: record.url, controlUrl: control };
  } catch {
    return null; // not a JSON log line: kept in the tail only
  }
}

/** `error` with the serve child's last log lines appended (what a failed run needs to be understood). */
export function withServeTail(error: unknown, serve: ServeChild | null): unknown {
  const tail = serve?.tail().slice(-10).join("\n") ?? "";
  if (tail !== "" && error instanceof Error)
    error.message += `\nkvedge serve's last log lines:\n${tail}`;
  return error;
}

/** Calls `onLine` with every whole line of `stream`, in order, until it ends. */
export async function forEachLine(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
) {
  const decoder = new TextDecoder();
  let pending = "";
  for await (const chunk of stream) {
    pending += decoder.decode(chunk, { stream: true });
    for (let newline = pending.indexOf("\n"); newline >= 0; newline = pending.indexOf("\n")) {
      onLine(pending.slice(0, newline));
      pending = pending.slice(newline + 1);
    }
  }
}

/** Waits until kvedge serve at `url` is ready and every engine has `subscribers` subscribers. */
export async function waitReady(
  url: string,
  engines: readonly NetworkedEngine[],
  subscribers = 1,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const ready = await fetch(`${url}/readyz`).then(
      (response) => response.ok,
      () => false,
    );
    if (ready && engines.every((engine) => engine.subscribers >= subscribers)) return;
    if (performance.now() > deadline)
      throw new Error(`kvedge serve was not ready within ${timeoutMs} ms`);
    await Bun.sleep(20);
  }
}
