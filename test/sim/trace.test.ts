// Goal: Mooncake traces parse with every documented alias, transform exactly as
// Dynamo's benchmark does (clamp, length factor, duplication, time scale, truncation),
// reject bad lines with an error naming the line, and synthesize deterministic prompts
// in which equal block ids mean equal tokens.
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import {
  CONVERSATION_TRACE_SHA256,
  conversationTracePath,
  loadConversationTrace,
} from "../../src/sim/embedded-trace";
import { requestTokens } from "../../src/sim/simulator";
import {
  DEFAULT_VOCAB_SIZE,
  writeIdTokens,
  writeOutputTokens,
  writePromptTokens,
} from "../../src/sim/tokens";
import {
  parseTrace,
  requestIds,
  TraceError,
  traceStats,
  transformTrace,
} from "../../src/sim/trace";

const lines = (...records: unknown[]): string =>
  records.map((record) => JSON.stringify(record)).join("\n");

function errorOf(text: string): TraceError {
  try {
    parseTrace(text);
  } catch (error) {
    if (error instanceof TraceError) return error;
    throw error;
  }
  throw new Error("expected a TraceError");
}

describe("parseTrace", () => {
  test("reads the Mooncake fields into arrays", () => {
    const trace = parseTrace(
      lines(
        { timestamp: 0, input_length: 600, output_length: 10, hash_ids: [0, 1] },
        { timestamp: 5, input_length: 512, output_length: 3, hash_ids: [0] },
      ),
    );
    expect(trace.count).toBe(2);
    expect(trace.blockTokens).toBe(512);
    expect(Array.from(trace.arrivalMs)).toEqual([0, 5]);
    expect(Array.from(trace.inputLength)).toEqual([600, 512]);
    expect(Array.from(trace.outputLength)).toEqual([10, 3]);
    expect(Array.from(requestIds(trace, 0))).toEqual([0, 1]);
    expect(Array.from(requestIds(trace, 1))).toEqual([0]);
    expect(trace.sessions).toBeNull();
  });

  test("accepts the aliases input_tokens, output_tokens, created_time; ignores unknown fields", () => {
    const trace = parseTrace(
      lines({
        created_time: 7,
        input_tokens: 100,
        output_tokens: 2,
        hash_ids: [3],
        priority: 1,
        request_id: "x",
        extra: true,
      }),
    );
    expect(trace.arrivalMs[0]).toBe(7);
    expect(trace.inputLength[0]).toBe(100);
    expect(trace.outputLength[0]).toBe(2);
  });

  test("clamps input_length to len(hash_ids) × 512", () => {
    const trace = parseTrace(
      lines({ timestamp: 0, input_length: 5000, output_length: 1, hash_ids: [1, 2] }),
    );
    expect(trace.inputLength[0]).toBe(1024);
  });

  test("without a timestamp, delay counts from the session's previous request (open loop)", () => {
    const trace = parseTrace(
      lines(
        { timestamp: 100, session_id: "a", input_length: 10, output_length: 1, hash_ids: [1] },
        { timestamp: 150, session_id: "b", input_length: 10, output_length: 1, hash_ids: [2] },
        { delay: 1000, session_id: "a", input_length: 10, output_length: 1, hash_ids: [1, 3] },
        { delay_ms: 20, input_length: 10, output_length: 1, hash_ids: [4] },
      ),
    );
    // Sorted by arrival: a@100, b@150, (no session)@1120, a@1100 → 100, 150, 1100, 1120.
    expect(Array.from(trace.arrivalMs)).toEqual([100, 150, 1100, 1120]);
    expect(trace.sessions).toEqual(["a", "b", "a", null]);
  });

  test("skips blank lines and counts lines from 1", () => {
    const text = `\n${lines({ timestamp: 0, input_length: 1, output_length: 1, hash_ids: [0] })}\n\n{"timestamp": 1}\n`;
    const error = errorOf(text);
    expect(error.line).toBe(4);
    expect(error.message).toBe("trace line 4: hash_ids must be an array of non-negative integers");
  });

  test("bad lines fail with the line number and what is wrong", () => {
    const ok = { timestamp: 0, input_length: 10, output_length: 1, hash_ids: [0] };
    const cases: [unknown, string][] = [
      ["not json", "not JSON"],
      [[1, 2], "must be a JSON object"],
      [{ ...ok, hash_ids: [1, -2] }, "hash_ids[1] must be an integer in [0, 4294967295], got -2"],
      [{ ...ok, hash_ids: [1.5] }, "hash_ids[0] must be an integer"],
      [{ ...ok, input_length: undefined }, "input_length is missing"],
      [{ ...ok, output_length: undefined }, "output_length is missing"],
      [{ ...ok, input_length: -1 }, "input_length must be a non-negative integer, got -1"],
      [{ ...ok, output_length: "3" }, 'output_length must be a non-negative integer, got "3"'],
      [{ ...ok, timestamp: "soon" }, 'timestamp must be a non-negative number, got "soon"'],
      [{ ...ok, hash_ids: [] }, "empty prompt"],
      [{ ...ok, input_length: 0 }, "empty prompt"],
      [{ ...ok, session_id: { a: 1 } }, "session_id must be a string or a number"],
    ];
    for (const [record, message] of cases) {
      const body = typeof record === "string" ? record : JSON.stringify(record);
      const error = errorOf(`${JSON.stringify(ok)}\n${body}`);
      expect(error.line).toBe(2);
      expect(error.message).toContain(`trace line 2: ${message}`);
    }
    expect(errorOf("").message).toBe("trace: no requests");
  });
});

