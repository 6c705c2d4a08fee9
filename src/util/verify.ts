/**
 * Invariant checks shared by every module. `assert` is cheap and always on (messages
 * are constant strings, so a passing assert costs one branch); the O(N) `verify()`
 * walks run after every mutation only with KVEDGE_VERIFY=1, read here and nowhere else.
 *
 * See docs/decisions.md#hot-path-checks.
 */

/** A broken internal invariant: a bug, never bad input. */
export class InvariantError extends Error {
  override readonly name = "InvariantError";
}

export function assert(condition: boolean, message: string): asserts condition {
  if (!condition) throw new InvariantError(message);
}

/** Throws InvariantError; for hot paths: `if (bad) fail("...")` keeps the check inline. */
export function fail(message: string): never {
  throw new InvariantError(message);
}

/** Whether O(N) self-checks run after every change (tests, debugging): KVEDGE_VERIFY=1. */
export const VERIFY = process.env.KVEDGE_VERIFY === "1";
