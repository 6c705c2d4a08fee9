// Goal: PairTable is an exact map from (hi, lo) to u32 — compared with a Map under a
// long random mix of inserts, updates, adjustments and deletions across several growths
// (backward-shift deletion is where open addressing usually goes wrong).
import { expect, test } from "bun:test";
import { PairTable } from "../../src/util/tables";
import { createRng, randomInt } from "../../src/sim/random";

test("random operations agree with a Map, through growth and deletion", () => {
  const rng = createRng(7);
  const table = new PairTable(4);
  const reference = new Map<string, number>();
  // Few distinct hi words and clustered lo words make probe runs collide and wrap.
  const key = (): [number, number] => [
    (randomInt(rng, 3) * 0x8000_0001) >>> 0,
    randomInt(rng, 3000),
  ];
  for (let step = 0; step < 60_000; step++) {
    const [hi, lo] = key();
    const name = `${hi}:${lo}`;
    const op = randomInt(rng, 4);
    if (op === 0) {
      const value = randomInt(rng, 0xffff_ffff);
      expect(table.set(hi, lo, value)).toBe(!reference.has(name));
      reference.set(name, value);
    } else if (op === 1) {
      expect(table.delete(hi, lo)).toBe(reference.delete(name));
    } else if (op === 2) {
      const delta = reference.has(name) ? -1 : 2;
      const expected = (reference.get(name) ?? 0) + delta;
      expect(table.adjust(hi, lo, delta)).toBe(expected);
      if (expected === 0) reference.delete(name);
      else reference.set(name, expected);
    } else {
      expect(table.get(hi, lo)).toBe(reference.get(name) ?? -1);
      expect(table.has(hi, lo)).toBe(reference.has(name));
    }
    expect(table.size).toBe(reference.size);
  }
  const seen = new Map<string, number>();
  table.forEach((hi, lo, value) => {
    seen.set(`${hi}:${lo}`, value);
  });
  expect(seen).toEqual(reference);
  for (const name of reference.keys()) {
    const [hi, lo] = name.split(":").map(Number) as [number, number];
    expect(table.delete(hi, lo)).toBe(true);
  }
  expect(table.size).toBe(0);
  let left = 0;
  table.forEach(() => {
    left++;
  });
  expect(left).toBe(0);
});

test("values must be u32", () => {
  const table = new PairTable();
  expect(() => table.set(1, 2, -1)).toThrow("u32");
  expect(() => table.adjust(1, 2, -1)).toThrow("u32");
  expect(table.adjust(1, 2, 0)).toBe(0);
  expect(table.size).toBe(0);
});
