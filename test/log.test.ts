// Goal: log lines are valid JSON with bigint as decimal strings, levels filter, child
// fields merge, and OnceLog logs a kind once while counting every occurrence.
import { expect, test } from "bun:test";
import { createLogger, memoryLogger, OnceLog } from "../src/util/log";

test("JSON lines with level filtering, child fields and bigint as strings", () => {
  const lines: string[] = [];
  const log = createLogger({
    level: "info",
    format: "json",
    write: (line) => lines.push(line),
    now: () => new Date(0),
  });
  log.debug("hidden");
  log.child({ component: "ingest" }).warn("gap", { worker_id: 18446744073709551615n, missing: 3 });
  expect(lines).toHaveLength(1);
  expect(JSON.parse(lines[0]!)).toEqual({
    time: "1970-01-01T00:00:00.000Z",
    level: "warn",
    msg: "gap",
    component: "ingest",
    worker_id: "18446744073709551615",
    missing: 3,
  });
});

test("pretty lines carry the message and fields", () => {
  const lines: string[] = [];
  const log = createLogger({
    format: "pretty",
    write: (line) => lines.push(line),
    now: () => new Date(0),
  });
  log.error("boom", { code: "E1" });
  expect(lines[0]).toBe("00:00:00.000 ERROR boom code=E1\n");
});

test("OnceLog logs each kind once and counts all", () => {
  const log = memoryLogger();
  const once = new OnceLog(log);
  once.report("truncated", "truncated frame", { bytes: 3 });
  once.report("truncated", "truncated frame", { bytes: 4 });
  once.report("bad_tag", "unknown tag");
  expect(log.records.map((record) => record.fields.kind)).toEqual(["truncated", "bad_tag"]);
  expect(once.counts.get("truncated")).toBe(2);
});
