/**
 * Loading the configuration: defaults < TOML file < KVEDGE_* environment < flags.
 *
 * Every mistake is one line that names the setting and where the bad value came from
 * (the file, the variable or the flag), and suggests the closest valid key for an
 * unknown one. Nothing is half-applied: an error means no configuration.
 */
import { readFileSync } from "node:fs";
import { parse as parseToml, TomlError } from "smol-toml";
import {
  type Config,
  CONFIG_FLAG,
  envName,
  OTHER_ENV,
  SECTIONS,
  SETTINGS,
  type Setting,
  WORKERS_FLAG,
} from "./schema";
import { tomlKind, ValueProblem } from "./values";
import {
  type WorkerEntry,
  WorkerProblem,
  wildcardProblem,
  workersFromText,
  workersFromToml,
} from "./workers";

/** An invalid configuration: the process must not start. The message is one line. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

export interface ConfigSources {
  /** Flags as `parseFlags` (src/cli/args) returns them: values by flag name, `true` for booleans. */
  readonly flags?: ReadonlyMap<string, readonly string[] | true>;
  /** The environment (process.env by default). */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Reads the config file; a synchronous file read by default. */
  readonly readFile?: (path: string) => string;
}

export interface LoadedConfig {
  readonly config: Config;
  /** The file read, if any. */
  readonly file: string | null;
  /** Where each value came from: "default", the file path, `KVEDGE_...`, or `--flag`. Keyed by setting key and "workers". */
  readonly origins: ReadonlyMap<string, string>;
  /** Findings that do not stop the start, one line each (e.g. an unknown KVEDGE_* variable). */
  readonly warnings: readonly string[];
}

/** Flag specs for every setting, to merge into a command's flags (shape of src/cli/args FlagSpecs). */
export function configFlagSpecs(): Record<
  string,
  { kind: "string" | "boolean"; multiple?: boolean }
> {
  const specs: Record<string, { kind: "string" | "boolean"; multiple?: boolean }> = {
    [CONFIG_FLAG]: { kind: "string" },
    [WORKERS_FLAG]: { kind: "string", multiple: true },
  };
  for (const s of SETTINGS) {
    if (isBoolean(s)) {
      specs[s.flag] = { kind: "boolean" };
      specs[`no-${s.flag}`] = { kind: "boolean" };
    } else {
      specs[s.flag] = { kind: "string" };
    }
  }
  return specs;
}

export function loadConfig(sources: ConfigSources = {}): LoadedConfig {
  const flags = sources.flags ?? new Map<string, readonly string[] | true>();
  const env = sources.env ?? process.env;
  const values = new Map<string, unknown>();
  const origins = new Map<string, string>();
  for (const s of SETTINGS) {
    values.set(s.key, s.default);
    origins.set(s.key, "default");
  }
  let workers: readonly WorkerEntry[] = [];
  origins.set("workers", "default");

  const file = lastFlag(flags, CONFIG_FLAG) ?? nonEmpty(env.KVEDGE_CONFIG) ?? null;
  if (file !== null) {
    const fromFile = readConfigFile(
      file,
      sources.readFile ?? ((path) => readFileSync(path, "utf8")),
    );
    for (const [key, value] of fromFile.values) {
      values.set(key, value);
      origins.set(key, file);
    }
    if (fromFile.workers !== null) {
      workers = fromFile.workers;
      origins.set("workers", file);
    }
  }

  const warnings: string[] = [];
  for (const s of SETTINGS) {
    const name = envName(s.flag);
    const text = nonEmpty(env[name]);
    if (text === undefined) continue;
    values.set(s.key, fromText(s, text, `${name} (${s.key})`));
    origins.set(s.key, name);
  }
  const envWorkers = nonEmpty(env[envName(WORKERS_FLAG)]);
  if (envWorkers !== undefined) {
    workers = workersOrFail(() => workersFromText(envWorkers, envName(WORKERS_FLAG)));
    origins.set("workers", envName(WORKERS_FLAG));
  }
  warnings.push(...unknownEnv(env));

  for (const s of SETTINGS) {
    if (isBoolean(s)) {
      const on = flags.get(s.flag) === true;
      const off = flags.get(`no-${s.flag}`) === true;
      if (on && off) throw new ConfigError(`--${s.flag} and --no-${s.flag} contradict each other`);
      if (on || off) {
        values.set(s.key, on);
        origins.set(s.key, on ? `--${s.flag}` : `--no-${s.flag}`);
      }
      continue;
    }
    const text = lastFlag(flags, s.flag);
    if (text === undefined) continue;
    values.set(s.key, fromText(s, text, `--${s.flag} (${s.key})`));
    origins.set(s.key, `--${s.flag}`);
  }
  const flagWorkers = flags.get(WORKERS_FLAG);
  if (Array.isArray(flagWorkers)) {
    workers = workersOrFail(() => workersFromText(flagWorkers.join(","), `--${WORKERS_FLAG}`));
    origins.set("workers", `--${WORKERS_FLAG}`);
  }

  const config = assemble(values, workers);
  checkTogether(config, origins);
  return { config, file, origins, warnings: [...warnings, ...clusterWarnings(config, origins)] };
}

