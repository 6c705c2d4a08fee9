// Goal: the typed-array building blocks behave like the plain models they replace, at
// every size (growth, shrinking, compaction, chunking), and give memory back.
// Method: seeded random operation sequences checked against Maps and Sets, and
// sentinel-filled pools (an id handed out twice, or lost, shows up as a broken sentinel).
import { describe, expect, test } from "bun:test";
import { IndexInvariantError } from "../../src/index/assert";
import { BlockPool, RUN_ORDER_MAX } from "../../src/index/crtc/blocks";
import { LinkTable } from "../../src/index/link-table";
import { ExternalLookup } from "../../src/index/lookup";
import { OwnerLists } from "../../src/index/owners";
import { native } from "../../src/native/library";
import { Random } from "../harness/streams";
import { expectChildSuitePasses } from "../support/suite";

describe("ExternalLookup", () => {
  test("matches a Map through growth into the large regime and back, with backward-shift deletes", () => {
    const random = new Random(11);
    const lookup = new ExternalLookup();
    const model = new Map<string, number>();
    const keys: [number, number][] = [];
    const freshBytes = lookup.bytes();
    // Grow to ~20k entries (large tables start above 1,024 slots), then drain.
    for (let step = 0; step < 60_000; step++) {
      const growing = step < 30_000;
      if (keys.length === 0 || (growing ? random.chance(0.8) : random.chance(0.1))) {
        // Small keys collide in the low words; random ones spread.
        const hi = random.chance(0.5) ? random.int(4) : Math.floor(random.next() * 2 ** 32);
        const lo = random.chance(0.5) ? random.int(5000) : Math.floor(random.next() * 2 ** 32);
        const key = `${hi}:${lo}`;
        if (model.has(key)) continue;
        const value = 1 + random.int(2 ** 31);
        expect(lookup.find(hi, lo)).toBe(0);
        lookup.insertAtProbe(hi, lo, value);
        model.set(key, value);
        keys.push([hi, lo]);
      } else {
        const at = random.int(keys.length);
        const [hi, lo] = keys[at]!;
        keys[at] = keys[keys.length - 1]!;
        keys.pop();
        expect(lookup.remove(hi, lo)).toBe(model.get(`${hi}:${lo}`)!);
        model.delete(`${hi}:${lo}`);
      }
      if (step % 5_000 === 0 || step === 29_999) {
        expect(lookup.count).toBe(model.size);
        for (const [hi, lo] of keys) expect(lookup.find(hi, lo)).toBe(model.get(`${hi}:${lo}`)!);
        // Load stays within the sizing rules (small: <= 3/4; large: 2/5..4/5).
        expect(lookup.count / lookup.capacity).toBeLessThanOrEqual(0.8);
        if (lookup.capacity > 1024)
          expect(lookup.count / lookup.capacity).toBeGreaterThanOrEqual(0.4);
      }
      if (step === 29_999) expect(lookup.capacity).toBeGreaterThan(4096);
    }
    for (const [hi, lo] of keys) expect(lookup.remove(hi, lo)).toBe(model.get(`${hi}:${lo}`)!);
    expect(lookup.count).toBe(0);
    expect(lookup.bytes()).toBe(freshBytes);
  });

  test("remove of an absent key changes nothing; clear resets", () => {
    const lookup = new ExternalLookup();
    lookup.set(1, 2, 3);
    expect(lookup.remove(1, 3)).toBe(0);
    expect(lookup.count).toBe(1);
    lookup.clear();
    expect(lookup.find(1, 2)).toBe(0);
    expect(() => {
      lookup.find(5, 5);
      lookup.insertAtProbe(5, 5, 0);
    }).toThrow(IndexInvariantError);
  });
});

