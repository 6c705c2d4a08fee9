/**
 * Value types of settings: how a value is read from TOML (typed) and from text
 * (environment variables and flags), how it is written back as TOML, and what the
 * docs call it. A problem is thrown as a `ValueProblem` whose message completes the
 * sentence "<key> <message>", so the loader can name the key and where it came from.
 */
import type { LoraAdapter } from "../hash";

export class ValueProblem extends Error {
  override readonly name = "ValueProblem";
}

export interface ValueType<T> {
  /** For docs and errors: "an integer in [0, 65535]", "one of auto|json|pretty". */
  readonly description: string;
  /** The value's placeholder in flag help: "N", "auto|json|pretty" ("" for booleans). */
  readonly placeholder: string;
  fromToml(value: unknown): T;
  fromText(text: string): T;
  /** The value as a TOML literal. */
  toToml(value: T): string;
}

/** A short, one-line rendering of a value for error messages. */
export function shown(value: unknown): string {
  let text: string;
  if (typeof value === "string") text = JSON.stringify(value);
  else if (typeof value === "bigint") text = value.toString();
  else if (value !== null && typeof value === "object")
    text = Array.isArray(value) ? "an array" : "a table";
  else text = String(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

/** What a TOML value is, for "expected X, got Y" messages. */
export function tomlKind(value: unknown): string {
  if (typeof value === "string") return "a string";
  if (typeof value === "boolean") return "a boolean";
  if (typeof value === "number" || typeof value === "bigint")
    return Number.isInteger(Number(value)) ? "an integer" : "a float";
  if (Array.isArray(value)) return "an array";
  if (value !== null && typeof value === "object")
    return value.constructor === Object || Object.getPrototypeOf(value) === null
      ? "a table"
      : "a date/time";
  return typeof value;
}

const INTEGER_TEXT = /^-?[0-9]+(_[0-9]+)*$/;
const NUMBER_TEXT = /^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$/;

export function integer(min: number, max: number): ValueType<number> {
  const description = `an integer in [${min}, ${max}]`;
  const check = (value: number, raw: unknown): number => {
    if (!Number.isSafeInteger(value) || value < min || value > max) {
      throw new ValueProblem(`must be ${description}, got ${shown(raw)}`);
    }
    return value;
  };
  return {
    description,
    placeholder: "N",
    fromToml(value) {
      if (typeof value === "bigint") throw new ValueProblem(`must be ${description}, got ${value}`);
      if (typeof value !== "number")
        throw new ValueProblem(`must be ${description}, got ${tomlKind(value)}`);
      return check(value, value);
    },
    fromText(text) {
      return check(
        INTEGER_TEXT.test(text.trim()) ? Number(text.trim().replaceAll("_", "")) : Number.NaN,
        text,
      );
    },
    toToml: (value) => String(value),
  };
}

export function decimal(min: number, max: number): ValueType<number> {
  const description = `a number in [${min}, ${max}]`;
  const check = (value: number, raw: unknown): number => {
    if (!Number.isFinite(value) || value < min || value > max)
      throw new ValueProblem(`must be ${description}, got ${shown(raw)}`);
    return value;
  };
  return {
    description,
    placeholder: "X",
    fromToml(value) {
      if (typeof value !== "number")
        throw new ValueProblem(`must be ${description}, got ${tomlKind(value)}`);
      return check(value, value);
    },
    fromText: (text) =>
      check(NUMBER_TEXT.test(text.trim()) ? Number(text.trim()) : Number.NaN, text),
    toToml: (value) =>
      Number.isInteger(value) && Math.abs(value) < 1e15 ? `${value}.0` : String(value),
  };
}

const TRUE_TEXT = new Set(["true", "1", "yes", "on"]);
const FALSE_TEXT = new Set(["false", "0", "no", "off"]);

export const boolean: ValueType<boolean> = {
  description: "a boolean",
  placeholder: "",
  fromToml(value) {
    if (typeof value !== "boolean")
      throw new ValueProblem(`must be true or false, got ${tomlKind(value)}`);
    return value;
  },
  fromText(text) {
    const lower = text.trim().toLowerCase();
    if (TRUE_TEXT.has(lower)) return true;
    if (FALSE_TEXT.has(lower)) return false;
    throw new ValueProblem(`must be true or false (or 1/0, yes/no, on/off), got ${shown(text)}`);
  },
  toToml: (value) => String(value),
};

export function oneOf<const T extends string>(values: readonly T[]): ValueType<T> {
  const description = `one of ${values.join("|")}`;
  const check = (text: string): T => {
    if ((values as readonly string[]).includes(text)) return text as T;
    throw new ValueProblem(`must be ${description}, got ${shown(text)}`);
  };
  return {
    description,
    placeholder: values.join("|"),
    fromToml(value) {
      if (typeof value !== "string")
        throw new ValueProblem(`must be ${description}, got ${tomlKind(value)}`);
      return check(value);
    },
    fromText: (text) => check(text.trim()),
    toToml: (value) => JSON.stringify(value),
  };
}

/** A string checked by `valid`; `description` says what it must be. */
export function text(
  description: string,
  placeholder: string,
  valid: (value: string) => boolean,
): ValueType<string> {
  const check = (value: string): string => {
    if (!valid(value)) throw new ValueProblem(`must be ${description}, got ${shown(value)}`);
    return value;
  };
  return {
    description,
    placeholder,
    fromToml(value) {
      if (typeof value !== "string")
        throw new ValueProblem(`must be ${description}, got ${tomlKind(value)}`);
      return check(value);
    },
    fromText: check,
    toToml: (value) => JSON.stringify(value),
  };
}

/** Highest CPU number accepted in a CPU list (Linux's default NR_CPUS ceiling). */
export const CPU_INDEX_MAX = 8191;

/**
 * A CPU list as Linux writes them ("0-3,8,10-11"): sorted, without duplicates.
 * TOML may also give an array of integers.
 */
export const cpuList: ValueType<number[]> = {
  description: 'a CPU list such as "0-3,8"',
  placeholder: "LIST",
  fromToml(value) {
    if (typeof value === "string") return parseCpuList(value);
    if (Array.isArray(value)) {
      const cpus = value.map((item) => {
        if (
          typeof item !== "number" ||
          !Number.isInteger(item) ||
          item < 0 ||
          item > CPU_INDEX_MAX
        ) {
          throw new ValueProblem(
            `must list CPU numbers in [0, ${CPU_INDEX_MAX}], got ${shown(item)}`,
          );
        }
        return item;
      });
      if (cpus.length === 0) throw new ValueProblem("must list at least one CPU");
      return [...new Set(cpus)].sort((a, b) => a - b);
    }
    throw new ValueProblem(`must be a CPU list such as "0-3,8", got ${tomlKind(value)}`);
  },
  fromText: (value) => parseCpuList(value),
  toToml: (cpus) => JSON.stringify(formatCpuList(cpus)),
};

function parseCpuList(value: string): number[] {
  const cpus = new Set<number>();
  const parts = value.split(",").map((part) => part.trim());
  for (const part of parts) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (match === null)
      throw new ValueProblem(`must be a CPU list such as "0-3,8", got ${shown(value)}`);
    const first = Number(match[1]);
    const last = match[2] === undefined ? first : Number(match[2]);
    if (last < first) throw new ValueProblem(`has a reversed range ${shown(part)}`);
    if (last > CPU_INDEX_MAX)
      throw new ValueProblem(`names CPU ${last}, above the maximum ${CPU_INDEX_MAX}`);
    for (let cpu = first; cpu <= last; cpu++) cpus.add(cpu);
  }
  return [...cpus].sort((a, b) => a - b);
}

/** The shortest list form: runs of consecutive CPUs as ranges. */
export function formatCpuList(cpus: readonly number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < cpus.length; i++) {
    let j = i;
    while (j + 1 < cpus.length && cpus[j + 1] === cpus[j]! + 1) j++;
    parts.push(i === j ? String(cpus[i]) : `${cpus[i]}-${cpus[j]}`);
    i = j;
  }
  return parts.join(",");
}

