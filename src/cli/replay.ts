import { replayTarget, type TargetReport } from "../sim/replay-driver";
import { DEFAULT_VOCAB_SIZE } from "../sim/tokens";
import { traceStats, transformTrace } from "../sim/trace";
import { parseU64 } from "../util/u64";
import {
  flagBool,
  flagInt,
  flagNumber,
  flagString,
  flagStrings,
  parseFlags,
  UsageError,
} from "./args";
import { type Command, HELP_FLAG } from "./command";
import { loadTrace, TIME_MODEL_FLAGS, TIME_MODEL_HELP, timeModelOf } from "./demo";

const flags = {
  ...HELP_FLAG,
  ...TIME_MODEL_FLAGS,
  trace: { kind: "string" },
  target: { kind: "string", multiple: true },
  engine: { kind: "string", multiple: true },
  requests: { kind: "string" },
  speedup: { kind: "string" },
  "time-scale": { kind: "string" },
  "reset-engines": { kind: "boolean" },
  json: { kind: "boolean" },
} as const;

export const replayCommand: Command = {
  name: "replay",
  summary: "drive running kvedge instances with a Mooncake trace (optionally against real engines)",
  flags,
  help: `Usage: kvedge replay --target URL [--target URL ...] [--engine ID=URL ...] [options]

Replays a trace against each kvedge target in turn (http://HOST:PORT of a kvedge
serve): every request is routed at its (scaled) arrival time over the WebSocket
API, and kvedge is told prefill_done and done. Prompts are synthesized from the
trace's block ids as in kvedge demo.

With --engine ID=URL for every worker, each request is then sent to the chosen
engine's HTTP API (kvedge mock-engine's POST /v1/generate, streaming) and the
lifecycle calls follow the engine's first token and finish. Without engines they
follow the durations the engine model gives each request alone.

Prints per target: decisions, route latency p50/p99 (client-measured), the hit rate
kvedge predicted (sum of overlap blocks × block size / prompt tokens), requests per
worker, and with engines their measured hit rate and modeled TTFT.

Options:
  --trace FILE           Mooncake-format JSONL trace (default: the embedded conversation trace)
  --target URL           a running kvedge serve (repeat for several, replayed one after another)
  --engine ID=URL        worker ID's engine HTTP API (repeat; e.g. 0=http://127.0.0.1:9000)
  --requests N           requests from the start of the trace (default: all)
  --time-scale F         multiply arrival times by F (1)
  --speedup X            model seconds per wall second (1)
  --reset-engines        POST /v1/reset to every engine before each target (mock engines)
  --json                 print one JSON object on stdout instead of the summary
${TIME_MODEL_HELP}  -h, --help             show this help
`,
  async run(argv) {
    const parsed = parseFlags(argv, flags);
    if (parsed.positionals.length > 0)
      throw new UsageError(`unexpected argument '${parsed.positionals[0]}'`);
    const targets = flagStrings(parsed, "target");
    if (targets.length === 0)
      throw new UsageError("--target URL is required (a running kvedge serve)");
    for (const target of targets) {
      if (!/^https?:\/\/[^/]+\/?$/.test(target))
        throw new UsageError(`--target must be http://HOST:PORT, got '${target}'`);
    }
    const engines = engineMap(flagStrings(parsed, "engine"));
    const speedup = flagNumber(parsed, "speedup", 1, 0.001, 1e6);
    const timeScale = flagNumber(parsed, "time-scale", 1, 1e-6, 1e6);
    const time = timeModelOf(parsed);
    const loaded = await loadTrace(flagString(parsed, "trace"));
    const requests = flagInt(parsed, "requests", loaded.trace.count, 1, 50_000_000);
    const trace = transformTrace(loaded.trace, { requests, timeScale });
    const json = flagBool(parsed, "json");
    const tty = process.stderr.isTTY === true;
    const reports: TargetReport[] = [];
    const run = Date.now().toString(36);
    for (let t = 0; t < targets.length; t++) {
      const target = targets[t]!;
      if (engines !== null && flagBool(parsed, "reset-engines")) await resetEngines(engines);
      const report = await replayTarget({
        trace,
        target,
        engines,
        speedup,
        time,
        vocabSize: DEFAULT_VOCAB_SIZE,
        requestPrefix: `replay-${run}-${t}-`,
        ...(tty
          ? {
              progress: (routed: number, total: number) => {
                process.stderr.write(`\r\x1b[2K${target}  ${routed}/${total} requests routed`);
              },
            }
          : {}),
      });
      if (tty) process.stderr.write("\r\x1b[2K");
      reports.push(report);
    }
    const config = {
      trace: loaded.name,
      requests: trace.count,
      time_scale: timeScale,
      speedup,
      span_s: traceStats(trace).spanMs / 1000,
    };
    if (json) {
      process.stdout.write(`${JSON.stringify({ targets: reports, config })}\n`);
    } else {
      process.stdout.write(
        `kvedge replay: ${trace.count} requests of ${loaded.name} (${config.span_s.toFixed(0)} s of arrivals at ×${speedup}).\n`,
      );
      for (const report of reports) process.stdout.write(renderTarget(report));
    }
    const failed = reports.some(
      (report) =>
        report.route_failures > 0 ||
        report.lifecycle_errors > 0 ||
        report.unmapped_workers > 0 ||
        (report.engines?.failed ?? 0) > 0,
    );
    return failed ? 1 : 0;
  },
};

