/**
 * HTTP plumbing shared by kvedge's API (src/server), the proxy and the mock engines
 * (src/sim): error answers (a KvedgeError as its code's status and OpenAI's error object,
 * ./errors.ts), bounded body reading (JSON or MessagePack), content negotiation, and
 * validation of the fields requests carry (token ids, 64-bit ids and hashes as decimal
 * strings).
 */
import { Unpackr } from "msgpackr";
import { KvedgeError } from "../domain/errors";
import { errorObject, STATUS_OF } from "./errors";
import { bufferBudget } from "../util/buffer-budget";
import { U64_MAX } from "../util/u64";
import { MsgpackEncoder, type MsgpackValue } from "../wire/msgpack";
import { defaultTokenScanner, parseRequestJson, ScannedTokens, TOKENS_MAX } from "./request-json";
import { BinRef, MsgpackRequestReader } from "../wire/request-msgpack";

export { TOKENS_MAX };

export const MSGPACK = "application/msgpack";

/**
 * Bun.serve's maxRequestBodySize for kvedge's servers: so large that Bun's own refusal
 * (a 413 without a body, then a reset the client may see instead) never applies, and
 * the body limit is always ours (`receiveBody`: a JSON 413 from the declared length or
 * past the limit). A body nobody reads is not buffered: Bun closes the connection.
 */
export const UNLIMITED_BODY = Number.MAX_SAFE_INTEGER;
const JSON_TYPE = "application/json";

/** 415 unless the request declares a JSON or MessagePack body (./guard.ts says why). */
export function checkBodyType(request: Request): void {
  const header = request.headers.get("content-type") ?? "";
  if (header === JSON_TYPE || header === MSGPACK) return; // what clients send, checked without parsing
  const type = header.split(";", 1)[0]!.trim().toLowerCase();
  if (type === JSON_TYPE || type === MSGPACK) return;
  throw new KvedgeError(
    "unsupported_media_type",
    `send the body as Content-Type: ${JSON_TYPE} or ${MSGPACK}${type === "" ? "" : `, not ${type}`}`,
  );
}

// Integers above 2^53 would lose precision as numbers; ids travel as strings anyway.
const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });
const encoder = new MsgpackEncoder();

/** Reads a request body of at most `limitBytes`, as JSON or (by Content-Type) MessagePack. */
export async function readBody(request: Request, limitBytes: number): Promise<unknown> {
  return parseBody(await receiveBody(request, limitBytes));
}

/** A request body as received: JSON text, or MessagePack bytes. */
export type ReceivedBody = { readonly json: string } | { readonly msgpack: Uint8Array };

/**
 * Receives a body of at most `limitBytes` without parsing it (`parseBody` does), so
 * the hot endpoints can parse in their turn batch (./turn.ts). Only JSON and
 * MessagePack bodies are accepted (415 otherwise).
 */
export function receiveBody(request: Request, limitBytes: number): Promise<ReceivedBody> {
  try {
    checkBodyType(request);
  } catch (error) {
    return Promise.reject(error);
  }
  const declared = request.headers.get("content-length");
  if (declared !== null && Number(declared) > limitBytes)
    return Promise.reject(tooLarge(declared, limitBytes));
  // A declared body is held from now until it has arrived (a streamed one, chunk by
  // chunk in readStream): in the process-wide budget of buffered bytes.
  const held = declared === null ? 0 : Number(declared) || 0;
  if (held > 0 && !bufferBudget.take(held)) return Promise.reject(overBudget());
  const failed = (error: unknown): never => {
    bufferBudget.give(held);
    throw error;
  };
  const msgpack = (request.headers.get("content-type") ?? "").startsWith(MSGPACK);
  if (declared !== null && !msgpack) {
    // JSON of a declared (and checked) length: the body as text in one step, the
    // cheapest way in (not request.body, which would build a stream). A body of only
    // a BOM decodes to "" but is not empty. Not an async function: on the hot path
    // every promise and await counts.
    return request.text().then((text) => {
      bufferBudget.give(held);
      if (text.length === 0 && !(held > 0))
        throw new KvedgeError("bad_request", "request body is empty");
      return { json: text };
    }, failed);
  }
  return readLimited(request, limitBytes, declared !== null).then((bytes) => {
    bufferBudget.give(held);
    if (bytes.length === 0) throw new KvedgeError("bad_request", "request body is empty");
    return msgpack ? { msgpack: bytes } : { json: utf8.decode(bytes) };
  }, failed);
}

/**
 * Receives a body of at most `limitBytes` as its bytes, unparsed and undecoded (the
 * proxy forwards them as they came), with the checks and budget of `receiveBody`:
 * JSON only (415 otherwise), or any type with `jsonOnly` false.
 */
