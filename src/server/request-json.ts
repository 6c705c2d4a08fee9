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
 * keep JSON.parse's order and a duplicate key still ends with the last value); the scanner itself only checks the separators between members and the
 * integers, and gives up on anything it does not fully understand. A top-level member
 * text that is not valid JSON makes that JSON.parse throw, and the whole text then goes
 * to JSON.parse for the error.
 */
/** A request longer than this many tokens is refused (8 MiB of body holds fewer anyway). */
export const TOKENS_MAX = 4_000_000;

/** Token ids the scanner already read and checked (integers in [0, 2^32)). */
export class ScannedTokens {
  constructor(readonly tokens: Uint32Array) {}
}

/** JSON.parse's result for `text`, with `token_ids` arrays of request objects as ScannedTokens. Throws as JSON.parse does. */
export function parseRequestJson(text: string): unknown {
  const fast = scanTop(text);
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
/** Digits of 4294967295. */
const TOKEN_DIGITS_MAX = 10;

// The scanner's state: the text and the position, shared by the functions below (one
// request is scanned at a time; nothing here is re-entered).
let text = "";
let at = 0;
let scratch = new Uint32Array(4096);

function skipSpace(): void {
  for (;;) {
    const c = text.charCodeAt(at);
    if (c !== SPACE && c !== LF && c !== CR && c !== TAB) return;
    at++;
  }
}

/** The top level: an object, or an array of objects. Undefined = use JSON.parse. */
function scanTop(source: string): unknown {
  text = source;
  at = 0;
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
      const scanned = scanTokens();
      if (scanned === undefined) return undefined;
      tokens = scanned;
      // A placeholder keeps the key where JSON.parse would put it.
      members += members.length === 0 ? '"token_ids":0' : ',"token_ids":0';
    } else {
      if (!skipValue()) return undefined;
      members += members.length === 0 ? text.slice(memberStart, at) : `,${text.slice(memberStart, at)}`;
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

/** `[` integer (`,` integer)* `]` with plain decimal integers in [0, 2^32); undefined otherwise. */
function scanTokens(): Uint32Array | undefined {
  if (text.charCodeAt(at) !== OPEN_BRACKET) return undefined;
  at++;
  skipSpace();
  let count = 0;
  if (text.charCodeAt(at) === CLOSE_BRACKET) {
    at++;
    return new Uint32Array(0);
  }
  for (;;) {
    let c = text.charCodeAt(at);
    if (c < ZERO || c > NINE) return undefined;
    const digitsStart = at;
    let value = 0;
    do {
      value = value * 10 + (c - ZERO);
      c = text.charCodeAt(++at);
    } while (c >= ZERO && c <= NINE);
    const digits = at - digitsStart;
    // A leading zero (JSON forbids it), or more digits than a u32 has: JSON.parse decides.
    if (digits > TOKEN_DIGITS_MAX || (digits > 1 && text.charCodeAt(digitsStart) === ZERO) || value > U32_MAX) return undefined;
    if (count === TOKENS_MAX) return undefined;
    if (count === scratch.length) {
      const grown = new Uint32Array(scratch.length * 2);
      grown.set(scratch);
      scratch = grown;
    }
    scratch[count++] = value;
    if (c === SPACE || c === LF || c === CR || c === TAB) {
      skipSpace();
      c = text.charCodeAt(at);
    }
    at++;
    if (c === CLOSE_BRACKET) return scratch.slice(0, count);
    if (c !== COMMA) return undefined;
    skipSpace();
  }
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
    if (Number.isNaN(c) || c === COMMA || c === CLOSE_BRACE || c === CLOSE_BRACKET
      || c === SPACE || c === LF || c === CR || c === TAB) break;
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