describe("ExternalLookup event calls", () => {
  // removeMany and insertRun (native when loaded) against one find/insert/remove at a
  // time: the same answers and, after every event, the very same table (same algorithm,
  // same order), through growth into the large regime, shrinking, and back to small.
  test("leave the table exactly as one operation at a time does", () => {
    const random = new Random(29);
    const batched = new ExternalLookup();
    const single = new ExternalLookup();
    const live: [number, number][] = [];
    const out = new Uint32Array(4096);
    let nextValue = 1;
    let largest = 0;
    const freshKey = (): [number, number] => {
      // Clustered words in half the keys, so probe runs collide and wrap.
      const hi = random.chance(0.5) ? random.int(3) : Math.floor(random.next() * 2 ** 32);
      const lo = random.chance(0.5) ? random.int(50_000) : Math.floor(random.next() * 2 ** 32);
      return [hi, lo];
    };
    for (let event = 0; event < 3_000; event++) {
      const size = 1 + random.int(random.chance(0.1) ? 2000 : 40);
      const keys = new Uint32Array(2 * size);
      const growing = event < 1_500;
      if (live.length === 0 || random.chance(growing ? 0.7 : 0.35)) {
        // A run of inserts; in some, a key already held (or repeated) stops it.
        for (let k = 0; k < size; k++) [keys[2 * k], keys[2 * k + 1]] = freshKey();
        if (live.length > 0 && random.chance(0.2)) {
          const at = random.int(size);
          [keys[2 * at], keys[2 * at + 1]] = random.pick(live);
        }
        const value = nextValue;
        nextValue += size;
        const placed = batched.insertRun(keys, 0, size, value);
        let expected = 0;
        for (; expected < size; expected++) {
          const hi = keys[2 * expected]!,
            lo = keys[2 * expected + 1]!;
          if (single.find(hi, lo) !== 0) break;
          single.insertAtProbe(hi, lo, value + expected, size - expected - 1);
          live.push([hi, lo]);
        }
        single.settleRun();
        expect(placed).toBe(expected);
      } else {
        // Removals: mostly held keys (some twice in one event), some never inserted.
        for (let k = 0; k < size; k++) {
          const [hi, lo] = random.chance(0.9) ? random.pick(live) : freshKey();
          keys[2 * k] = hi;
          keys[2 * k + 1] = lo;
        }
        batched.removeMany(keys, 0, size, out);
        for (let k = 0; k < size; k++) {
          expect(out[k]).toBe(single.remove(keys[2 * k]!, keys[2 * k + 1]!));
        }
        for (let k = live.length - 1; k >= 0; k--) {
          if (single.find(live[k]![0], live[k]![1]) === 0) {
            live[k] = live[live.length - 1]!;
            live.pop();
          }
        }
      }
      expect(batched.count).toBe(single.count);
      expect(batched.capacity).toBe(single.capacity);
      expect(Buffer.from(batched.table.buffer).equals(Buffer.from(single.table.buffer))).toBe(true);
      largest = Math.max(largest, single.capacity);
    }
    expect(largest).toBeGreaterThan(8192);
    expect(single.capacity).toBeLessThan(4096);
  });

  test("an event's keys can start anywhere in the array", () => {
    const lookup = new ExternalLookup();
    const keys = Uint32Array.of(9, 9, 1, 2, 3, 4, 5, 6, 9, 9);
    expect(lookup.insertRun(keys, 1, 3, 10)).toBe(3);
    const found = [lookup.find(1, 2), lookup.find(3, 4), lookup.find(5, 6), lookup.find(9, 9)];
    expect(found).toEqual([10, 11, 12, 0]);
    const out = new Uint32Array(3);
    lookup.removeMany(keys, 2, 3, out);
    expect([...out]).toEqual([11, 12, 0]);
    expect(lookup.count).toBe(1);
    expect(() => lookup.insertRun(keys, 0, 1, 0)).toThrow(IndexInvariantError);
    // The native calls trust their bounds: the methods check them.
    expect(() => lookup.insertRun(keys, 4, 2, 20)).toThrow(IndexInvariantError);
    expect(() => lookup.removeMany(keys, 3, 3, out)).toThrow(IndexInvariantError);
    expect(() => lookup.removeMany(keys, 0, 4, out)).toThrow(IndexInvariantError);
  });

  test("a run that grew the table and then stopped early gives the room back", () => {
    const lookup = new ExternalLookup();
    // Large tables grow past 0.8 of their capacity: fill one up to that edge.
    let next = 1;
    const one = new Uint32Array(2);
    while (lookup.count < 20_000 || lookup.count < Math.floor(0.8 * lookup.capacity)) {
      one[0] = 0;
      one[1] = next++;
      lookup.insertRun(one, 0, 1, next);
    }
    const count = lookup.count;
    // 100,000 new keys, the sixth one already held: the first insert grows the table for
    // all of them (5x), the sixth stops the run.
    const run = new Uint32Array(2 * 100_000);
    for (let k = 0; k < 100_000; k++) run[2 * k + 1] = next + k;
    run[11] = 7;
    expect(lookup.insertRun(run, 0, 100_000, next)).toBe(5);
    expect(lookup.count).toBe(count + 5);
    expect(lookup.count).toBeGreaterThanOrEqual(0.4 * lookup.capacity);
  });

  test("reserve makes room at once: that many inserts then take no resize", () => {
    const lookup = new ExternalLookup();
    const keys = new Uint32Array(2 * 9000);
    for (let k = 0; k < 9000; k++) keys[2 * k + 1] = k + 1;
    expect(lookup.insertRun(keys, 0, 5000, 1)).toBe(5000);
    lookup.reserve(4000);
    const table = lookup.table;
    expect(lookup.insertRun(keys, 5000, 4000, 5001)).toBe(4000);
    expect(lookup.table).toBe(table);
    lookup.reserve(0);
    expect(lookup.table).toBe(table);
    // Out of the small regime with few keys held: a large table all the same.
    const sparse = new ExternalLookup();
    expect(sparse.insertRun(keys, 0, 300, 1)).toBe(300);
    expect(sparse.capacity).toBe(1024);
    sparse.reserve(250);
    expect(sparse.capacity).toBeGreaterThan(1024);
    expect(sparse.insertRun(keys, 300, 250, 301)).toBe(250);
    for (let k = 0; k < 550; k++) expect(sparse.find(0, k + 1)).toBe(k + 1);
  });

  test.skipIf(native === null)(
    "the same without native code",
    () => {
      expectChildSuitePasses([import.meta.path, "-t", "^ExternalLookup"], { KVEDGE_NATIVE: "0" });
    },
    60_000,
  );
});

