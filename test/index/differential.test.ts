// Goal: every backend equals the reference model on thousands of seeded event streams
// (outcomes, counters, stats, findMatches after every event, dump/restore, and exact
// emptiness after removing every worker). Method: test/harness (knobs listed there).
import { createIndex } from "../../src/index/index";
import { differentialSuite } from "../harness/suite";

differentialSuite({ name: "crtc", create: (options) => createIndex("crtc", 1, options) });
differentialSuite({
  name: "positional",
  create: (options) => createIndex("positional", 1, options),
});
