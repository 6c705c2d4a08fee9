/**
 * The tidy rules `npm test` enforces (test/tidy.test.ts) beyond what Biome checks
 * (formatting, line width and lint: `biome.json`), and the measurements they compare with
 * the ratchet in test/tidy-ratchet.json:
 *
 * - functions in src/ at most MAX_FUNCTION_LINES lines long (per function: its length);
 * - no BigInt, `new Map`, `JSON.` or `console.log` on the hot paths (src/index,
 *   src/wire), except where the ratchet justifies each use;
 * - no fix-me markers (an unfinished thing gets an issue, not a marker);
 * - no merge-conflict markers in any tracked text file (docs included).
 *
 * The ratchet only shrinks: a file that exceeds its entry fails, and so does an entry
 * that is larger than what the file now has (lower it: `bun scripts/tidy.ts --update`).
 */
import { parse } from "@babel/parser";
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";

export const MAX_FUNCTION_LINES = 60;
/** Folders (and files) whose code is checked, relative to the repository root. */
export const CHECKED = ["src", "test", "bench", "scripts", "build.ts"];
/** Hot paths: where the banned APIs need a justified exemption. */
export const HOT_PATHS = ["src/index/", "src/wire/"];
export const BANNED = ["BigInt", "new Map", "JSON.", "console.log"] as const;
export type Banned = (typeof BANNED)[number];

const FIX_MARKER = ["FIX", "ME"].join("");

export interface Ratchet {
  /** "file: function name" -> its length in lines (over MAX_FUNCTION_LINES). */
  readonly longFunctions: Record<string, number>;
  /** "file: API" -> how many uses, and why they are allowed there. */
  readonly hotPathApis: Record<string, { readonly count: number; readonly why: string }>;
}

/** What the tree has now, in the ratchet's shape, plus where fix-me markers are. */
export interface Measured {
  readonly longFunctions: Record<string, number>;
  readonly hotPathApis: Record<string, number>;
  readonly fixMarkers: string[];
}

export function codeFiles(root: string): string[] {
  const files: string[] = [];
  const walk = (path: string): void => {
    for (const entry of readdirSync(path, { withFileTypes: true })) {
      if (entry.name === "node_modules" || entry.name.startsWith(".")) continue;
      const child = join(path, entry.name);
      if (entry.isDirectory()) walk(child);
      else if (/\.(ts|mjs)$/.test(entry.name)) files.push(relative(root, child));
    }
  };
  for (const top of CHECKED) {
    if (/\.(ts|mjs)$/.test(top)) files.push(top);
    else walk(join(root, top));
  }
  return files.sort();
}

export function measure(root: string): Measured {
  const measured: Measured = { longFunctions: {}, hotPathApis: {}, fixMarkers: [] };
  for (const file of codeFiles(root)) {
    const text = readFileSync(join(root, file), "utf8");
    measureSource(file, text, measured);
  }
  return measured;
}

// Built from parts so that this file does not hold the markers it looks for.
const CONFLICT_MARKER = new RegExp(
  `^(${["<".repeat(7), "=".repeat(7), ">".repeat(7)].join("|")})( |$)`,
);

/** The files git tracks under `root` (every file but node_modules when it is no checkout). */
export function trackedFiles(root: string): string[] {
  const git = spawnSync("git", ["ls-files", "-z"], { cwd: root, encoding: "utf8" });
  if (git.status === 0) return git.stdout.split("\0").filter((file) => file !== "");
  const files: string[] = [];
  const walk = (path: string): void => {
    for (const entry of readdirSync(path, { withFileTypes: true })) {
      if (entry.name === "node_modules" || entry.name.startsWith(".git")) continue;
      const child = join(path, entry.name);
      if (entry.isDirectory()) walk(child);
      else files.push(relative(root, child));
    }
  };
  walk(root);
  return files;
}

/** `file:line` of every merge-conflict marker line in `text` (a binary file has none). */
export function conflictMarkers(file: string, text: string): string[] {
  if (text.includes("\0")) return [];
  const found: string[] = [];
  text.split("\n").forEach((line, i) => {
    if (CONFLICT_MARKER.test(line)) found.push(`${file}:${i + 1}`);
  });
  return found;
}

