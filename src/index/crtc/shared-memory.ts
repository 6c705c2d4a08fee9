/**
 * Where the crtc's pools keep their typed arrays. Private memory (the default, one
 * thread) grows an array by allocating a bigger one and copying. Shared memory gives
 * every array one SharedArrayBuffer reserved up front at its largest size (sized by the
 * index memory budget); Linux backs its pages only once they are touched, so an array
 * grows by taking a longer view of the same buffer (no copy, and readers on other
 * threads keep seeing it) and shrinks by a shorter view whose tail pages go back to the
 * kernel (madvise). The views are plain fixed-length typed arrays: no resizable buffer
 * (docs/decisions.md#plain-typed-arrays).
 */
import type { Pointer } from "bun:ffi";
import { addressOf, libc, offsetAddress } from "../../native/library";

export interface PoolMemory {
  readonly shared: boolean;
  /**
   * The array `name` with `length` entries: its first `keep` entries are those of `old`
   * (the array this replaces, or null), the rest are zero.
   */
  u32(name: string, length: number, old: Uint32Array | null, keep: number): Uint32Array;
  u8(name: string, length: number, old: Uint8Array | null, keep: number): Uint8Array;
}

/** Private arrays, grown by copying. */
export const PRIVATE_MEMORY: PoolMemory = {
  shared: false,
  u32(_name, length, old, keep) {
    const next = new Uint32Array(length);
    if (old !== null && keep > 0) next.set(old.subarray(0, Math.min(keep, length, old.length)));
    return next;
  },
  u8(_name, length, old, keep) {
    const next = new Uint8Array(length);
    if (old !== null && keep > 0) next.set(old.subarray(0, Math.min(keep, length, old.length)));
    return next;
  },
};

/** The largest SharedArrayBuffer Bun 1.4.5 allocates (4 GiB). */
export const REGION_BYTES_MAX = 2 ** 32;
/** Tail pages are returned in steps of this (a multiple of 4 KiB and 64 KiB pages). */
const RELEASE_GRANULE = 65_536;
const MADV_DONTNEED = 4;

/** One named array's buffer and how much of it was handed out (bytes). */
interface Region {
  readonly buffer: SharedArrayBuffer;
  readonly base: Pointer | null;
  used: number;
}

/**
 * The shared regions of one index: `limits` gives each array's name and its largest
 * size in bytes. The buffers go to readers in a descriptor (shared.ts).
 */
export class SharedRegions implements PoolMemory {
  readonly shared = true;
  readonly buffers: Record<string, SharedArrayBuffer> = {};
  /** Bytes handed back to the kernel, and madvise calls that failed (no glibc). */
  releasedBytes = 0;
  releaseFailures = 0;
  private readonly regions: Record<string, Region> = {};

  constructor(limits: Record<string, number>) {
    for (const [name, bytes] of Object.entries(limits)) {
      if (!Number.isInteger(bytes) || bytes <= 0 || bytes > REGION_BYTES_MAX) {
        const range = `1..${REGION_BYTES_MAX}`;
        throw new RangeError(`shared region ${name}: ${bytes} bytes is not in ${range}`);
      }
      const buffer = new SharedArrayBuffer(bytes);
      this.buffers[name] = buffer;
      const base = libc === null ? null : addressOf(new Uint8Array(buffer));
      this.regions[name] = { buffer, base, used: 0 };
    }
  }

  u32(name: string, length: number, _old: Uint32Array | null, keep: number): Uint32Array {
    const region = this.take(name, 4 * length);
    const view = new Uint32Array(region.buffer, 0, length);
    if (keep < length) view.fill(0, keep);
    return view;
  }

  u8(name: string, length: number, _old: Uint8Array | null, keep: number): Uint8Array {
    const region = this.take(name, length);
    const view = new Uint8Array(region.buffer, 0, length);
    if (keep < length) view.fill(0, keep);
    return view;
  }

  /** The whole region as u32s (versions: never shrunk, never zeroed after creation). */
  whole(name: string): Uint32Array {
    return new Uint32Array(this.region(name).buffer);
  }

  private region(name: string): Region {
    const region = this.regions[name];
    if (region === undefined) throw new Error(`no shared region named ${name}`);
    return region;
  }

  private take(name: string, bytes: number): Region {
    const region = this.region(name);
    if (bytes > region.buffer.byteLength) {
      const size = region.buffer.byteLength;
      throw new RangeError(`shared index region ${name} is full (${size} bytes): budget too small`);
    }
    if (bytes < region.used) this.release(region, bytes);
    else region.used = bytes;
    return region;
  }

  /** Returns the pages past `bytes` (rounded up to a granule) to the kernel; they read as zero. */
  private release(region: Region, bytes: number): void {
    const from = Math.ceil(bytes / RELEASE_GRANULE) * RELEASE_GRANULE;
    const to = Math.ceil(region.used / RELEASE_GRANULE) * RELEASE_GRANULE;
    region.used = bytes;
    if (to <= from) return;
    const length = Math.min(to, region.buffer.byteLength) - from;
    if (
      libc === null ||
      region.base === null ||
      libc.madvise(offsetAddress(region.base, from), length, MADV_DONTNEED) !== 0
    ) {
      this.releaseFailures++;
      return;
    }
    this.releasedBytes += length;
  }
}
