/**
 * Runs the compiled `kvedge serve` as a subprocess on loopback, waits until it
 * listens, and collects its JSON log lines.
 */
import type { Subprocess } from "bun";
import { kvedgeBinary } from "./kvedge";

export interface ServeProcess {
  readonly url: string;
  readonly proc: Subprocess<"ignore", "pipe", "pipe">;
  /** Parsed JSON log lines so far. */
  readonly logs: Record<string, unknown>[];
  /** Sends SIGTERM and waits for the exit code. */
  stop(signal?: "SIGTERM" | "SIGINT"): Promise<number>;
  /** Waits until a log line satisfies `predicate`. */
  waitForLog(predicate: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
}

export async function startServe(args: readonly string[], env: Record<string, string> = {}): Promise<ServeProcess> {
  const proc = Bun.spawn([kvedgeBinary(), "serve", "--port", "0", "--log-format", "json", "--log-level", "debug", ...args], {
    env: { PATH: process.env.PATH ?? "", ...env },
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const logs: Record<string, unknown>[] = [];
  const waiters: { predicate: (line: Record<string, unknown>) => boolean; resolve: (line: Record<string, unknown>) => void }[] = [];
  let tail = "";
  let exited = false;
  void (async () => {
    const decoder = new TextDecoder();
    for await (const chunk of proc.stderr) {
      tail += decoder.decode(chunk, { stream: true });
      let newline;
      while ((newline = tail.indexOf("\n")) >= 0) {
        const text = tail.slice(0, newline);
        tail = tail.slice(newline + 1);
        let line: Record<string, unknown>;
        try {
          line = JSON.parse(text);
        } catch {
          line = { msg: text, unparsed: true };
        }
        logs.push(line);
        for (let i = waiters.length - 1; i >= 0; i--) {
          if (waiters[i]!.predicate(line)) waiters.splice(i, 1)[0]!.resolve(line);
        }
      }
    }
    exited = true;
  })();
  const waitForLog = (predicate: (line: Record<string, unknown>) => boolean, timeoutMs = 10_000) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const seen = logs.find(predicate);
      if (seen !== undefined) return resolve(seen);
      const timer = setTimeout(() => reject(new Error(`no such log line within ${timeoutMs} ms; logs: ${JSON.stringify(logs.slice(-20))}`)), timeoutMs);
      waiters.push({ predicate, resolve: (line) => { clearTimeout(timer); resolve(line); } });
    });
  let listening: Record<string, unknown>;
  try {
    listening = await waitForLog((line) => line.msg === "listening");
  } catch (error) {
    proc.kill();
    throw new Error(`kvedge serve did not start (exited: ${exited}): ${(error as Error).message}`);
  }
  return {
    url: String(listening.url),
    proc,
    logs,
    waitForLog,
    async stop(signal = "SIGTERM") {
      proc.kill(signal);
      return await proc.exited;
    },
  };
}
