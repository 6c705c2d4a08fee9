// Goal: the status page, loaded in real headless Chromium against a running `kvedge
// serve --proxy` with live traffic, shows what an operator needs: the workers, routes/s
// and the decision time, predicted against observed hits over the same answers,
// events/s and their lag, admission, the proxy's counters (every one /v1/status has),
// per-worker cached blocks and load as bars; each degraded worker with its real cause
// (a worker whose observed hits fall short; a worker whose engine is not reachable) in
// compact alerts and in the table. Its history is the server's: reloaded, the page
// draws the last minutes at once. It loads nothing but its own server's URLs (the
// control listener). A screenshot is written to a temporary directory.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../support/net";
import { until } from "../support/wait";
import { Browser, CHROMIUM } from "../support/chromium";
import {
  type MockEngine,
  missThenHit,
  startMockEngines,
  stopMockEngines,
  zeroCachedTokensFront,
} from "../support/mock-fleet";
import { startServe, type ServeProcess } from "../support/serve";

type Json = Record<string, any>;
let engines: MockEngine[] = [];
let liar: Server<undefined>;
let serve: ServeProcess;
let browser: Browser | null = null;

beforeAll(async () => {
  engines = await startMockEngines(3, { speedup: 50, seed: 30 });
  // Worker 1's answers report no cached tokens: the page must show it distrusted.
  liar = zeroCachedTokensFront(engines[0]!.http);
  const workers = engines.map(
    (engine, i) =>
      `${i + 1}=${engine.networked.endpoint};http=${i === 0 ? `http://127.0.0.1:${liar.port}` : engine.http}`,
  );
  // Worker 4's engine is down: its events never come (degraded: not connected).
  workers.push(`4=tcp://127.0.0.1:${await freePort()}`);
  serve = await startServe(["--proxy", "--workers", workers.join(","), "--observed-window", "2"]);
  // Events published before kvedge subscribes are lost (no replay endpoint here).
  await until(
    () => engines.every((engine) => engine.networked.subscribers > 0),
    "kvedge to subscribe to every engine",
  );
});

afterAll(async () => {
  await browser?.close();
  await serve?.stop();
  await liar?.stop(true);
  await stopMockEngines(engines);
});

const promptOf = (n: number) => Array.from({ length: 96 }, (_, i) => 1 + n * 1000 + i);

const statusOf = async (): Promise<Json> =>
  (await (await fetch(`${serve.controlUrl}/v1/status?since=${Date.now()}`)).json()) as Json;

/** Conversations of a miss and a predicted hit each; with `untilFlagged`, until worker 1 is flagged. */
async function traffic(untilFlagged: boolean, rounds: number, first = 0): Promise<void> {
  for (let n = first; n < first + rounds; n++) {
    await missThenHit(serve, promptOf(n));
    if (untilFlagged) {
      const workers = (await statusOf()).workers as Json[];
      if (workers[0]!.observed_hits.suspect === true) return;
    }
  }
}

const PAGE_STATE = `({
  summary: document.getElementById("summary").textContent,
  rows: [...document.querySelectorAll("#workers tr")].map((tr) => [...tr.children].map((td) => td.textContent)),
  routesNow: document.getElementById("routes-now").textContent,
  latencyNow: document.getElementById("latency-now").textContent,
  hitsNow: document.getElementById("hits-now").textContent,
  lagNow: document.getElementById("lag-now").textContent,
  admissionNow: document.getElementById("admission-now").textContent,
  lines: Object.fromEntries([...document.querySelectorAll("polyline.series")].map((p) =>
    [p.closest("svg").id + "/" + p.classList[1], Number(p.dataset.points)])),
  proxyCounters: [...document.querySelectorAll(".legend .counter")].map((s) => s.dataset.counter),
  blockBars: [...document.querySelectorAll("#chart-blocks rect.bar")].map((r) => [r.dataset.worker, r.getAttribute("fill"), Number(r.getAttribute("height"))]),
  loadBars: document.querySelectorAll("#chart-load rect.bar").length,
  alerts: [...document.querySelectorAll("#alerts .alert")].map((a) => a.textContent),
  alertHeights: [...document.querySelectorAll("#alerts .alert")].map((a) => a.getBoundingClientRect().height),
  resources: performance.getEntriesByType("resource").map((e) => e.name),
})`;

