/**
 * Runs the compiled `kvedge serve` as a subprocess on loopback, waits until it
 * listens, and collects its JSON log lines. Starting and stopping are the demo's own
 * (src/sim/serve-process.ts); this adds the parsed logs tests look into.
 */
import { startServeChild } from "../../src/sim/serve-process";
import { kvedgeBinary } from "./kvedge";

type LogLine = Record<string, unknown>;

export interface ServeProcess {
  readonly url: string;
  /** The control plane: the control listener with `--proxy`, else `url`. */
  readonly controlUrl: string;
  /** Parsed JSON log lines so far. */
  readonly logs: LogLine[];
  /** Sends SIGTERM (or SIGINT) and waits for the exit code. */
  stop(signal?: "SIGTERM" | "SIGINT"): Promise<number>;
  /** Sends a signal and returns at once. */
  kill(signal: NodeJS.Signals): void;
  /** Resolves with the exit code when the process has exited. */
  readonly exited: Promise<number>;
  /** Waits until a log line satisfies `predicate`. */
  waitForLog(predicate: (line: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
}

interface Waiter {
  readonly predicate: (line: LogLine) => boolean;
  readonly resolve: (line: LogLine) => void;
}

/** `kvedge serve --port 0` with JSON debug logs, `args` after; `env` is all it sees. */
export async function startServe(
  args: readonly string[],
  env: Record<string, string> = {},
): Promise<ServeProcess> {
  const logs: LogLine[] = [];
  const waiters: Waiter[] = [];
  const onLine = (text: string): void => {
    let line: LogLine;
    try {
      line = JSON.parse(text);
    } catch {
      line = { msg: text, unparsed: true };
    }
    logs.push(line);
    for (let i = waiters.length - 1; i >= 0; i--) {
      if (waiters[i]!.predicate(line)) waiters.splice(i, 1)[0]!.resolve(line);
    }
  };
  const child = await startServeChild({
    command: [kvedgeBinary()],
    args: ["--log-level", "debug", ...args],
    env: { PATH: process.env.PATH ?? "", ...env },
    onLine,
  });
  const waitForLog = (predicate: (line: LogLine) => boolean, timeoutMs = 10_000) =>
    new Promise<LogLine>((resolve, reject) => {
      const seen = logs.find(predicate);
      if (seen !== undefined) return resolve(seen);
      const timer = setTimeout(() => {
        reject(
          new Error(
            `no such log line within ${timeoutMs} ms; logs: ${JSON.stringify(logs.slice(-20))}`,
          ),
        );
      }, timeoutMs);
      waiters.push({
        predicate,
        resolve: (line) => {
          clearTimeout(timer);
          resolve(line);
        },
      });
    });
  return {
    url: child.url,
    controlUrl: child.controlUrl,
    logs,
    waitForLog,
    stop: (signal = "SIGTERM") => child.stop(20_000, signal),
    kill: (signal) => child.kill(signal),
    exited: child.exited,
  };
}

/** Every `/metrics` sample at `baseUrl`, by its name and labels as printed (`name{a="b"}`). */
export async function metricsOf(baseUrl: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${baseUrl}/metrics`)).text();
  const values = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line === "") continue;
    const at = line.lastIndexOf(" ");
    values.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return values;
}

/** The value of one `/metrics` sample (`name` or `name{labels}` as printed) at `baseUrl`; NaN if absent. */
export async function metricValue(baseUrl: string, sample: string): Promise<number> {
  return (await metricsOf(baseUrl)).get(sample) ?? Number.NaN;
}

/** POSTs `body` as JSON to `url`. */
export function postJson(url: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  return fetch(url, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
    ...(signal === undefined ? {} : { signal }),
  });
}
