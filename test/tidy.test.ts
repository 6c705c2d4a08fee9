// Goal: the code stays tidy and only gets tidier. Lines of at most 100 columns, short
// functions in src/, no BigInt / new Map / JSON. / console.log on the hot paths (src/index,
// src/wire) without a justified entry, no unfinished-work markers. The exceptions that
// exist are listed in test/tidy-ratchet.json, which may only shrink: a file over its entry
// fails, and so does an entry larger than what its file now has (rules in test/support/tidy.ts;
// `bun scripts/tidy.ts --update` lowers the entries).
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { compare, measure, type Measured, measureSource, type Ratchet } from "./support/tidy";
import ratchet from "./tidy-ratchet.json";

const ROOT = join(import.meta.dir, "..");

describe("tidy", () => {
  test("the tree keeps within the ratchet, and the ratchet is as tight as the tree", () => {
    expect(compare(ratchet as Ratchet, measure(ROOT))).toEqual([]);
  });

  test("every hot-path exemption says why", () => {
    for (const [key, entry] of Object.entries((ratchet as Ratchet).hotPathApis)) {
      expect({ key, why: entry.why.length > 10 }).toEqual({ key, why: true });
    }
  });

  test("the rules catch what they name", () => {
    const empty: Ratchet = { longLines: {}, longFunctions: {}, hotPathApis: {} };
    const bad: Measured = {
      longLines: { "src/a.ts": 2 },
      longFunctions: { "src/a.ts: f": 70 },
      hotPathApis: { "src/index/a.ts: new Map": 1 },
      fixMarkers: ["src/a.ts:3"],
    };
    expect(compare(empty, bad)).toHaveLength(4);
    const clean: Measured = { longLines: {}, longFunctions: {}, hotPathApis: {}, fixMarkers: [] };
    const stale: Ratchet = {
      longLines: { "src/a.ts": 1 },
      longFunctions: {},
      hotPathApis: { "src/index/a.ts: new Map": { count: 1, why: "a listed use that went away" } },
    };
    const problems = compare(stale, clean);
    expect(problems.map((problem) => problem.endsWith("lower it"))).toEqual([true, true]);
  });

  test("each rule is measured from the source", () => {
    const body = Array.from({ length: 61 }, (_, i) => `  const v${i} = ${i};`).join("\n");
    const source = [
      "const m = new Map<number, number>();",
      "const b = 1n + BigInt(2);",
      "console.log(JSON.stringify([...m]), b);",
      `export class C {\n  run(): void {\n${body}\n  }\n}`,
      `const list = [() => {\n${body}\n}];`,
      `// ${"x".repeat(100)}`,
      `// ${["FIX", "ME"].join("")}: a marker`,
    ].join("\n");
    const out: Measured = { longLines: {}, longFunctions: {}, hotPathApis: {}, fixMarkers: [] };
    measureSource("src/index/x.ts", source, out);
    expect(out).toEqual({
      longLines: { "src/index/x.ts": 1 },
      longFunctions: { "src/index/x.ts: C.run": 63, "src/index/x.ts: list.(anonymous)": 63 },
      hotPathApis: {
        "src/index/x.ts: new Map": 1,
        "src/index/x.ts: BigInt": 2,
        "src/index/x.ts: console.log": 1,
        "src/index/x.ts: JSON.": 1,
      },
      fixMarkers: ["src/index/x.ts:133"],
    });
    const cold: Measured = { longLines: {}, longFunctions: {}, hotPathApis: {}, fixMarkers: [] };
    measureSource("src/server/x.ts", source, cold);
    expect(cold.hotPathApis).toEqual({});
  });
});
