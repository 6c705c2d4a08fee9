// KeyTable against a plain Map: random churn with colliding low bits, steady-state
// churn, growth and shrinking back to its first size when emptied.
import { describe, expect, test } from "bun:test";
import { KeyTable } from "../../src/util/tables";
import { xorshift32 } from "../../src/util/random";

describe("KeyTable", () => {
  test("random sets, overwrites and deletes agree with a Map", () => {
    const next = xorshift32(7);
    const random = () => next() / 2 ** 32;
    const table = new KeyTable();
    const model = new Map<number, number>();
    // Keys share their low bits in groups (long probe runs), and some exceed 2^32.
    const keyOf = () => {
      const group = Math.floor(random() * 64);
      const high = Math.floor(random() * 2 ** 21);
      return high * 2 ** 32 + group * 1024;
    };
    const known: number[] = [];
    for (let step = 0; step < 200_000; step++) {
      const r = random();
      if (r < 0.5 || known.length === 0) {
        const key =
          r < 0.1 && known.length > 0 ? known[Math.floor(random() * known.length)]! : keyOf();
        const value = Math.floor(random() * 2 ** 31);
        table.set(key, value);
        if (!model.has(key)) known.push(key);
        model.set(key, value);
      } else {
        const at = Math.floor(random() * known.length);
        const key = known[at]!;
        expect(table.delete(key)).toBe(model.delete(key));
        known[at] = known[known.length - 1]!;
        known.pop();
      }
      if (step % 1000 === 0) {
        expect(table.size).toBe(model.size);
        for (const [key, value] of model) expect(table.get(key)).toBe(value);
        expect(table.get(keyOf() + 1)).toBe(-1); // odd keys are never set
      }
    }
    for (const key of known) expect(table.delete(key)).toBe(true);
    expect(table.size).toBe(0);
    expect(table.delete(12)).toBe(false);
  });

  test("steady churn keeps its size and capacity; emptying it gives the memory back", () => {
    const table = new KeyTable();
    const initialBytes = table.bytes;
    const live = 12_500;
    let steadyBytes = 0;
    for (let i = 0; i < 200_000; i++) {
      table.set(i * 2_654_435_761, i);
      if (i >= live) expect(table.delete((i - live) * 2_654_435_761)).toBe(true);
      if (i === 50_000) steadyBytes = table.bytes;
      if (i > 50_000) expect(table.bytes).toBe(steadyBytes);
    }
    expect(table.size).toBe(live);
    for (let i = 200_000 - live; i < 200_000; i++) expect(table.get(i * 2_654_435_761)).toBe(i);
    for (let i = 200_000 - live; i < 200_000; i++) table.delete(i * 2_654_435_761);
    expect(table.size).toBe(0);
    expect(table.bytes).toBe(initialBytes);
  });

  test("refuses keys that are not integers in [0, 2^53)", () => {
    const table = new KeyTable();
    for (const key of [-1, 0.5, 2 ** 53, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => table.set(key, 1)).toThrow(RangeError);
    }
  });
});
