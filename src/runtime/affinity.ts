/**
 * CPU pinning, so one kvedge process stays on one NUMA domain's cores.
 *
 * `sched_setaffinity` (libc, through src/native/library.ts) pins one thread; Bun already runs
 * several (JIT, GC, I/O), so every thread in /proc/self/task is pinned, and threads
 * started later inherit the mask. Memory follows: Linux allocates pages on the node of
 * the CPU that first touches them, so pinned threads get node-local memory without a
 * separate memory policy (use `numactl --membind` for a hard guarantee).
 */
import { readdirSync, readFileSync } from "node:fs";
import { libc } from "../native/library";

/** CPUs the mask can name; 1024 matches glibc's cpu_set_t. */
const CPU_SET_BITS = 1024;
const CPU_LIST_MAX = CPU_SET_BITS;

/** Parses a Linux CPU list such as "0-3,8,10-11" (as in /sys and taskset -c). */
export function parseCpuList(text: string): number[] {
  const cpus = new Set<number>();
  for (const part of text.split(",")) {
    const piece = part.trim();
    const match = /^(\d+)(?:-(\d+))?$/.exec(piece);
    if (match === null) throw new Error(`bad CPU list '${text}': '${piece}' is not N or N-M`);
    const first = Number(match[1]);
    const last = match[2] === undefined ? first : Number(match[2]);
    if (last < first) throw new Error(`bad CPU list '${text}': range ${piece} runs backwards`);
    if (last >= CPU_SET_BITS)
      throw new Error(`bad CPU list '${text}': CPU ${last} is above ${CPU_SET_BITS - 1}`);
    for (let cpu = first; cpu <= last; cpu++) cpus.add(cpu);
    if (cpus.size > CPU_LIST_MAX) break;
  }
  return [...cpus].sort((a, b) => a - b);
}

/** The CPUs of a NUMA node, from sysfs. */
export function numaNodeCpus(node: number, sysfs = "/sys/devices/system/node"): number[] {
  let text: string;
  try {
    text = readFileSync(`${sysfs}/node${node}/cpulist`, "utf8").trim();
  } catch {
    throw new Error(`NUMA node ${node} does not exist on this machine (no ${sysfs}/node${node})`);
  }
  return parseCpuList(text);
}

function maskOf(cpus: readonly number[]): Uint8Array {
  const mask = new Uint8Array(CPU_SET_BITS / 8);
  for (const cpu of cpus) mask[cpu >> 3]! |= 1 << (cpu & 7);
  return mask;
}

/** The CPUs thread `tid` (0 = the calling thread) may run on. */
export function getAffinity(tid = 0): number[] {
  if (libc === null) throw new Error("CPU affinity needs glibc (libc.so.6)");
  const mask = new Uint8Array(CPU_SET_BITS / 8);
  if (libc.sched_getaffinity(tid, mask.length, mask) !== 0)
    throw new Error(`sched_getaffinity(${tid}) failed`);
  const cpus: number[] = [];
  for (let cpu = 0; cpu < CPU_SET_BITS; cpu++)
    if (mask[cpu >> 3]! & (1 << (cpu & 7))) cpus.push(cpu);
  return cpus;
}

/** Pins the calling thread only (a kvedge Worker pinning itself to its own CPUs). */
export function pinThread(cpus: readonly number[]): void {
  if (libc === null) throw new Error("CPU affinity needs glibc (libc.so.6)");
  if (cpus.length === 0) throw new Error("no CPUs to pin to");
  const mask = maskOf(cpus);
  if (libc.sched_setaffinity(0, mask.length, mask) !== 0) {
    throw new Error(`cannot pin a thread to CPUs ${cpus.join(",")}: not available to this process`);
  }
}

/**
 * Pins every thread of this process to `cpus`, but those in `except` (threads that pinned
 * themselves elsewhere). Returns how many threads were pinned. Fails (naming the CPUs)
 * if none of them is available to this process.
 */
export function pinProcess(cpus: readonly number[], except: readonly number[] = []): number {
  if (libc === null) throw new Error("CPU affinity needs glibc (libc.so.6)");
  if (cpus.length === 0) throw new Error("no CPUs to pin to");
  const mask = maskOf(cpus);
  let pinned = 0;
  for (const entry of readdirSync("/proc/self/task")) {
    if (except.includes(Number(entry))) continue;
    // A thread may exit between listing and pinning; that is fine.
    if (libc.sched_setaffinity(Number(entry), mask.length, mask) === 0) pinned++;
  }
  if (pinned === 0)
    throw new Error(`cannot pin to CPUs ${cpus.join(",")}: not available to this process`);
  return pinned;
}
