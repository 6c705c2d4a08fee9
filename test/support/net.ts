/**
 * Loopback sockets for tests: a free port (bound, then released for the process under
 * test to take or to leave closed), whether anything listens on a port, and one raw
 * HTTP/1.1 request with headers a fetch would not send (a malformed Host).
 */
import { connect, createServer } from "node:net";

/** A loopback port nothing listens on once this resolves. */
export async function freePort(): Promise<number> {
  return await new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      server.close(() => resolve(port));
    });
  });
}

/** Whether anything accepts connections on 127.0.0.1:port. */
export function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port }, () => {
      socket.destroy();
      resolve(true);
    });
    socket.on("error", () => resolve(false));
  });
}

/** Sends `line` (e.g. "GET /healthz") with this Host header; resolves with the status line. */
export function rawStatus(port: number, host: string, line: string): Promise<string> {
  return new Promise((resolve) => {
    let got = "";
    const socket = connect({ host: "127.0.0.1", port }, () => {
      socket.write(`${line} HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 0\r\n\r\n`);
    });
    socket.on("data", (chunk: Buffer) => {
      got += chunk.toString("latin1");
      if (got.includes("\r\n")) socket.destroy();
    });
    socket.on("close", () => resolve(got.split("\r\n")[0] ?? ""));
    socket.on("error", () => {});
  });
}
