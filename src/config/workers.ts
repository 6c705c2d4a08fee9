/**
 * Engine workers in the configuration: `[[workers]]` tables in the file, or the
 * compact `--workers` / KVEDGE_WORKERS form
 *
 *   ID[:DP]=ENDPOINT[;replay=ENDPOINT][;topic=TOPIC][;http=URL],...
 *
 * e.g. `1=tcp://10.0.0.5:5557;replay=tcp://10.0.0.5:5558,2:1=ipc:///run/engine2.sock`.
 * Endpoints are where kvedge connects: `tcp://HOST:PORT` (HOST a name, an IPv4
 * address or a bracketed IPv6 address) or `ipc:///ABSOLUTE/PATH`. An engine endpoint
 * may instead be `tcp://*:PORT`: kvedge binds it and the engine connects (vLLM's
 * "connect" mode); a replay endpoint is always connected to. `http_endpoint` is the
 * engine's OpenAI-compatible server (`http://HOST:PORT`), where `serve --proxy` forwards.
 */
import { parseU64 } from "../util/u64";
import { shown, tomlKind, ValueProblem } from "./values";

export interface WorkerEntry {
  readonly worker_id: bigint;
  readonly dp_rank: number;
  /** The engine's PUB socket. */
  readonly endpoint: string;
  /** The engine's ROUTER socket for replaying missed events, if it has one. */
  readonly replay_endpoint: string | null;
  /** ZMQ subscription prefix; "" = everything. */
  readonly topic: string;
  /** The engine's OpenAI-compatible HTTP server (the proxy forwards there), if given. */
  readonly http_endpoint?: string | null;
}

export const WORKER_KEYS = [
  "worker_id",
  "dp_rank",
  "endpoint",
  "replay_endpoint",
  "topic",
  "http_endpoint",
] as const;
/** A bound on entries from outside input (the config file or one flag). */
export const WORKER_ENTRIES_MAX = 65_535;
const DP_RANK_MAX = 0xffff_ffff;
/** sun_path holds 108 bytes including the terminating NUL. */
const IPC_PATH_BYTES_MAX = 107;
const HOST_NAME =
  /^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$/;
const IPV6 = /^[0-9A-Fa-f:.]+$/;

/**
 * Checks an endpoint; throws a ValueProblem that completes "<key> ...". With
 * `bindable`, `tcp://*:PORT` (bind on every interface) is accepted too.
 */
export function checkEndpoint(endpoint: string, bindable = false): string {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(endpoint)?.[1];
  if (bindable && /^tcp:\/\/\*:[0-9]+$/.test(endpoint)) {
    const port = Number(endpoint.slice("tcp://*:".length));
    if (!(port >= 1 && port <= 65_535))
      throw new ValueProblem(`has a bad port ${port} in ${shown(endpoint)} (1-65535)`);
    return endpoint;
  }
  if (scheme === "tcp") {
    const match = /^tcp:\/\/(\[[^\]]*\]|[^:/]*):([0-9]+)$/.exec(endpoint);
    if (match === null) throw new ValueProblem(`must be tcp://HOST:PORT, got ${shown(endpoint)}`);
    const host = match[1]!;
    const port = Number(match[2]);
    const hostOk = host.startsWith("[")
      ? IPV6.test(host.slice(1, -1)) && host.includes(":")
      : HOST_NAME.test(host);
    if (!hostOk) throw new ValueProblem(`has a bad host ${shown(host)} in ${shown(endpoint)}`);
    if (!(port >= 1 && port <= 65_535))
      throw new ValueProblem(`has a bad port ${match[2]} in ${shown(endpoint)} (1-65535)`);
    return endpoint;
  }
  if (scheme === "ipc") {
    const path = endpoint.slice("ipc://".length);
    if (!path.startsWith("/"))
      throw new ValueProblem(`must be ipc:///ABSOLUTE/PATH, got ${shown(endpoint)}`);
    if (path.length < 2 || path.endsWith("/"))
      throw new ValueProblem(`must name a socket file, got ${shown(endpoint)}`);
    if (new TextEncoder().encode(path).length > IPC_PATH_BYTES_MAX) {
      throw new ValueProblem(
        `has a socket path longer than ${IPC_PATH_BYTES_MAX} bytes: ${shown(endpoint)}`,
      );
    }
    return endpoint;
  }
  const what = scheme === undefined ? "no scheme" : `scheme '${scheme}'`;
  throw new ValueProblem(
    `has ${what} in ${shown(endpoint)}: only tcp://HOST:PORT and ipc:///PATH are valid`,
  );
}

