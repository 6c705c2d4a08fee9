/**
 * A set of topic prefixes: a message matches when its first frame starts with one of
 * them (the empty prefix matches everything). Subscriptions are few (vLLM uses one
 * topic), so matching is a linear scan with an all-match shortcut.
 */
import type { FrameList } from "./frames";

export class PrefixSet {
  /** prefix (latin1 key) -> how many times it was added */
  private readonly counts = new Map<string, number>();
  private prefixes: Uint8Array[] = [];
  private matchAll = false;

  get size(): number {
    return this.counts.size;
  }

  /**
   * Adds a prefix; with `counted`, adding it again needs as many removals (SUB side,
   * like libzmq); otherwise it is a plain set (a peer's subscriptions on a PUB).
   * Returns true when the prefix was not present before. The prefix is copied.
   */
  add(prefix: Uint8Array, counted: boolean): boolean {
    const key = keyOf(prefix);
    const count = this.counts.get(key) ?? 0;
    if (count > 0 && !counted) return false;
    this.counts.set(key, count + 1);
    if (count > 0) return false;
    this.prefixes.push(prefix.slice());
    if (prefix.length === 0) this.matchAll = true;
    return true;
  }

  /** Removes one reference; returns true when the prefix is gone entirely. */
  remove(prefix: Uint8Array): boolean {
    const key = keyOf(prefix);
    const count = this.counts.get(key) ?? 0;
    if (count === 0) return false;
    if (count > 1) {
      this.counts.set(key, count - 1);
      return false;
    }
    this.counts.delete(key);
    this.prefixes = this.prefixes.filter((p) => keyOf(p) !== key);
    if (prefix.length === 0) this.matchAll = false;
    return true;
  }

  has(prefix: Uint8Array): boolean {
    return this.counts.has(keyOf(prefix));
  }

  matches(topic: Uint8Array): boolean {
    if (this.matchAll) return true;
    const prefixes = this.prefixes;
    for (let i = 0; i < prefixes.length; i++) {
      const prefix = prefixes[i]!;
      if (prefix.length > topic.length) continue;
      let j = 0;
      while (j < prefix.length && prefix[j] === topic[j]) j++;
      if (j === prefix.length) return true;
    }
    return false;
  }

  /** Whether frame `index` of a received message matches. */
  matchesFrame(frames: FrameList, index: number): boolean {
    if (this.matchAll) return true;
    const prefixes = this.prefixes;
    for (let i = 0; i < prefixes.length; i++)
      if (frames.startsWith(index, prefixes[i]!)) return true;
    return false;
  }

  /** The distinct prefixes (copies owned by the set; do not mutate). */
  list(): readonly Uint8Array[] {
    return this.prefixes;
  }
}

function keyOf(prefix: Uint8Array): string {
  return Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength).toString("latin1");
}

export function toBytes(value: Uint8Array | string): Uint8Array {
  return typeof value === "string" ? new TextEncoder().encode(value) : value;
}
