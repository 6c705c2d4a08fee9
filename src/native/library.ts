/**
 * The one home of bun:ffi: loads the native library (native/kvedge.c) once and
 * exposes its symbol table, and the few libc calls kvedge makes. Callers keep their
 * own pure fallbacks for when a table is null.
 *
 * build.ts compiles the library before tests and before `bun build --compile`, which
 * embeds it in dist/kvedge. If it is missing, empty (no C compiler), of another ABI
 * version, or KVEDGE_NATIVE=0 is set, `native` is null and `nativeUnavailableReason`
 * says why. A new native function is declared in `kvedgeSymbols` below (and
 * ABI_VERSION raised when a signature changes).
 */
import { dlopen, FFIType, type Pointer, ptr } from "bun:ffi";
import libraryPath from "../../native/build/libkvedge.so" with { type: "file" };

const ABI_VERSION = 5;

const kvedgeSymbols = {
  kv_abi_version: { args: [], returns: FFIType.u32 },
  /**
   * (tokens, tokenStart, tokenCount, stride, window, seedHi, seedLo, out, outStart) ->
   * blocks hashed (src/hash).
   */
  kv_hash_blocks: {
    args: [
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.ptr,
      FFIType.u32,
    ],
    returns: FFIType.u32,
  },
  /** (local, count, out): the sequence-hash chain of `count` (hi, lo) pairs (src/hash). */
  kv_chain_hashes: { args: [FFIType.ptr, FFIType.u32, FFIType.ptr], returns: FFIType.void },
  /**
   * (bytes, length, start, out, max, end): the JSON array of plain decimal u32 integers
   * at `bytes[start]` (its `[`) into `out` (at most `max`), the position after its `]`
   * into `end[0]`; returns the count, or -1 for anything else (src/http/request-json.ts).
   */
  kv_scan_tokens: {
    args: [FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.ptr, FFIType.u32, FFIType.ptr],
    returns: FFIType.i32,
  },
  /**
   * (bytes, length, start, count, out, at, end): up to `count` msgpack values at
   * `bytes[start]`, each a positive fixint or a uint8/16/32, into out[at..]; the position
   * after the last one read into `end[0]`; returns how many were read, fewer at any other
   * encoding or past `length` (src/wire/kv-events/decode.ts).
   */
  kv_msgpack_u32s: {
    args: [
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.ptr,
      FFIType.u32,
      FFIType.ptr,
    ],
    returns: FFIType.u32,
  },
  /**
   * (table, capacity, shift, scale, keys, first, count, out, at, limits): removes an
   * event's keys from an index lookup; (.., keys, first, count, value, limits): inserts a
   * run of them. Both stop where the table must resize (src/index/lookup.ts).
   */
  kv_lookup_remove: {
    args: [
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.f64,
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.ptr,
      FFIType.u32,
      FFIType.ptr,
    ],
    returns: FFIType.u32,
  },
  kv_lookup_insert_run: {
    args: [
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.f64,
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.ptr,
    ],
    returns: FFIType.u32,
  },
  /**
   * (old, oldCapacity, table, capacity, shift, scale): a lookup's resize, every entry of
   * `old` into the empty `table` (src/index/lookup.ts).
   */
  kv_lookup_rehash: {
    args: [FFIType.ptr, FFIType.u32, FFIType.ptr, FFIType.u32, FFIType.u32, FFIType.f64],
    returns: FFIType.void,
  },
  /**
   * (keys, stamps, mask, stamp, hashes, start, count, parentHi, parentLo, hasParent) ->
   * 1 if a pair repeats in a store (src/ingest/normalize.ts's stamped set), else 0.
   */
  kv_pairs_repeat: {
    args: [
      FFIType.ptr,
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.ptr,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
      FFIType.u32,
    ],
    returns: FFIType.u32,
  },
} as const;

const libcSymbols = {
  /** (tid, maskBytes, mask) -> 0 or -1 (src/runtime/affinity.ts). */
  sched_setaffinity: { args: [FFIType.i32, FFIType.u64, FFIType.ptr], returns: FFIType.i32 },
  sched_getaffinity: { args: [FFIType.i32, FFIType.u64, FFIType.ptr], returns: FFIType.i32 },
  /** (address, length, advice) -> 0 or -1 (src/index/crtc/shared-memory.ts returns pages). */
  madvise: { args: [FFIType.ptr, FFIType.u64, FFIType.i32], returns: FFIType.i32 },
  /** (fd, operation) -> 0 or -1 (src/state/dir.ts locks the state directory). */
  flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
} as const;

type Symbols<T extends Parameters<typeof dlopen>[1]> = ReturnType<typeof dlopen<T>>["symbols"];
export type NativeLibrary = Symbols<typeof kvedgeSymbols>;
export type Libc = Symbols<typeof libcSymbols>;

/** Why the native library is not in use, or null when it is. */
export let nativeUnavailableReason: string | null = null;

function loadNative(): NativeLibrary | null {
  if (process.env.KVEDGE_NATIVE === "0") {
    nativeUnavailableReason = "disabled by KVEDGE_NATIVE=0";
    return null;
  }
  try {
    const lib = dlopen(libraryPath, kvedgeSymbols);
    const abi = lib.symbols.kv_abi_version();
    if (abi !== ABI_VERSION) {
      lib.close();
      nativeUnavailableReason = `native ABI ${abi}, expected ${ABI_VERSION}`;
      return null;
    }
    return lib.symbols;
  } catch (error) {
    nativeUnavailableReason = `cannot load ${libraryPath}: ${(error as Error).message}`;
    return null;
  }
}

function loadLibc(): Libc | null {
  try {
    return dlopen("libc.so.6", libcSymbols).symbols;
  } catch {
    return null; // not glibc (musl, another OS): CPU pinning says so when asked for
  }
}

/** The native library's symbols, or null (then every caller uses its pure fallback). */
export const native: NativeLibrary | null = loadNative();
/** glibc's calls, or null where there is no libc.so.6; independent of KVEDGE_NATIVE. */
export const libc: Libc | null = loadLibc();

/** The address of a typed array's first byte, for the libc calls that take one. */
export function addressOf(view: Uint8Array): Pointer {
  return ptr(view);
}

/** An address `bytes` past `base` (a pointer is a number in bun:ffi). */
export function offsetAddress(base: Pointer, bytes: number): Pointer {
  return (base + bytes) as Pointer;
}