/** Parses TOML text as a config file would be (for tests and --print-config round trips). */
export function parseConfigText(
  text: string,
  name: string,
): { values: Map<string, unknown>; workers: WorkerEntry[] | null } {
  let document: Record<string, unknown>;
  try {
    document = parseToml(text, {
      integersAsBigInt: "asNeeded",
      unsafeKeyBehaviour: "throw",
    }) as Record<string, unknown>;
  } catch (error) {
    if (error instanceof TomlError) {
      const reason = error.message.split("\n")[0]!.replace(/^Invalid TOML document: /, "");
      throw new ConfigError(
        `config file ${name}: line ${error.line}, column ${error.column}: ${reason}`,
      );
    }
    throw error;
  }
  const values = new Map<string, unknown>();
  let workers: WorkerEntry[] | null = null;
  const byKey = new Map(SETTINGS.map((s) => [s.key, s]));
  for (const [section, body] of Object.entries(document)) {
    if (section === "workers") {
      workers = workersOrFail(() => workersFromToml(body, suggestAmong), name);
      continue;
    }
    if (!SECTIONS.includes(section))
      throw new ConfigError(`config file ${name}: unknown key ${section}${suggestKey(section)}`);
    if (body === null || typeof body !== "object" || Array.isArray(body)) {
      throw new ConfigError(
        `config file ${name}: ${section} must be a table ([${section}]), got ${tomlKind(body)}`,
      );
    }
    for (const [field, value] of Object.entries(body)) {
      const key = `${section}.${field}`;
      const s = byKey.get(key);
      if (s === undefined)
        throw new ConfigError(`config file ${name}: unknown key ${key}${suggestKey(key)}`);
      try {
        values.set(key, s.type.fromToml(value));
      } catch (error) {
        if (error instanceof ValueProblem)
          throw new ConfigError(`config file ${name}: ${key} ${error.message}`);
        throw error;
      }
    }
  }
  return { values, workers };
}

function readConfigFile(path: string, read: (path: string) => string) {
  let text: string;
  try {
    text = read(path);
  } catch (error) {
    const code = (error as { code?: string }).code;
    const reason =
      code === "ENOENT"
        ? "no such file"
        : code === "EACCES"
          ? "permission denied"
          : code === "EISDIR"
            ? "is a directory"
            : String(error);
    throw new ConfigError(`config file ${path}: cannot read it (${reason})`);
  }
  return parseConfigText(text, path);
}

function fromText(s: Setting, text: string, where: string): unknown {
  try {
    return s.type.fromText(text);
  } catch (error) {
    if (error instanceof ValueProblem) throw new ConfigError(`${where} ${error.message}`);
    throw error;
  }
}

