/**
 * JSON request parsing with a fast path for `token_ids`.
 *
 * A route or match request is mostly its token ids: 1k–100k integers. JSON.parse makes
 * an array of numbers, which `tokenIds` then checks and copies into a Uint32Array; for a
 * 4k-token prompt that is most of a request's CPU time. `parseRequestJson` reads such
 * an array straight into a Uint32Array and hands every other member to JSON.parse.
 *
 * The fast path takes only a top-level object (or an array of objects, the WebSocket
 * batch) whose `token_ids`, if present, is an array of plain decimal integers in
 * [0, 2^32) — at most TOKENS_MAX of them — and whose keys have no escapes. Anything
 * else, valid or not, goes to JSON.parse whole, so errors and unusual forms (`1e3`,
 * `-1`, `"1"`, duplicate `token_ids`, ...) get exactly the old behaviour and messages.
 *
 * Why the result equals JSON.parse's: the text outside `token_ids` is re-parsed by
 * JSON.parse verbatim (members in their order, `token_ids` as a placeholder, so keys
 * keep JSON.parse's order and a duplicate key still ends with the last value); the
 * scanner itself only checks the separators between members and the integers, and
 * gives up on anything it does not fully understand. A member text that is not valid
 * JSON makes that JSON.parse throw, and the whole text then goes to JSON.parse for the
 * error.
 *
 * The integers themselves are read by native code (native/kvedge.c kv_scan_tokens,
 * under 1 ns per byte) when the library is loaded and the text is ASCII (so character
 * and byte positions agree): the text is encoded into a scratch buffer once, which
 * costs far less than reading the digits in JavaScript. The native scanner accepts
 * exactly what the JavaScript one below accepts (tests compare the two), and either
 * way anything not accepted goes to JSON.parse.
 *
 * See docs/decisions.md#native-token-reader.
 */
import { native as nativeLibrary } from "../native/library";

/** A request longer than this many tokens is refused (8 MiB of body holds fewer anyway). */
export const TOKENS_MAX = 4_000_000;

/** Token ids the scanner already read and checked (integers in [0, 2^32)). */
export class ScannedTokens {
  constructor(readonly tokens: Uint32Array) {}
}

/** Who reads the digits of `token_ids`: native code (when loaded) or JavaScript. */
export type TokenScanner = "native" | "js";

export const defaultTokenScanner: TokenScanner = nativeLibrary === null ? "js" : "native";

/**
 * JSON.parse's result for `text`, with `token_ids` arrays of request objects as
 * ScannedTokens. Throws as JSON.parse does. (`scanner`: tests and benches compare the two.)
 *
 * `transient`: the token arrays are views into one buffer that the next parse reuses,
 * for callers that hash the tokens before they parse again (the routing paths): no
 * array is allocated per request, which at 4 KB per 1,024 tokens was a large part of
 * what started the garbage collector. Otherwise each array is a copy of its own.
 */
export function parseRequestJson(
  text: string,
  scanner: TokenScanner = defaultTokenScanner,
  transient = false,
): unknown {
  const fast = scanTop(text, scanner === "native" && nativeLibrary !== null, transient);
  return fast === undefined ? JSON.parse(text) : fast;
}

const SPACE = 0x20;
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const ZERO = 0x30;
const NINE = 0x39;
const U32_MAX = 0xffff_ffff;

// The scanner's state: the text and the position, shared by the functions below (one
// request is scanned at a time; nothing here is re-entered).
let text = "";
let at = 0;
/** The most token ids (and 4x that in bytes) the scanner's buffers keep between requests. */
const SCRATCH_KEPT = 1 << 20;
/** Where scanned token ids go; a transient parse leaves them there (from offset 0 up to `scratchUsed`). */
let scratch = new Uint32Array(4096);
let scratchUsed = 0;
let transientTokens = false;
/** Native scanning: wanted for this text; `bytesReady`: `bytes` holds the text (ASCII). */
let native = false;
let bytesReady = false;
let bytes = new Uint8Array(16384);
const nativeEnd = new Uint32Array(1);
const encoder = new TextEncoder();

/** Bytes the scanner's buffers hold now (tests: they shrink back after a huge request). */
export function scannerBufferBytes(): number {
  return scratch.byteLength + bytes.byteLength;
}

function skipSpace(): void {
  while (isSpace(text.charCodeAt(at))) at++;
}

