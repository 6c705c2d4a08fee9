/**
 * Shared-system-prompt churn (the harness of seed 001, Dynamo PR "release unowned
 * radix branches after eviction"): one worker keeps 16 system-prompt blocks; each
 * cycle stores a unique 8-block suffix under them and removes it again. 5,000 warm-up
 * cycles reuse two suffixes, then --cycles unique suffixes run. Every cycle checks the
 * held-block count is back to 16; checkpoints (every 2^16 cycles) also check the prompt
 * still matches in full and the last suffix is gone. Besides the overall rate, the JSON
 * gives the fastest 2^16-cycle stretch (the machine's other jobs slow the rest). RSS is read from /proc/self after
 * a forced GC, after warm-up and at the end.
 *
 * The warm-up is --warmup cycles (default 200,000, not 5,000): Bun's JIT is still
 * compiling the hot paths after 5,000 cycles, and that code then lands in "RSS added"
 * (+2 to +5 MB, varying run to run). Alternating two suffixes leaves the index exactly
 * as after 5,000 such cycles; `--warmup 5000` runs the original harness. Also printed:
 * how many times the optimizing JIT compiled the hot functions (more than a handful
 * means a deopt loop).
 *
 * Timed region: the unique cycles, including event generation (hashes written into
 * reused typed arrays), store, remove, the per-cycle check and the checkpoints.
 * Outside: index creation, warm-up, GC and RSS reads.
 *
 *   bun bench/churn.ts [--backend crtc|positional|reference] [--cycles N] [--warmup N] [--json]
 */
import { numberOfDFGCompiles } from "bun:jsc";
import { storeChain } from "../src/index/crtc/store";
import { removeHashes } from "../src/index/crtc/remove";
import { createIndex } from "../src/index/index";
import { BACKEND_NAMES, type BackendName, MatchResult, StoreStatus } from "../src/index/types";
import { benchFlags, provenance, rssBytes } from "./lib";

const PROMPT_BLOCKS = 16;
const SUFFIX_BLOCKS = 8;
const CHECKPOINT_MASK = 0xffff;
const WORKER = 1n;

const flags = benchFlags(
  "bun bench/churn.ts [--backend crtc|positional|reference] [--cycles N] [--warmup N] [--json]",
  {
    backend: { type: "string" },
    cycles: { type: "string" },
    warmup: { type: "string" },
    json: { type: "boolean" },
  },
);
const backend = (flags.backend ?? "crtc") as BackendName;
if (!BACKEND_NAMES.includes(backend))
  throw new Error(`--backend must be one of ${BACKEND_NAMES.join(", ")}`);
const cycles = Number(flags.cycles ?? 1_000_000);
if (!Number.isSafeInteger(cycles) || cycles < 1)
  throw new Error("--cycles must be a positive integer");
const json = flags.json === true;

const warmupCycles = Number(flags.warmup ?? 200_000);
if (!Number.isSafeInteger(warmupCycles) || warmupCycles < 2 || warmupCycles % 2 !== 0) {
  throw new Error("--warmup must be an even integer >= 2");
}
const index = createIndex(backend, 16, { verify: false });
const counters = index.counters;
const promptExternal = new Uint32Array(2 * PROMPT_BLOCKS);
const promptLocal = new Uint32Array(2 * PROMPT_BLOCKS);
for (let i = 0; i < PROMPT_BLOCKS; i++) {
  promptExternal[2 * i] = 0x7000_0000;
  promptExternal[2 * i + 1] = i + 1;
  promptLocal[2 * i] = 0x5000_0000;
  promptLocal[2 * i + 1] = i + 1;
}
const parentHi = promptExternal[2 * (PROMPT_BLOCKS - 1)]!;
const parentLo = promptExternal[2 * (PROMPT_BLOCKS - 1) + 1]!;
const suffixExternal = new Uint32Array(2 * SUFFIX_BLOCKS);
const suffixLocal = new Uint32Array(2 * SUFFIX_BLOCKS);
const match = new MatchResult();
const query = new Uint32Array(2 * (PROMPT_BLOCKS + SUFFIX_BLOCKS));

function storePrompt(): void {
  if (
    index.applyStored(WORKER, 0, false, 0, 0, promptExternal, promptLocal, PROMPT_BLOCKS) !==
    StoreStatus.Ok
  ) {
    throw new Error("storing the prompt failed");
  }
}

