/**
 * A local `nats-server` for the replicated demo and the tests: always bound to
 * 127.0.0.1 (its own default is every interface), on a port picked free, with the
 * slow-consumer limits docs/operations.md recommends (a stuck replica is cut after 2 s
 * instead of stalling the others). Waits for "Server is ready"; `restart` brings it
 * back on the same port.
 */
import type { Subprocess } from "bun";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { forEachLine } from "./serve-process";

const CANDIDATES = ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"];

/** The nats-server executable, or null when it is not installed. */
export function natsServerPath(): string | null {
  for (const dir of (process.env.PATH ?? "").split(":")) {
    if (dir !== "" && existsSync(join(dir, "nats-server"))) return join(dir, "nats-server");
  }
  return CANDIDATES.find((path) => existsSync(path)) ?? null;
}

export interface NatsServerOptions {
  /** Extra arguments (auth, TLS), after the loopback address and port. */
  readonly args?: readonly string[];
  /** A fixed port (default: a free one). */
  readonly port?: number;
  readonly startTimeoutMs?: number;
}

export class NatsServer {
  private proc: Subprocess<"ignore", "ignore", "pipe"> | null = null;
  private readonly dir = mkdtempSync(join(tmpdir(), "kvedge-nats-"));
  private readonly config = join(this.dir, "nats.conf");
  private log: string[] = [];

  private constructor(
    readonly port: number,
    private readonly options: NatsServerOptions,
  ) {
    // write_deadline and max_pending exist only in a config file; -a and -p still rule.
    writeFileSync(this.config, 'write_deadline: "2s"\nmax_pending: 8MB\n');
  }

  /** Starts a server on 127.0.0.1 and waits until it is ready. */
  static async start(options: NatsServerOptions = {}): Promise<NatsServer> {
    const server = new NatsServer(options.port ?? (await freePort()), options);
    await server.run();
    return server;
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  get pid(): number {
    return this.proc?.pid ?? -1;
  }

  /** Its last log lines (for error messages). */
  tail(): string[] {
    return this.log.slice(-20);
  }

  /** Stops it (SIGTERM, then SIGKILL after `graceMs`). */
  async stop(graceMs = 3000): Promise<void> {
    const proc = this.proc;
    this.proc = null;
    if (proc === null || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill("SIGTERM");
    const killer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
    await proc.exited;
    clearTimeout(killer);
  }

  /** Stops it and starts it again on the same port. */
  async restart(downMs = 0): Promise<void> {
    await this.stop();
    if (downMs > 0) await Bun.sleep(downMs);
    await this.run();
  }

  /** Stops it for good and removes its files. */
  async close(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async run(): Promise<void> {
    const binary = natsServerPath();
    if (binary === null)
      throw new Error("nats-server is not installed (Debian: apt-get install nats-server)");
    const proc = Bun.spawn(
      [
        binary,
        "-c",
        this.config,
        "-a",
        "127.0.0.1",
        "-p",
        String(this.port),
        ...(this.options.args ?? []),
      ],
      { stdin: "ignore", stdout: "ignore", stderr: "pipe" },
    );
    this.proc = proc;
    this.log = [];
    const ready = new Promise<void>((resolve, reject) => {
      void forEachLine(proc.stderr, (line) => {
        this.log.push(line);
        if (this.log.length > 200) this.log.shift();
        if (line.includes("Server is ready")) resolve();
      });
      void proc.exited.then((code) =>
        reject(new Error(`nats-server exited with ${code}:\n${this.tail().join("\n")}`)),
      );
    });
    const timeoutMs = this.options.startTimeoutMs ?? 10_000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`nats-server not ready within ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      await Promise.race([ready, late]);
    } catch (error) {
      await this.stop(500);
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A TCP port free on 127.0.0.1 now (the OS picks it; the listener is closed again). */
export async function freePort(): Promise<number> {
  const listener = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: { data() {} },
  });
  const port = listener.port;
  listener.stop(true);
  return port;
}