describe("transformTrace", () => {
  const base = parseTrace(
    lines(
      { timestamp: 0, input_length: 700, output_length: 5, hash_ids: [0, 1], session_id: "s" },
      { timestamp: 10, input_length: 100, output_length: 6, hash_ids: [2], session_id: "t" },
    ),
  );

  test("length factor F: id h → h·F … h·F+F−1, prompt × F", () => {
    const trace = transformTrace(base, { lengthFactor: 3 });
    expect(Array.from(requestIds(trace, 0))).toEqual([0, 1, 2, 3, 4, 5]);
    expect(Array.from(requestIds(trace, 1))).toEqual([6, 7, 8]);
    expect(Array.from(trace.inputLength)).toEqual([2100, 300]);
    expect(Array.from(trace.outputLength)).toEqual([5, 6]);
  });

  test("duplication K: copy c shifts ids by c·(max_id+1), same times, session suffixes", () => {
    const trace = transformTrace(base, { duplicationFactor: 2 });
    expect(trace.count).toBe(4);
    expect(Array.from(trace.arrivalMs)).toEqual([0, 0, 10, 10]);
    expect(Array.from(requestIds(trace, 0))).toEqual([0, 1]);
    expect(Array.from(requestIds(trace, 1))).toEqual([3, 4]);
    expect(Array.from(requestIds(trace, 3))).toEqual([5]);
    expect(trace.sessions).toEqual(["s:copy_0", "s:copy_1", "t:copy_0", "t:copy_1"]);
  });

  test("F then K compose; time scale multiplies arrivals; requests truncates", () => {
    const trace = transformTrace(base, {
      lengthFactor: 2,
      duplicationFactor: 2,
      timeScale: 0.5,
      requests: 3,
    });
    expect(trace.count).toBe(3);
    expect(Array.from(requestIds(trace, 1))).toEqual([6, 7, 8, 9]); // shift (2+1)·2 = 6
    expect(Array.from(trace.arrivalMs)).toEqual([0, 0, 5]);
  });

  test("rejects bad factors", () => {
    expect(() => transformTrace(base, { lengthFactor: 0 })).toThrow("length factor");
    expect(() => transformTrace(base, { duplicationFactor: 1.5 })).toThrow("duplication factor");
    expect(() => transformTrace(base, { timeScale: 0 })).toThrow("time scale");
    expect(() => transformTrace(base, { requests: 0 })).toThrow("request count");
    expect(() => transformTrace(base, { lengthFactor: 2 ** 31 })).toThrow("overflow");
  });
});

