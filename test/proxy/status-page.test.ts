// Goal: the status page, loaded in real headless Chromium against a running `kvedge
// serve --proxy` with live traffic, shows what is happening: the workers, routes/s,
// predicted and observed hit-rate lines, events/s, per-worker cached blocks and load as
// bars, and a worker whose observed hits fall short as distrusted (red bar, alert,
// table). The page loads nothing but its own server's URLs. A screenshot is written.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { existsSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
const SCREENSHOT = join(tmpdir(), "kvedge-status-page.png");
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

/** Conversations of a miss and a predicted hit each; with `untilFlagged`, until worker 1 is flagged. */
async function traffic(untilFlagged: boolean, rounds: number, first = 0): Promise<void> {
  for (let n = first; n < first + rounds; n++) {
    await missThenHit(serve, promptOf(n));
    if (untilFlagged) {
      const workers = ((await (await fetch(`${serve.controlUrl}/v1/workers`)).json()) as Json)
        .workers as Json[];
      if (workers[0]!.observed_hits.suspect === true) return;
    }
  }
}

test("the status page in headless Chromium shows the fleet, the rates and the distrusted worker", async () => {
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
  await browser.waitFor("Number(document.body.dataset.polls) >= 6", "six polls of /v1/status");
  stop = true;
  await background;
  const page = await browser.evaluate<Json>(`({
    summary: document.getElementById("summary").textContent,
    rows: [...document.querySelectorAll("#workers tr")].map((tr) => [...tr.children].map((td) => td.textContent)),
    routesNow: document.getElementById("routes-now").textContent,
    hitsNow: document.getElementById("hits-now").textContent,
    routeLine: document.querySelectorAll("#chart-routes polyline.routes").length,
    predictedLine: document.querySelectorAll("#chart-hits polyline.predicted").length,
    observedLine: document.querySelectorAll("#chart-hits polyline.observed").length,
    eventLine: document.querySelectorAll("#chart-events polyline.events").length,
    blockBars: [...document.querySelectorAll("#chart-blocks rect.bar")].map((r) => [r.dataset.worker, r.getAttribute("fill"), Number(r.getAttribute("height"))]),
    loadBars: document.querySelectorAll("#chart-load rect.bar").length,
    alerts: [...document.querySelectorAll("#alerts .alert")].map((a) => a.textContent),
    resources: performance.getEntriesByType("resource").map((e) => e.name),
  })`);
  expect(page.summary).toContain("3 workers");
  expect(page.summary).toContain("1 degraded");
  expect(page.rows).toHaveLength(3);
  expect(page.rows.map((row: string[]) => row[0])).toEqual(["1", "2", "3"]);
  expect(page.rows[0][4]).toBe("hits suspect");
  expect(page.rows[1][4]).toBe("exact");
  expect(page.rows.every((row: string[]) => row[3] === "connected")).toBe(true);
  expect(page.routesNow).toMatch(/\/s$/);
  expect(page.hitsNow).toMatch(/^predicted \d+\.\d% · observed \d+\.\d% \(since start\)$/);
  expect(page.routeLine).toBe(1);
  expect(page.predictedLine).toBe(1);
  expect(page.observedLine).toBe(1);
  expect(page.eventLine).toBe(1);
  expect(page.blockBars.map((bar: [string, string, number]) => [bar[0], bar[1]])).toEqual([
    ["1", "#dc2626"],
    ["2", "#2563eb"],
    ["3", "#2563eb"],
  ]);
  expect(page.blockBars.some((bar: [string, string, number]) => bar[2] > 0)).toBe(true);
  expect(page.loadBars).toBe(3);
  expect(
    page.alerts.some((text: string) =>
      text.startsWith("worker 1: observed hits far below predicted"),
    ),
  ).toBe(true);
  // No external assets: every resource the page loaded is its own server's.
  expect(page.resources.length).toBeGreaterThan(0);
  expect(page.resources.every((url: string) => url.startsWith(serve.controlUrl))).toBe(true);
  const png = await browser.screenshot();
  expect([...png.subarray(1, 4)].map((c) => String.fromCharCode(c)).join("")).toBe("PNG");
  expect(png.length).toBeGreaterThan(20_000);
  writeFileSync(SCREENSHOT, png);
}, 60_000);
