// Goal: every open-addressing table in kvedge is an exact map, checked by one suite:
// long random mixes of inserts, overwrites, deletes (backward shift is where open
// addressing goes wrong) and lookups against a Map, through growth and shrinking;
// then exact memory: emptied after a burst or churned at a steady size, each gives
// back exactly the bytes of a fresh table. The shared tables (src/util/tables.ts) and
// their users' wrappers run it, and so do the index's own tables through adapters.
import { describe, expect, test } from "bun:test";
import { ExternalLookup } from "../../src/index/lookup";
import { LinkTable } from "../../src/index/link-table";
import { AMBIGUOUS, NamespaceTable } from "../../src/ingest/namespace";
import { xorshift32 } from "../../src/util/random";
import { KeyTable, PairTable, TripleTable } from "../../src/util/tables";

/** A table as the suite sees it: keys (owner, hi, lo), values small integers >= 0. */
interface Subject {
  set(owner: number, hi: number, lo: number, value: number): void;
  /** The value, or -1 when absent. */
  get(owner: number, hi: number, lo: number): number;
  delete(owner: number, hi: number, lo: number): void;
  size(): number;
  bytes(): number;
}

interface Case {
  readonly name: string;
  readonly make: () => Subject;
  /** Key words the table tells apart (the others are 0 in the keys it is given). */
  readonly words: 1 | 2 | 3;
  /** The value after set(value) over `old` (-1 = absent); default: `value`. */
  readonly afterSet?: (old: number, value: number) => number;
  /** Whether delete removes an entry holding `old`; default: always. */
  readonly deletes?: (old: number) => boolean;
  /** Values the suite may store (default 2^20). */
  readonly values?: number;
}

const AMBIGUOUS_VALUE = 1_000_000;

const cases: Case[] = [
  {
    name: "KeyTable (53-bit number keys)",
    words: 2,
    make: () => {
      const table = new KeyTable();
      const key = (hi: number, lo: number) => (hi & 0x1f_ffff) * 2 ** 32 + (lo >>> 0);
      return {
        set: (_o, hi, lo, value) => table.set(key(hi, lo), value),
        get: (_o, hi, lo) => table.get(key(hi, lo)),
        delete: (_o, hi, lo) => void table.delete(key(hi, lo)),
        size: () => table.size,
        bytes: () => table.bytes,
      };
    },
  },
  {
    name: "PairTable ((hi, lo) keys)",
    words: 2,
    make: () => {
      const table = new PairTable();
      return {
        set: (_o, hi, lo, value) => void table.set(hi, lo, value),
        get: (_o, hi, lo) => table.get(hi, lo),
        delete: (_o, hi, lo) => void table.delete(hi, lo),
        size: () => table.size,
        bytes: () => table.bytes,
      };
    },
  },
  {
    name: "PairTable as a reference count (adjust)",
    words: 2,
    make: () => {
      const table = new PairTable();
      return {
        // Stored as value + 1: adjusting to 0 is what removes an entry.
        set: (_o, hi, lo, value) =>
          void table.adjust(hi, lo, value + 1 - Math.max(0, table.get(hi, lo))),
        get: (_o, hi, lo) => (table.has(hi, lo) ? table.get(hi, lo) - 1 : -1),
        delete: (_o, hi, lo) => void table.adjust(hi, lo, -Math.max(0, table.get(hi, lo))),
        size: () => table.size,
        bytes: () => table.bytes,
      };
    },
  },
  {
    name: "TripleTable ((owner, hi, lo) keys)",
    words: 3,
    make: () => {
      const table = new TripleTable();
      return {
        set: (owner, hi, lo, value) => void table.set(owner, hi, lo, value),
        get: (owner, hi, lo) => table.get(owner, hi, lo),
        delete: (owner, hi, lo) => void table.delete(owner, hi, lo),
        size: () => table.size,
        bytes: () => table.bytes,
      };
    },
  },
  {
    name: "NamespaceTable (ingest: a second namespace makes a block ambiguous)",
    words: 3,
    values: 4,
    afterSet: (old, value) => (old === -1 || old === value ? value : AMBIGUOUS_VALUE),
    deletes: (old) => old !== AMBIGUOUS_VALUE,
    make: () => {
      const table = new NamespaceTable(1 << 20);
      return {
        set: (owner, hi, lo, value) => table.record(owner, hi, lo, `tenant-${value}`),
        get: (owner, hi, lo) => {
          const name = table.get(owner, hi, lo);
          if (name === undefined) return -1;
          return name === AMBIGUOUS ? AMBIGUOUS_VALUE : Number(name.slice(7));
        },
        delete: (owner, hi, lo) => table.forget(owner, hi, lo),
        size: () => table.size,
        bytes: () => table.bytes,
      };
    },
  },
  {
    // src/index/link-table.ts (values are non-zero: the suite's value + 1).
    name: "index LinkTable (adapter)",
    words: 3,
    make: () => {
      const table = new LinkTable();
      return {
        set: (owner, hi, lo, value) => {
          const old = table.find(owner, hi, lo);
          if (old === 0) table.insert(owner, hi, lo, value + 1);
          else table.replace(owner, hi, lo, old, value + 1);
        },
        get: (owner, hi, lo) => table.find(owner, hi, lo) - 1,
        delete: (owner, hi, lo) => {
          const old = table.find(owner, hi, lo);
          if (old !== 0) table.remove(owner, hi, lo, old);
        },
        size: () => table.count,
        bytes: () => table.bytes(),
      };
    },
  },
  {
    // src/index/lookup.ts (values are non-zero: the suite's value + 1).
    name: "index ExternalLookup (adapter)",
    words: 2,
    make: () => {
      const table = new ExternalLookup();
      return {
        set: (_o, hi, lo, value) => table.set(hi, lo, value + 1),
        get: (_o, hi, lo) => table.find(hi, lo) - 1,
        delete: (_o, hi, lo) => void table.remove(hi, lo),
        size: () => table.count,
        bytes: () => table.bytes(),
      };
    },
  },
];

