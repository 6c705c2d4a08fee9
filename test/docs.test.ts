// Goal: the documentation's pointers hold: every relative link in README.md, docs/ and
// bench/*.md names a file that exists (and, for decisions.md, an entry that exists),
// every `docs/decisions.md#...` named in the code is an entry, and the README stays a
// newcomer's page (about 200 lines).
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { ERROR_CODES } from "../src/domain/errors";
import { STATUS_OF } from "../src/http/errors";
import { codeFiles } from "./support/tidy";

const ROOT = join(import.meta.dir, "..");
const DOCS = [
  "README.md",
  "bench/RESULTS.md",
  "bench/JOURNAL.md",
  ...readdirSync(join(ROOT, "docs")).map((name) => `docs/${name}`),
];
const DECISIONS = readFileSync(join(ROOT, "docs", "decisions.md"), "utf8");
const ANCHORS = new Set([...DECISIONS.matchAll(/<a id="([a-z0-9-]+)"><\/a>/g)].map((m) => m[1]!));

/** Every folder README under src/ and native/. */
function readmes(): string[] {
  const found: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
      if (entry.isDirectory()) walk(`${dir}/${entry.name}`);
      else if (entry.name === "README.md") found.push(`${dir}/${entry.name}`);
    }
  };
  walk("src");
  walk("native");
  return found;
}

describe("documentation", () => {
  test("relative links point at files that exist, and at decisions that exist", () => {
    const broken: string[] = [];
    let checked = 0;
    for (const doc of DOCS) {
      const text = readFileSync(join(ROOT, doc), "utf8");
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target!) || target!.startsWith("#")) continue;
        checked++;
        const [path, anchor] = target!.split("#");
        const file = join(ROOT, dirname(doc), path!);
        if (!existsSync(file)) broken.push(`${doc}: ${target}`);
        else if (anchor && file.endsWith("decisions.md") && !ANCHORS.has(anchor)) {
          broken.push(`${doc}: ${target}`);
        }
      }
    }
    expect(broken).toEqual([]);
    expect(checked).toBeGreaterThan(40);
  });

  test("every decision the code points to exists", () => {
    const missing: string[] = [];
    for (const file of codeFiles(ROOT)) {
      const text = readFileSync(join(ROOT, file), "utf8");
      for (const [, anchor] of text.matchAll(/docs\/decisions\.md#([a-z0-9-]+)/g)) {
        if (!ANCHORS.has(anchor!)) missing.push(`${file}: ${anchor}`);
      }
    }
    expect(missing).toEqual([]);
    expect(ANCHORS.size).toBeGreaterThan(10);
  });

  test("decisions are numbered 1..N in order, each under its anchor; a numbered mention links its entry", () => {
    const entries = [...DECISIONS.matchAll(/<a id="([a-z0-9-]+)"><\/a>\n## (\d+)\./g)];
    expect(entries.map((m) => Number(m[2]))).toEqual(entries.map((_, i) => i + 1));
    expect(entries.length).toBe(ANCHORS.size);
    const numberOf = new Map(entries.map((m) => [m[1]!, Number(m[2])]));
    const wrong: string[] = [];
    for (const doc of [...DOCS, ...readmes()]) {
      const text = readFileSync(join(ROOT, doc), "utf8");
      // Every "decision N" is a link to the entry numbered N ("decision 13.5 µs" is a time).
      for (const m of text.matchAll(/(\[)?[Dd]ecision (\d+)(?![\d.\-–])(\]\(([^)]*)\))?/g)) {
        const anchor = m[4]?.split("#")[1];
        if (m[1] === undefined || anchor === undefined || numberOf.get(anchor) !== Number(m[2]))
          wrong.push(`${doc}: ${m[0]}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  test("the README stays short", () => {
    const lines = readFileSync(join(ROOT, "README.md"), "utf8").split("\n").length;
    expect(lines).toBeLessThanOrEqual(220);
  });

  test("docs/api.md lists every error code with its status, and each code is thrown somewhere", () => {
    const api = readFileSync(join(ROOT, "docs", "api.md"), "utf8");
    const listed = [...api.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \|/gm)].map((m) => [
      m[1],
      Number(m[2]),
    ]);
    expect(listed).toEqual(ERROR_CODES.map((code) => [code, STATUS_OF[code]]));
    const source = codeFiles(ROOT)
      .filter((file) => file.startsWith("src/") && !file.startsWith("src/domain/"))
      .map((file) => readFileSync(join(ROOT, file), "utf8"))
      .join("\n");
    const unused = ERROR_CODES.filter(
      (code) => !new RegExp(`KvedgeError\\(\\s*"${code}"`).test(source),
    );
    expect(unused).toEqual([]);
  });
});
