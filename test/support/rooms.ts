/**
 * The rooms of src/ (its top folders) and the one order they import in: a file may
 * import from its own room or from a room listed before it, never from one after it,
 * and no two files import each other, directly or around a loop. Type-only imports
 * count: they tie the rooms together as much as any other. test/tidy.test.ts holds the
 * tree to it; docs/architecture.md lists the rooms in this order.
 */
import { parse } from "@babel/parser";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";

/** Lowest first. */
export const ROOMS = [
  "util",
  "native",
  "domain",
  "wire",
  "hash",
  "http",
  "index",
  "ingest",
  "route",
  "config",
  "runtime",
  "core",
  "state",
  "cluster",
  "proxy",
  "server",
  "sim",
  "cli",
] as const;

export interface ImportGraph {
  /** src-relative file -> the src-relative files it imports. */
  readonly edges: ReadonlyMap<string, readonly string[]>;
}

/** Every relative import of every .ts file under `src` (a path), resolved to a file. */
export function importGraph(src: string): ImportGraph {
  const files: string[] = [];
  const walk = (path: string): void => {
    for (const entry of readdirSync(path, { withFileTypes: true })) {
      const child = join(path, entry.name);
      if (entry.isDirectory()) walk(child);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts"))
        files.push(relative(src, child));
    }
  };
  walk(src);
  const edges = new Map<string, string[]>();
  for (const file of files.sort()) {
    const targets = importSpecifiers(readFileSync(join(src, file), "utf8"))
      .filter((spec) => spec.startsWith("."))
      .map((spec) => resolveModule(src, file, spec))
      .filter((target): target is string => target !== null && target !== file);
    edges.set(file, [...new Set(targets)]);
  }
  return { edges };
}

/** The module specifiers a source imports or re-exports, dynamic imports included. */
export function importSpecifiers(text: string): string[] {
  const ast = parse(text, { sourceType: "module", plugins: ["typescript", "importAttributes"] });
  const found: string[] = [];
  const visit = (node: unknown): void => {
    if (typeof node !== "object" || node === null) return;
    if (Array.isArray(node)) {
      for (const child of node) visit(child);
      return;
    }
    const record = node as Record<string, unknown>;
    const source = record.source as { value?: unknown } | null | undefined;
    if (/^(Import|ExportNamed|ExportAll)Declaration$/.test(String(record.type))) {
      if (typeof source?.value === "string") found.push(source.value);
    }
    if (record.type === "ImportExpression" && typeof source?.value === "string")
      found.push(source.value);
    if (
      record.type === "CallExpression" &&
      (record.callee as { type?: string })?.type === "Import"
    ) {
      const first = (record.arguments as { value?: unknown }[])[0];
      if (typeof first?.value === "string") found.push(first.value);
    }
    for (const [key, value] of Object.entries(record)) {
      if (key !== "loc" && !key.endsWith("Comments")) visit(value);
    }
  };
  visit(ast.program);
  return found;
}

function resolveModule(src: string, from: string, spec: string): string | null {
  const base = normalize(join(dirname(from), spec));
  for (const candidate of [`${base}.ts`, join(base, "index.ts"), base]) {
    if (
      !candidate.startsWith("..") &&
      existsSync(join(src, candidate)) &&
      candidate.endsWith(".ts")
    )
      return candidate;
  }
  return null;
}

/** The room of a src-relative file: its top folder ("." for a file at the top). */
export function roomOf(file: string): string {
  const slash = file.indexOf("/");
  return slash < 0 ? "." : file.slice(0, slash);
}

/**
 * Imports against the order, as "from -> to" lines, and rooms the order does not list.
 * `order` lowest first.
 */
export function roomProblems(graph: ImportGraph, order: readonly string[]): string[] {
  const problems: string[] = [];
  const rank = new Map(order.map((room, i) => [room, i]));
  for (const [from, targets] of graph.edges) {
    const fromRoom = roomOf(from);
    if (fromRoom !== "." && !rank.has(fromRoom))
      problems.push(`${from}: room ${fromRoom} is not in the order`);
    for (const to of targets) {
      const toRoom = roomOf(to);
      if (toRoom === fromRoom) continue;
      if ((rank.get(toRoom) ?? -1) > (rank.get(fromRoom) ?? -1))
        problems.push(`src/${from} -> src/${to} (${fromRoom} imports ${toRoom}, a higher room)`);
    }
  }
  return problems;
}

/** Every set of files that import each other around a loop (Tarjan's components). */
export function importCycles(graph: ImportGraph): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const cycles: string[][] = [];
  let next = 0;
  const connect = (file: string): void => {
    index.set(file, next);
    low.set(file, next++);
    stack.push(file);
    onStack.add(file);
    for (const target of graph.edges.get(file) ?? []) {
      if (!index.has(target)) {
        connect(target);
        low.set(file, Math.min(low.get(file)!, low.get(target)!));
      } else if (onStack.has(target)) {
        low.set(file, Math.min(low.get(file)!, index.get(target)!));
      }
    }
    if (low.get(file) !== index.get(file)) return;
    const component: string[] = [];
    for (;;) {
      const member = stack.pop()!;
      onStack.delete(member);
      component.push(member);
      if (member === file) break;
    }
    if (component.length > 1) cycles.push(component.sort());
  };
  for (const file of graph.edges.keys()) if (!index.has(file)) connect(file);
  return cycles;
}
