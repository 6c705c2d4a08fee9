/**
 * A raw-TCP HTTP server on loopback whose every answer byte is the test's: a handler
 * gets each request (head and Content-Length body) and the socket, and writes what it
 * likes (a proper answer, garbage, half a chunk), when it likes, or nothing; it can
 * close or reset. The server counts connections (open now, ever) and keeps what each
 * request sent, so tests can assert that a connection was closed and what arrived.
 */
import type { Socket, TCPSocketListener } from "bun";

export interface RawRequest {
  readonly method: string;
  readonly path: string;
  /** Header names in lower case. */
  readonly headers: Record<string, string>;
  readonly body: Uint8Array;
  readonly text: string;
}

/** The connection a handler answers on. */
export interface RawConnection {
  readonly id: number;
  /** Whether the peer (the client) has closed it. */
  readonly closed: boolean;
  write(data: string | Uint8Array): void;
  /** Writes a chunked-encoding chunk. */
  chunk(data: string | Uint8Array): void;
  /** The head of a streamed answer (chunked). */
  streamHead(status?: number, contentType?: string): void;
  /** A whole answer with Content-Length. */
  json(status: number, body: unknown): void;
  /** Ends a chunked body (the last chunk), leaving the connection to the client. */
  endChunks(): void;
  /** Closes (FIN) or resets (RST) the connection. */
  close(): void;
  reset(): void;
  /** Resolves when the client closed the connection. */
  readonly gone: Promise<void>;
}

export type RawHandler = (request: RawRequest, connection: RawConnection) => void | Promise<void>;

interface ConnectionData {
  id: number;
  buffer: Uint8Array;
  closed: boolean;
  answered: boolean;
  gone: () => void;
  connection: RawConnection | null;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export class RawHttpServer {
  /** Connections open now, and ever accepted. */
  open = 0;
  accepted = 0;
  readonly requests: RawRequest[] = [];
  private listener: TCPSocketListener<ConnectionData> | null = null;
  private readonly sockets = new Set<Socket<ConnectionData>>();

  constructor(private handler: RawHandler) {}

  get port(): number {
    return this.listener!.port;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Replaces the handler (for requests from now on). */
  handle(handler: RawHandler): void {
    this.handler = handler;
  }

  start(): this {
    this.listener = Bun.listen<ConnectionData>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open: (socket) => {
          this.open++;
          this.sockets.add(socket);
          socket.data = {
            id: ++this.accepted,
            buffer: new Uint8Array(0),
            closed: false,
            answered: false,
            gone: () => {},
            connection: null,
          };
        },
        data: (socket, data) => this.received(socket, data),
        close: (socket) => this.gone(socket),
        error: (socket) => this.gone(socket),
      },
    });
    return this;
  }

  stop(): void {
    for (const socket of this.sockets) socket.terminate();
    this.listener?.stop(true);
  }

  private gone(socket: Socket<ConnectionData>): void {
    if (socket.data.closed) return;
    socket.data.closed = true;
    this.sockets.delete(socket);
    this.open--;
    socket.data.gone();
  }

  private received(socket: Socket<ConnectionData>, data: Uint8Array): void {
    const state = socket.data;
    if (state.answered) return;
    const joined = new Uint8Array(state.buffer.length + data.length);
    joined.set(state.buffer);
    joined.set(data, state.buffer.length);
    state.buffer = joined;
    const end = indexOf(joined, "\r\n\r\n");
    if (end < 0) return;
    const lines = decoder.decode(joined.subarray(0, end)).split("\r\n");
    const [method, path] = lines[0]!.split(" ");
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":");
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    const length = Number(headers["content-length"] ?? 0);
    if (joined.length < end + 4 + length) return;
    state.answered = true;
    const body = joined.slice(end + 4, end + 4 + length);
    const request = { method: method!, path: path!, headers, body, text: decoder.decode(body) };
    this.requests.push(request);
    void this.handler(request, this.connectionOf(socket));
  }

  private connectionOf(socket: Socket<ConnectionData>): RawConnection {
    const state = socket.data;
    const gone = new Promise<void>((resolve) => {
      state.gone = resolve;
    });
    const write = (data: string | Uint8Array) => {
      if (!state.closed) socket.write(data);
    };
    return {
      id: state.id,
      get closed() {
        return state.closed;
      },
      gone,
      write,
      chunk(data) {
        const bytes = typeof data === "string" ? encoder.encode(data) : data;
        write(`${bytes.length.toString(16)}\r\n`);
        write(bytes);
        write("\r\n");
      },
      streamHead(status = 200, contentType = "text/event-stream") {
        write(
          `HTTP/1.1 ${status} OK\r\ncontent-type: ${contentType}\r\ntransfer-encoding: chunked\r\n\r\n`,
        );
      },
      json(status, body) {
        const bytes = encoder.encode(JSON.stringify(body));
        write(
          `HTTP/1.1 ${status} X\r\ncontent-type: application/json\r\ncontent-length: ${bytes.length}\r\n\r\n`,
        );
        write(bytes);
      },
      endChunks() {
        write("0\r\n\r\n");
      },
      close() {
        socket.end();
      },
      reset() {
        socket.terminate();
      },
    };
  }
}

function indexOf(bytes: Uint8Array, text: string): number {
  const needle = encoder.encode(text);
  outer: for (let i = 0; i + needle.length <= bytes.length; i++) {
    for (let j = 0; j < needle.length; j++) if (bytes[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}