describe("the shipped conversation trace", () => {
  test("is byte-identical to the Mooncake release", () => {
    const digest = createHash("sha256").update(readFileSync(conversationTracePath)).digest("hex");
    expect(digest).toBe(CONVERSATION_TRACE_SHA256);
  });

  test("parses to the documented shape", async () => {
    const trace = await loadConversationTrace();
    const stats = traceStats(trace);
    expect(stats.requests).toBe(12_031);
    expect(stats.spanMs).toBe(3_536_999);
    expect(stats.distinctIds).toBe(182_790);
    expect(trace.hashIds.length).toBe(288_500);
    expect(Math.round(stats.promptTokens / stats.requests)).toBe(12_035);
  });
});

describe("token synthesis", () => {
  test("a block id always gives the same tokens, in range", () => {
    const a = new Uint32Array(512);
    const b = new Uint32Array(512);
    writeIdTokens(12345, 512, 0, 512, DEFAULT_VOCAB_SIZE, a, 0);
    writeIdTokens(12345, 512, 0, 512, DEFAULT_VOCAB_SIZE, b, 0);
    expect(b).toEqual(a);
    expect(Math.max(...a)).toBeLessThan(DEFAULT_VOCAB_SIZE);
    expect(new Set(a).size).toBeGreaterThan(500); // not a constant or a short cycle
    const part = new Uint32Array(16);
    writeIdTokens(12345, 512, 100, 116, DEFAULT_VOCAB_SIZE, part, 0);
    expect(part).toEqual(a.subarray(100, 116));
  });

  test("different ids differ at every 16-token block", () => {
    const blocks = new Set<string>();
    const out = new Uint32Array(512);
    for (let id = 0; id < 2000; id++) {
      writeIdTokens(id, 512, 0, 512, DEFAULT_VOCAB_SIZE, out, 0);
      for (let b = 0; b < 32; b++)
        blocks.add(`${b}:${out.subarray(16 * b, 16 * b + 16).join(",")}`);
    }
    expect(blocks.size).toBe(2000 * 32);
  });

  test("a prompt is its ids' blocks concatenated, truncated to the input length", () => {
    const ids = Uint32Array.from([7, 8, 9]);
    const prompt = new Uint32Array(1100);
    writePromptTokens(ids, 512, 1100, 1000, prompt);
    const block = new Uint32Array(512);
    writeIdTokens(8, 512, 0, 512, 1000, block, 0);
    expect(prompt.subarray(512, 1024)).toEqual(block);
    writeIdTokens(9, 512, 0, 76, 1000, block, 0);
    expect(prompt.subarray(1024)).toEqual(block.subarray(0, 76));
    expect(() => writePromptTokens(ids, 512, 1537, 1000, new Uint32Array(2000))).toThrow(
      "from 3 blocks",
    );
  });

  test("requests with equal leading ids share exactly those prompt tokens", async () => {
    const trace = await loadConversationTrace();
    const first = requestTokens(trace, 0, DEFAULT_VOCAB_SIZE);
    const second = requestTokens(trace, 1, DEFAULT_VOCAB_SIZE);
    expect(requestIds(trace, 0)[0]).toBe(requestIds(trace, 1)[0]!); // both start with id 0
    expect(second.subarray(0, 512)).toEqual(first.subarray(0, 512));
    expect(second.subarray(512, 528)).not.toEqual(first.subarray(512, 528));
    expect(first.length).toBe(trace.inputLength[0]! + trace.outputLength[0]!);
    expect(requestTokens(trace, 0, DEFAULT_VOCAB_SIZE)).toEqual(first);
  });

  test("output tokens are deterministic per request and unlike other requests'", () => {
    const a = new Uint32Array(5000);
    const b = new Uint32Array(5000);
    writeOutputTokens(1, 5000, DEFAULT_VOCAB_SIZE, a, 0);
    writeOutputTokens(1, 5000, DEFAULT_VOCAB_SIZE, b, 0);
    expect(b).toEqual(a);
    writeOutputTokens(2, 5000, DEFAULT_VOCAB_SIZE, b, 0);
    expect(b.subarray(0, 16)).not.toEqual(a.subarray(0, 16));
    expect(b.subarray(4096, 4112)).not.toEqual(a.subarray(4096, 4112));
  });
});
