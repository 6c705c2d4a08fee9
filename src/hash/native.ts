/**
 * Loads the native fast paths (native/kvedge.c) through bun:ffi.
 *
 * build.ts compiles the library before tests and before `bun build --compile`, which
 * embeds it in dist/kvedge. If it is missing, empty (no C compiler), of another ABI
 * version, or KVEDGE_NATIVE=0 is set, `nativeHash` is null and callers use the
 * pure fallback.
 */
import { dlopen, FFIType } from "bun:ffi";
import libraryPath from "../../native/build/libkvedge.so" with { type: "file" };

const ABI_VERSION = 1;

const symbols = {
  kv_abi_version: { args: [], returns: FFIType.u32 },
  kv_hash_blocks: {
    args: [FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.ptr],
    returns: FFIType.u32,
  },
  kv_chain_hashes: { args: [FFIType.ptr, FFIType.u32, FFIType.ptr], returns: FFIType.void },
} as const;

export interface NativeHash {
  hashBlocks(
    tokens: Uint32Array, tokenCount: number, stride: number, window: number,
    seedHi: number, seedLo: number, out: Uint32Array,
  ): number;
  chainHashes(local: Uint32Array, count: number, out: Uint32Array): void;
}

/** Why the native library is not in use, or null when it is. */
export let nativeUnavailableReason: string | null = null;

function load(): NativeHash | null {
  if (process.env.KVEDGE_NATIVE === "0") {
    nativeUnavailableReason = "disabled by KVEDGE_NATIVE=0";
    return null;
  }
  try {
    const lib = dlopen(libraryPath, symbols);
    const abi = lib.symbols.kv_abi_version();
    if (abi !== ABI_VERSION) {
      lib.close();
      nativeUnavailableReason = `native ABI ${abi}, expected ${ABI_VERSION}`;
      return null;
    }
    const hashBlocks = lib.symbols.kv_hash_blocks;
    const chainHashes = lib.symbols.kv_chain_hashes;
    return {
      hashBlocks: (tokens, tokenCount, stride, window, seedHi, seedLo, out) =>
        hashBlocks(tokens, tokenCount, stride, window, seedHi, seedLo, out),
      chainHashes: (local, count, out) => chainHashes(local, count, out),
    };
  } catch (error) {
    nativeUnavailableReason = `cannot load ${libraryPath}: ${(error as Error).message}`;
    return null;
  }
}

export const nativeHash: NativeHash | null = load();
