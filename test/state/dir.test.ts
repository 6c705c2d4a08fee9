// Goal: a state directory is used by one process at a time, is usable or refused with a
// clear reason before anything starts, and starts without the temporary snapshot files
// a killed process left. Method: real directories and files in a temp dir; the lock is
// the kernel's (flock), so a second open, even in this process, is refused until the
// first lets go. (Two processes, a process killed with the lock, and a directory the
// process may not write: test/e2e/state-dir.test.ts, with the binary.)
import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { libc } from "../../src/native/library";
import { LOCK_FILE, openStateDir, StateDirError } from "../../src/state/dir";
import { SNAPSHOT_FILE, SNAPSHOT_TEMP_PREFIX } from "../../src/state/snapshot";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup();
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "kvedge-state-dir-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function refusal(path: string): StateDirError {
  try {
    const state = openStateDir(path);
    state.release();
  } catch (error) {
    if (error instanceof StateDirError) return error;
    throw error;
  }
  throw new Error(`${path} was not refused`);
}

describe("the state directory", () => {
  test("a missing one is created and locked; the lock file names the holder", () => {
    const dir = join(tempDir(), "nested", "state");
    const state = openStateDir(dir);
    cleanups.push(() => state.release());
    expect(state.locked).toBe(libc !== null);
    expect(readFileSync(join(dir, LOCK_FILE), "utf8")).toBe(`${process.pid}\n`);
  });

  test("one holder at a time: a second open is refused naming the holder, until it lets go", () => {
    const dir = tempDir();
    const first = openStateDir(dir);
    const busy = refusal(dir);
    expect(busy.busy).toBe(true);
    expect(busy.message).toBe(`state.dir ${dir} is in use by kvedge process ${process.pid}`);
    first.release();
    const second = openStateDir(dir);
    second.release();
  });

  test("temporary snapshot files of an earlier process are removed; nothing else is", () => {
    const dir = tempDir();
    for (const name of [`${SNAPSHOT_TEMP_PREFIX}123`, `${SNAPSHOT_TEMP_PREFIX}999`, SNAPSHOT_FILE])
      writeFileSync(join(dir, name), "x");
    writeFileSync(join(dir, "notes.txt"), "kept");
    const state = openStateDir(dir);
    cleanups.push(() => state.release());
    expect(state.staleRemoved).toBe(2);
    expect(readdirSync(dir).sort()).toEqual([LOCK_FILE, SNAPSHOT_FILE, "notes.txt"].sort());
  });

  test("a regular file, or a path below one, is refused with what is wrong", () => {
    const file = join(tempDir(), "plain");
    writeFileSync(file, "");
    expect(refusal(file).message).toBe(`state.dir ${file} is not a directory`);
    const below = join(file, "state");
    expect(refusal(below).message).toBe(`state.dir ${below} cannot be read (ENOTDIR)`);
    expect(refusal(below).busy).toBe(false);
    expect(existsSync(join(file, LOCK_FILE))).toBe(false);
  });
});
