/**
 * Loads the native fast paths (native/kvedge.c) through bun:ffi: block hashing
 * (`nativeHash`, used by src/hash), the JSON token-id scanner (`nativeTokens`, used by
 * src/server/request-json.ts) and the msgpack token-id reader (`nativeMsgpackTokens`,
 * used by src/wire/kv-events/decode.ts).
 *
 * build.ts compiles the library before tests and before `bun build --compile`, which
 * embeds it in dist/kvedge. If it is missing, empty (no C compiler), of another ABI
 * version, or KVEDGE_NATIVE=0 is set, both are null and callers use the pure
 * fallbacks.
 */
import { dlopen, FFIType } from "bun:ffi";
import libraryPath from "../../native/build/libkvedge.so" with { type: "file" };

const ABI_VERSION = 3;

const symbols = {
  kv_abi_version: { args: [], returns: FFIType.u32 },
  kv_hash_blocks: {
    args: [FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.ptr],
    returns: FFIType.u32,
  },
  kv_chain_hashes: { args: [FFIType.ptr, FFIType.u32, FFIType.ptr], returns: FFIType.void },
  kv_scan_tokens: {
    args: [FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.ptr, FFIType.u32, FFIType.ptr],
    returns: FFIType.i32,
  },
  kv_msgpack_u32s: {
    args: [
      FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.u32, FFIType.ptr, FFIType.u32, FFIType.ptr,
    ],
    returns: FFIType.u32,
  },
} as const;

export interface NativeHash {
  hashBlocks(
    tokens: Uint32Array, tokenCount: number, stride: number, window: number,
    seedHi: number, seedLo: number, out: Uint32Array,
  ): number;
  chainHashes(local: Uint32Array, count: number, out: Uint32Array): void;
}

export interface NativeTokens {
  /**
   * The JSON array of plain decimal u32 integers at `bytes[start]` (its `[`) into `out`
   * (at most `max`), the position after its `]` into `end[0]`: returns the count, or -1
   * for anything else (the caller's general parser decides).
   */
  scanTokens(bytes: Uint8Array, length: number, start: number, out: Uint32Array, max: number, end: Uint32Array): number;
}

export interface NativeMsgpackTokens {
  /**
   * Up to `count` msgpack elements at `bytes[start]`, each a positive fixint or a
   * uint8/16/32, into `out` from index `at`; the position after the last one read into
   * `end[0]`. Returns how many were read (fewer at any other encoding or past `length`).
   */
  readU32s(
    bytes: Uint8Array, length: number, start: number, count: number,
    out: Uint32Array, at: number, end: Uint32Array,
  ): number;
}

/** Why the native library is not in use, or null when it is. */
export let nativeUnavailableReason: string | null = null;

interface Loaded {
  hash: NativeHash;
  tokens: NativeTokens;
  msgpackTokens: NativeMsgpackTokens;
}

function load(): Loaded | null {
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
    const scanTokens = lib.symbols.kv_scan_tokens;
    const readU32s = lib.symbols.kv_msgpack_u32s;
    return {
      hash: {
        hashBlocks: (tokens, tokenCount, stride, window, seedHi, seedLo, out) =>
          hashBlocks(tokens, tokenCount, stride, window, seedHi, seedLo, out),
        chainHashes: (local, count, out) => chainHashes(local, count, out),
      },
      tokens: {
        scanTokens: (bytes, length, start, out, max, end) => scanTokens(bytes, length, start, out, max, end),
      },
      msgpackTokens: {
        readU32s: (bytes, length, start, count, out, at, end) =>
          readU32s(bytes, length, start, count, out, at, end),
      },
    };
  } catch (error) {
    nativeUnavailableReason = `cannot load ${libraryPath}: ${(error as Error).message}`;
    return null;
  }
}

const loaded = load();
export const nativeHash: NativeHash | null = loaded?.hash ?? null;
export const nativeTokens: NativeTokens | null = loaded?.tokens ?? null;
export const nativeMsgpackTokens: NativeMsgpackTokens | null = loaded?.msgpackTokens ?? null;
