// Goal: the proxy's tokens are the engine's tokens. kvedge's tokenizer (the official
// Hugging Face bindings, through src/proxy/tokenizer.ts) gives exactly the ids of the
// bindings called directly, and of the independent pure-JS implementation
// (@huggingface/tokenizers, on well-formed text), on real Qwen3 and Llama 3 tokenizer
// files: hand-written edge cases and thousands of random strings, lone surrogates
// included. Its chat templates render exactly as transformers renders them for vLLM
// (Python's jinja2 with transformers' environment), on conversations with system
// prompts, several turns, tools and reasoning.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";
import { createRng, randomInt, type Rng } from "../../src/sim/random";
import { chatMessages } from "../../src/proxy/openai";
import { loadTokenizer } from "../../src/proxy/tokenizer";
import { LLAMA3_DIR, QWEN3_DIR } from "../support/tokenizers";

const RANDOM_STRINGS = 2000;
const binding = require("tokenizers/tokenizers.linux-x64-gnu.node") as {
  Tokenizer: {
    fromFile(path: string): {
      encode(
        text: string,
        pair: null,
        options: { addSpecialTokens: boolean },
      ): Promise<{ getIds(): number[] }>;
    };
  };
};

const EDGE_CASES = [
  "",
  " ",
  "  ",
  "\n",
  "\n\n\n",
  "\t",
  " \t\n ",
  "a",
  "A",
  "hello world",
  "Hello, World!",
  "  leading",
  "trailing  ",
  "don't can't won't I'm you're",
  "1234567890",
  "3.14159",
  "1,000,000",
  "0x1F",
  "v1.2.3-beta+build.7",
  "日本語のテキスト",
  "中文测试，标点。",
  "한국어",
  "Ελληνικά",
  "русский текст",
  "עברית",
  "العربية",
  "हिन्दी",
  "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦",
  "🇫🇷🇯🇵",
  "e\u0301 combining",
  "\u00e9 precomposed",
  "\u200b zero width \u200d joiner",
  "\ufeffBOM",
  "\u0000 nul \u0001 ctrl \u007f del",
  "\r\n windows \r mac",
  "tabs\tinside\twords",
  "<|im_start|>user\nhi<|im_end|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
  "<|endoftext|>",
  "<|im_start",
  "|>",
  "<|",
  "<think>\n</think>",
  "```python\ndef f(x):\n    return x * 2\n```",
  "    indented code\n        more",
  '{"json": [1, 2, {"k": null}]}',
  "https://example.com/path?q=1&r=2#frag",
  "user@example.com",
  "ALLCAPS SHOUTING",
  "CamelCaseIdentifier snake_case_name",
  "a".repeat(1000),
  "ab ".repeat(300),
  "🎉".repeat(100),
  `${" ".repeat(50)}x`,
  "lone high \ud800 surrogate",
  "lone low \udc00 surrogate",
  "\udbff\udfff pair at the top",
  "\ud83d",
  "x\udfffy",
  "\ud800\ud800",
];

const PIECES = [
  " ",
  "  ",
  "\n",
  "\t",
  "\r\n",
  "the",
  " the",
  "The",
  "router",
  " cache",
  "KV",
  "token",
  "ization",
  "'s",
  "n't",
  "!",
  "?",
  ".",
  ",",
  ";",
  "...",
  "—",
  "–",
  "«",
  "»",
  "“",
  "”",
  "(",
  ")",
  "[",
  "]",
  "{",
  "}",
  "<",
  ">",
  "/",
  "\\",
  "#",
  "$",
  "%",
  "&",
  "*",
  "+",
  "=",
  "_",
  "-",
  "0",
  "7",
  "42",
  "2026",
  "3.5",
  "日本",
  "語",
  "中文",
  "한",
  "ü",
  "ß",
  "ø",
  "é",
  "e\u0301",
  "😀",
  "👍🏽",
  "🇯🇵",
  "\u200b",
  "\ufeff",
  "<|im_start|>",
  "<|im_end|>",
  "<|endoftext|>",
  "<|begin_of_text|>",
  "<|eot_id|>",
  "<think>",
  "</think>",
  "\u0000",
  "\u001b[0m",
];

function randomString(rng: Rng): string {
  const parts: string[] = [];
  const count = 1 + randomInt(rng, 40);
  for (let i = 0; i < count; i++) {
    const kind = randomInt(rng, 10);
    if (kind < 6) parts.push(PIECES[randomInt(rng, PIECES.length)]!);
    else if (kind < 8)
      parts.push(String.fromCharCode(0x20 + randomInt(rng, 0x5f))); // printable ASCII
    else if (kind === 8)
      parts.push(String.fromCodePoint(randomInt(rng, 0x30000))); // any code point below plane 3 (lone surrogates too)
    else parts.push(String.fromCharCode(0xd800 + randomInt(rng, 0x800))); // a lone surrogate
  }
  return parts.join("");
}

const TOKENIZERS = [
  ["Qwen3", QWEN3_DIR],
  ["Llama 3", LLAMA3_DIR],
] as const;

