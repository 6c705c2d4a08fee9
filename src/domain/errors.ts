/**
 * Domain errors: what a caller did (or what kvedge or an engine could not do), with a
 * stable code. A leaf module: any layer may throw these. The transports answer each code
 * with one status (src/http/errors.ts, STATUS_OF) and put the code on the wire
 * (`{"error": {"message", "type", "param", "code"}}`, OpenAI's error object), so a client
 * can act on the code without reading the message.
 */
export const ERROR_CODES = [
  "bad_request",
  "cannot_listen",
  "unauthorized",
  "forbidden",
  "not_found",
  "unknown_request",
  "unknown_worker",
  "unknown_model",
  "method_not_allowed",
  "duplicate_request",
  "duplicate_held_request",
  "worker_exists",
  "conflict",
  "too_large",
  "unsupported_media_type",
  "overloaded",
  "client_closed",
  "internal",
  "unsupported",
  "engine_unreachable",
  "engine_failed",
  "engine_timeout",
  "no_workers",
  "shutting_down",
  "busy",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * `text` cut to at most `max` characters (marked with "…"): what an error message may
 * quote of a client's input, so an answer never echoes unbounded input.
 */
export function clip(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max)}…`;
}

export interface ErrorDetails {
  /** When to try again, in seconds (an overloaded or busy refusal's Retry-After). */
  readonly retryAfterSecs?: number | null;
  /** The request field at fault, when one is (OpenAI's `param`). */
  readonly param?: string | null;
}

export class KvedgeError extends Error {
  override readonly name = "KvedgeError";
  readonly retryAfterSecs: number | null;
  readonly param: string | null;
  constructor(
    readonly code: ErrorCode,
    message: string,
    details: ErrorDetails = {},
  ) {
    super(message);
    this.retryAfterSecs = details.retryAfterSecs ?? null;
    this.param = details.param ?? null;
  }
}