/** The top level: an object, or an array of objects. Undefined = use JSON.parse. */
function scanTop(source: string, useNative: boolean, transient: boolean): unknown {
  text = source;
  at = 0;
  native = useNative;
  bytesReady = false;
  transientTokens = transient;
  scratchUsed = 0;
  // A huge request grew the buffers; the next one gives them back.
  if (scratch.length > SCRATCH_KEPT) scratch = new Uint32Array(4096);
  if (bytes.length > 4 * SCRATCH_KEPT) bytes = new Uint8Array(16384);
  try {
    skipSpace();
    const first = text.charCodeAt(at);
    let value: unknown;
    if (first === OPEN_BRACE) value = scanObject();
    else if (first === OPEN_BRACKET) value = scanObjectArray();
    else return undefined;
    if (value === undefined) return undefined;
    skipSpace();
    return at === text.length ? value : undefined;
  } finally {
    text = "";
  }
}

function scanObjectArray(): unknown[] | undefined {
  at++; // [
  const items: unknown[] = [];
  skipSpace();
  if (text.charCodeAt(at) === CLOSE_BRACKET) {
    at++;
    return items;
  }
  for (;;) {
    if (text.charCodeAt(at) !== OPEN_BRACE) return undefined;
    const item = scanObject();
    if (item === undefined) return undefined;
    items.push(item);
    skipSpace();
    const c = text.charCodeAt(at++);
    if (c === CLOSE_BRACKET) return items;
    if (c !== COMMA) return undefined;
    skipSpace();
  }
}

/** An object at `at` (on its `{`): members other than token_ids go through JSON.parse. */
function scanObject(): Record<string, unknown> | undefined {
  at++; // {
  let members = "";
  let tokens: Uint32Array | null = null;
  skipSpace();
  if (text.charCodeAt(at) === CLOSE_BRACE) {
    at++;
    return {};
  }
  for (;;) {
    if (text.charCodeAt(at) !== QUOTE) return undefined;
    const memberStart = at;
    const keyStart = ++at;
    for (;;) {
      const c = text.charCodeAt(at);
      if (c === QUOTE) break;
      if (c === BACKSLASH || c < SPACE || Number.isNaN(c)) return undefined;
      at++;
    }
    const isTokens = at - keyStart === 9 && text.startsWith("token_ids", keyStart);
    at++; // closing quote
    skipSpace();
    if (text.charCodeAt(at++) !== COLON) return undefined;
    skipSpace();
    if (isTokens) {
      if (tokens !== null) return undefined;
      const scanned = native ? scanTokensNative() : scanTokens();
      if (scanned === undefined) return undefined;
      tokens = scanned;
      // A placeholder keeps the key where JSON.parse would put it.
      members += members.length === 0 ? '"token_ids":0' : ',"token_ids":0';
    } else {
      if (!skipValue()) return undefined;
      members +=
        members.length === 0 ? text.slice(memberStart, at) : `,${text.slice(memberStart, at)}`;
    }
    skipSpace();
    const c = text.charCodeAt(at++);
    if (c === CLOSE_BRACE) break;
    if (c !== COMMA) return undefined;
    skipSpace();
  }
  let object: Record<string, unknown>;
  if (members.length === 0) object = {};
  else {
    try {
      object = JSON.parse(`{${members}}`) as Record<string, unknown>;
    } catch {
      return undefined;
    }
  }
  if (tokens !== null) object.token_ids = new ScannedTokens(tokens);
  return object;
}

/**
 * scanTokens in native code. The text is encoded once per parse (on its first
 * token_ids); if it is not all ASCII, byte and character positions differ and the
 * JavaScript scanner takes over.
 */
function scanTokensNative(): Uint32Array | undefined {
  const length = text.length;
  if (!bytesReady) {
    if (bytes.length < length) bytes = new Uint8Array(Math.max(length, 2 * bytes.length));
    const { read, written } = encoder.encodeInto(text, bytes);
    if (read !== length || written !== length) {
      native = false;
      return scanTokens();
    }
    bytesReady = true;
  }
  // `[` and n integers take at least 2n characters: room for every one the text can
  // hold, so the native side stops at TOKENS_MAX exactly as scanTokens does (the
  // bound it gets is also the buffer's size, for memory safety).
  const room = Math.min(TOKENS_MAX, ((length - at) >>> 1) + 1);
  const start = scratchUsed;
  // A new buffer leaves the arrays already handed out in the old one.
  if (scratch.length < start + room)
    scratch = new Uint32Array(Math.max(start + room, Math.min(TOKENS_MAX, 2 * scratch.length)));
  const out = start === 0 ? scratch : scratch.subarray(start);
  const count = nativeLibrary!.kv_scan_tokens(
    bytes,
    length,
    at,
    out,
    Math.min(TOKENS_MAX, out.length),
    nativeEnd,
  );
  if (count < 0) return undefined;
  at = nativeEnd[0]!;
  return scanned(start, count);
}

