/**
 * Real headless Chromium (Debian's `chromium` package) driven over the DevTools
 * protocol: open a page, evaluate expressions in it, take a screenshot. Loopback only:
 * the debugging port binds 127.0.0.1, and background networking, component updates,
 * sync and QUIC are off, so the browser talks to nothing but the page's server.
 */
import type { Subprocess } from "bun";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const CHROMIUM = "/usr/bin/chromium";

export class Browser {
  private nextId = 1;
  private readonly pending = new Map<
    number,
    { resolve: (value: any) => void; reject: (error: Error) => void }
  >();

  private constructor(
    private readonly proc: Subprocess,
    private readonly socket: WebSocket,
    private readonly profile: string,
    private sessionId: string | null = null,
  ) {
    socket.onmessage = (event) => {
      const message = JSON.parse(String(event.data)) as {
        id?: number;
        result?: unknown;
        error?: { message: string };
      };
      if (message.id === undefined) return;
      const waiter = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.error !== undefined) waiter?.reject(new Error(message.error.message));
      else waiter?.resolve(message.result);
    };
  }

  static async launch(width = 1400, height = 1100): Promise<Browser> {
    const profile = mkdtempSync(join(tmpdir(), "kvedge-chromium-"));
    const proc = Bun.spawn(
      [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--mute-audio",
        `--user-data-dir=${profile}`,
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        `--window-size=${width},${height}`,
        "about:blank",
      ],
      { stdin: "ignore", stdout: "ignore", stderr: Bun.file(join(profile, "stderr.log")) },
    );
    const url = await devtoolsUrl(proc, join(profile, "stderr.log"));
    const socket = new WebSocket(url);
    await new Promise<void>((resolve, reject) => {
      socket.onopen = () => resolve();
      socket.onerror = () => reject(new Error(`cannot open ${url}`));
    });
    const browser = new Browser(proc, socket, profile);
    const { targetId } = await browser.send("Target.createTarget", { url: "about:blank" });
    const { sessionId } = await browser.send("Target.attachToTarget", { targetId, flatten: true });
    browser.sessionId = sessionId;
    await browser.send("Emulation.setDeviceMetricsOverride", {
      width,
      height,
      deviceScaleFactor: 1,
      mobile: false,
    });
    return browser;
  }

  send(method: string, params: Record<string, unknown> = {}): Promise<any> {
    const id = this.nextId++;
    const message: Record<string, unknown> = { id, method, params };
    if (this.sessionId !== null && !method.startsWith("Target."))
      message.sessionId = this.sessionId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.socket.send(JSON.stringify(message));
    });
  }

  async open(url: string): Promise<void> {
    await this.send("Page.enable");
    await this.send("Page.navigate", { url });
  }

  /** The value of a JavaScript expression in the page (promises awaited). */
  async evaluate<T>(expression: string): Promise<T> {
    const { result, exceptionDetails } = await this.send("Runtime.evaluate", {
      expression,
      returnByValue: true,
      awaitPromise: true,
    });
    if (exceptionDetails !== undefined)
      throw new Error(
        `${expression}: ${exceptionDetails.text} ${exceptionDetails.exception?.description ?? ""}`,
      );
    return result.value as T;
  }

  /** Polls an expression until it is truthy. */
  async waitFor(expression: string, what: string, timeoutMs = 15_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!(await this.evaluate<boolean>(`Boolean(${expression})`).catch(() => false))) {
      if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await Bun.sleep(100);
    }
  }

  async screenshot(): Promise<Uint8Array> {
    const { data } = await this.send("Page.captureScreenshot", {
      format: "png",
      captureBeyondViewport: true,
    });
    return Buffer.from(data as string, "base64");
  }

  async close(): Promise<void> {
    this.socket.close();
    this.proc.kill("SIGTERM");
    await this.proc.exited;
    rmSync(this.profile, { recursive: true, force: true });
  }
}

/** Chromium prints its DevTools address on stderr (a file here: a pipe left unread would block it). */
async function devtoolsUrl(proc: Subprocess, log: string): Promise<string> {
  const deadline = performance.now() + 20_000;
  for (;;) {
    const text = await Bun.file(log)
      .text()
      .catch(() => "");
    const match = /DevTools listening on (ws:\/\/127\.0\.0\.1:\d+\/\S+)/.exec(text);
    if (match !== null) return match[1]!;
    if (proc.exitCode !== null || performance.now() > deadline) {
      proc.kill("SIGKILL");
      throw new Error(`chromium did not start: ${text.slice(-500)}`);
    }
    await Bun.sleep(50);
  }
}