/** Adds one file's measurements to `out`. */
export function measureSource(file: string, text: string, out: Measured): void {
  const lines = text.split("\n");
  lines.forEach((line, i) => {
    if (line.includes(FIX_MARKER)) out.fixMarkers.push(`${file}:${i + 1}`);
  });
  const hot = HOT_PATHS.some((prefix) => file.startsWith(prefix));
  if (!file.startsWith("src/") && !file.startsWith("scripts/")) return;
  const ast = parse(text, { sourceType: "module", plugins: ["typescript"] });
  walkAst(ast.program as unknown as Node, [], (node, names) => {
    const length = isFunction(node) ? node.loc!.end.line - node.loc!.start.line + 1 : 0;
    if (length > MAX_FUNCTION_LINES) {
      out.longFunctions[uniqueKey(out.longFunctions, `${file}: ${names.join(".")}`)] = length;
    }
    const api = hot ? bannedApi(node) : null;
    const key = `${file}: ${api}`;
    if (api !== null) out.hotPathApis[key] = (out.hotPathApis[key] ?? 0) + 1;
  });
}

// The AST is walked as plain objects; only the fields used here are typed.
interface Node {
  readonly type: string;
  readonly loc?: { readonly start: { line: number }; readonly end: { line: number } };
  readonly [field: string]: unknown;
}

function isNode(value: unknown): value is Node {
  return typeof value === "object" && value !== null && typeof (value as Node).type === "string";
}

function isFunction(node: Node): boolean {
  const declared = node.type === "TSDeclareMethod" || node.type === "TSDeclareFunction";
  return /Function|Method$/.test(node.type) && !declared && isNode(node.body);
}

/**
 * Visits every node with the names of the declarations it sits in (class, function,
 * variable, property); a function without a name of its own is "(anonymous)".
 */
function walkAst(node: Node, names: string[], visit: Visit, named = false): void {
  const name = declaredName(node);
  const own = name ?? (isFunction(node) && !named ? "(anonymous)" : null);
  const inner = own === null ? names : [...names, own];
  visit(node, inner);
  for (const key of Object.keys(node)) {
    if (key === "loc" || key.endsWith("Comments")) continue;
    const value = node[key];
    const children = Array.isArray(value) ? value : [value];
    for (const child of children) if (isNode(child)) walkAst(child, inner, visit, name !== null);
  }
}

type Visit = (node: Node, names: string[]) => void;

function declaredName(node: Node): string | null {
  const id = node.id ?? node.key;
  const names = /Declaration|Declarator|Method|Property/.test(node.type);
  return names && isNode(id) && id.type === "Identifier" ? (id.name as string) : null;
}

function uniqueKey(table: Record<string, number>, key: string): string {
  let unique = key;
  for (let n = 2; unique in table; n++) unique = `${key} #${n}`;
  return unique;
}

function bannedApi(node: Node): Banned | null {
  if (node.type === "BigIntLiteral") return "BigInt";
  if (node.type === "Identifier" && node.name === "BigInt") return "BigInt";
  const callee = node.callee;
  if (node.type === "NewExpression" && isNode(callee) && callee.name === "Map") return "new Map";
  const { object, property } = node;
  if (node.type !== "MemberExpression" || !isNode(object) || !isNode(property)) return null;
  if (object.name === "JSON") return "JSON.";
  if (object.name === "console" && property.name === "log") return "console.log";
  return null;
}

/** Every way the tree breaks the ratchet, as messages (empty = tidy). */
export function compare(ratchet: Ratchet, measured: Measured): string[] {
  const problems = measured.fixMarkers.map((at) => `${at}: ${FIX_MARKER} (file an issue instead)`);
  const functions = `function over ${MAX_FUNCTION_LINES} lines`;
  problems.push(...ratchetProblems(functions, ratchet.longFunctions, measured.longFunctions));
  const allowed = Object.fromEntries(
    Object.entries(ratchet.hotPathApis).map(([key, entry]) => [key, entry.count]),
  );
  problems.push(...ratchetProblems("hot-path use of a banned API", allowed, measured.hotPathApis));
  return problems;
}

type Counts = Record<string, number>;

function ratchetProblems(what: string, allowed: Counts, now: Counts): string[] {
  const problems: string[] = [];
  for (const [key, count] of Object.entries(now)) {
    const limit = allowed[key] ?? 0;
    if (count > limit) problems.push(`${key}: ${count} (${what}; allowed ${limit})`);
  }
  for (const [key, limit] of Object.entries(allowed)) {
    const count = now[key] ?? 0;
    if (count < limit) problems.push(`${key}: ${count} now, ratchet ${limit} (${what}): lower it`);
  }
  return problems;
}
