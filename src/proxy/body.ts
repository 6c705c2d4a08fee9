/**
 * Changes to a client's JSON body made on its bytes: what kvedge must add is spliced in
 * and the rest stays as the client wrote it (numbers past 2^53, float spellings, key
 * order, duplicate keys, unknown fields, escapes). Parsing and writing the body again
 * would round `"seed": 18446744073709551615` to 18446744073709552000.
 *
 * The input has been parsed already (JSON.parse accepted it), so the scanner here only
 * finds where the top-level members are. JSON's structure is ASCII, and no byte of a
 * multi-byte UTF-8 character is ASCII, so it scans bytes without decoding them.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const COMMA = 0x2c;

const encoder = new TextEncoder();
const utf8 = new TextDecoder();

/** A member of an object: its key (decoded) and where its value's bytes are. */
export interface Member {
  readonly key: string;
  readonly valueStart: number;
  readonly valueEnd: number;
}

/** An object's members, in order; `at` is where the object's `{` is. */
export function membersOf(bytes: Uint8Array, at: number): Member[] {
  const members: Member[] = [];
  let i = skipSpace(bytes, at + 1);
  while (bytes[i] !== CLOSE_BRACE) {
    const keyEnd = skipString(bytes, i);
    const key = keyOf(bytes, i, keyEnd);
    const valueStart = skipSpace(bytes, skipSpace(bytes, keyEnd) + 1); // past the colon
    const valueEnd = skipValue(bytes, valueStart);
    members.push({ key, valueStart, valueEnd });
    i = skipSpace(bytes, valueEnd);
    if (bytes[i] === COMMA) i = skipSpace(bytes, i + 1);
  }
  return members;
}

/** Where the top-level object starts (after a BOM and whitespace). */
export function objectStart(bytes: Uint8Array): number {
  const bom = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0;
  return skipSpace(bytes, bom);
}

/**
 * The body with `stream_options.include_usage` true: the member added before the
 * closing brace, or `include_usage` set in the client's own `stream_options` (the
 * last one, as JSON.parse and the engines read duplicates).
 */
export function withUsageAsked(bytes: Uint8Array): Uint8Array {
  const start = objectStart(bytes);
  const options = membersOf(bytes, start).findLast((member) => member.key === "stream_options");
  if (options === undefined) {
    const close = lastCloseBrace(bytes);
    const empty = skipSpace(bytes, start + 1) === close;
    return splice(
      bytes,
      close,
      close,
      `${empty ? "" : ","}"stream_options":{"include_usage":true}`,
    );
  }
  if (bytes[options.valueStart] !== OPEN_BRACE)
    return splice(bytes, options.valueStart, options.valueEnd, '{"include_usage":true}');
  const inner = membersOf(bytes, options.valueStart);
  const usage = inner.findLast((member) => member.key === "include_usage");
  if (usage !== undefined) return splice(bytes, usage.valueStart, usage.valueEnd, "true");
  const at = options.valueStart + 1;
  return splice(bytes, at, at, `"include_usage":true${inner.length === 0 ? "" : ","}`);
}

/** The body with member `key` (the last one of that name) set to `json`, added if absent. */
export function withMember(bytes: Uint8Array, key: string, json: string): Uint8Array {
  const member = membersOf(bytes, objectStart(bytes)).findLast((m) => m.key === key);
  if (member === undefined) {
    const close = lastCloseBrace(bytes);
    return splice(bytes, close, close, `,${JSON.stringify(key)}:${json}`);
  }
  return splice(bytes, member.valueStart, member.valueEnd, json);
}

function splice(bytes: Uint8Array, from: number, to: number, text: string): Uint8Array {
  const inserted = encoder.encode(text);
  const out = new Uint8Array(bytes.length - (to - from) + inserted.length);
  out.set(bytes.subarray(0, from));
  out.set(inserted, from);
  out.set(bytes.subarray(to), from + inserted.length);
  return out;
}

function lastCloseBrace(bytes: Uint8Array): number {
  let i = bytes.length - 1;
  while (i >= 0 && bytes[i] !== CLOSE_BRACE) i--;
  return i;
}

function skipSpace(bytes: Uint8Array, i: number): number {
  while (i < bytes.length) {
    const byte = bytes[i]!;
    if (byte !== 0x20 && byte !== 0x0a && byte !== 0x0d && byte !== 0x09) break;
    i++;
  }
  return i;
}

/** `i` at a string's opening quote; returns the index past its closing one. */
function skipString(bytes: Uint8Array, i: number): number {
  for (let j = i + 1; j < bytes.length; j++) {
    const byte = bytes[j]!;
    if (byte === BACKSLASH) j++;
    else if (byte === QUOTE) return j + 1;
  }
  return bytes.length;
}

function keyOf(bytes: Uint8Array, from: number, to: number): string {
  const raw = bytes.subarray(from, to);
  // A key with escapes ("stream\u005foptions") is read as JSON reads it.
  return raw.includes(BACKSLASH)
    ? (JSON.parse(utf8.decode(raw)) as string)
    : utf8.decode(raw.subarray(1, -1));
}

/** Past one value starting at `i`. */
function skipValue(bytes: Uint8Array, i: number): number {
  const first = bytes[i];
  if (first === QUOTE) return skipString(bytes, i);
  if (first !== OPEN_BRACE && first !== OPEN_BRACKET) {
    // A number or a literal: up to the next delimiter.
    let j = i;
    while (j < bytes.length) {
      const byte = bytes[j]!;
      if (byte === COMMA || byte === CLOSE_BRACE || byte === CLOSE_BRACKET || byte <= 0x20) break;
      j++;
    }
    return j;
  }
  let depth = 0;
  for (let j = i; j < bytes.length; j++) {
    const byte = bytes[j]!;
    if (byte === QUOTE) j = skipString(bytes, j) - 1;
    else if (byte === OPEN_BRACE || byte === OPEN_BRACKET) depth++;
    else if (byte === CLOSE_BRACE || byte === CLOSE_BRACKET) {
      if (--depth === 0) return j + 1;
    }
  }
  return bytes.length;
}
