/**
 * The state directory (`state.dir`) as one process uses it: checked usable before the
 * start goes on, locked for the life of the process, and cleared of the temporary
 * snapshot files a process killed while writing left behind.
 *
 * The lock is flock(2) on `DIR/kvedge.lock` (docs/decisions.md#state-dir-lock): the
 * kernel drops it when the process ends, however it ends (SIGKILL, a crash), so there
 * is never a stale lock to clean up, and a pid that a new process happens to reuse
 * cannot fake one. The holder writes its pid into the file, for the refusal to name it.
 * Without glibc (no libc.so.6 to call flock through) the directory is used unlocked,
 * and start-up says so.
 */
import {
  accessSync,
  closeSync,
  constants,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import { libc } from "../native/library";
import { SNAPSHOT_TEMP_PREFIX } from "./snapshot";

export const LOCK_FILE = "kvedge.lock";
const LOCK_EX = 2;
const LOCK_NB = 4;

/** Why the directory cannot be used: one line, said before anything else starts. */
export class StateDirError extends Error {
  constructor(
    message: string,
    /** Another process holds the directory (not a setting to fix). */
    readonly busy = false,
  ) {
    super(message);
  }
}

export interface StateDir {
  readonly path: string;
  /** Whether the lock is held (false only where flock cannot be called). */
  readonly locked: boolean;
  /** Temporary snapshot files of an earlier process, removed at open. */
  readonly staleRemoved: number;
  /** Lets go of the lock (the process ending does that too). */
  release(): void;
}

/** Checks, locks and cleans `path` (creating it if missing); throws StateDirError. */
export function openStateDir(path: string): StateDir {
  checkUsable(path);
  const fd = openLockFile(path);
  const locked = lock(fd, path);
  return {
    path,
    locked,
    staleRemoved: removeStaleTemps(path),
    release: () => closeSync(fd),
  };
}

const codeOf = (error: unknown) => (error as NodeJS.ErrnoException).code ?? String(error);

function checkUsable(path: string): void {
  let isDirectory: boolean;
  try {
    isDirectory = statSync(path).isDirectory();
  } catch (error) {
    if (codeOf(error) !== "ENOENT")
      throw new StateDirError(`state.dir ${path} cannot be read (${codeOf(error)})`);
    try {
      mkdirSync(path, { recursive: true, mode: 0o700 });
    } catch (made) {
      throw new StateDirError(`state.dir ${path} cannot be created (${codeOf(made)})`);
    }
    isDirectory = true;
  }
  if (!isDirectory) throw new StateDirError(`state.dir ${path} is not a directory`);
  try {
    accessSync(path, constants.R_OK | constants.W_OK | constants.X_OK);
    readdirSync(path);
  } catch (error) {
    throw new StateDirError(`state.dir ${path} is not readable and writable (${codeOf(error)})`);
  }
}

function openLockFile(path: string): number {
  try {
    return openSync(join(path, LOCK_FILE), constants.O_RDWR | constants.O_CREAT, 0o600);
  } catch (error) {
    // A read-only file system (EROFS) passes access(2) for root: this is where it shows.
    throw new StateDirError(`state.dir ${path} is not writable (${codeOf(error)})`);
  }
}

/** Takes the lock or throws (busy); false where flock cannot be called. */
function lock(fd: number, path: string): boolean {
  if (libc === null) return false;
  if (libc.flock(fd, LOCK_EX | LOCK_NB) !== 0) {
    closeSync(fd);
    throw new StateDirError(`state.dir ${path} is in use by ${holderOf(path)}`, true);
  }
  const pid = new TextEncoder().encode(`${process.pid}\n`);
  ftruncateSync(fd, 0);
  writeSync(fd, pid, 0, pid.length, 0);
  return true;
}

function holderOf(path: string): string {
  try {
    const pid = readFileSync(join(path, LOCK_FILE), "utf8").trim();
    return /^[0-9]+$/.test(pid) ? `kvedge process ${pid}` : "another kvedge process";
  } catch {
    return "another kvedge process";
  }
}

/** Removes `kvedge.snapshot.tmp-*` (no one else writes here: the lock is ours). */
function removeStaleTemps(path: string): number {
  let removed = 0;
  for (const name of readdirSync(path)) {
    if (!name.startsWith(SNAPSHOT_TEMP_PREFIX)) continue;
    try {
      unlinkSync(join(path, name));
      removed++;
    } catch {
      // Gone already, or not ours to remove: the snapshot writes go on either way.
    }
  }
  return removed;
}