describe("LinkTable", () => {
  test("matches a Map; unlinking a key that names another value is refused", () => {
    const random = new Random(5);
    const table = new LinkTable();
    const model = new Map<string, number>();
    const keys: [number, number, number][] = [];
    for (let step = 0; step < 20_000; step++) {
      if (keys.length === 0 || (step < 10_000 ? random.chance(0.75) : random.chance(0.2))) {
        const key = random.int(64);
        const hi = random.int(3);
        const lo = random.int(1000);
        const name = `${key}:${hi}:${lo}`;
        if (model.has(name)) continue;
        const value = 1 + random.int(1e9);
        table.insert(key, hi, lo, value);
        model.set(name, value);
        keys.push([key, hi, lo]);
      } else {
        const at = random.int(keys.length);
        const [key, hi, lo] = keys[at]!;
        keys[at] = keys[keys.length - 1]!;
        keys.pop();
        const value = model.get(`${key}:${hi}:${lo}`)!;
        expect(() => table.remove(key, hi, lo, value + 1)).toThrow(IndexInvariantError);
        table.remove(key, hi, lo, value);
        model.delete(`${key}:${hi}:${lo}`);
      }
    }
    expect(table.count).toBe(model.size);
    for (const [key, hi, lo] of keys)
      expect(table.find(key, hi, lo)).toBe(model.get(`${key}:${hi}:${lo}`)!);
    table.insert(99, 1, 2, 3);
    expect(() => table.insert(99, 1, 2, 7)).toThrow(IndexInvariantError);
  });
});

