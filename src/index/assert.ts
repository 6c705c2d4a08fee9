/**
 * Cheap O(1) assertions, always on. Messages are constant strings so a passing
 * assert costs one branch; `verify()` walks (O(N)) are separate and gated.
 *
 * See docs/decisions.md#hot-path-checks.
 */

/** A broken internal invariant of an index: a bug, never bad input. */
export class IndexInvariantError extends Error {
  override readonly name = "IndexInvariantError";
}

export function assert(condition: boolean, message: string): asserts condition {
  if (!condition) throw new IndexInvariantError(message);
}

/** Whether `verify()` runs after every mutation unless an index says otherwise. */
export const VERIFY_BY_DEFAULT = process.env.KVEDGE_VERIFY === "1";

/** Throws IndexInvariantError; for hot paths: `if (bad) fail("...")` keeps the check inline. */
export function fail(message: string): never {
  throw new IndexInvariantError(message);
}