/** Bound on configured LoRA adapters, and on the length of a name. */
const LORA_ADAPTERS_MAX = 4096;
const LORA_NAME_LENGTH_MAX = 256;
const LORA_ID_MAX = 0xffff_ffff;
const LORA_ENTRY = /^([^\s,=\0]+)(?:=(\d+))?$/;

/**
 * LoRA adapters as `name[=id],...` (the id: the adapter's int id, as engines that send
 * only `lora_id` name it); TOML may also give an array of `name[=id]` strings. Names and
 * ids are each unique.
 */
export const loraAdapterList: ValueType<LoraAdapter[]> = {
  description: 'a list of LoRA adapters such as "sql-lora=1,chat-lora"',
  placeholder: "NAME[=ID],...",
  fromToml(value) {
    if (typeof value === "string") return parseLoraAdapters(value.split(","));
    if (Array.isArray(value) && value.every((item) => typeof item === "string"))
      return parseLoraAdapters(value as string[]);
    throw new ValueProblem(
      `must be a list of LoRA adapters such as "sql-lora=1,chat-lora", got ${tomlKind(value)}`,
    );
  },
  fromText: (value) => parseLoraAdapters(value.split(",")),
  toToml: (adapters) =>
    JSON.stringify(
      adapters.map(({ name, id }) => (id === null ? name : `${name}=${id}`)).join(","),
    ),
};

function parseLoraAdapters(entries: readonly string[]): LoraAdapter[] {
  const adapters: LoraAdapter[] = [];
  const names = new Set<string>();
  const ids = new Set<number>();
  for (const raw of entries) {
    const entry = raw.trim();
    if (entry === "" && entries.length === 1) break; // "" = none
    const match = LORA_ENTRY.exec(entry);
    if (match === null || match[1]!.length > LORA_NAME_LENGTH_MAX)
      throw new ValueProblem(`must list LoRA adapters as NAME[=ID], got ${shown(entry)}`);
    const name = match[1]!;
    const id = match[2] === undefined ? null : Number(match[2]);
    if (id !== null && !(id <= LORA_ID_MAX))
      throw new ValueProblem(`has a LoRA id above ${LORA_ID_MAX}: ${shown(entry)}`);
    if (names.has(name)) throw new ValueProblem(`names LoRA adapter ${shown(name)} twice`);
    if (id !== null && ids.has(id)) throw new ValueProblem(`gives LoRA id ${id} twice`);
    names.add(name);
    if (id !== null) ids.add(id);
    adapters.push({ name, id });
  }
  if (adapters.length > LORA_ADAPTERS_MAX)
    throw new ValueProblem(`lists more than ${LORA_ADAPTERS_MAX} LoRA adapters`);
  return adapters;
}
