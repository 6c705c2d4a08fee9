// Goal: /metrics text is valid Prometheus exposition format: one HELP and one TYPE per
// family before its samples, escaped label values and help text that parse back to
// the original strings, cumulative histogram buckets; sample sources read plain
// counters at scrape time; router metrics follow the router's state, including
// series disappearing with a removed worker.
// Method: render the real prom-client registry and parse the text back with an
// independent parser written from the format's rules.
import { describe, expect, test } from "bun:test";
import { DEFAULT_SEED } from "../../src/hash";
import { promptHashes, Router } from "../../src/route";
import { Histogram, Registry } from "prom-client";
import {
  FastHistogram,
  HTTP_ROUTE_LABELS_MAX,
  registerRouterMetrics,
  ServerMetrics,
} from "../../src/server/metrics";
import { createMetricsRegistry, registerSamples } from "../../src/util/metrics";
import { removeWorker } from "../support/workers";

interface Sample {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly value: number;
}

interface Family {
  help?: string;
  type?: string;
  readonly samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

function unescapeHelp(text: string): string {
  return text.replace(/\\(\\|n)/g, (_, c: string) => (c === "n" ? "\n" : "\\"));
}

/** Parses exposition text; throws on anything malformed. */
function parseExposition(text: string): Map<string, Family> {
  const families = new Map<string, Family>();
  const family = (name: string) => {
    let f = families.get(name);
    if (f === undefined) families.set(name, (f = { samples: [] }));
    return f;
  };
  expect(text.endsWith("\n")).toBe(true);
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const meta = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
    if (meta !== null) {
      const [, kind, name, rest] = meta as unknown as [string, string, string, string];
      expect(name).toMatch(NAME);
      const f = family(name);
      if (kind === "HELP") {
        expect(f.help).toBeUndefined();
        f.help = unescapeHelp(rest);
      } else {
        expect(f.type).toBeUndefined();
        expect(f.samples).toHaveLength(0); // TYPE comes before the samples
        expect(["counter", "gauge", "histogram", "summary", "untyped"]).toContain(rest);
        f.type = rest;
      }
      continue;
    }
    expect(line.startsWith("#")).toBe(false);
    let at = 0;
    while (at < line.length && line[at] !== "{" && line[at] !== " ") at++;
    const name = line.slice(0, at);
    expect(name).toMatch(NAME);
    const labels: Record<string, string> = {};
    if (line[at] === "{") {
      at++;
      while (line[at] !== "}") {
        const eq = line.indexOf("=", at);
        const label = line.slice(at, eq);
        expect(label).toMatch(/^[a-zA-Z_][a-zA-Z0-9_]*$/);
        expect(line[eq + 1]).toBe('"');
        let value = "";
        let i = eq + 2;
        for (; line[i] !== '"'; i++) {
          if (i >= line.length) throw new Error(`unterminated label value in ${line}`);
          if (line[i] === "\\") {
            const next = line[++i];
            if (next === "n") value += "\n";
            else if (next === "\\" || next === '"') value += next;
            else throw new Error(`bad escape \\${next} in ${line}`);
          } else {
            value += line[i];
          }
        }
        labels[label] = value;
        at = i + 1;
        if (line[at] === ",") at++;
      }
      at++;
    }
    expect(line[at]).toBe(" ");
    const value = Number(
      line
        .slice(at + 1)
        .split(" ")[0]!
        .replace("+Inf", "Infinity"),
    );
    expect(Number.isNaN(value)).toBe(false);
    const base = [...families.keys()].find(
      (f) =>
        name === f ||
        (families.get(f)!.type === "histogram" &&
          [`${f}_bucket`, `${f}_sum`, `${f}_count`].includes(name)),
    );
    if (base === undefined) throw new Error(`sample ${name} before its TYPE`);
    families.get(base)!.samples.push({ name, labels, value });
  }
  for (const [name, f] of families) {
    expect(f.help, name).toBeDefined();
    expect(f.type, name).toBeDefined();
  }
  return families;
}

async function scrape(
  registry: ReturnType<typeof createMetricsRegistry>,
): Promise<Map<string, Family>> {
  return parseExposition(await registry.metrics());
}

