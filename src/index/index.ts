/**
 * kvedge's index: which worker holds which prefix of which token sequence.
 * README.md in this folder is the map (semantics, backends, the apply format).
 */
import { CrtcIndex } from "./crtc/crtc";
import { PositionalIndex } from "./positional/positional";
import { ReferenceIndex } from "./reference/reference";
import type { BackendName, IndexOptions, KvIndex } from "./types";

export { applyOp, ApplyInputError, type ApplyResult } from "./apply";
export type * from "./ops";
export * from "./types";

/** A new, empty index of `backend` for blocks of `blockSize` tokens. */
export function createIndex(
  backend: BackendName,
  blockSize: number,
  options: IndexOptions = {},
): KvIndex {
  if (!Number.isInteger(blockSize) || blockSize < 1)
    throw new RangeError(`block size must be a positive integer, got ${blockSize}`);
  switch (backend) {
    case "crtc":
      return new CrtcIndex(blockSize, options);
    case "positional":
      return new PositionalIndex(blockSize, options);
    case "reference":
      return new ReferenceIndex(blockSize, options);
    default:
      throw new RangeError(
        `unknown index backend '${String(backend)}' (crtc, positional, reference)`,
      );
  }
}
