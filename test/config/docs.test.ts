// Goal: docs/configuration.md is what the schema renders, so the documented settings
// are the real ones (regenerate with `npm run docs:config`).
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { configurationDoc, SETTINGS } from "../../src/config";

const DOC = join(import.meta.dir, "..", "..", "docs", "configuration.md");

describe("docs/configuration.md", () => {
  test("matches the schema (run `npm run docs:config` after changing a setting)", () => {
    expect(readFileSync(DOC, "utf8")).toBe(configurationDoc());
  });

  test("names every setting's key, flag and default", () => {
    const doc = configurationDoc();
    for (const s of SETTINGS) {
      expect(doc).toContain(`\`${s.key}\``);
      expect(doc).toContain(`\`--${s.flag}\``);
      if (s.default !== null) expect(doc).toContain(`\`${s.type.toToml(s.default)}\``);
    }
  });
});
