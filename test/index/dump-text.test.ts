// Goal: GET /v1/dump's text, written from packed words without strings, is exactly
// the JSON of dump()'s events (u64 edge values, long chains cut into 4096-block events
// that chain on, holes with placeholders), and applying it rebuilds an equal index.
import { expect, test } from "bun:test";
import { createIndex } from "../../src/index";
import { DUMP_CHAIN_BLOCKS_MAX, DumpText, writeU64 } from "../../src/index/dump";
import { applyOp } from "../../src/index/apply";
import { ReferenceIndex } from "../../src/index/reference/reference";
import { freezeNow, packIndex } from "../../src/index/pack";
import type { KvIndex } from "../../src/index/types";

test("u64 decimal digits written from (hi, lo) words equal BigInt's", () => {
  const out = new Uint8Array(32);
  let state = 12345;
  const word = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0);
  const edges: [number, number][] = [
    [0, 0],
    [0, 1],
    [0, 0xffff_ffff],
    [0x1f_ffff, 0xffff_ffff],
    [0x20_0000, 0],
    [0xffff_ffff, 0xffff_ffff],
    [0xf423f, 0xffff_ffff],
    [0x3b9a_c9ff, 0x2710],
    [1_000_000, 999_999],
  ];
  for (let i = 0; i < 5000; i++) edges.push([word() >>> (i % 32), word()]);
  for (const [hi, lo] of edges) {
    const end = writeU64(out, 0, hi, lo);
    const text = new TextDecoder().decode(out.subarray(0, end));
    expect(text).toBe(((BigInt(hi) << 32n) | BigInt(lo)).toString());
  }
});

function textOf(index: KvIndex, sliceBytes: number): { text: string; slices: number } {
  const { words, workerIds } = packIndex(freezeNow(index.freeze()));
  const writer = new DumpText(words, workerIds, index.blockSize, sliceBytes);
  let text = "";
  let slices = 0;
  while (!writer.done) {
    text += new TextDecoder().decode(writer.next(sliceBytes, () => false));
    slices++;
  }
  return { text, slices };
}

test("the text is dump()'s JSON: a 5,000-block chain cut at 4096, a hole, big hashes", () => {
  const index = createIndex("crtc", 4);
  const oracle = new ReferenceIndex(4);
  const n = 5000;
  const external = new Uint32Array(2 * n);
  const local = new Uint32Array(2 * n);
  for (let i = 0; i < n; i++) {
    external.set([0xfedc_ba98, i], 2 * i);
    local.set([i * 7919, 0xffff_fff0 - i], 2 * i);
  }
  for (const target of [index, oracle]) {
    target.applyStored(18_446_744_073_709_551_615n, 3, false, 0, 0, external, local, n);
    target.applyStored(5n, 0, false, 0, 0, external, local, 50);
    target.applyRemoved(5n, 0, external.subarray(20), 1); // a hole: blocks 11.. stay held below it
  }
  const events = index.dump();
  const chains = events.filter((e) => e.op === "stored" && e.worker_id === "18446744073709551615");
  const lengths = chains.map((e) => (e.op === "stored" ? e.block_hashes.length : 0));
  expect(lengths).toEqual([DUMP_CHAIN_BLOCKS_MAX, n - DUMP_CHAIN_BLOCKS_MAX]);
  const { text, slices } = textOf(index, 4096);
  expect(slices).toBeGreaterThan(2); // whole events per slice: the two long ones each end one
  expect(text).toBe(events.map((e) => `${JSON.stringify(e)}\n`).join(""));
  expect(text).toContain('"removed"'); // the hole's placeholder
  const restored = new ReferenceIndex(4);
  for (const line of text.trimEnd().split("\n")) applyOp(restored, JSON.parse(line));
  expect(restored.canonical()).toEqual(oracle.canonical());
});