describe("registry", () => {
  test("process metrics that hold under Bun, and nothing Node-specific", async () => {
    const families = await scrape(createMetricsRegistry());
    expect([...families.keys()].sort()).toEqual([
      "process_cpu_seconds_total",
      "process_cpu_system_seconds_total",
      "process_cpu_user_seconds_total",
      "process_max_fds",
      "process_open_fds",
      "process_resident_memory_bytes",
      "process_start_time_seconds",
    ]);
    expect(families.get("process_resident_memory_bytes")!.samples[0]!.value).toBeGreaterThan(
      1_000_000,
    );
    expect(families.get("process_open_fds")!.samples[0]!.value).toBeGreaterThan(0);
    expect(createMetricsRegistry().contentType).toContain("text/plain");
  });

  test("sample sources read plain objects at every scrape; labels and help are escaped", async () => {
    const registry = createMetricsRegistry();
    const counters = { stored: 3, removed: 0 };
    const odd = 'a"b\\c\nd';
    registerSamples(registry, {
      name: "kvedge_test_events_total",
      help: "Events with a \\ backslash\nand a newline.",
      type: "counter",
      labelNames: ["kind"],
      collect(emit) {
        emit(counters.stored, { kind: "stored" });
        emit(counters.removed, { kind: odd });
      },
    });
    const level = { value: 1.5 };
    registerSamples(registry, {
      name: "kvedge_test_level",
      help: "A level.",
      type: "gauge",
      collect: (emit) => emit(level.value),
    });
    let families = await scrape(registry);
    const events = families.get("kvedge_test_events_total")!;
    expect(events.type).toBe("counter");
    expect(events.help).toBe("Events with a \\ backslash\nand a newline.");
    expect(events.samples).toEqual([
      { name: "kvedge_test_events_total", labels: { kind: "stored" }, value: 3 },
      { name: "kvedge_test_events_total", labels: { kind: odd }, value: 0 },
    ]);
    counters.stored = 10;
    level.value = -2;
    families = await scrape(registry);
    expect(families.get("kvedge_test_events_total")!.samples[0]!.value).toBe(10);
    expect(families.get("kvedge_test_level")!.samples).toEqual([
      { name: "kvedge_test_level", labels: {}, value: -2 },
    ]);
  });

  test("counters must be named *_total and never go negative", async () => {
    const registry = createMetricsRegistry();
    expect(() =>
      registerSamples(registry, {
        name: "kvedge_bad",
        help: "x",
        type: "counter",
        collect: () => {},
      }),
    ).toThrow(/_total/);
    registerSamples(registry, {
      name: "kvedge_neg_total",
      help: "x",
      type: "counter",
      collect: (emit) => emit(-1),
    });
    await expect(registry.metrics()).rejects.toThrow(/not a non-negative number/);
  });
});

describe("server histograms", () => {
  test("HTTP durations by route and status, cumulative buckets; routes beyond the cap become 'other'", async () => {
    const registry = createMetricsRegistry();
    const metrics = new ServerMetrics(registry);
    metrics.observeHttp("/v1/route", 200, 0.0003);
    metrics.observeHttp("/v1/route", 200, 0.002);
    metrics.observeHttp("/v1/requests/{id}/done", 404, 0.00005);
    for (let i = 0; i < HTTP_ROUTE_LABELS_MAX + 5; i++)
      metrics.observeHttp(`/made-up/${i}`, 404, 0.001);
    metrics.observeRouteDecision(0.000_004);
    const families = await scrape(registry);
    const http = families.get("kvedge_http_request_duration_seconds")!;
    expect(http.type).toBe("histogram");
    const route = http.samples.filter((s) => s.labels.route === "/v1/route");
    const buckets = route.filter((s) => s.name.endsWith("_bucket"));
    for (let i = 1; i < buckets.length; i++)
      expect(buckets[i]!.value).toBeGreaterThanOrEqual(buckets[i - 1]!.value);
    expect(buckets.find((b) => b.labels.le === "0.0005")!.value).toBe(1);
    expect(buckets.find((b) => b.labels.le === "+Inf")!.value).toBe(2);
    expect(route.find((s) => s.name.endsWith("_count"))!.value).toBe(2);
    expect(route.find((s) => s.name.endsWith("_sum"))!.value).toBeCloseTo(0.0023, 10);
    expect(route.every((s) => s.labels.status === "200")).toBe(true);
    const routes = new Set(http.samples.map((s) => s.labels.route));
    expect(routes.size).toBe(HTTP_ROUTE_LABELS_MAX + 1); // the first 64 distinct routes + "other"
    expect(
      http.samples.find((s) => s.labels.route === "other" && s.name.endsWith("_count"))!.value,
    ).toBe(7);
    const decision = families.get("kvedge_route_decision_duration_seconds")!;
    expect(decision.samples.find((s) => s.labels.le === "0.000005")!.value).toBe(1);
    expect(decision.samples.find((s) => s.labels.le === "0.0000025")!.value).toBe(0);
  });
});

