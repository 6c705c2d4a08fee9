/**
 * Structured logging: JSON lines (one object per line) for machines, or a compact
 * human form on a TTY. Every module takes a `Logger` and never writes to the console
 * itself, so tests can pass `silentLogger` or capture lines with `memoryLogger`.
 */

export type Level = "debug" | "info" | "warn" | "error";
export type Fields = Record<string, unknown>;

const LEVEL_RANK: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(message: string, fields?: Fields): void;
  info(message: string, fields?: Fields): void;
  warn(message: string, fields?: Fields): void;
  error(message: string, fields?: Fields): void;
  /** A logger that adds `fields` to every line (e.g. the component or the worker). */
  child(fields: Fields): Logger;
}

export type LogFormat = "json" | "pretty";

export interface LoggerOptions {
  readonly level?: Level;
  readonly format?: LogFormat;
  /** Where lines go; stderr by default. */
  readonly write?: (line: string) => void;
  readonly now?: () => Date;
}

// bigint is not JSON; 64-bit ids and hashes are logged as decimal strings.
const replacer = (_key: string, value: unknown): unknown =>
  typeof value === "bigint" ? value.toString() : value;

function render(
  format: LogFormat,
  time: Date,
  level: Level,
  message: string,
  fields: Fields,
): string {
  if (format === "json") {
    return `${JSON.stringify({ time: time.toISOString(), level, msg: message, ...fields }, replacer)}\n`;
  }
  let line = `${time.toISOString().slice(11, 23)} ${level.toUpperCase().padEnd(5)} ${message}`;
  for (const [key, value] of Object.entries(fields)) {
    const text = typeof value === "string" ? value : JSON.stringify(value, replacer);
    line += ` ${key}=${text}`;
  }
  return `${line}\n`;
}

export function createLogger(options: LoggerOptions = {}): Logger {
  const threshold = LEVEL_RANK[options.level ?? "info"];
  const format = options.format ?? (process.stderr.isTTY ? "pretty" : "json");
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const now = options.now ?? (() => new Date());
  const make = (base: Fields): Logger => {
    const emit = (level: Level, message: string, fields?: Fields): void => {
      if (LEVEL_RANK[level] < threshold) return;
      write(
        render(format, now(), level, message, fields === undefined ? base : { ...base, ...fields }),
      );
    };
    return {
      debug: (message, fields) => emit("debug", message, fields),
      info: (message, fields) => emit("info", message, fields),
      warn: (message, fields) => emit("warn", message, fields),
      error: (message, fields) => emit("error", message, fields),
      child: (fields) => make({ ...base, ...fields }),
    };
  };
  return make({});
}

/** Discards everything. */
export const silentLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
  child: () => silentLogger,
};

export interface LogRecord {
  readonly level: Level;
  readonly message: string;
  readonly fields: Fields;
}

/** Keeps records in memory, for tests that assert what was logged. */
export function memoryLogger(records: LogRecord[] = []): Logger & { records: LogRecord[] } {
  const make = (base: Fields): Logger => ({
    debug: (message, fields) =>
      records.push({ level: "debug", message, fields: { ...base, ...fields } }),
    info: (message, fields) =>
      records.push({ level: "info", message, fields: { ...base, ...fields } }),
    warn: (message, fields) =>
      records.push({ level: "warn", message, fields: { ...base, ...fields } }),
    error: (message, fields) =>
      records.push({ level: "error", message, fields: { ...base, ...fields } }),
    child: (fields) => make({ ...base, ...fields }),
  });
  return Object.assign(make({}), { records });
}

/**
 * Logs the first occurrence of each kind of problem with a sample, then only counts,
 * so a peer sending garbage cannot flood the log. `counts` feeds the metrics.
 */
export class OnceLog {
  readonly counts = new Map<string, number>();

  constructor(private readonly log: Logger) {}

  report(kind: string, message: string, sample?: Fields): void {
    const seen = this.counts.get(kind) ?? 0;
    this.counts.set(kind, seen + 1);
    if (seen === 0)
      this.log.warn(message, {
        kind,
        ...sample,
        note: "later occurrences of this kind are only counted",
      });
  }
}
