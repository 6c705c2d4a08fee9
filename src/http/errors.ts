/**
 * Errors on the wire: the one table from a domain error code (src/domain/errors.ts) to
 * its HTTP status, and the error object every answer carries, HTTP JSON, MessagePack and
 * WebSocket alike: OpenAI's `{"error": {"message", "type", "param", "code"}}`, which the
 * official clients parse. docs/api.md lists every code (a test holds the two equal).
 */
import { clip, type ErrorCode, KvedgeError } from "../domain/errors";
import type { Logger } from "../util/log";

/** The HTTP status of each code: the one place codes become statuses. */
export const STATUS_OF: Readonly<Record<ErrorCode, number>> = {
  bad_request: 400,
  cannot_listen: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  unknown_request: 404,
  unknown_worker: 404,
  unknown_model: 404,
  method_not_allowed: 405,
  duplicate_request: 409,
  duplicate_held_request: 409,
  worker_exists: 409,
  conflict: 409,
  too_large: 413,
  unsupported_media_type: 415,
  overloaded: 429,
  client_closed: 499,
  internal: 500,
  unsupported: 501,
  engine_unreachable: 502,
  engine_failed: 502,
  engine_timeout: 504,
  no_workers: 503,
  shutting_down: 503,
  busy: 503,
};

/** OpenAI's error `type`, by status class (what its clients map to exception classes). */
export function errorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

export interface ErrorObject {
  readonly message: string;
  readonly type: string;
  readonly param: string | null;
  readonly code: ErrorCode;
}

/** Longest error message sent: whatever a message quotes of the input, the answer stays small. */
const MESSAGE_MAX = 2048;

/** The `error` member of an answer. */
export function errorObject(error: KvedgeError): ErrorObject {
  const status = STATUS_OF[error.code];
  const message = clip(error.message, MESSAGE_MAX);
  const param = error.param === null ? null : clip(error.param, 256);
  return { message, type: errorType(status), param, code: error.code };
}

/** A client's error as a KvedgeError; null for anything else (a bug: answered as internal). */
export function clientError(error: unknown): KvedgeError | null {
  return error instanceof KvedgeError ? error : null;
}

/** The error an unexpected failure is answered with (its details go to the log only). */
export const INTERNAL_ERROR = new KvedgeError("internal", "internal error");

/** A request whose client went away before its answer. */
export function clientClosed(): KvedgeError {
  return new KvedgeError("client_closed", "the client closed the request");
}

/** A request refused or ended because kvedge stops. */
export function shuttingDown(): KvedgeError {
  return new KvedgeError("shutting_down", "kvedge is shutting down");
}

/** A KvedgeError as it crosses threads (structured clone keeps plain objects only). */
export interface WireError {
  readonly code: ErrorCode;
  readonly message: string;
  readonly retryAfterSecs: number | null;
  readonly param: string | null;
}

/** What a request failed with, to answer on another thread; a bug is logged here and sent as internal. */
export function wireError(error: unknown, log: Logger): WireError {
  const client = clientError(error);
  if (client === null) {
    const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
    log.error("request failed", { error: text });
  }
  const { code, message, retryAfterSecs, param } = client ?? INTERNAL_ERROR;
  return { code, message, retryAfterSecs, param };
}

/** The KvedgeError a WireError stands for. */
export function fromWire(wire: WireError): KvedgeError {
  return new KvedgeError(wire.code, wire.message, wire);
}