describe("FastHistogram", () => {
  test("renders exactly as prom-client's Histogram (text and JSON), also across a reset", async () => {
    const buckets = [0.000_001, 0.000_005, 0.0001, 0.001, 0.25, 1];
    const theirs = new Registry();
    const ours = new Registry();
    const labeled = new Histogram({
      name: "t_labeled_seconds",
      help: "Labeled \\ help.",
      labelNames: ["route", "status"],
      buckets,
      registers: [theirs],
    });
    const plain = new Histogram({
      name: "t_plain_seconds",
      help: "Plain.",
      buckets,
      registers: [theirs],
    });
    const fastLabeled = new FastHistogram("t_labeled_seconds", "Labeled \\ help.", buckets, ours);
    const fastPlain = new FastHistogram("t_plain_seconds", "Plain.", buckets, ours);
    const plainSeries = fastPlain.series({});
    const series = new Map<string, ReturnType<FastHistogram["series"]>>();
    const observe = (route: string, status: number, value: number) => {
      labeled.labels(route, String(status)).observe(value);
      const key = `${route} ${status}`;
      if (!series.has(key)) series.set(key, fastLabeled.series({ route, status: String(status) }));
      fastLabeled.observe(series.get(key)!, value);
      plain.observe(value);
      fastPlain.observe(plainSeries, value);
    };
    const same = async () => {
      expect(await ours.metrics()).toBe(await theirs.metrics());
      expect(await ours.getMetricsAsJSON()).toEqual(await theirs.getMetricsAsJSON());
    };
    await same(); // before any observation: the unlabeled series only
    const values = [0, 0.000_001, 0.000_001_1, 0.000_005, 0.0003, 0.001, 0.3, 1, 7, 0.1 + 0.2];
    values.forEach((value, i) => {
      observe(i % 3 === 0 ? "/v1/route" : 'we"ird\\route', 200 + (i % 2) * 204, value);
    });
    await same();
    theirs.resetMetrics();
    ours.resetMetrics();
    await same();
    observe("/v1/route", 200, 0.002);
    await same();
    expect(() => fastPlain.observe(plainSeries, Number.NaN)).toThrow(TypeError);
  });
});

describe("router metrics", () => {
  test("routed requests and active load per worker; a removed worker's series disappear", async () => {
    const registry = createMetricsRegistry();
    const router = new Router({ blockSize: 4, random: () => 0.5 });
    const big = 2n ** 64n - 1n;
    router.load.table.acquire(big, 0);
    router.load.table.acquire(7n, 3);
    registerRouterMetrics(registry, router);
    const p = promptHashes(
      Uint32Array.from({ length: 10 }, (_, i) => i),
      4,
      DEFAULT_SEED,
    );
    const request = { chain: p.chain, blockCount: p.blockCount, tokenCount: 10 };
    const first = router.route(request, { count: 1, slots: [0], blocks: [2] }); // worker `big` holds 2 blocks
    router.route(request, { count: 1, slots: [0], blocks: [2] });
    router.load.prefillDone(first.requestId);
    router.load.done("missing");
    let families = await scrape(registry);
    const value = (family: string, labels: Record<string, string>) =>
      families
        .get(family)!
        .samples.find((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;
    const bigLabels = { worker_id: big.toString(), dp_rank: "0" };
    expect(value("kvedge_routed_requests_total", bigLabels)).toBe(2);
    expect(value("kvedge_routed_requests_total", { worker_id: "7", dp_rank: "3" })).toBe(0);
    expect(value("kvedge_worker_active_requests", bigLabels)).toBe(2);
    expect(value("kvedge_worker_active_prefill_tokens", bigLabels)).toBe(2); // second request: 10 - 8 cached
    expect(value("kvedge_worker_active_decode_blocks", bigLabels)).toBe(2);
    expect(value("kvedge_worker_degraded", bigLabels)).toBe(0);
    expect(value("kvedge_request_lifecycle_total", { event: "admitted" })).toBe(2);
    expect(value("kvedge_request_lifecycle_total", { event: "prefill_done" })).toBe(1);
    expect(value("kvedge_request_lifecycle_total", { event: "unknown" })).toBe(1);
    expect(value("kvedge_route_tracked_blocks", {})).toBe(2);
    expect(value("kvedge_route_tracker_bytes", {})).toBeGreaterThan(0);
    removeWorker(router.load, big, 0);
    families = await scrape(registry);
    for (const name of [
      "kvedge_routed_requests_total",
      "kvedge_worker_active_requests",
      "kvedge_worker_active_decode_blocks",
    ]) {
      expect(families.get(name)!.samples.map((s) => s.labels.worker_id)).toEqual(["7"]);
    }
    expect(value("kvedge_request_lifecycle_total", { event: "dropped_with_worker" })).toBe(2);
    expect(value("kvedge_route_tracked_blocks", {})).toBe(0);
  });

  test("every family follows the naming conventions", async () => {
    const registry = createMetricsRegistry();
    registerRouterMetrics(registry, new Router({ blockSize: 16 }));
    new ServerMetrics(registry);
    for (const [name, family] of await scrape(registry)) {
      expect(name.startsWith("kvedge_") || name.startsWith("process_")).toBe(true);
      if (family.type === "counter") expect(name.endsWith("_total")).toBe(true);
      if (family.type === "histogram") expect(name.endsWith("_seconds")).toBe(true);
    }
  });
});