export function receiveBytes(
  request: Request,
  limitBytes: number,
  jsonOnly = true,
): Promise<Uint8Array> {
  const header = request.headers.get("content-type") ?? "";
  if (jsonOnly && header.split(";", 1)[0]!.trim().toLowerCase() !== JSON_TYPE) {
    return Promise.reject(
      new KvedgeError("unsupported_media_type", `send the body as Content-Type: ${JSON_TYPE}`),
    );
  }
  const declared = request.headers.get("content-length");
  if (declared !== null && Number(declared) > limitBytes)
    return Promise.reject(tooLarge(declared, limitBytes));
  const held = declared === null ? 0 : Number(declared) || 0;
  if (held > 0 && !bufferBudget.take(held)) return Promise.reject(overBudget());
  return readLimited(request, limitBytes, declared !== null).then(
    (bytes) => {
      bufferBudget.give(held);
      if (bytes.length === 0 && jsonOnly)
        throw new KvedgeError("bad_request", "request body is empty");
      return bytes;
    },
    (error: unknown) => {
      bufferBudget.give(held);
      throw error;
    },
  );
}

function tooLarge(declared: string, limitBytes: number): KvedgeError {
  return new KvedgeError(
    "too_large",
    `request body of ${declared} bytes is over the limit of ${limitBytes}`,
  );
}

function overBudget(): KvedgeError {
  return new KvedgeError(
    "busy",
    `kvedge holds its limit of ${bufferBudget.limitBytes} bytes of unfinished requests and replies; try again`,
  );
}

/**
 * A received body, parsed. `transient`: JSON token arrays may be views that the next
 * parse reuses (parseRequestJson), for callers that hash them at once.
 */
export function parseBody(body: ReceivedBody, transient = false): unknown {
  if ("json" in body) return parseJson(body.json, transient);
  // One request map of the usual shape: read into the reader's refilled body.
  if (transient && bodyReader.read(body.msgpack) && !bodyReader.isBatch)
    return bodyReader.request(0);
  try {
    return unpackr.unpack(body.msgpack);
  } catch (error) {
    throw new KvedgeError("bad_request", `malformed MessagePack body: ${(error as Error).message}`);
  }
}

function parseJson(text: string, transient: boolean): unknown {
  try {
    return parseRequestJson(text, defaultTokenScanner, transient);
  } catch (error) {
    throw new KvedgeError("bad_request", `malformed JSON body: ${(error as Error).message}`);
  }
}

const utf8 = new TextDecoder();
const bodyReader = new MsgpackRequestReader(1);

function readLimited(request: Request, limitBytes: number, declared: boolean): Promise<Uint8Array> {
  // A declared length was checked against the limit already: the body at once, much
  // cheaper than iterating the stream (and than touching request.body, which builds one).
  // See docs/decisions.md#whole-bodies.
  return declared ? request.bytes() : readStream(request, limitBytes);
}

async function readStream(request: Request, limitBytes: number): Promise<Uint8Array> {
  if (request.body === null) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    for await (const chunk of request.body) {
      if (total + chunk.byteLength > limitBytes)
        throw new KvedgeError("too_large", `request body is over the limit of ${limitBytes} bytes`);
      if (!bufferBudget.take(chunk.byteLength)) throw overBudget();
      total += chunk.byteLength;
      chunks.push(chunk);
    }
  } finally {
    bufferBudget.give(total);
  }
  if (chunks.length === 1) return chunks[0]!;
  const joined = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    joined.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return joined;
}

export function wantsMsgpack(request: Request): boolean {
  return (request.headers.get("accept") ?? "").includes(MSGPACK);
}

const bigintAsString = (_key: string, value: unknown): unknown =>
  typeof value === "bigint" ? value.toString() : value;

/**
 * JSON text of a response body, bigints as decimal strings. Plain JSON.stringify first
 * (a replacer function slows every response down, and API bodies carry ids as strings
 * already); only a body it refuses, i.e. one holding a bigint, takes the replacer.
 */
export function toJson(body: unknown): string {
  try {
    return JSON.stringify(body);
  } catch (error) {
    if (!(error instanceof TypeError)) throw error;
    return JSON.stringify(body, bigintAsString);
  }
}

