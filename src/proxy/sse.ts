/**
 * A Server-Sent Events stream read as it passes, byte for byte, by the rules of WHATWG
 * HTML ("Parsing an event stream"): a line ends at CRLF, LF or a lone CR (a CR ending
 * one read and an LF starting the next are one line end), a blank line ends an event,
 * an event's `data` lines are joined with LF; comments and other fields pass unread.
 * Nothing is decoded and re-encoded: the bytes passed on are the bytes received.
 *
 * The scanner remembers the last `usage` object an event carried. With `dropUsage`
 * (kvedge asked for usage on the client's behalf) it drops the usage-only chunk
 * (`"choices": []` with a `usage` object) whole, however it was split; everything else
 * passes. To decide, it holds the bytes of the event being read until its blank line,
 * and only those: what is complete passes at once. Without `dropUsage` nothing is held.
 */

const LF = 0x0a;
const CR = 0x0d;
/** An event held longer than this passes on unread (a usage chunk is never this long). */
export const EVENT_BYTES_MAX = 1 << 20;

const utf8 = new TextDecoder();

export class SseScanner {
  /** The last `usage` object an event carried (null: none yet). */
  usage: Record<string, unknown> | null = null;
  /** Events read (each with data), and usage-only chunks dropped. */
  events = 0;
  dropped = 0;
  /** The current line's bytes from earlier reads (bounded by EVENT_BYTES_MAX). */
  private lineCarry: Uint8Array[] = [];
  private lineCarryBytes = 0;
  /** The current event's data lines, decoded; null once it is too long to read. */
  private data: string[] | null = [];
  private dataBytes = 0;
  private afterCr = false;
  private firstLine = true;
  /** Held bytes of the current event (dropUsage only). */
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  /** The current event grew past EVENT_BYTES_MAX: its bytes pass as they come. */
  private passing = false;
  /** An event just ended on a CR at the end of a read: an LF that follows is its own. */
  private pendingLf: "keep" | "drop" | null = null;

  constructor(private readonly dropUsage: boolean) {}

  /** Reads `chunk`; appends the bytes to pass on now (views of it, or held bytes) to `out`. */
  push(chunk: Uint8Array, out: Uint8Array[]): void {
    let start = 0; // where the current event's bytes begin in this chunk
    if (this.pendingLf !== null && chunk.length > 0) {
      if (chunk[0] === LF) {
        if (this.pendingLf === "keep" && this.dropUsage) out.push(chunk.subarray(0, 1));
        start = 1;
        this.afterCr = false;
      }
      this.pendingLf = null;
    }
    let lineStart = start;
    for (let i = start; i < chunk.length; i++) {
      const byte = chunk[i]!;
      if (byte !== LF && byte !== CR) continue;
      if (byte === LF && this.afterCr && i === lineStart) {
        // The LF of a CRLF whose CR ended the line.
        this.afterCr = false;
        lineStart = i + 1;
        continue;
      }
      this.afterCr = byte === CR;
      const blank = this.endLine(chunk, lineStart, i);
      lineStart = i + 1;
      if (!blank) continue;
      let end = i + 1;
      if (byte === CR && chunk[end] === LF) end++; // the CRLF is the event's
      const keep = this.dispatch();
      if (this.dropUsage) this.release(chunk.subarray(start, end), keep, out);
      if (byte === CR && end === i + 1 && end === chunk.length)
        this.pendingLf = keep ? "keep" : "drop";
      if (end > i + 1) {
        this.afterCr = false;
        i = end - 1;
        lineStart = end;
      }
      start = end;
    }
    if (lineStart < chunk.length) this.afterCr = false; // the read ends inside a line
    this.carryLine(chunk.subarray(lineStart));
    if (!this.dropUsage) out.push(chunk);
    else this.hold(chunk.subarray(start), out);
  }

  /** The end of the stream: held bytes (an unterminated last event) pass as they are. */
  end(out: Uint8Array[]): void {
    for (const part of this.held) out.push(part);
    this.held = [];
    this.heldBytes = 0;
  }

  /** A line ended at `end` (exclusive); reads it if it is a data line. True if it was blank. */
  private endLine(chunk: Uint8Array, from: number, end: number): boolean {
    let line = chunk.subarray(from, end);
    if (this.lineCarryBytes > 0) {
      line = Buffer.concat([...this.lineCarry, line]);
      this.lineCarry = [];
      this.lineCarryBytes = 0;
    }
    if (this.firstLine) {
      this.firstLine = false;
      if (line[0] === 0xef && line[1] === 0xbb && line[2] === 0xbf) line = line.subarray(3); // a BOM
    }
    if (line.length === 0) return true;
    if (!isDataField(line) || this.data === null) return false;
    const valueAt = line.length > 4 && line[5] === 0x20 ? 6 : 5; // one space after the colon
    const value = line.length <= 5 ? "" : utf8.decode(line.subarray(valueAt));
    this.dataBytes += line.length;
    if (this.dataBytes > EVENT_BYTES_MAX) this.data = null;
    else this.data.push(value);
    return false;
  }

  private carryLine(rest: Uint8Array): void {
    if (rest.length === 0) return;
    if (this.lineCarryBytes + rest.length > EVENT_BYTES_MAX) {
      this.data = null; // an endless line: this event is not read
      this.lineCarry = [];
      this.lineCarryBytes = 0;
      return;
    }
    this.lineCarry.push(rest.slice());
    this.lineCarryBytes += rest.length;
  }

  /** An event ended: reads its data; false if it is the usage chunk to drop. */
  private dispatch(): boolean {
    const data = this.data;
    this.data = [];
    this.dataBytes = 0;
    const passed = this.passing;
    this.passing = false;
    if (data === null || data.length === 0) return true;
    this.events++;
    const text = data.join("\n");
    if (!text.includes('"usage"')) return true;
    let chunk: { choices?: unknown; usage?: unknown };
    try {
      chunk = JSON.parse(text) as typeof chunk;
    } catch {
      return true;
    }
    const usage = chunk?.usage;
    if (usage === null || typeof usage !== "object" || Array.isArray(usage)) return true;
    this.usage = usage as Record<string, unknown>;
    const drop =
      this.dropUsage && !passed && Array.isArray(chunk.choices) && chunk.choices.length === 0;
    if (drop) this.dropped++;
    return !drop;
  }

  /** The current event's bytes from this chunk (`part`) end it: passed with the held ones, or dropped. */
  private release(part: Uint8Array, keep: boolean, out: Uint8Array[]): void {
    if (keep) {
      for (const held of this.held) out.push(held);
      if (part.length > 0) out.push(part);
    }
    this.held = [];
    this.heldBytes = 0;
  }

  /** What is left of the chunk belongs to an event not ended yet: held, unless it is too long. */
  private hold(rest: Uint8Array, out: Uint8Array[]): void {
    if (rest.length === 0) return;
    if (this.passing) {
      out.push(rest);
      return;
    }
    if (this.heldBytes + rest.length > EVENT_BYTES_MAX) {
      this.end(out);
      out.push(rest);
      this.passing = true;
      return;
    }
    this.held.push(rest.slice());
    this.heldBytes += rest.length;
  }
}

/** `data` or `data:...`: the field name is everything before the first colon. */
function isDataField(line: Uint8Array): boolean {
  return (
    line.length >= 4 &&
    line[0] === 0x64 &&
    line[1] === 0x61 &&
    line[2] === 0x74 &&
    line[3] === 0x61 &&
    (line.length === 4 || line[4] === 0x3a)
  );
}