function engineMap(entries: readonly string[]): Map<string, string> | null {
  if (entries.length === 0) return null;
  const map = new Map<string, string>();
  for (const entry of entries) {
    const match = /^([^=]+)=(https?:\/\/[^/]+\/?)$/.exec(entry);
    const id = match === null ? null : parseU64(match[1]);
    if (match === null || id === null)
      throw new UsageError(`--engine must be ID=http://HOST:PORT, got '${entry}'`);
    if (map.has(id.toString())) throw new UsageError(`--engine ${id} given twice`);
    map.set(id.toString(), match[2]!.replace(/\/$/, ""));
  }
  return map;
}

async function resetEngines(engines: ReadonlyMap<string, string>): Promise<void> {
  for (const [id, url] of engines) {
    const response = await fetch(`${url}/v1/reset`, { method: "POST" });
    if (!response.ok)
      throw new Error(
        `resetting engine ${id} (${url}): HTTP ${response.status} ${await response.text()}`,
      );
  }
}

function renderTarget(report: TargetReport): string {
  const lines = [
    `\n${report.target}: ${report.decisions}/${report.requests} routed in ${report.wall_s.toFixed(1)} s` +
      `, route latency p50 ${report.route_latency_p50_ms.toFixed(2)} ms, p99 ${report.route_latency_p99_ms.toFixed(2)} ms`,
    `  predicted hit rate ${(100 * report.predicted_hit_rate).toFixed(1)}%; requests per worker: ` +
      Object.entries(report.requests_per_worker)
        .sort(([a], [b]) => (BigInt(a) < BigInt(b) ? -1 : 1))
        .map(([id, count]) => `${id}=${count}`)
        .join(" "),
  ];
  if (report.engines !== null) {
    lines.push(
      `  engines: ${report.engines.completed} completed, ${report.engines.failed} failed;` +
        ` measured hit rate ${(100 * report.engines.hit_rate).toFixed(1)}%, TTFT p50 ${report.engines.ttft_p50_ms.toFixed(0)} ms,` +
        ` p99 ${report.engines.ttft_p99_ms.toFixed(0)} ms (modeled)`,
    );
  }
  const problems =
    report.route_failures +
    report.lifecycle_errors +
    report.unmapped_workers +
    (report.engines?.failed ?? 0);
  if (problems > 0) {
    lines.push(
      `  problems: ${report.route_failures} route failures, ${report.lifecycle_errors} lifecycle errors,` +
        ` ${report.unmapped_workers} unmapped workers; first: ${report.first_error}`,
    );
  }
  return `${lines.join("\n")}\n`;
}
