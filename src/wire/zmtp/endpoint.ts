/**
 * ZeroMQ endpoint strings: `tcp://host:port` (host: IPv4, `[IPv6]`, a DNS name, or `*`
 * when binding; port 0 or `*` when binding means "any free port") and `ipc:///path`
 * (a Unix stream socket; the path is everything after `ipc://`).
 */

export type Endpoint =
  | { readonly transport: "tcp"; readonly host: string; readonly port: number }
  | { readonly transport: "ipc"; readonly path: string };

/** Longest sun_path on Linux, minus the terminating NUL. */
const IPC_PATH_BYTES_MAX = 107;

export class EndpointError extends Error {
  readonly code = "ZMTP_BAD_ENDPOINT";
  constructor(endpoint: string, why: string) {
    super(`invalid ZeroMQ endpoint ${JSON.stringify(endpoint)}: ${why}`);
    this.name = "EndpointError";
  }
}

export function parseEndpoint(endpoint: string, forBind: boolean): Endpoint {
  if (endpoint.startsWith("ipc://")) {
    const path = endpoint.slice("ipc://".length);
    if (path === "" || path === "*")
      throw new EndpointError(endpoint, "ipc needs an explicit path");
    if (path.startsWith("@"))
      throw new EndpointError(endpoint, "abstract-namespace ipc is not supported");
    if (Buffer.byteLength(path) > IPC_PATH_BYTES_MAX)
      throw new EndpointError(endpoint, `path longer than ${IPC_PATH_BYTES_MAX} bytes`);
    return { transport: "ipc", path };
  }
  if (!endpoint.startsWith("tcp://"))
    throw new EndpointError(endpoint, "only tcp:// and ipc:// are supported");
  const rest = endpoint.slice("tcp://".length);
  const colon = rest.lastIndexOf(":");
  if (colon <= 0) throw new EndpointError(endpoint, "expected host:port");
  let host = rest.slice(0, colon);
  const portText = rest.slice(colon + 1);
  if (host.startsWith("[")) {
    if (!host.endsWith("]")) throw new EndpointError(endpoint, "unterminated [IPv6] host");
    host = host.slice(1, -1);
  } else if (host.includes(":")) {
    throw new EndpointError(endpoint, "IPv6 hosts must be written in brackets: tcp://[::1]:5557");
  }
  if (host === "") throw new EndpointError(endpoint, "empty host");
  if (host.includes(";"))
    throw new EndpointError(endpoint, "source-address endpoints are not supported");
  let port: number;
  if (portText === "*") {
    port = 0;
  } else if (/^[0-9]{1,5}$/.test(portText)) {
    port = Number(portText);
    if (port > 65_535) throw new EndpointError(endpoint, "port out of range");
  } else {
    throw new EndpointError(endpoint, "port must be a number or *");
  }
  if (forBind) {
    if (host === "*") host = "0.0.0.0";
  } else {
    if (host === "*") throw new EndpointError(endpoint, "cannot connect to a wildcard host");
    if (port === 0) throw new EndpointError(endpoint, "cannot connect to port 0");
  }
  return { transport: "tcp", host, port };
}

export function formatTcp(host: string, port: number): string {
  return host.includes(":") ? `tcp://[${host}]:${port}` : `tcp://${host}:${port}`;
}
