/**
 * One received message as frame locations, without allocating a view per frame: frame i
 * is bytes [start(i), end(i)) of buffer(i). Hot consumers (the ingest ring copy, the
 * msgpack walker) read through the locations; `frame(i)` / `views()` make views for
 * convenience.
 *
 * Lifetime: the object is reused for the next message and the buffers may be a receive
 * chunk or a reassembly arena that is reused too, so everything here is valid only until
 * the callback that received it returns. Copy (`copy()`) to keep.
 */
export class FrameList {
  /** Frames in the message (>= 1 when delivered). */
  count = 0;
  private buffers: Uint8Array[] = [];
  /** start, end pairs */
  private bounds = new Int32Array(32);
  private readonly viewArray: Uint8Array[] = [];

  buffer(index: number): Uint8Array {
    this.check(index);
    return this.buffers[index]!;
  }

  start(index: number): number {
    this.check(index);
    return this.bounds[2 * index]!;
  }

  end(index: number): number {
    this.check(index);
    return this.bounds[2 * index + 1]!;
  }

  size(index: number): number {
    this.check(index);
    return this.bounds[2 * index + 1]! - this.bounds[2 * index]!;
  }

  /** Frame `index` as a view (allocates one view). */
  frame(index: number): Uint8Array {
    this.check(index);
    return this.buffers[index]!.subarray(this.bounds[2 * index]!, this.bounds[2 * index + 1]!);
  }

  /** All frames as views, in an array that is itself reused for the next message. */
  views(): Uint8Array[] {
    const views = this.viewArray;
    views.length = this.count;
    for (let i = 0; i < this.count; i++)
      views[i] = this.buffers[i]!.subarray(this.bounds[2 * i]!, this.bounds[2 * i + 1]!);
    return views;
  }

  /** Owned copies of all frames. */
  copy(): Uint8Array[] {
    const out: Uint8Array[] = [];
    for (let i = 0; i < this.count; i++) out.push(this.frame(i).slice());
    return out;
  }

  /** Whether frame `index` starts with `prefix`. */
  startsWith(index: number, prefix: Uint8Array): boolean {
    const buffer = this.buffer(index);
    const start = this.bounds[2 * index]!;
    if (prefix.length > this.bounds[2 * index + 1]! - start) return false;
    for (let i = 0; i < prefix.length; i++) if (buffer[start + i] !== prefix[i]) return false;
    return true;
  }

  /** @internal Appends a frame location (the decoder bounds the count). */
  add(buffer: Uint8Array, start: number, end: number): void {
    const index = this.count++;
    if (2 * index + 2 > this.bounds.length) {
      const grown = new Int32Array(this.bounds.length * 2);
      grown.set(this.bounds);
      this.bounds = grown;
    }
    this.buffers[index] = buffer;
    this.bounds[2 * index] = start;
    this.bounds[2 * index + 1] = end;
  }

  /** @internal Forgets the message (drops buffer references so chunks can be freed). */
  clear(): void {
    for (let i = 0; i < this.count; i++) this.buffers[i] = EMPTY;
    this.viewArray.length = 0;
    this.count = 0;
  }

  private check(index: number): void {
    if (!(index >= 0 && index < this.count))
      throw new RangeError(`frame ${index} of ${this.count}`);
  }
}

const EMPTY: Uint8Array = new Uint8Array(0);
