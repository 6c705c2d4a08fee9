/**
 * A TCP proxy on 127.0.0.1 in front of one loopback port, which a test can cut (every
 * connection closed, new ones refused at once) and restore: one process loses its
 * connection while everything else goes on.
 */
import type { Socket, TCPSocketListener } from "bun";

interface Pair {
  client: Socket<Pair>;
  upstream: Socket<Pair> | null;
  /** Client bytes that came before the upstream connected. */
  early: Uint8Array[];
}

export class TcpProxy {
  private readonly pairs = new Set<Pair>();
  private cut = false;

  private constructor(private readonly listener: TCPSocketListener<Pair>) {}

  static start(targetPort: number): TcpProxy {
    const holder: { proxy: TcpProxy | null } = { proxy: null };
    const listener = Bun.listen<Pair>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open(client) {
          const proxy = holder.proxy!;
          if (proxy.cut) {
            client.end();
            return;
          }
          const pair: Pair = { client, upstream: null, early: [] };
          client.data = pair;
          proxy.pairs.add(pair);
          void Bun.connect<Pair>({
            hostname: "127.0.0.1",
            port: targetPort,
            socket: {
              open(upstream) {
                upstream.data = pair;
                pair.upstream = upstream;
                for (const bytes of pair.early) upstream.write(bytes);
                pair.early = [];
              },
              data(_upstream, bytes) {
                pair.client.write(bytes);
              },
              close() {
                proxy.drop(pair);
              },
              error() {
                proxy.drop(pair);
              },
            },
          }).catch(() => proxy.drop(pair));
        },
        data(client, bytes) {
          const pair = client.data;
          if (pair.upstream === null) pair.early.push(bytes.slice());
          else pair.upstream.write(bytes);
        },
        close(client) {
          if (client.data) holder.proxy!.drop(client.data);
        },
        error(client) {
          if (client.data) holder.proxy!.drop(client.data);
        },
      },
    });
    holder.proxy = new TcpProxy(listener);
    return holder.proxy;
  }

  get port(): number {
    return this.listener.port;
  }

  /** Closes every connection through the proxy and refuses new ones until `restore`. */
  cutAll(): void {
    this.cut = true;
    for (const pair of [...this.pairs]) this.drop(pair);
  }

  restore(): void {
    this.cut = false;
  }

  stop(): void {
    this.cutAll();
    this.listener.stop(true);
  }

  private drop(pair: Pair): void {
    if (!this.pairs.delete(pair)) return;
    pair.client.end();
    pair.upstream?.end();
  }
}
