/**
 * A loopback port that never completes a connection: a listening socket (made through
 * libc, since Bun accepts every connection it listens for) with a backlog of 0 that is
 * never accepted from, filled by a few connections of its own. Later SYNs are dropped,
 * as a dead or firewalled host drops them, so a connect waits until its own timeout.
 */
import { dlopen, FFIType, ptr } from "bun:ffi";

const libc = dlopen("libc.so.6", {
  socket: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  bind: { args: [FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
  listen: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  getsockname: { args: [FFIType.i32, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  close: { args: [FFIType.i32], returns: FFIType.i32 },
});

const AF_INET = 2;
const SOCK_STREAM = 1;

export interface BlackHole {
  readonly port: number;
  readonly url: string;
  close(): void;
}

export async function blackHole(): Promise<BlackHole> {
  const fd = libc.symbols.socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw new Error("socket() failed");
  const address = new Uint8Array(16); // sockaddr_in: family, port 0, 127.0.0.1
  address[0] = AF_INET;
  address.set([127, 0, 0, 1], 4);
  if (libc.symbols.bind(fd, ptr(address), 16) !== 0 || libc.symbols.listen(fd, 0) !== 0) {
    libc.symbols.close(fd);
    throw new Error("bind() or listen() failed");
  }
  libc.symbols.getsockname(fd, ptr(address), ptr(new Uint32Array([16])));
  const port = (address[2]! << 8) | address[3]!;
  // Fill the accept queue: from the second on, connections wait for a SYN-ACK.
  const fillers = Array.from({ length: 3 }, () =>
    Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {} } }).catch(() => null),
  );
  await Promise.race([fillers[0], Bun.sleep(1000)]);
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    close() {
      libc.symbols.close(fd);
      for (const filler of fillers) void filler.then((socket) => socket?.terminate());
    },
  };
}
