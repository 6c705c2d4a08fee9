/**
 * Waiting on conditions instead of sleeping for a guessed time: tests poll what they
 * need to see and fail with a message naming it when it does not come. The timeouts are
 * generous (a shared 2-core machine); a passing test never waits for them.
 */

const POLL_MS = 5;

/** Polls `check` until it is true; after `timeoutMs` throws, naming `what`. */
export async function until(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await Bun.sleep(POLL_MS);
  }
}

/**
 * Polls `check` until it returns a value other than undefined, and returns it. An error
 * thrown by `check` counts as "not yet" (a server still starting); the last one is
 * reported on timeout.
 */
export async function eventually<T>(
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
  what = "condition",
): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  let last: unknown;
  while (performance.now() < deadline) {
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (error) {
      last = error;
    }
    await Bun.sleep(POLL_MS);
  }
  const cause = last === undefined ? "" : `: ${(last as Error).message}`;
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${cause}`);
}

/** A free TCP port on loopback: bound, then released, for a side that must know it first. */
export function freePort(): number {
  const probe = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = probe.port;
  probe.stop(true);
  return port;
}