test("the status page in headless Chromium shows the fleet, its rates and history, and why workers are degraded", async () => {
  expect(
    existsSync(CHROMIUM) ? "chromium installed" : `${CHROMIUM} missing (apt-get install chromium)`,
  ).toBe("chromium installed");
  await traffic(true, 40);
  browser = await Browser.launch();
  await browser.open(`${serve.controlUrl}/`);
  // Traffic while the page polls, so its rates are not zero.
  let round = 0;
  let stop = false;
  const background = (async () => {
    while (!stop && round < 5000) await traffic(false, 1, 500 + round++);
  })();
  await browser.waitFor("Number(document.body.dataset.polls) >= 8", "eight polls of /v1/status");
  stop = true;
  await background;
  const page = await browser.evaluate<Json>(PAGE_STATE);
  expect(page.summary).toContain("4 workers · 2 degraded");
  expect(page.rows.map((row: string[]) => row[0])).toEqual(["1", "2", "3", "4"]);
  expect(page.rows[0][4]).toBe("hits suspect");
  expect(page.rows[0][5]).toStartWith("observed hits far below predicted");
  expect(page.rows[1][4]).toBe("exact");
  expect(page.rows[1][5]).toBe("");
  expect(page.rows[3][3]).not.toBe("connected");
  expect(page.rows[3][5]).toStartWith("engine not connected");
  // Event lag per worker: the mock engines stamp their batches.
  expect(page.rows[1][12]).toMatch(/^\d+(\.\d)? ms$/);
  expect(page.routesNow).toMatch(/\/s$/);
  expect(page.latencyNow).toMatch(/^p50 ≤ [\d.]+ (µs|ms) · p99 ≤ [\d.]+ (µs|ms)$/);
  expect(page.hitsNow).toMatch(/^predicted \d+\.\d% · observed \d+\.\d%$/);
  expect(page.lagNow).toMatch(/ ms mean$/);
  expect(page.admissionNow).toBe("off");
  for (const line of [
    "chart-routes/routes",
    "chart-latency/p50",
    "chart-latency/p99",
    "chart-hits/predicted",
    "chart-hits/observed",
    "chart-events/events",
    "chart-lag/lag",
    "chart-admission/held",
    "chart-proxy-volume/requests",
    "chart-proxy-problems/failovers",
  ])
    expect(page.lines[line] ?? 0).toBeGreaterThan(0);
  // Every counter the proxy has is drawn, whatever its name.
  const proxy = (await statusOf()).proxy as Json;
  expect(page.proxyCounters.sort()).toEqual(Object.keys(proxy).sort());
  expect(page.blockBars.map((bar: [string, string, number]) => [bar[0], bar[1]])).toEqual([
    ["1", "#dc2626"],
    ["2", "#2563eb"],
    ["3", "#2563eb"],
    ["4", "#dc2626"],
  ]);
  expect(page.blockBars.some((bar: [string, string, number]) => bar[2] > 0)).toBe(true);
  expect(page.loadBars).toBe(4);
  // Compact alerts: one line per cause, each one line high.
  expect(page.alerts).toHaveLength(2);
  expect(page.alerts[0]).toStartWith("worker 1 — observed hits far below predicted");
  expect(page.alerts[1]).toStartWith("worker 4 — engine not connected");
  const [first, second] = page.alertHeights as number[];
  expect(first).toBe(second!);
  expect(first).toBeLessThan(32);
  // No external assets: every resource the page loaded is its own server's.
  expect(page.resources.length).toBeGreaterThan(0);
  expect(page.resources.every((url: string) => url.startsWith(serve.controlUrl))).toBe(true);

  // Reloaded, the page draws the server's history at once, after its first poll.
  await browser.open(`${serve.controlUrl}/`);
  await browser.waitFor(
    "Number(document.body.dataset.polls) >= 1",
    "the first poll after a reload",
  );
  const reloaded = await browser.evaluate<Json>(PAGE_STATE);
  // As many points as the page had drawn before (the history only grows), not one.
  expect(reloaded.lines["chart-routes/routes"]).toBeGreaterThanOrEqual(
    page.lines["chart-routes/routes"],
  );
  expect(reloaded.lines["chart-routes/routes"]).toBeGreaterThan(5);
  expect(reloaded.lines["chart-hits/observed"]).toBeGreaterThan(0);
  const png = await browser.screenshot();
  expect([...png.subarray(1, 4)].map((c) => String.fromCharCode(c)).join("")).toBe("PNG");
  expect(png.length).toBeGreaterThan(20_000);
  writeFileSync(join(mkdtempSync(join(tmpdir(), "kvedge-status-")), "status-page.png"), png);
}, 90_000);
