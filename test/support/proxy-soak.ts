/**
 * A load of proxied requests that end every way a request can (test/proxy/soak-e2e and
 * bench/proxy-load.ts --scenario soak): clients in closed loops send streamed and plain
 * completions to `kvedge serve --proxy` in front of a FaultyEngine, and at random leave
 * early (before the answer, after its first event) or ask the engine to fail (an error
 * status, garbage, a close or reset before or mid-answer, broken framing, a hang that a
 * timeout ends). The clients use kvedge's own HTTP client: the process's fetch is capped.
 */
import { Exchange, originOf } from "../../src/http/client";
import type { Fault } from "./faulty-engine";

export interface SoakOptions {
  readonly url: string;
  readonly clients: number;
  /** Clients stop starting requests once this is true. */
  readonly stop: (counts: SoakCounts) => boolean;
  readonly random: () => number;
}

export interface SoakCounts {
  requests: number;
  /** Streams read to their [DONE], plain answers read whole. */
  answered: number;
  /** Left on purpose before the end. */
  left: number;
  /** Cut by kvedge (the engine failed or stalled). */
  cut: number;
  /** Refused or failed with an error status. */
  errors: number;
  /** A stream that ended without [DONE] and without an error: must stay 0. */
  truncated: number;
}

type Action = "stream" | "plain" | "leave-early" | "leave-mid" | Fault;

/** How often each action is taken (the rest of the weight is plain streams). */
const ACTIONS: readonly [Action, number][] = [
  ["plain", 0.1],
  ["leave-early", 0.08],
  ["leave-mid", 0.08],
  ["status", 0.03],
  ["garbage", 0.02],
  ["close-before", 0.02],
  ["reset-before", 0.02],
  ["hang-before", 0.02],
  ["close-mid", 0.03],
  ["reset-mid", 0.03],
  ["garble-mid", 0.02],
  ["hang-mid", 0.02],
];

function pick(random: () => number): Action {
  let draw = random();
  for (const [action, weight] of ACTIONS) {
    if (draw < weight) return action;
    draw -= weight;
  }
  return "stream";
}

const TIMEOUTS = { connectMs: 10_000, firstByteMs: 60_000, idleMs: 60_000 };

export async function soak(options: SoakOptions): Promise<SoakCounts> {
  const counts: SoakCounts = { requests: 0, answered: 0, left: 0, cut: 0, errors: 0, truncated: 0 };
  const origin = originOf(options.url);
  const client = async (id: number): Promise<void> => {
    while (!options.stop(counts)) {
      const action = pick(options.random);
      const stream = action !== "plain";
      const fault: Fault =
        action === "stream" || action === "plain" || action.startsWith("leave")
          ? "ok"
          : (action as Fault);
      const body = { prompt: [1 + (id % 97), 2, 3, 4], max_tokens: 2, stream, x_fault: fault };
      counts.requests++;
      const exchange = new Exchange(
        {
          origin,
          method: "POST",
          path: "/v1/completions",
          headers: [["content-type", "application/json"]],
          body: new TextEncoder().encode(JSON.stringify(body)),
        },
        TIMEOUTS,
      );
      if (action === "leave-early") {
        await Bun.sleep(0);
        exchange.abort();
        counts.left++;
        continue;
      }
      await run(exchange, action, stream, counts);
    }
  };
  await Promise.all(Array.from({ length: options.clients }, (_, id) => client(id)));
  return counts;
}

async function run(
  exchange: Exchange,
  action: Action,
  stream: boolean,
  counts: SoakCounts,
): Promise<void> {
  let text = "";
  try {
    const head = await exchange.head;
    for (;;) {
      const step = await exchange.read();
      if (step.done) break;
      text += new TextDecoder().decode(step.value);
      if (action === "leave-mid") {
        exchange.abort();
        counts.left++;
        return;
      }
    }
    if (head.status !== 200) counts.errors++;
    else if (!stream || text.endsWith("data: [DONE]\n\n")) counts.answered++;
    else counts.truncated++;
  } catch {
    counts.cut++;
  }
}