/** A JSON response, or MessagePack when the client's Accept header asks for it. */
export function reply(request: Request | null, status: number, body: unknown): Response {
  if (request !== null && wantsMsgpack(request))
    return msgpackReply(status, (out) => out.value(body as MsgpackValue));
  return new Response(toJson(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

/** A MessagePack response whose body `write` writes (for answers written without objects). */
export function msgpackReply(status: number, write: (encoder: MsgpackEncoder) => void): Response {
  encoder.reset();
  write(encoder);
  // A copy: the Response may read its body after the encoder moved on.
  return new Response(encoder.finish(), { status, headers: { "content-type": MSGPACK } });
}

/** A client's error as its code's status, with OpenAI's error object as the body. */
export function errorReply(request: Request | null, error: KvedgeError): Response {
  const response = reply(request, STATUS_OF[error.code], { error: errorObject(error) });
  if (error.retryAfterSecs !== null)
    response.headers.set("retry-after", String(error.retryAfterSecs));
  return response;
}

// ---- Field validation: every message names the field and what it must be. ----

export function asObject(value: unknown, what = "request body"): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new KvedgeError("bad_request", `${what} must be a JSON object`);
  }
  return value as Record<string, unknown>;
}

const TOKEN_LIMIT = 2 ** 32;

/**
 * `token_ids`: integers in [0, 2^32), as an array (JSON, MessagePack), or in a
 * MessagePack body as `bin` bytes: little-endian u32, 4 bytes per token.
 */
export function tokenIds(body: Record<string, unknown>, field = "token_ids"): Uint32Array {
  const value = body[field];
  if (value instanceof ScannedTokens) return value.tokens;
  if (value instanceof BinRef) return tokenBytes(value.source, value.start, value.end, field);
  if (value instanceof Uint8Array) return tokenBytes(value, 0, value.length, field);
  if (!Array.isArray(value))
    throw new KvedgeError("bad_request", `${field} must be an array of integers`, { param: field });
  if (value.length > TOKENS_MAX)
    throw new KvedgeError("too_large", `${field} has over ${TOKENS_MAX} tokens`, { param: field });
  const tokens = new Uint32Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const token = value[i];
    if (
      typeof token !== "number" ||
      !Number.isInteger(token) ||
      token < 0 ||
      token >= TOKEN_LIMIT
    ) {
      throw new KvedgeError(
        "bad_request",
        `${field}[${i}] must be an integer in [0, 2^32), got ${describeValue(token)}`,
        { param: field },
      );
    }
    tokens[i] = token;
  }
  return tokens;
}

/** A value for an error message: MessagePack integers past 2^53 arrive as bigints, which JSON.stringify refuses. */
function describeValue(value: unknown): string {
  return typeof value === "bigint" ? value.toString() : (JSON.stringify(value) ?? String(value));
}

/**
 * Token ids sent as bytes (a MessagePack `bin`): copied into a scratch array reused by
 * every call, so there is no per-token work and no allocation. (Viewing the bytes in
 * place would need the message's ArrayBuffer, which Bun materializes at a cost well
 * above the copy.) The result is valid until the next call: callers hash it at once.
 * kvedge runs only on little-endian hosts (x64, arm64), so the copy reads them right.
 */
function tokenBytes(bytes: Uint8Array, start: number, end: number, field: string): Uint32Array {
  const length = end - start;
  if (length % 4 !== 0) {
    throw new KvedgeError(
      "bad_request",
      `${field} as bytes must be little-endian u32s (a multiple of 4 bytes), got ${length} bytes`,
      { param: field },
    );
  }
  const count = length / 4;
  if (count > TOKENS_MAX)
    throw new KvedgeError("too_large", `${field} has over ${TOKENS_MAX} tokens`, { param: field });
  if (tokenScratch.length < count) {
    tokenScratch = new Uint32Array(Math.max(count, 2 * tokenScratch.length));
    tokenScratchBytes = new Uint8Array(tokenScratch.buffer);
  }
  // A Buffer (a WebSocket frame) copies natively; other byte arrays through a view.
  if (Buffer.isBuffer(bytes)) bytes.copy(tokenScratchBytes, 0, start, end);
  else
    tokenScratchBytes.set(start === 0 && end === bytes.length ? bytes : bytes.subarray(start, end));
  return tokenScratch.subarray(0, count);
}

let tokenScratch = new Uint32Array(8192);
let tokenScratchBytes = new Uint8Array(tokenScratch.buffer);

/** A u64 given as a decimal string (or a number below 2^53, or a MessagePack integer). */
export function u64Field(value: unknown, field: string): bigint {
  if (typeof value === "string" && /^(0|[1-9][0-9]{0,19})$/.test(value)) {
    const big = BigInt(value);
    if (big <= U64_MAX) return big;
  } else if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) {
    return BigInt(value);
  } else if (typeof value === "bigint" && value >= 0n && value <= U64_MAX) {
    return value;
  }
  throw new KvedgeError(
    "bad_request",
    `${field} must be an unsigned 64-bit integer as a decimal string`,
    { param: field },
  );
}

export function optionalString(
  body: Record<string, unknown>,
  field: string,
  maxLength = 1024,
): string | null {
  const value = body[field];
  if (value === undefined || value === null) return null;
  if (typeof value !== "string")
    throw new KvedgeError("bad_request", `${field} must be a string`, { param: field });
  if (value.length > maxLength)
    throw new KvedgeError("bad_request", `${field} is longer than ${maxLength} characters`, {
      param: field,
    });
  return value;
}

export function optionalNumber(
  body: Record<string, unknown>,
  field: string,
  min: number,
  max: number,
): number | null {
  const value = body[field];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value) || value < min || value > max) {
    throw new KvedgeError("bad_request", `${field} must be a number in [${min}, ${max}]`, {
      param: field,
    });
  }
  return value;
}

export function optionalInt(
  body: Record<string, unknown>,
  field: string,
  min: number,
  max: number,
): number | null {
  const value = optionalNumber(body, field, min, max);
  if (value !== null && !Number.isInteger(value))
    throw new KvedgeError("bad_request", `${field} must be an integer`, { param: field });
  return value;
}
