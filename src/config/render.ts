/**
 * The configuration as text: the resolved settings as a TOML file (for
 * `kvedge serve --print-config`), and the reference of all settings that
 * docs/configuration.md is generated from (`npm run docs:config`).
 */
import type { LoadedConfig } from "./load";
import { CONFIG_FLAG, envName, SECTIONS, SETTINGS, WORKERS_FLAG } from "./schema";
import type { WorkerEntry } from "./workers";

/**
 * The resolved configuration as TOML that loads back to the same values. Each value
 * not at its default says where it came from; secrets are never printed.
 */
export function renderConfig(loaded: LoadedConfig): string {
  const lines = [
    "# kvedge configuration, resolved from: defaults < config file < KVEDGE_* environment < flags",
  ];
  if (loaded.file !== null) lines.push(`# config file: ${loaded.file}`);
  const config = loaded.config as unknown as Record<string, Record<string, unknown>>;
  for (const section of SECTIONS) {
    lines.push("", `[${section}]`);
    for (const s of SETTINGS.filter((setting) => setting.key.startsWith(`${section}.`))) {
      const name = s.key.slice(section.length + 1);
      const value = config[section]![name];
      const note = overridden(loaded, s.key);
      if (value === null) lines.push(`# ${name} is not set`);
      else if (s.secret) lines.push(`# ${name} is set (not shown)${note}`);
      else lines.push(`${name} = ${s.type.toToml(value)}${note}`);
    }
  }
  const note = overridden(loaded, "workers");
  if (loaded.config.workers.length === 0)
    lines.push("", "# no [[workers]]: engines can be added at run time");
  for (const worker of loaded.config.workers) lines.push("", ...renderWorker(worker, note));
  return `${lines.join("\n")}\n`;
}

/** "  # from X" for a value set by the environment or a flag (the header names the file). */
function overridden(loaded: LoadedConfig, key: string): string {
  const origin = loaded.origins.get(key) ?? "default";
  return origin === "default" || origin === loaded.file ? "" : `  # from ${origin}`;
}

function renderWorker(worker: WorkerEntry, note: string): string[] {
  const lines = [`[[workers]]${note}`];
  lines.push(`worker_id = "${worker.worker_id}"`, `dp_rank = ${worker.dp_rank}`);
  // No endpoint: an approximate worker (its cache predicted from kvedge's decisions).
  if (worker.endpoint !== null) lines.push(`endpoint = ${JSON.stringify(worker.endpoint)}`);
  if (worker.replay_endpoint !== null)
    lines.push(`replay_endpoint = ${JSON.stringify(worker.replay_endpoint)}`);
  if (worker.topic !== "") lines.push(`topic = ${JSON.stringify(worker.topic)}`);
  if (worker.http_endpoint != null)
    lines.push(`http_endpoint = ${JSON.stringify(worker.http_endpoint)}`);
  if (worker.capacity_blocks != null) lines.push(`capacity_blocks = ${worker.capacity_blocks}`);
  return lines;
}

/**
 * Help lines for every config flag (for `kvedge serve --help`): flag, placeholder,
 * meaning, environment variable and default.
 */
export function flagHelp(): string {
  const rows: [string, string][] = [
    [`--${CONFIG_FLAG} FILE`, `TOML config file [${envName(CONFIG_FLAG)}]`],
    [
      `--${WORKERS_FLAG} LIST`,
      `engines: ID[:DP]=ENDPOINT|none[;replay=ENDPOINT][;topic=T][;http=URL][;capacity=N],... (repeatable) [${envName(WORKERS_FLAG)}]`,
    ],
  ];
  for (const s of SETTINGS) {
    const flag =
      typeof s.default === "boolean" ? `--[no-]${s.flag}` : `--${s.flag} ${s.type.placeholder}`;
    const fallback = s.default === null ? "" : `, default ${s.type.toToml(s.default)}`;
    rows.push([flag, `${s.help} [${envName(s.flag)}${fallback}]`]);
  }
  const width = Math.max(...rows.map(([flag]) => flag.length));
  return rows.map(([flag, text]) => `  ${flag.padEnd(width)}  ${text}\n`).join("");
}

/** A Markdown table of every setting: key, flag, environment variable, type, default, meaning. */
export function settingsTable(): string {
  const rows = [
    "| Key | Flag | Environment | Type | Default | Meaning |",
    "|---|---|---|---|---|---|",
  ];
  const cell = (text: string) => text.replaceAll("|", "\\|");
  for (const s of SETTINGS) {
    const fallback = s.default === null ? "not set" : `\`${s.type.toToml(s.default)}\``;
    const flag =
      typeof s.default === "boolean" ? `\`--${s.flag}\`, \`--no-${s.flag}\`` : `\`--${s.flag}\``;
    rows.push(
      `| \`${s.key}\` | ${flag} | \`${envName(s.flag)}\` | ${cell(s.type.description)} | ${cell(fallback)} | ${cell(s.help)} |`,
    );
  }
  rows.push(
    `| \`[[workers]]\` | \`--${WORKERS_FLAG}\` | \`${envName(WORKERS_FLAG)}\` | list of engines | none | ` +
      'Engines to subscribe to: `worker_id`, `dp_rank` (0), `endpoint`, `replay_endpoint`, `topic` (""), `http_endpoint` (for --proxy). ' +
      "Compact form: `ID[:DP]=ENDPOINT[;replay=ENDPOINT][;topic=T][;http=URL],...` |",
  );
  rows.push(
    `| | \`--${CONFIG_FLAG}\` | \`${envName(CONFIG_FLAG)}\` | path | none | The TOML config file to read. |`,
  );
  return `${rows.join("\n")}\n`;
}

/** docs/configuration.md: how settings are read, then the table of every setting. */
export function configurationDoc(): string {
  return `${CONFIGURATION_INTRO}\n${settingsTable()}\n${CONFIGURATION_OUTRO}`;
}

const CONFIGURATION_INTRO = `# Configuration

<!-- Generated from src/config/schema.ts by \`npm run docs:config\`; edit the schema, not this file. -->

\`kvedge serve\` reads defaults, then a TOML file (\`--config FILE\` or \`KVEDGE_CONFIG\`; a
commented example is [\`examples/kvedge.toml\`](../examples/kvedge.toml)), then \`KVEDGE_*\`
environment variables, then flags; each later source wins, and a \`[[workers]]\` list
from a later source replaces the earlier one. Every setting's environment variable is
\`KVEDGE_\` plus its flag name in upper case with \`-\` as \`_\`. An invalid value stops the
start with one line naming the key and where the value came from; an unknown key in
the file is refused with the closest valid one suggested. \`kvedge serve
--print-config\` prints the resolved settings and the origin of each.
`;

const CONFIGURATION_OUTRO = `Workers added at run time through \`POST /v1/workers\` are not written back to the file.

Other environment variables, read outside the settings: \`KVEDGE_NATIVE=0\` forces the
pure-TypeScript fallbacks of the native library, \`KVEDGE_NATIVE_AVX2=0\` keeps the native
token reader off its AVX2 path, and \`KVEDGE_VERIFY=1\` checks the index's invariants after
every change (slow; see [developing.md](developing.md)).
`;
