/**
 * Writes docs/configuration.md from the config schema (`npm run docs:config`).
 * test/config/docs.test.ts fails when the committed file and the schema disagree.
 */
import { join } from "node:path";
import { configurationDoc } from "../src/config/render";

const path = join(import.meta.dir, "..", "docs", "configuration.md");
await Bun.write(path, configurationDoc());
console.log(`wrote ${path}`);