function workersOrFail(read: () => WorkerEntry[], file?: string): WorkerEntry[] {
  try {
    return read();
  } catch (error) {
    if (!(error instanceof WorkerProblem)) throw error;
    const prefix = file === undefined ? "" : `config file ${file}: `;
    const key = error.key === null ? "" : `${error.key} `;
    throw new ConfigError(`${prefix}${error.where}: ${key}${error.message}`);
  }
}

function assemble(values: ReadonlyMap<string, unknown>, workers: readonly WorkerEntry[]): Config {
  const config: Record<string, Record<string, unknown> | readonly WorkerEntry[]> = {};
  for (const section of SECTIONS) config[section] = {};
  for (const [key, value] of values) {
    const [section, field] = key.split(".") as [string, string];
    (config[section] as Record<string, unknown>)[field] = value;
  }
  config.workers = workers;
  return config as unknown as Config;
}

/** Rules that involve two settings. */
function checkTogether(config: Config, origins: ReadonlyMap<string, string>): void {
  const from = (key: string) => {
    const origin = origins.get(key)!;
    return origin === "default" ? `${key} (default)` : `${key} (from ${origin})`;
  };
  const ingest = config.ingest;
  if (
    ingest.heartbeat_interval_ms > 0 &&
    ingest.heartbeat_timeout_ms <= ingest.heartbeat_interval_ms
  ) {
    throw new ConfigError(
      `${from("ingest.heartbeat_timeout_ms")} = ${ingest.heartbeat_timeout_ms} must exceed ` +
        `${from("ingest.heartbeat_interval_ms")} = ${ingest.heartbeat_interval_ms}`,
    );
  }
  if (ingest.reconnect_max_ms < ingest.reconnect_min_ms) {
    throw new ConfigError(
      `${from("ingest.reconnect_max_ms")} = ${ingest.reconnect_max_ms} is below ` +
        `${from("ingest.reconnect_min_ms")} = ${ingest.reconnect_min_ms}`,
    );
  }
  if ((config.runtime.index_threads ?? 0) > 0 && config.state.dir !== null) {
    throw new ConfigError(
      `${from("state.dir")} cannot be used with ` +
        `${from("runtime.index_threads")} = 1 (snapshots of the writer thread's index ` +
        "are not supported yet)",
    );
  }
  if (config.cluster.nats_url !== null) checkCluster(config, from);
  checkWildcards(config, from);
  checkControlPort(config, from);
  const writerThread = (config.runtime.index_threads ?? 0) > 0;
  const approximate = config.workers.find((worker) => worker.endpoint === null);
  if (writerThread && approximate !== undefined) {
    throw new ConfigError(
      `worker ${approximate.worker_id} has no endpoint (an approximate worker), which needs ` +
        `${from("runtime.index_threads")} = 0: predictions are written on the main thread`,
    );
  }
  const threaded = writerThread || (config.runtime.route_threads ?? 0) > 0;
  if (threaded && config.index.backend !== "crtc") {
    const key = writerThread ? "runtime.index_threads" : "runtime.route_threads";
    throw new ConfigError(
      `${from(key)} needs index.backend = crtc (the index threads share), ` +
        `not ${from("index.backend")} = ${config.index.backend}`,
    );
  }
}

/** With a NATS URL: the client's options come in pairs, and one way to authenticate. */
function checkCluster(config: Config, from: (key: string) => string): void {
  const c = config.cluster;
  const pair = (a: keyof Config["cluster"], b: keyof Config["cluster"]): void => {
    if ((c[a] === null) !== (c[b] === null)) {
      const [set, unset] = c[a] === null ? [b, a] : [a, b];
      throw new ConfigError(`${from(`cluster.${set}`)} needs cluster.${unset} too`);
    }
  };
  pair("user", "password");
  pair("tls_cert_file", "tls_key_file");
  const ways = [c.token, c.user, c.credentials_file, c.nkey_seed_file].filter((v) => v !== null);
  if (ways.length > 1)
    throw new ConfigError(
      "set one of cluster.token, cluster.user and password, cluster.credentials_file, cluster.nkey_seed_file",
    );
}

