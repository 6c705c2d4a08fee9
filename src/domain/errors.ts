/**
 * Domain errors: what a caller did that the core refuses, with a stable code. A leaf
 * module (any layer may throw these); the transports map codes to their statuses in
 * one table (src/server/http.ts, STATUS_OF).
 */
export type ErrorCode =
  | "bad_request"
  | "no_workers"
  | "duplicate_request"
  | "duplicate_held_request"
  | "unknown_request"
  | "worker_exists"
  | "unknown_worker"
  | "cannot_listen"
  | "shutting_down"
  | "overloaded"
  | "unsupported";

export class KvedgeError extends Error {
  override readonly name = "KvedgeError";
  /** `retryAfterSecs`: when to try again (an overloaded refusal's Retry-After). */
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly retryAfterSecs: number | null = null,
  ) {
    super(message);
  }
}