/**
 * Whether an endpoint names a wildcard address: `tcp://*:PORT` (kvedge binds every
 * interface), `tcp://0.0.0.0:PORT`, `tcp://[::]:PORT` and their spellings. Refused
 * unless `ingest.allow_wildcard_endpoints` is set: a worker added over the API must not
 * open a port on every interface, whatever `server.host` says.
 */
export function isWildcardEndpoint(endpoint: string): boolean {
  const match = /^tcp:\/\/(\[[^\]]*\]|[^:/]*):/i.exec(endpoint);
  if (match === null) return false;
  const host = match[1]!.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  return host === "*" || /^(?:[0:]+|(?:[0:]*:ffff:)?0+\.0+\.0+\.0+)$/.test(host);
}

/** Why an entry is refused while wildcard endpoints are not allowed (the field at fault), or null. */
export function wildcardProblem(entry: WorkerEntry): { field: string; message: string } | null {
  for (const [field, endpoint] of [
    ["endpoint", entry.endpoint],
    ["replay_endpoint", entry.replay_endpoint],
  ] as const) {
    if (endpoint !== null && isWildcardEndpoint(endpoint)) {
      const message =
        `${field} ${shown(endpoint)} names a wildcard address (every interface); ` +
        "set ingest.allow_wildcard_endpoints to accept it";
      return { field, message };
    }
  }
  return null;
}

/** Checks an engine's HTTP base URL: http(s)://HOST:PORT with no path; returns it without a trailing slash. */
export function checkHttpEndpoint(value: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new ValueProblem(`must be http://HOST:PORT, got ${shown(value)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new ValueProblem(`must be http:// or https://, got ${shown(value)}`);
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "" || url.username !== "") {
    throw new ValueProblem(`must be a base URL without path, query or user, got ${shown(value)}`);
  }
  return value.endsWith("/") ? value.slice(0, -1) : value;
}

function workerId(value: unknown): bigint {
  const id = parseU64(value);
  if (id === null) {
    throw new ValueProblem(
      `must be a u64: a decimal string, or an integer below 2^53, got ${shown(value)}`,
    );
  }
  return id;
}

function dpRank(value: unknown): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > DP_RANK_MAX) {
    throw new ValueProblem(
      `must be an integer in [0, ${DP_RANK_MAX}], got ${typeof value === "number" ? value : tomlKind(value)}`,
    );
  }
  return value;
}

