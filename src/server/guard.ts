/**
 * What a web page in someone's browser must not be able to do to kvedge: browsers send
 * "simple" cross-origin requests (a form, or fetch with a text/plain body) without asking
 * first, and a DNS-rebound name reaches a loopback server as if it were same-origin. So:
 *
 * - a request body must say it is JSON or MessagePack (415 otherwise, ./http.ts
 *   checkBodyType): neither type can be sent cross-origin without a CORS preflight,
 *   which kvedge never answers;
 * - a state-changing request (not GET/HEAD, and the WebSocket upgrade, which CORS does
 *   not cover) whose `Origin` is not the server's own, or whose `Sec-Fetch-Site` says
 *   another site sent it, is refused (403);
 * - a server listening on loopback answers only Host names that are loopback (403
 *   otherwise): a rebound name is not.
 *
 * Clients that are not browsers send no Origin or Sec-Fetch-Site and are unaffected.
 * A Host header that is not a host (and port) at all is refused first, with 400.
 */
import { KvedgeError } from "../domain/errors";

export class RequestGuard {
  private readonly loopback: boolean;

  constructor(listenHost: string) {
    this.loopback = isLoopbackName(listenHost);
  }

  /** 403 for a request a browser could have been made to send from elsewhere (400: a malformed Host). */
  check(request: Request, changesState: boolean): void {
    const headers = request.headers;
    const host = headers.get("host") ?? "";
    if (host !== "" && !HOST_HEADER.test(host)) {
      throw new KvedgeError("bad_request", "the Host header is not a host name or address");
    }
    if (this.loopback && !isLoopbackName(hostName(host))) {
      throw new KvedgeError(
        "forbidden",
        `Host ${JSON.stringify(host)} is not a loopback name; this server listens on loopback only`,
      );
    }
    if (!changesState) return;
    const site = headers.get("sec-fetch-site");
    if (site !== null && site !== "same-origin" && site !== "none") {
      throw new KvedgeError(
        "forbidden",
        `cross-origin requests are refused (Sec-Fetch-Site: ${site})`,
      );
    }
    const origin = headers.get("origin");
    if (origin !== null && originHost(origin) !== host.toLowerCase()) {
      throw new KvedgeError(
        "forbidden",
        `cross-origin requests are refused (Origin ${origin} is not this server)`,
      );
    }
  }
}

/**
 * A Host header: a name or IPv4 address (RFC 3986 reg-name characters), or an IPv6
 * address in brackets, then an optional port. Anything else ("[", "a:1:2") is malformed.
 */
const HOST_HEADER = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]+)(?::[0-9]{0,5})?$/;

/** The path of a request, or 400 when its URL (built from the Host header) does not parse. */
export function requestPath(request: Request): string {
  try {
    return new URL(request.url).pathname;
  } catch {
    throw new KvedgeError("bad_request", "the request's Host header or target is malformed");
  }
}

/** "host:port" of an Origin header, or "" when it names none ("null", garbage). */
function originHost(origin: string): string {
  try {
    return new URL(origin).host.toLowerCase();
  } catch {
    return "";
  }
}

/** The name part of a Host header: "[::1]:8080" -> "::1", "localhost:80" -> "localhost". */
function hostName(host: string): string {
  if (host.startsWith("[")) return host.slice(1, host.indexOf("]") >>> 0);
  const colon = host.indexOf(":");
  return colon < 0 ? host : host.slice(0, colon);
}

function isLoopbackName(name: string): boolean {
  const lower = name.toLowerCase();
  return (
    lower === "localhost" ||
    lower.endsWith(".localhost") ||
    lower === "::1" ||
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(lower)
  );
}
