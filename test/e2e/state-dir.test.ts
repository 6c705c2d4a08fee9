// Goal: `kvedge serve --state-dir` takes its directory for itself: a second process on
// the same directory refuses to start with one line and a non-zero exit, while the
// first lives; once the first is killed (SIGKILL: no cleanup ran) the directory is free
// again, and the temporary snapshot file a killed writer left is gone after the next
// start. A directory that cannot be used (a regular file; one the process may not
// write) stops the start with one line naming it. Method: the compiled binary; the
// unwritable case runs it as an unprivileged user (setpriv) when the tests run as root,
// since root may write anywhere.
import { afterEach, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SNAPSHOT_TEMP_PREFIX } from "../../src/state/snapshot";
import { kvedgeBinary, runKvedge } from "../support/kvedge";
import { type ServeProcess, startServe } from "../support/serve";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-state-e2e-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function serveOn(dir: string): Promise<ServeProcess> {
  const serve = await startServe(["--warmup-routes", "0", "--state-dir", dir]);
  cleanups.push(() => serve.kill("SIGKILL"));
  return serve;
}

/** A second `kvedge serve` on `dir`, which must refuse: its exit code and stderr. */
const refused = (dir: string) =>
  runKvedge(["serve", "--port", "0", "--warmup-routes", "0", "--state-dir", dir]);

describe("one process per state directory", () => {
  test("a second process is refused while the first lives; after SIGKILL the directory is free", async () => {
    const dir = tempDir();
    const first = await serveOn(dir);
    const second = await refused(dir);
    expect(second.code).toBe(1);
    expect(second.stderr).toMatch(
      new RegExp(`^kvedge serve: state\\.dir ${dir} is in use by kvedge process \\d+\\n$`),
    );
    // Killed while writing a snapshot: its temporary file stays behind, and its lock does not.
    const stale = join(dir, `${SNAPSHOT_TEMP_PREFIX}424242`);
    writeFileSync(stale, "half a snapshot");
    first.kill("SIGKILL");
    await first.exited;
    await serveOn(dir);
    expect(existsSync(stale)).toBe(false);
  });
});

describe("a state directory that cannot be used stops the start", () => {
  test("a regular file", async () => {
    const file = join(tempDir(), "state");
    writeFileSync(file, "");
    const result = await refused(file);
    expect([result.code, result.stderr]).toEqual([
      2,
      `kvedge serve: state.dir ${file} is not a directory\n`,
    ]);
  });

  test("a directory the process may not write", async () => {
    const parent = tempDir();
    chmodSync(parent, 0o755); // reachable by anyone; the directory itself read-only
    const dir = join(parent, "read-only");
    mkdirSync(dir);
    chmodSync(dir, 0o555);
    const root = process.getuid?.() === 0;
    // Root writes anywhere: run kvedge as nobody, as a service account would run it.
    const command = [
      ...(root ? ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] : []),
      kvedgeBinary(),
      ...["serve", "--port", "0", "--warmup-routes", "0", "--state-dir", dir],
    ];
    const child = Bun.spawn(command, {
      cwd: tmpdir(),
      env: { PATH: process.env.PATH ?? "" },
      stdout: "pipe",
      stderr: "pipe",
    });
    const [stderr, code] = await Promise.all([new Response(child.stderr).text(), child.exited]);
    expect([code, stderr]).toEqual([
      2,
      `kvedge serve: state.dir ${dir} is not readable and writable (EACCES)\n`,
    ]);
  });
});