/** The `count` token ids scanned into `scratch` at `start`: a view (transient) or a copy. */
function scanned(start: number, count: number): Uint32Array {
  if (!transientTokens) return scratch.slice(start, start + count);
  scratchUsed = start + count;
  return scratch.subarray(start, start + count);
}

/** `[` integer (`,` integer)* `]` with plain decimal integers in [0, 2^32); undefined otherwise. */
function scanTokens(): Uint32Array | undefined {
  // Locals, not the module's `text`/`at`: this loop runs once per character.
  const source = text;
  let i = at;
  let out = scratch;
  const start = scratchUsed;
  if (source.charCodeAt(i) !== OPEN_BRACKET) return undefined;
  let c = source.charCodeAt(++i);
  while (isSpace(c)) c = source.charCodeAt(++i);
  if (c === CLOSE_BRACKET) {
    at = i + 1;
    return new Uint32Array(0);
  }
  let count = 0;
  for (;;) {
    let value = c - ZERO;
    if (value === 0) {
      c = source.charCodeAt(++i);
      if (c >= ZERO && c <= NINE) return undefined; // a leading zero: JSON.parse decides
    } else {
      if (!(value >= 1 && value <= 9)) return undefined;
      c = source.charCodeAt(++i);
      while (c >= ZERO && c <= NINE) {
        value = value * 10 + (c - ZERO);
        c = source.charCodeAt(++i);
      }
      // Also catches any number of extra digits (the value only grows).
      if (value > U32_MAX) return undefined;
    }
    if (count === TOKENS_MAX) return undefined;
    if (start + count === out.length) {
      // The arrays already handed out stay in the old buffer; this one moves over.
      const grown = new Uint32Array(start + Math.min(TOKENS_MAX, 2 * Math.max(count, 2048)));
      grown.set(out.subarray(start, start + count), start);
      scratch = out = grown;
    }
    out[start + count++] = value;
    if (c !== COMMA) {
      while (isSpace(c)) c = source.charCodeAt(++i);
      if (c === CLOSE_BRACKET) {
        at = i + 1;
        return scanned(start, count);
      }
      if (c !== COMMA) return undefined;
    }
    c = source.charCodeAt(++i);
    while (isSpace(c)) c = source.charCodeAt(++i);
  }
}

/** JSON whitespace (all four are at most 0x20; NaN, past the end, is not). */
function isSpace(c: number): boolean {
  return c <= SPACE && (c === SPACE || c === LF || c === CR || c === TAB);
}

/**
 * Moves past one JSON value without checking its inside (JSON.parse does that later):
 * a string, a bracketed structure (nesting and strings tracked), or a scalar up to the
 * next delimiter. False when it cannot tell where the value ends.
 */
function skipValue(): boolean {
  const first = text.charCodeAt(at);
  if (first === QUOTE) return skipString();
  if (first === OPEN_BRACE || first === OPEN_BRACKET) {
    let depth = 0;
    for (;;) {
      const c = text.charCodeAt(at);
      if (Number.isNaN(c)) return false;
      if (c === QUOTE) {
        if (!skipString()) return false;
        continue;
      }
      at++;
      if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
      else if ((c === CLOSE_BRACE || c === CLOSE_BRACKET) && --depth === 0) return true;
    }
  }
  const start = at;
  for (;;) {
    const c = text.charCodeAt(at);
    if (
      Number.isNaN(c) ||
      c === COMMA ||
      c === CLOSE_BRACE ||
      c === CLOSE_BRACKET ||
      c === SPACE ||
      c === LF ||
      c === CR ||
      c === TAB
    )
      break;
    at++;
  }
  return at > start;
}

function skipString(): boolean {
  at++; // opening quote
  for (;;) {
    const c = text.charCodeAt(at++);
    if (c === QUOTE) return true;
    if (c === BACKSLASH) at++;
    else if (c < SPACE || Number.isNaN(c)) return false;
  }
}