/** Writes suffix number `n`'s hashes (unique per n). */
function writeSuffix(n: number): void {
  for (let i = 0; i < SUFFIX_BLOCKS; i++) {
    suffixExternal[2 * i] = n;
    suffixExternal[2 * i + 1] = 0x8000_0000 | i;
    suffixLocal[2 * i] = Math.imul(n, 0x9e3779b1) >>> 0;
    suffixLocal[2 * i + 1] = (n ^ (i << 24)) >>> 0;
  }
}

function cycle(n: number): void {
  writeSuffix(n);
  if (
    index.applyStored(
      WORKER,
      0,
      true,
      parentHi,
      parentLo,
      suffixExternal,
      suffixLocal,
      SUFFIX_BLOCKS,
    ) !== StoreStatus.Ok
  ) {
    throw new Error(`cycle ${n}: store rejected`);
  }
  if (index.applyRemoved(WORKER, 0, suffixExternal, SUFFIX_BLOCKS) !== 0)
    throw new Error(`cycle ${n}: unknown hashes`);
  if (counters.blocksStored - counters.blocksRemoved !== PROMPT_BLOCKS)
    throw new Error(`cycle ${n}: held blocks drifted`);
}

function checkpoint(n: number): void {
  if (index.stats().blocks !== PROMPT_BLOCKS)
    throw new Error(`cycle ${n}: index holds ${index.stats().blocks} blocks`);
  query.set(promptLocal);
  query.set(suffixLocal.subarray(0, 2 * SUFFIX_BLOCKS), 2 * PROMPT_BLOCKS);
  index.findMatches(query, PROMPT_BLOCKS + SUFFIX_BLOCKS, match);
  if (match.count !== 1 || match.blocks[0] !== PROMPT_BLOCKS)
    throw new Error(`cycle ${n}: prompt no longer matches exactly`);
}

/** RSS after a full GC and a pause that lets the allocator return freed pages. */
function settledRss(): number {
  Bun.gc(true);
  Bun.sleepSync(1000);
  Bun.gc(true);
  return rssBytes();
}

storePrompt();
for (let n = 0; n < warmupCycles; n++) cycle(n & 1);
checkpoint(warmupCycles);
const rssAfterWarmup = settledRss();

const started = performance.now();
const cpuStarted = process.cpuUsage();
// The fastest stretch between checkpoints: on a shared host, what the code does when
// nothing else runs.
let stretchStart = started;
let bestStretch = 0;
for (let n = 0; n < cycles; n++) {
  cycle(2 + n);
  if ((n & CHECKPOINT_MASK) === CHECKPOINT_MASK) {
    const now = performance.now();
    bestStretch = Math.max(bestStretch, (CHECKPOINT_MASK + 1) / ((now - stretchStart) / 1000));
    checkpoint(n);
    stretchStart = performance.now();
  }
}
checkpoint(cycles);
const seconds = (performance.now() - started) / 1000;
const cpu = process.cpuUsage(cpuStarted);
// CPU time of the process (all its threads): on a shared host, far less polluted than wall time.
const cpuSeconds = (cpu.user + cpu.system) / 1e6;
const rssAfter = settledRss();

const result = {
  backend,
  cycles,
  warmup_cycles: warmupCycles,
  cycles_per_sec: Math.round(cycles / seconds),
  best_stretch_cycles_per_sec: Math.round(bestStretch),
  cycles_per_cpu_sec: Math.round(cycles / cpuSeconds),
  rss_after_warmup_mb: rssAfterWarmup / 1e6,
  rss_after_mb: rssAfter / 1e6,
  rss_added_mb: (rssAfter - rssAfterWarmup) / 1e6,
  blocks_end: index.stats().blocks,
  nodes_end: index.stats().nodes,
  // More than a handful of optimizing compiles of a hot function means a deopt loop.
  dfg_compiles: {
    cycle: numberOfDFGCompiles(cycle),
    ...(backend === "crtc"
      ? {
          storeChain: numberOfDFGCompiles(storeChain),
          removeHashes: numberOfDFGCompiles(removeHashes),
        }
      : {}),
  },
  provenance: provenance(),
};
if (json) {
  process.stdout.write(`${JSON.stringify(result)}\n`);
} else {
  console.log(
    `${backend}: ${cycles} cycles, ${(result.cycles_per_sec / 1e6).toFixed(3)}M cycles/s, ` +
      `RSS ${result.rss_after_warmup_mb.toFixed(3)} -> ${result.rss_after_mb.toFixed(3)} MB ` +
      `(added ${result.rss_added_mb.toFixed(3)} MB), ${result.blocks_end} blocks held at the end`,
  );
}
