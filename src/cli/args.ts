/**
 * Command-line flags. A small parser of our own (instead of node:util parseArgs)
 * because kvedge takes numbers as positionals — `kvedge hash -1` must say "-1 is not
 * a token", not "unknown option -1" — and every error must fit on one line.
 */

/** A mistake in how a command was called: one line on stderr, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

export type FlagKind = "string" | "boolean";

export interface FlagSpec {
  readonly kind: FlagKind;
  readonly short?: string;
  /** May be given more than once; values collect in order. */
  readonly multiple?: boolean;
}

export type FlagSpecs = Readonly<Record<string, FlagSpec>>;

export interface Parsed {
  readonly flags: Map<string, string[] | true>;
  readonly positionals: string[];
}

const NUMBER_LIKE = /^-\d/;

export function parseFlags(argv: readonly string[], specs: FlagSpecs): Parsed {
  const flags = new Map<string, string[] | true>();
  const positionals: string[] = [];
  const byShort = new Map<string, string>();
  for (const [name, spec] of Object.entries(specs)) if (spec.short) byShort.set(spec.short, name);

  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!arg.startsWith("-") || arg === "-" || NUMBER_LIKE.test(arg)) {
      positionals.push(arg);
      continue;
    }
    let name: string;
    let inline: string | undefined;
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
      inline = eq < 0 ? undefined : arg.slice(eq + 1);
    } else {
      const long = byShort.get(arg.slice(1));
      if (long === undefined) throw new UsageError(`unknown option ${arg}`);
      name = long;
    }
    const spec = specs[name];
    if (spec === undefined) throw new UsageError(`unknown option --${name}`);
    if (spec.kind === "boolean") {
      if (inline !== undefined) throw new UsageError(`option --${name} takes no value`);
      flags.set(name, true);
      continue;
    }
    let value = inline;
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new UsageError(`option --${name} needs a value`);
      value = argv[++i]!;
    }
    const previous = flags.get(name);
    if (Array.isArray(previous)) {
      if (!spec.multiple) throw new UsageError(`option --${name} given more than once`);
      previous.push(value);
    } else {
      flags.set(name, [value]);
    }
  }
  return { flags, positionals };
}

export function flagBool(parsed: Parsed, name: string): boolean {
  return parsed.flags.get(name) === true;
}

export function flagString(parsed: Parsed, name: string): string | undefined {
  const value = parsed.flags.get(name);
  return Array.isArray(value) ? value[value.length - 1] : undefined;
}

export function flagStrings(parsed: Parsed, name: string): string[] {
  const value = parsed.flags.get(name);
  return Array.isArray(value) ? value : [];
}

/** An integer flag within [min, max]; `fallback` when absent. */
export function flagInt(
  parsed: Parsed,
  name: string,
  fallback: number,
  min: number,
  max: number,
): number {
  const text = flagString(parsed, name);
  if (text === undefined) return fallback;
  return parseIntIn(text, `--${name}`, min, max);
}

/** A finite number flag within [min, max]; `fallback` when absent. */
export function flagNumber(
  parsed: Parsed,
  name: string,
  fallback: number,
  min: number,
  max: number,
): number {
  const text = flagString(parsed, name);
  if (text === undefined) return fallback;
  const value = text.trim() === "" ? Number.NaN : Number(text);
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new UsageError(`--${name} must be a number in [${min}, ${max}], got '${text}'`);
  }
  return value;
}

export function parseIntIn(text: string, what: string, min: number, max: number): number {
  const value = /^-?\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new UsageError(`${what} must be an integer in [${min}, ${max}], got '${text}'`);
  }
  return value;
}