/** Cluster settings that do nothing without a NATS URL. */
function clusterWarnings(config: Config, origins: ReadonlyMap<string, string>): string[] {
  const c = config.cluster;
  if (c.nats_url !== null) return [];
  return Object.keys(c)
    .filter((key) => key !== "nats_url" && origins.get(`cluster.${key}`) !== "default")
    .map((key) => `cluster.${key} is set but does nothing without cluster.nats_url`);
}

function checkWildcards(config: Config, from: (key: string) => string): void {
  if (config.ingest.allow_wildcard_endpoints) return;
  for (const entry of config.workers) {
    const problem = wildcardProblem(entry);
    if (problem === null) continue;
    throw new ConfigError(
      `worker ${entry.worker_id} dp_rank ${entry.dp_rank}: ${problem.message} ` +
        `(${from("ingest.allow_wildcard_endpoints")} is off)`,
    );
  }
}

/** With the proxy, the control listener needs a port of its own. */
function checkControlPort(config: Config, from: (key: string) => string): void {
  const { server } = config;
  if (!config.proxy.enabled || server.port === 0 || server.control_port !== server.port) return;
  throw new ConfigError(
    `${from("server.control_port")} = ${server.control_port} is ${from("server.port")}: ` +
      "with proxy.enabled the control listener needs a port of its own",
  );
}

function unknownEnv(env: Readonly<Record<string, string | undefined>>): string[] {
  const known = new Set([
    ...SETTINGS.map((s) => envName(s.flag)),
    envName(WORKERS_FLAG),
    envName(CONFIG_FLAG),
    ...OTHER_ENV,
  ]);
  const warnings: string[] = [];
  for (const name of Object.keys(env).sort()) {
    if (!name.startsWith("KVEDGE_") || known.has(name)) continue;
    warnings.push(`unknown environment variable ${name} ignored${suggestAmong(name, [...known])}`);
  }
  return warnings;
}

function lastFlag(
  flags: ReadonlyMap<string, readonly string[] | true>,
  name: string,
): string | undefined {
  const value = flags.get(name);
  return Array.isArray(value) ? value[value.length - 1] : undefined;
}

/** Empty environment values count as unset (as container tools pass them). */
function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value;
}

function isBoolean(s: Setting): boolean {
  return typeof s.default === "boolean";
}

/** " (did you mean X?)" for the closest valid setting key, or "". */
export function suggestKey(path: string): string {
  const name = path.split(".").pop()!;
  // The right name in the wrong section.
  const moved = SETTINGS.find((s) => s.key.endsWith(`.${name}`));
  if (moved !== undefined && moved.key !== path) return ` (did you mean ${moved.key}?)`;
  return suggestAmong(path, [...SETTINGS.map((s) => s.key), ...SECTIONS, "workers"]);
}

/** " (did you mean X?)" for the closest of `among` within a small edit distance, or "". */
export function suggestAmong(word: string, among: readonly string[]): string {
  let best = "";
  let bestDistance = Infinity;
  for (const candidate of among) {
    const distance = editDistance(word.toLowerCase(), candidate.toLowerCase());
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return bestDistance <= Math.max(2, Math.floor(word.length / 4)) ? ` (did you mean ${best}?)` : "";
}

/** Levenshtein distance, with an adjacent swap counted as one edit. */
function editDistance(a: string, b: string): number {
  const rows = a.length + 1;
  const cols = b.length + 1;
  const d = new Uint32Array(rows * cols);
  for (let i = 0; i < rows; i++) d[i * cols] = i;
  for (let j = 0; j < cols; j++) d[j] = j;
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let value = Math.min(
        d[(i - 1) * cols + j]! + 1,
        d[i * cols + j - 1]! + 1,
        d[(i - 1) * cols + j - 1]! + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        value = Math.min(value, d[(i - 2) * cols + j - 2]! + 1);
      d[i * cols + j] = value;
    }
  }
  return d[rows * cols - 1]!;
}