/** Keys from a small space, so lookups hit, and clustered words, so probe runs collide. */
function keys(words: 1 | 2 | 3, seed: number, space: number) {
  const next = xorshift32(seed);
  return (): [number, number, number] => {
    const n = next() % space;
    const owner = words === 3 ? n % 3 : 0;
    const hi = words >= 2 ? (((n >>> 2) % 5) * 0x8000_0001) >>> 0 : 0;
    return [owner, hi, (((n * 0x9e37_79b1) >>> 8) & 0xffff_ff00) | (n & 0xff)];
  };
}

type Key = [number, number, number];

function check(subject: Subject, model: Map<string, number>, byName: Map<string, Key>) {
  expect(subject.size()).toBe(model.size);
  for (const [name, value] of model) {
    const [owner, hi, lo] = byName.get(name)!;
    const got = subject.get(owner, hi, lo);
    if (got !== value) expect(`${name} -> ${got}`).toBe(`${name} -> ${value}`);
  }
}

describe.each(cases)("$name", (c) => {
  const afterSet = c.afterSet ?? ((_old: number, value: number) => value);
  const deletes = c.deletes ?? (() => true);
  const values = c.values ?? 1 << 20;

  test("random sets, overwrites, deletes, lookups agree with a Map, growing and shrinking", () => {
    const subject = c.make();
    const model = new Map<string, number>();
    const byName = new Map<string, Key>();
    const next = xorshift32(11);
    // Phases: grow to ~6k keys, churn, drain to a few (shrinking), grow again.
    const phases: Key[] = [
      [40_000, 6000, 3],
      [30_000, 6000, 2],
      [30_000, 6000, 1],
      [20_000, 300, 2],
    ];
    let seed = 1;
    for (const [steps, space, bias] of phases) {
      const key = keys(c.words, seed++, space);
      for (let step = 0; step < steps; step++) {
        const [owner, hi, lo] = key();
        const name = `${owner}:${hi}:${lo}`;
        byName.set(name, [owner, hi, lo]);
        const old = model.get(name) ?? -1;
        const op = next() % 4;
        if (op < bias) {
          const value = next() % values;
          subject.set(owner, hi, lo, value);
          model.set(name, afterSet(old, value));
        } else if (op < 3) {
          subject.delete(owner, hi, lo);
          if (old !== -1 && deletes(old)) model.delete(name);
        } else {
          expect(subject.get(owner, hi, lo)).toBe(old);
        }
        if (subject.size() !== model.size) expect(subject.size()).toBe(model.size);
      }
      check(subject, model, byName);
    }
  });

  test("a burst emptied, and churn at a steady size, hold exactly a fresh table's bytes", () => {
    const subject = c.make();
    const fresh = subject.bytes();
    const key = keys(c.words, 5, 1 << 30);
    for (let round = 0; round < 3; round++) {
      const burst: Key[] = [];
      for (let i = 0; i < 20_000; i++) burst.push(key());
      for (const [owner, hi, lo] of burst) subject.set(owner, hi, lo, 1);
      expect(subject.bytes()).toBeGreaterThan(fresh);
      for (const [owner, hi, lo] of burst.reverse()) subject.delete(owner, hi, lo);
      expect(subject.size()).toBe(0);
      expect(subject.bytes()).toBe(fresh);
    }
    const live: Key[] = [];
    let steady = 0;
    for (let i = 0; i < 60_000; i++) {
      const entry = key();
      subject.set(entry[0], entry[1], entry[2], 1);
      live.push(entry);
      if (live.length > 5000) {
        const [owner, hi, lo] = live.shift()!;
        subject.delete(owner, hi, lo);
      }
      if (i === 20_000) steady = subject.bytes();
      if (i > 20_000 && subject.bytes() !== steady) expect(subject.bytes()).toBe(steady);
    }
    for (const [owner, hi, lo] of live) subject.delete(owner, hi, lo);
    expect(subject.size()).toBe(0);
    expect(subject.bytes()).toBe(fresh);
  });
});

describe("the shared tables' edges", () => {
  test("TripleTable: values past int32 or negative are refused; retain keeps its pick", () => {
    const table = new TripleTable();
    expect(() => table.set(1, 2, 3, -1)).toThrow(RangeError);
    expect(() => table.set(1, 2, 3, 2 ** 31)).toThrow(RangeError);
    for (let i = 0; i < 1000; i++) table.set(i % 4, i, i * 3, i);
    const fresh = new TripleTable().bytes;
    table.retain((owner) => owner === 2);
    expect(table.size).toBe(250);
    for (let i = 0; i < 1000; i++) expect(table.get(i % 4, i, i * 3)).toBe(i % 4 === 2 ? i : -1);
    table.retain(() => false);
    expect(table.bytes).toBe(fresh);
  });

  test("PairTable.clear(expected) sizes for what comes, never below its first capacity", () => {
    const table = new PairTable(256);
    const first = table.bytes;
    table.clear(10_000);
    expect(table.bytes).toBeGreaterThanOrEqual(2 * 10_000 * 16);
    for (let i = 0; i < 10_000; i++) expect(table.set(i, i, 1)).toBe(true);
    expect(table.set(5, 5, 1)).toBe(false);
    table.clear(3);
    expect(table.size).toBe(0);
    expect(table.has(5, 5)).toBe(false);
    expect(table.bytes).toBe(first);
  });
});
