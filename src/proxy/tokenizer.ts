/**
 * The model's own tokenizer, as the engine runs it: Hugging Face `tokenizers` (the
 * official Rust library, through its N-API bindings) over the model's tokenizer.json,
 * and its chat template from tokenizer_config.json rendered with `@huggingface/jinja`.
 * Nothing is downloaded: a directory with the two files is given.
 *
 * Routing on tokens that differ from the engine's gives zero hits without any error,
 * so a tokenizer that does not load stops the start (TokenizerError, one line).
 */
import { existsSync, readFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { Template } from "@huggingface/jinja";

/** The part of the bindings' Tokenizer this module uses. */
interface NativeTokenizer {
  encode(
    text: string,
    pair: null,
    options: { addSpecialTokens: boolean },
  ): Promise<{ getIds(): number[] }>;
  getVocabSize(withAddedTokens: boolean): number;
}

interface Binding {
  Tokenizer: { fromString(json: string): NativeTokenizer };
}

let binding: Binding | null = null;

/**
 * The bindings' own index.js requires every platform's addon it can find (and the
 * compiled binary would embed them all); Linux needs one of these two. build.ts
 * resolves both to its target's, so a binary embeds one.
 */
function loadBinding(): Binding {
  binding ??= (
    process.arch === "arm64"
      ? require("tokenizers/tokenizers.linux-arm64-gnu.node")
      : require("tokenizers/tokenizers.linux-x64-gnu.node")
  ) as Binding;
  return binding;
}

export class TokenizerError extends Error {
  override readonly name = "TokenizerError";
}

/** One chat message as OpenAI's API carries it (content already flattened to text where needed). */
export type ChatMessage = Record<string, unknown>;

export interface ChatOptions {
  readonly addGenerationPrompt: boolean;
  readonly continueFinalMessage?: boolean;
  readonly tools?: unknown;
  /** Extra template variables (vLLM's chat_template_kwargs). */
  readonly extra?: Record<string, unknown>;
}

export class PromptTokenizer {
  /** The model name served (tokenizer_config's name_or_path, else the directory name). */
  readonly model: string;
  readonly vocabSize: number;
  private readonly template: Template | null;
  private readonly specialTokens: Record<string, string>;

  constructor(
    private readonly native: NativeTokenizer,
    config: Record<string, unknown>,
    fallbackName: string,
  ) {
    const name = config.name_or_path ?? config._name_or_path;
    this.model = typeof name === "string" && name !== "" ? name : fallbackName;
    this.vocabSize = native.getVocabSize(true);
    this.specialTokens = {};
    for (const key of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
      const text = tokenText(config[key]);
      if (text !== null) this.specialTokens[key] = text;
    }
    const source = chatTemplateOf(config);
    try {
      this.template = source === null ? null : new Template(source);
    } catch (error) {
      throw new TokenizerError(`the chat template does not parse: ${(error as Error).message}`);
    }
  }

  get hasChatTemplate(): boolean {
    return this.template !== null;
  }

  /**
   * Token ids of `text`. Lone UTF-16 surrogates become U+FFFD first (what the bindings
   * do on their own too, and what any UTF-8 transport does).
   */
  async encode(text: string, addSpecialTokens: boolean): Promise<Uint32Array> {
    const encoding = await this.native.encode(text.toWellFormed(), null, { addSpecialTokens });
    return Uint32Array.from(encoding.getIds());
  }

  /** The prompt text the chat template makes of `messages`, as vLLM renders it. */
  renderChat(messages: readonly ChatMessage[], options: ChatOptions): string {
    if (this.template === null)
      throw new TokenizerError(
        "the tokenizer has no chat template (tokenizer_config.json chat_template)",
      );
    return this.template.render({
      ...this.specialTokens,
      ...options.extra,
      messages,
      tools: options.tools ?? null,
      add_generation_prompt: options.addGenerationPrompt && options.continueFinalMessage !== true,
      continue_final_message: options.continueFinalMessage === true,
    });
  }
}

/** A tokenizer from the two files' contents (tests, and tokenizers made in code). */
export function tokenizerFromText(
  tokenizerJson: string,
  config: Record<string, unknown>,
  name: string,
): PromptTokenizer {
  let native: NativeTokenizer;
  try {
    native = loadBinding().Tokenizer.fromString(tokenizerJson);
  } catch (error) {
    throw new TokenizerError(`tokenizer.json does not load: ${firstLine(error)}`);
  }
  return new PromptTokenizer(native, config, name);
}

/** Loads DIR/tokenizer.json and DIR/tokenizer_config.json (and DIR/chat_template.jinja if the config has none). */
export function loadTokenizer(dir: string): PromptTokenizer {
  const path = resolve(dir);
  const read = (file: string, required: boolean): string | null => {
    const full = join(path, file);
    if (!existsSync(full)) {
      if (required) throw new TokenizerError(`${full} does not exist`);
      return null;
    }
    try {
      return readFileSync(full, "utf8");
    } catch (error) {
      throw new TokenizerError(`cannot read ${full}: ${firstLine(error)}`);
    }
  };
  const json = read("tokenizer.json", true)!;
  const configText = read("tokenizer_config.json", true)!;
  let config: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(configText);
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed))
      throw new Error("not a JSON object");
    config = parsed as Record<string, unknown>;
  } catch (error) {
    throw new TokenizerError(
      `${join(path, "tokenizer_config.json")} is not valid: ${firstLine(error)}`,
    );
  }
  if (config.chat_template === undefined) {
    const template = read("chat_template.jinja", false);
    if (template !== null) config = { ...config, chat_template: template };
  }
  try {
    return tokenizerFromText(json, config, basename(path));
  } catch (error) {
    if (error instanceof TokenizerError) throw new TokenizerError(`${path}: ${error.message}`);
    throw error;
  }
}

/** A special token as tokenizer_config.json gives it: a string or `{"content": "..."}`. */
function tokenText(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (
    value !== null &&
    typeof value === "object" &&
    typeof (value as { content?: unknown }).content === "string"
  ) {
    return (value as { content: string }).content;
  }
  return null;
}

/** `chat_template`: a string, or a list of `{name, template}` of which "default" is used. */
function chatTemplateOf(config: Record<string, unknown>): string | null {
  const value = config.chat_template;
  if (typeof value === "string") return value;
  if (Array.isArray(value)) {
    const named = value.find((entry) => (entry as { name?: unknown })?.name === "default") as
      | { template?: unknown }
      | undefined;
    if (typeof named?.template === "string") return named.template;
  }
  return null;
}

function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n")[0]!;
}
