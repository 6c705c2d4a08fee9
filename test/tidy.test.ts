// Goal: the code stays tidy and only gets tidier. Biome owns formatting, line width and
// lint (`biome.json`; `npx biome check --write .` fixes most of it). What no tool checks is
// measured here: short functions in src/, no BigInt / new Map / JSON. / console.log on the
// hot paths (src/index, src/wire) without a justified entry, no unfinished-work markers,
// no merge-conflict markers in any tracked file. The exceptions that exist are listed in
// test/tidy-ratchet.json, which may only shrink: a function over its entry fails, and so
// does an entry larger than what its function now has (rules in test/support/tidy.ts;
// `bun scripts/tidy.ts --update` lowers the entries).
import { describe, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  compare,
  conflictMarkers,
  type Measured,
  measure,
  measureSource,
  type Ratchet,
  trackedFiles,
} from "./support/tidy";
import ratchet from "./tidy-ratchet.json";
import { importCycles, importGraph, ROOMS, roomProblems } from "./support/rooms";

const ROOT = join(import.meta.dir, "..");
const empty = (): Measured => ({ longFunctions: {}, hotPathApis: {}, fixMarkers: [] });

describe("tidy", () => {
  test("Biome: the tree is formatted and its lint is clean", () => {
    const biome = join(ROOT, "node_modules", ".bin", "biome");
    const run = spawnSync(biome, ["ci", "--colors=off", "."], { cwd: ROOT, encoding: "utf8" });
    const errors = `${run.stdout}${run.stderr}`
      .split("\n")
      .filter((line) => / (lint|format)/.test(line));
    expect({ status: run.status, errors }).toEqual({ status: 0, errors: [] });
  });

  test("no tracked file holds a merge-conflict marker", () => {
    const found: string[] = [];
    for (const file of trackedFiles(ROOT)) {
      let text: string;
      try {
        text = readFileSync(join(ROOT, file), "utf8");
      } catch {
        continue; // deleted in the work tree
      }
      found.push(...conflictMarkers(file, text));
    }
    expect(found).toEqual([]);
  });

  test("src/ imports in one order of rooms, and no files import each other around a loop", () => {
    const graph = importGraph(join(ROOT, "src"));
    expect(roomProblems(graph, ROOMS)).toEqual([]);
    expect(importCycles(graph)).toEqual([]);
  });

  test("docs/architecture.md lists the rooms in the order the test holds", () => {
    const doc = readFileSync(join(ROOT, "docs", "architecture.md"), "utf8");
    const sentence = doc.match(/Room order:([^.]*)\./)?.[1] ?? "";
    const listed = sentence.match(/`[a-z]+`/g)?.map((room) => room.slice(1, -1));
    expect(listed).toEqual([...ROOMS]);
  });

  test("the room rules catch a back-import and a loop", () => {
    const edges = new Map<string, string[]>([
      ["index/a.ts", ["util/x.ts", "server/s.ts"]],
      ["util/x.ts", ["util/y.ts"]],
      ["util/y.ts", ["util/x.ts"]],
      ["server/s.ts", ["index/a.ts"]],
      ["mystery/m.ts", []],
    ]);
    expect(roomProblems({ edges }, ["util", "index", "server"])).toEqual([
      "src/index/a.ts -> src/server/s.ts (index imports server, a higher room)",
      "mystery/m.ts: room mystery is not in the order",
    ]);
    expect(importCycles({ edges })).toEqual([
      ["util/x.ts", "util/y.ts"],
      ["index/a.ts", "server/s.ts"],
    ]);
  });

  test("the tree keeps within the ratchet, and the ratchet is as tight as the tree", () => {
    expect(compare(ratchet as Ratchet, measure(ROOT))).toEqual([]);
  });

  test("every hot-path exemption says why", () => {
    for (const [key, entry] of Object.entries((ratchet as Ratchet).hotPathApis)) {
      expect({ key, why: entry.why.length > 10 }).toEqual({ key, why: true });
    }
  });

  test("the rules catch what they name", () => {
    const none: Ratchet = { longFunctions: {}, hotPathApis: {} };
    const bad: Measured = {
      longFunctions: { "src/a.ts: f": 70 },
      hotPathApis: { "src/index/a.ts: new Map": 1 },
      fixMarkers: ["src/a.ts:3"],
    };
    expect(compare(none, bad)).toHaveLength(3);
    const stale: Ratchet = {
      longFunctions: { "src/a.ts: f": 61 },
      hotPathApis: { "src/index/a.ts: new Map": { count: 1, why: "a listed use that went away" } },
    };
    const problems = compare(stale, empty());
    expect(problems.map((problem) => problem.endsWith("lower it"))).toEqual([true, true]);
    const marker = ["<".repeat(7), " HEAD"].join("");
    const text = ["# notes", marker, "ours", "=".repeat(7), "theirs", `${">".repeat(7)} b`];
    expect(conflictMarkers("docs/x.md", text.join("\n"))).toEqual([
      "docs/x.md:2",
      "docs/x.md:4",
      "docs/x.md:6",
    ]);
    expect(conflictMarkers("docs/x.md", "a heading\n=======\nunderlined")).toEqual(["docs/x.md:2"]);
  });

  test("each rule is measured from the source", () => {
    const body = Array.from({ length: 61 }, (_, i) => `  const v${i} = ${i};`).join("\n");
    const source = [
      "const m = new Map<number, number>();",
      "const b = 1n + BigInt(2);",
      "console.log(JSON.stringify([...m]), b);",
      `export class C {\n  run(): void {\n${body}\n  }\n}`,
      `const list = [() => {\n${body}\n}];`,
      `// ${["FIX", "ME"].join("")}: a marker`,
    ].join("\n");
    const out = empty();
    measureSource("src/index/x.ts", source, out);
    expect(out).toEqual({
      longFunctions: { "src/index/x.ts: C.run": 63, "src/index/x.ts: list.(anonymous)": 63 },
      hotPathApis: {
        "src/index/x.ts: new Map": 1,
        "src/index/x.ts: BigInt": 2,
        "src/index/x.ts: console.log": 1,
        "src/index/x.ts: JSON.": 1,
      },
      fixMarkers: ["src/index/x.ts:132"],
    });
    const cold = empty();
    measureSource("src/server/x.ts", source, cold);
    expect(cold.hotPathApis).toEqual({});
  });
});
