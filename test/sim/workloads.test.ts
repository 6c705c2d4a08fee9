// Goal: the generated traces are Mooncake-format, deterministic for a seed, and have the
// shape their documentation promises: a burst's requests share a fresh prefix and arrive
// within the window; an agent session sends its whole previous context with every turn,
// sub-agents share it, and sessions of one agent type share its system prompt.
import { describe, expect, test } from "bun:test";
import { MOONCAKE_BLOCK_TOKENS, parseTrace } from "../../src/sim/trace";
import { agenticTrace, burstTrace, DEFAULT_BURST } from "../../src/sim/workloads";

interface Line {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
  session_id: string;
}

const lines = (text: string): Line[] =>
  text
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as Line);

describe("burst", () => {
  test("bursts of 64 sharing a fresh 8-block prefix within 50 ms; nothing shared across bursts", () => {
    const text = burstTrace();
    expect(burstTrace()).toBe(text);
    expect(burstTrace({ seed: 8 })).not.toBe(text);
    const trace = parseTrace(text);
    expect(trace.count).toBe(DEFAULT_BURST.bursts * DEFAULT_BURST.requestsPerBurst);
    const bursts = new Map<string, Line[]>();
    for (const line of lines(text)) {
      const list = bursts.get(line.session_id) ?? [];
      list.push(line);
      bursts.set(line.session_id, list);
    }
    const prefixes = new Set<string>();
    for (const [, burst] of bursts) {
      expect(burst).toHaveLength(64);
      const prefix = burst[0]!.hash_ids.slice(0, 8).join(",");
      expect(prefixes.has(prefix)).toBe(false);
      prefixes.add(prefix);
      const times = burst.map((line) => line.timestamp);
      expect(Math.max(...times) - Math.min(...times)).toBeLessThanOrEqual(50);
      for (const line of burst) {
        expect(line.hash_ids.slice(0, 8).join(",")).toBe(prefix);
        expect(line.input_length).toBeGreaterThan(8 * MOONCAKE_BLOCK_TOKENS);
        // The suffix is the request's own.
        expect(line.hash_ids.length).toBe(Math.ceil(line.input_length / MOONCAKE_BLOCK_TOKENS));
      }
    }
  });
});

describe("agentic", () => {
  const text = agenticTrace({ sessions: 60, seed: 3 });
  const all = lines(text);

  test("Mooncake format, sorted by arrival, deterministic", () => {
    expect(agenticTrace({ sessions: 60, seed: 3 })).toBe(text);
    expect(parseTrace(text).count).toBe(all.length);
    for (let i = 1; i < all.length; i++)
      expect(all[i]!.timestamp).toBeGreaterThanOrEqual(all[i - 1]!.timestamp);
    for (const line of all)
      expect(line.hash_ids.length).toBe(Math.ceil(line.input_length / MOONCAKE_BLOCK_TOKENS));
  });

  test("every turn sends the session's context so far: the previous turn's full blocks are its prefix", () => {
    const turns = new Map<string, Line[]>();
    for (const line of all) {
      if (line.session_id.includes("/")) continue;
      const list = turns.get(line.session_id) ?? [];
      list.push(line);
      turns.set(line.session_id, list);
    }
    let checked = 0;
    for (const [, session] of turns) {
      for (let k = 1; k < session.length; k++) {
        const before = session[k - 1]!;
        const full = Math.floor(before.input_length / MOONCAKE_BLOCK_TOKENS);
        expect(session[k]!.hash_ids.slice(0, full)).toEqual(before.hash_ids.slice(0, full));
        expect(session[k]!.input_length).toBeGreaterThan(before.input_length);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(100);
  });

  test("sub-agents share their session's context and arrive within 50 ms; agent types share system prompts", () => {
    const fans = new Map<string, Line[]>();
    for (const line of all) {
      const at = line.session_id.indexOf("/sub-");
      if (at < 0) continue;
      const turn = line.session_id.slice(0, line.session_id.lastIndexOf("-"));
      const list = fans.get(turn) ?? [];
      list.push(line);
      fans.set(turn, list);
    }
    expect(fans.size).toBeGreaterThan(0);
    for (const [, fan] of fans) {
      expect(fan.length).toBeGreaterThanOrEqual(4);
      const times = fan.map((line) => line.timestamp);
      expect(Math.max(...times) - Math.min(...times)).toBeLessThanOrEqual(50);
      const first = fan[0]!.hash_ids;
      const shared = fan.every((line) => line.hash_ids[0] === first[0]);
      expect(shared).toBe(true);
    }
    // The most used first block (a system prompt) opens many sessions.
    const opens = new Map<number, number>();
    for (const line of all) opens.set(line.hash_ids[0]!, (opens.get(line.hash_ids[0]!) ?? 0) + 1);
    expect(Math.max(...opens.values())).toBeGreaterThan(all.length / 8);
  });
});