/** A problem with one entry: `where` names it ("[[workers]] entry 2", "--workers entry 1"). */
export class WorkerProblem extends Error {
  override readonly name = "WorkerProblem";
  constructor(
    readonly where: string,
    readonly key: string | null,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Reads `[[workers]]` tables. `suggest` names the closest valid key for an unknown one.
 */
export function workersFromToml(
  value: unknown,
  suggest: (key: string, among: readonly string[]) => string,
): WorkerEntry[] {
  if (!Array.isArray(value))
    throw new WorkerProblem(
      "workers",
      null,
      `must be an array of tables ([[workers]]), got ${tomlKind(value)}`,
    );
  if (value.length > WORKER_ENTRIES_MAX)
    throw new WorkerProblem("workers", null, `has more than ${WORKER_ENTRIES_MAX} entries`);
  const entries = value.map((table, index) => {
    const where = `[[workers]] entry ${index + 1}`;
    if (table === null || typeof table !== "object" || Array.isArray(table)) {
      throw new WorkerProblem(where, null, `must be a table, got ${tomlKind(table)}`);
    }
    const fields = table as Record<string, unknown>;
    for (const key of Object.keys(fields)) {
      if (!(WORKER_KEYS as readonly string[]).includes(key)) {
        throw new WorkerProblem(where, key, `is not a worker setting${suggest(key, WORKER_KEYS)}`);
      }
    }
    const field = <T>(key: string, read: (value: unknown) => T): T => {
      try {
        return read(fields[key]);
      } catch (error) {
        if (error instanceof ValueProblem) throw new WorkerProblem(where, key, error.message);
        throw error;
      }
    };
    const text = (value: unknown): string => {
      if (typeof value !== "string")
        throw new ValueProblem(`must be a string, got ${tomlKind(value)}`);
      return value;
    };
    if (fields.worker_id === undefined) throw new WorkerProblem(where, "worker_id", "is required");
    if (fields.endpoint === undefined) throw new WorkerProblem(where, "endpoint", "is required");
    return {
      worker_id: field("worker_id", workerId),
      dp_rank: fields.dp_rank === undefined ? 0 : field("dp_rank", dpRank),
      endpoint: field("endpoint", (v) => checkEndpoint(text(v), true)),
      replay_endpoint:
        fields.replay_endpoint === undefined
          ? null
          : field("replay_endpoint", (v) => checkEndpoint(text(v))),
      topic: fields.topic === undefined ? "" : field("topic", text),
      ...(fields.http_endpoint === undefined
        ? {}
        : { http_endpoint: field("http_endpoint", (v) => checkHttpEndpoint(text(v))) }),
    } satisfies WorkerEntry;
  });
  checkDuplicates(entries, (index) => `[[workers]] entry ${index + 1}`);
  return entries;
}

/** Parses the compact form; `origin` names the source ("--workers", "KVEDGE_WORKERS"). */
export function workersFromText(value: string, origin: string): WorkerEntry[] {
  const items = value.split(",").map((item) => item.trim());
  if (items.length > WORKER_ENTRIES_MAX)
    throw new WorkerProblem(origin, null, `has more than ${WORKER_ENTRIES_MAX} entries`);
  if (value.trim() === "") return [];
  const entries = items.map((item, index) => {
    const where = `${origin} entry ${index + 1} (${shown(item)})`;
    const wrap = <T>(key: string | null, read: () => T): T => {
      try {
        return read();
      } catch (error) {
        if (error instanceof ValueProblem) throw new WorkerProblem(where, key, error.message);
        throw error;
      }
    };
    const equals = item.indexOf("=");
    if (equals < 0)
      throw new WorkerProblem(
        where,
        null,
        "must be ID[:DP]=ENDPOINT[;replay=ENDPOINT][;topic=TOPIC][;http=URL]",
      );
    const [idText, rankText, ...extra] = item.slice(0, equals).split(":");
    if (extra.length > 0) throw new WorkerProblem(where, null, "has more than one ':' before '='");
    const [endpoint, ...options] = item.slice(equals + 1).split(";");
    let replay: string | null = null;
    let topic = "";
    let http: string | null = null;
    for (const option of options) {
      const at = option.indexOf("=");
      const name = at < 0 ? option : option.slice(0, at);
      const optionValue = at < 0 ? "" : option.slice(at + 1);
      if (name === "replay") replay = wrap("replay_endpoint", () => checkEndpoint(optionValue));
      else if (name === "topic") topic = optionValue;
      else if (name === "http") http = wrap("http_endpoint", () => checkHttpEndpoint(optionValue));
      else
        throw new WorkerProblem(
          where,
          null,
          `has an unknown option ${shown(name)} (valid: replay=, topic=, http=)`,
        );
    }
    return {
      worker_id: wrap("worker_id", () => workerId(idText)),
      dp_rank:
        rankText === undefined
          ? 0
          : wrap("dp_rank", () => dpRank(/^\d+$/.test(rankText) ? Number(rankText) : rankText)),
      endpoint: wrap("endpoint", () => checkEndpoint(endpoint!, true)),
      replay_endpoint: replay,
      topic,
      ...(http === null ? {} : { http_endpoint: http }),
    } satisfies WorkerEntry;
  });
  checkDuplicates(entries, (index) => `${origin} entry ${index + 1}`);
  return entries;
}

function checkDuplicates(entries: readonly WorkerEntry[], name: (index: number) => string): void {
  const seen = new Map<string, number>();
  entries.forEach((entry, index) => {
    const key = `${entry.worker_id}:${entry.dp_rank}`;
    const first = seen.get(key);
    if (first !== undefined) {
      throw new WorkerProblem(
        name(index),
        null,
        `repeats worker ${entry.worker_id} dp_rank ${entry.dp_rank} (first in ${name(first)})`,
      );
    }
    seen.set(key, index);
  });
}
