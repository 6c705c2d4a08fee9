/**
 * Prints what the tidy test measures, and with --update rewrites test/tidy-ratchet.json
 * to the tree's current state. --update refuses to raise or add an entry unless
 * --allow-growth is given (a merge that brings new code); growth then shows in the diff.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { compare, measure, type Ratchet } from "../test/support/tidy";

const ROOT = join(import.meta.dir, "..");
const PATH = join(ROOT, "test", "tidy-ratchet.json");
const { values } = parseArgs({
  options: { update: { type: "boolean" }, "allow-growth": { type: "boolean" } },
  strict: true,
});

const old: Ratchet = await Bun.file(PATH).json();
const now = measure(ROOT);
const problems = compare(old, now);
for (const problem of problems) console.log(problem);
const grows = problems.filter((problem) => !problem.includes("lower it"));
if (values.update) {
  if (grows.length > 0 && !values["allow-growth"]) {
    console.log(`not updated: ${grows.length} entries would grow (--allow-growth to accept them)`);
    process.exit(1);
  }
  const hotPathApis: Ratchet["hotPathApis"] = {};
  for (const [key, count] of Object.entries(now.hotPathApis)) {
    hotPathApis[key] = { count, why: old.hotPathApis[key]?.why ?? "(say why)" };
  }
  const ratchet: Ratchet = {
    longFunctions: now.longFunctions,
    hotPathApis,
  };
  await Bun.write(PATH, `${JSON.stringify(ratchet, null, 2)}\n`);
  console.log(`wrote ${PATH}`);
}