describe("OwnerLists", () => {
  test("matches a model through list growth, shrinking, inline single owners and compaction", () => {
    const random = new Random(3);
    const records = 300;
    const owners = new OwnerLists(records);
    const model: Map<number, number>[] = Array.from({ length: records }, () => new Map());
    for (let step = 0; step < 60_000; step++) {
      const record = random.int(records);
      const slot = random.int(random.chance(0.5) ? 4 : 200);
      if (random.chance(step < 30_000 ? 0.6 : 0.3)) {
        const value = 1 + random.int(1000);
        owners.set(record, slot, value);
        model[record]!.set(slot, value);
      } else {
        expect(owners.remove(record, slot)).toBe(model[record]!.delete(slot));
      }
      if (step % 997 === 0) {
        for (let r = 0; r < records; r++) {
          expect(owners.count[r]).toBe(model[r]!.size);
          let max = 0;
          for (const [s, v] of model[r]!) {
            expect(owners.get(r, s)).toBe(v);
            max = Math.max(max, v);
          }
          expect(owners.max(r)).toBe(max);
        }
      }
    }
    for (let r = 0; r < records; r++) owners.reset(r);
    expect(owners.liveArenaWords()).toBe(0);
  });
});

describe("BlockPool (buddy allocator)", () => {
  test("sentinel-checked runs: no id is handed out twice, every id comes back, the pool shrinks", () => {
    const random = new Random(9);
    const pool = new BlockPool();
    const initial = pool.bytes();
    const live: [number, number, number][] = []; // start, order, sentinel
    let sentinel = 1;
    const check = (): void => {
      for (const [start, order, mark] of live) {
        for (let id = start; id < start + 2 ** order; id++) expect(pool.node[id]).toBe(mark);
      }
    };
    for (let phase = 0; phase < 4; phase++) {
      const allocating = phase % 2 === 0;
      for (let step = 0; step < 3_000; step++) {
        if (live.length === 0 || random.chance(allocating ? 0.7 : 0.3)) {
          const order = random.chance(0.05) ? 10 + random.int(4) : random.int(6);
          const start = pool.allocate(order);
          for (let id = start; id < start + 2 ** order; id++) {
            expect(pool.node[id]).toBeLessThan(0xffff_ff00); // not inside a free run
            pool.node[id] = sentinel;
          }
          live.push([start, order, sentinel++]);
        } else {
          const [start, order, mark] = live.splice(random.int(live.length), 1)[0]!;
          for (let id = start; id < start + 2 ** order; id++) expect(pool.node[id]).toBe(mark);
          for (let id = start; id < start + 2 ** order; id++) pool.node[id] = 0;
          pool.free(start, order);
        }
      }
      check();
      expect(pool.freeIds() + pool.allocated).toBe(pool.capacity);
    }
    for (const [start, order] of live.splice(0)) {
      for (let id = start; id < start + 2 ** order; id++) pool.node[id] = 0;
      pool.free(start, order);
    }
    expect(pool.allocated).toBe(1); // the reserved id 0
    expect(pool.bytes()).toBe(initial);
  });

  test("beyond one chunk the pool grows by chunks and trims free chunks at its end", () => {
    const pool = new BlockPool();
    const chunk = 2 ** RUN_ORDER_MAX;
    const runs: number[] = [];
    for (let i = 0; i < 9; i++) runs.push(pool.allocate(RUN_ORDER_MAX));
    expect(pool.capacity % chunk).toBe(0);
    expect(pool.capacity).toBeLessThanOrEqual(12 * chunk); // not a power of two past 2^17
    expect(() => pool.allocate(RUN_ORDER_MAX + 1)).toThrow(IndexInvariantError);
    for (const start of runs.splice(1)) pool.free(start, RUN_ORDER_MAX);
    expect(pool.capacity).toBeLessThanOrEqual(3 * chunk);
    pool.free(runs[0]!, RUN_ORDER_MAX);
    expect(pool.allocated).toBe(1);
    expect(pool.capacity).toBe(1024);
    expect(() => pool.free(runs[0]!, RUN_ORDER_MAX)).toThrow(IndexInvariantError); // outside the pool now
    const kept = pool.allocate(3);
    const freed = pool.allocate(3); // its buddy stays allocated, so it cannot merge away
    pool.free(freed, 3);
    expect(() => pool.free(freed, 3)).toThrow(IndexInvariantError);
    pool.free(kept, 3);
  });
});