describe("tokenizer parity", () => {
  for (const [name, dir] of TOKENIZERS) {
    test(`${name}: kvedge = the bindings = @huggingface/tokenizers, on edge cases and ${RANDOM_STRINGS} random strings`, async () => {
      const kvedge = loadTokenizer(dir);
      const direct = binding.Tokenizer.fromFile(join(dir, "tokenizer.json"));
      const js = new JsTokenizer(
        JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
        JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
      );
      const rng = createRng(name.length * 7919);
      const inputs = [
        ...EDGE_CASES,
        ...Array.from({ length: RANDOM_STRINGS }, () => randomString(rng)),
      ];
      let surrogates = 0;
      const mismatches: string[] = [];
      for (let i = 0; i < inputs.length; i++) {
        const text = inputs[i]!;
        if (!text.isWellFormed()) surrogates++;
        const special = i % 2 === 0;
        const ours = Array.from(await kvedge.encode(text, special));
        const official = (await direct.encode(text, null, { addSpecialTokens: special })).getIds();
        const pure = js.encode(text.toWellFormed(), { add_special_tokens: special }).ids;
        if (
          JSON.stringify(ours) !== JSON.stringify(official) ||
          JSON.stringify(ours) !== JSON.stringify(pure)
        ) {
          mismatches.push(JSON.stringify(text));
        }
      }
      expect(mismatches).toEqual([]);
      expect(surrogates).toBeGreaterThan(RANDOM_STRINGS / 4);
    }, 60_000);
  }
});

// transformers' chat-template environment (PreTrainedTokenizerBase._compile_jinja_template),
// which vLLM's chat endpoints use.
const PYTHON_RENDER = `
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
job = json.load(sys.stdin)
template = env.from_string(job["template"])
print(json.dumps([template.render(**context) for context in job["contexts"]]))
`;

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

const CONVERSATIONS: { messages: Record<string, unknown>[]; tools?: unknown }[] = [
  { messages: [{ role: "user", content: "Hi!" }] },
  {
    messages: [
      { role: "system", content: "Be terse." },
      { role: "user", content: "What is a KV cache?" },
    ],
  },
  {
    messages: [
      { role: "system", content: "You are helpful." },
      { role: "user", content: "First question" },
      { role: "assistant", content: "First answer" },
      { role: "user", content: "  Second question with spaces  \n" },
    ],
  },
  {
    messages: [
      { role: "user", content: "Think about it" },
      { role: "assistant", content: "<think>\nreasoning here\n</think>\n\nThe answer." },
      { role: "user", content: "Again" },
    ],
  },
  { messages: [{ role: "user", content: "Weather in Paris?" }], tools: TOOLS },
  {
    messages: chatMessages({
      messages: [
        { role: "user", content: "Weather in Paris?" },
        {
          role: "assistant",
          content: "",
          tool_calls: [
            {
              id: "c1",
              type: "function",
              function: { name: "get_weather", arguments: '{"city": "Paris"}' },
            },
          ],
        },
        { role: "tool", tool_call_id: "c1", content: '{"temp_c": 21}' },
      ],
    }),
    tools: TOOLS,
  },
  {
    messages: [
      { role: "user", content: "日本語で答えて 😀" },
      { role: "assistant", content: "はい" },
      { role: "user", content: "ありがとう" },
    ],
  },
];

test("tool calls reach the template as vLLM passes them: arguments parsed from JSON", () => {
  const [message] = chatMessages({
    messages: [
      {
        role: "assistant",
        tool_calls: [
          { function: { name: "f", arguments: '{"a": [1, 2]}' } },
          { function: { name: "g", arguments: "" } },
        ],
      },
    ],
  });
  expect(message!.tool_calls).toEqual([
    { function: { name: "f", arguments: { a: [1, 2] } } },
    { function: { name: "g", arguments: {} } },
  ]);
  expect(message!.content).toBe("");
  expect(() =>
    chatMessages({
      messages: [{ role: "assistant", tool_calls: [{ function: { name: "f", arguments: "{" } }] }],
    }),
  ).toThrow("messages[0].tool_calls[0].function.arguments is not valid JSON");
});

describe("chat template parity with transformers' jinja2", () => {
  // The first Python with jinja2: the one on PATH, else Debian's (python3-jinja2).
  const pythonBin =
    ["python3", "/usr/bin/python3"].find(
      (bin) => Bun.spawnSync([bin, "-c", "import jinja2"]).exitCode === 0,
    ) ?? "python3";
  const python = Bun.spawnSync([pythonBin, "-c", "import jinja2"]);
  for (const [name, dir] of TOKENIZERS) {
    test(`${name}: every conversation renders as vLLM renders it`, () => {
      expect(
        python.exitCode === 0
          ? "jinja2 available"
          : "python3 with jinja2 missing (apt-get install python3-jinja2)",
      ).toBe("jinja2 available");
      const kvedge = loadTokenizer(dir);
      const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) as Record<
        string,
        unknown
      >;
      const special = (key: string) => {
        const value = config[key] as string | { content: string } | null | undefined;
        return typeof value === "string" ? value : value?.content;
      };
      const contexts = [];
      const ours = [];
      for (const conversation of CONVERSATIONS) {
        for (const addGenerationPrompt of [true, false]) {
          contexts.push({
            messages: conversation.messages,
            tools: conversation.tools ?? null,
            add_generation_prompt: addGenerationPrompt,
            continue_final_message: false,
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
            pad_token: special("pad_token"),
            unk_token: special("unk_token"),
          });
          ours.push(
            kvedge.renderChat(conversation.messages, {
              addGenerationPrompt,
              tools: conversation.tools,
            }),
          );
        }
      }
      const result = Bun.spawnSync([pythonBin, "-c", PYTHON_RENDER], {
        stdin: new TextEncoder().encode(
          JSON.stringify({ template: config.chat_template, contexts }),
        ),
      });
      expect(result.stderr.toString()).toBe("");
      expect(ours).toEqual(JSON.parse(result.stdout.toString()) as string[]);
    });
  }
});
