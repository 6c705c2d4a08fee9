/**
 * How the demo tells kvedge serve about its engines: by their event endpoints, or, for
 * the engines that publish no events (`--events none|mixed`), as approximate workers
 * with the capacity kvedge is told. Shared by the routing-API and the proxied runs.
 */
import { approximateEngines, type DemoOptions } from "./demo-options";
import type { NetworkedEngine } from "./networked-engine";

/**
 * kvedge serve's --workers: an engine that publishes events by its endpoints, one that
 * does not as `ID=none` with the capacity kvedge is told (and its OpenAI server, `http`).
 */
export function workersArg(
  engines: readonly NetworkedEngine[],
  options: DemoOptions,
  https: readonly string[] | null,
): string {
  const approximate = new Set(approximateEngines(options.events ?? "all", engines.length));
  const capacity = options.predictedCapacityBlocks ?? options.capacityBlocks;
  return engines
    .map((engine, w) => {
      const http = https === null ? "" : `;http=${https[w]}`;
      return approximate.has(w)
        ? `${w}=none;capacity=${capacity}${http}`
        : `${w}=${engine.endpoint};replay=${engine.replayEndpoint}${http}`;
    })
    .join(",");
}

/** The engines kvedge subscribes to (it waits for their PUB sockets to see it). */
export function exactEngines(
  engines: readonly NetworkedEngine[],
  options: DemoOptions,
): NetworkedEngine[] {
  const approximate = new Set(approximateEngines(options.events ?? "all", engines.length));
  return engines.filter((_, w) => !approximate.has(w));
}
