/**
 * The server's side of errors: which status each domain error code (src/domain/errors.ts)
 * answers with, over HTTP and WebSocket alike. The generic HTTP plumbing (HttpError,
 * bodies, replies, field checks) is src/http/http.ts, shared with the proxy and the
 * mock engines.
 */
import { type ErrorCode, KvedgeError } from "../domain/errors";
import { HttpError } from "../http/http";

/** The HTTP status of each domain error code: the one place codes become statuses. */
export const STATUS_OF: Readonly<Record<ErrorCode, number>> = {
  bad_request: 400,
  cannot_listen: 400,
  unknown_request: 404,
  unknown_worker: 404,
  duplicate_request: 409,
  duplicate_held_request: 409,
  worker_exists: 409,
  no_workers: 503,
  shutting_down: 503,
  overloaded: 429,
  unsupported: 501,
};

/** The client's error as an HttpError (a domain error gets its code's status); null for a bug. */
export function clientError(error: unknown): HttpError | null {
  if (error instanceof HttpError) return error;
  if (error instanceof KvedgeError) {
    return new HttpError(STATUS_OF[error.code], error.message, error.retryAfterSecs);
  }
  return null;
}
