// Goal: the bus's messages read back exactly as written (every fact type, requests by
// handle, workers by identity through the dictionary even when a slot changes hands within
// a message, long chains cut to their first CHAIN_BLOCKS_MAX blocks; predictions as an
// anchor and the new blocks' local hashes, cut to their first CHAIN_BLOCKS_MAX new
// blocks; corrections; a joining replica's runs of predictions), an encoder's
// published array is never written again, and every malformed message is refused whole
// with its reason before any fact is applied.
// Method: MessageEncoder over a real WorkerTable; FactReader with a recording visitor;
// truncations and single-byte changes of real messages.
import { describe, expect, test } from "bun:test";
import {
  BadMessage,
  CHAIN_BLOCKS_MAX,
  FactReader,
  type FactVisitor,
  KIND,
  MessageEncoder,
  readHeader,
} from "../../src/cluster/codec";
import { WorkerTable } from "../../src/domain/worker-table";

function recorder(): { visitor: FactVisitor; seen: string[] } {
  const seen: string[] = [];
  let names: string[] = [];
  const visitor: FactVisitor = {
    begin: (workers) => {
      names = workers.ids.map((id, i) => `${id}:${workers.ranks[i]}`);
    },
    routed: (id, worker, chain, blocks, prefill, output, decode) =>
      seen.push(
        `routed ${id} ${names[worker]} ${blocks} ${chain[0] ?? "-"}/${chain[2 * blocks - 1] ?? "-"} ${prefill} ${output} ${decode}`,
      ),
    prefillDone: (id) => seen.push(`prefill ${id}`),
    ended: (id, reason, freed) => seen.push(`ended ${id} ${reason} ${freed}`),
    decodeTotal: (worker, blocks) => seen.push(`total ${names[worker]} ${blocks}`),
    predicted: (worker, anchored, hi, lo, local, count) =>
      seen.push(
        `predicted ${names[worker]} ${anchored ? `${hi}/${lo}` : "root"} ${count} ${count > 0 ? `${local[0]}/${local[2 * count - 1]}` : "-"}`,
      ),
    corrected: (worker, shortfall, named, hi, lo) =>
      seen.push(
        `corrected ${names[worker]} ${shortfall ? "shortfall" : "surplus"} ${named ? `${hi}/${lo}` : "-"}`,
      ),
    predictedOlder: (worker, anchored, hi, lo, local, count, age) =>
      seen.push(
        `older ${names[worker]} ${anchored ? `${hi}/${lo}` : "root"} ${count} ${local[0]}/${local[2 * count - 1]} ${age}`,
      ),
  };
  return { visitor, seen };
}

function facts(): { table: WorkerTable; message: Uint8Array } {
  const table = new WorkerTable();
  const a = table.acquire(2n ** 64n - 1n, 3);
  const b = table.acquire(7n, 0);
  const encoder = new MessageEncoder("r-1", 99, table);
  encoder.begin(KIND.facts);
  encoder.beginFacts();
  const chain = Uint32Array.from({ length: 2 * (CHAIN_BLOCKS_MAX + 5) }, (_, i) => i + 1);
  encoder.routed(1, a, chain, 3, 48, 2);
  encoder.routed(2, b, chain, CHAIN_BLOCKS_MAX + 5, 5, 0);
  encoder.routedFlat(0xffff_ffff, b, 17, 1, 9);
  encoder.prefillDone(70_000);
  encoder.ended(1, "expired", 4);
  encoder.decodeTotal(a, 12);
  table.release(b); // slot b changes hands within the message: a new dictionary entry
  const c = table.acquire(8n, 1);
  expect(c).toBe(b);
  encoder.routedFlat(5, c, 1, 0, 0);
  // Predictions: (local, chain) of 5 blocks; 2 held already, then none held, then a
  // refresh, then more new blocks than a fact carries.
  const local = Uint32Array.from({ length: 10 }, (_, i) => 100 + i);
  const hashes = Uint32Array.from({ length: 10 }, (_, i) => 200 + i);
  expect(encoder.predicted(a, local, hashes, 2, 5)).toBe(3);
  expect(encoder.predicted(c, local, hashes, 0, 5)).toBe(5);
  expect(encoder.predicted(a, local, hashes, 5, 5)).toBe(0);
  expect(encoder.predicted(a, chain, chain, 1, CHAIN_BLOCKS_MAX + 5)).toBe(CHAIN_BLOCKS_MAX);
  encoder.corrected(a, true, true, 12, 0xffff_ffff);
  encoder.corrected(a, true, false, 0, 0);
  encoder.predictedOlder(c, true, 7, 8, local, 5, 3000);
  encoder.predictedOlder(a, false, 0, 0, local, 1, 0);
  encoder.corrected(c, false, true, 3, 4); // a surplus names no block; the last fact, 4 bytes
  return { table, message: encoder.finish(41, 1234.5) };
}

describe("the bus's messages", () => {
  test("read back as written", () => {
    const { message } = facts();
    const header = readHeader(message);
    expect([header.kind, header.replicaId, header.epoch, header.seq, header.sentAtMs]).toEqual([
      KIND.facts,
      "r-1",
      99,
      41,
      1234.5,
    ]);
    const { visitor, seen } = recorder();
    const reader = new FactReader();
    reader.read(message, header.bodyAt, null); // checks only
    reader.read(message, header.bodyAt, visitor);
    expect(seen).toEqual([
      "routed 1 18446744073709551615:3 3 1/6 48 2 null",
      `routed 2 7:0 ${CHAIN_BLOCKS_MAX} 1/${2 * CHAIN_BLOCKS_MAX} 5 0 null`,
      "routed 4294967295 7:0 0 -/- 17 1 9",
      "prefill 70000",
      "ended 1 expired 4",
      "total 18446744073709551615:3 12",
      "routed 5 8:1 0 -/- 1 0 0",
      "predicted 18446744073709551615:3 202/203 3 104/109",
      "predicted 8:1 root 5 100/109",
      "predicted 18446744073709551615:3 208/209 0 -",
      `predicted 18446744073709551615:3 1/2 ${CHAIN_BLOCKS_MAX} 3/${2 * CHAIN_BLOCKS_MAX + 2}`,
      "corrected 18446744073709551615:3 shortfall 12/4294967295",
      "corrected 18446744073709551615:3 shortfall -",
      "older 8:1 7/8 5 100/109 3000",
      "older 18446744073709551615:3 root 1 100/101 0",
      "corrected 8:1 surplus -",
    ]);
  });

  test("a finished message is the caller's: the encoder never writes it again", () => {
    const table = new WorkerTable();
    const slot = table.acquire(1n, 0);
    const encoder = new MessageEncoder("r", 1, table);
    const sent: Uint8Array[] = [];
    for (const handle of [1, 2, 3]) {
      encoder.begin(KIND.facts);
      encoder.beginFacts();
      encoder.routedFlat(handle, slot, 1, 0, 0);
      sent.push(encoder.finish(1, 0));
    }
    const ids = sent.map((message) => {
      const { visitor, seen } = recorder();
      new FactReader().read(message, readHeader(message).bodyAt, visitor);
      return seen[0]!.split(" ")[1];
    });
    expect(ids).toEqual(["1", "2", "3"]);
  });

  test("malformed messages are refused whole, with their reason", () => {
    const { message } = facts();
    const reasonOf = (bytes: Uint8Array): string => {
      try {
        const header = readHeader(bytes);
        let applied = 0;
        const counting: FactVisitor = {
          begin() {},
          routed: () => void applied++,
          prefillDone: () => void applied++,
          ended: () => void applied++,
          decodeTotal: () => void applied++,
          predicted: () => void applied++,
          corrected: () => void applied++,
          predictedOlder: () => void applied++,
        };
        new FactReader().read(bytes, header.bodyAt, null);
        new FactReader().read(bytes, header.bodyAt, counting);
        return `ok ${applied}`;
      } catch (error) {
        expect(error).toBeInstanceOf(BadMessage);
        return (error as BadMessage).message;
      }
    };
    expect(reasonOf(message)).toBe("ok 16");
    const changed = (at: number, value: number) => {
      const copy = message.slice();
      copy[at] = value;
      return reasonOf(copy);
    };
    expect(changed(0, 0x7b)).toBe("not_kvedge");
    expect(changed(1, 2)).toBe("version");
    expect(changed(2, 9)).toBe("kind");
    expect(changed(4, 0)).toBe("header"); // epoch 0
    expect(changed(25, "*".charCodeAt(0))).toBe("replica_id");
    expect(reasonOf(message.subarray(0, 10))).toBe("truncated");
    expect(reasonOf(new Uint8Array(2 * 1024 * 1024))).toBe("oversized");
    // A prediction without an anchor and without blocks, bad flags, a correction's age.
    const one = (write: (encoder: MessageEncoder, slot: number) => void): Uint8Array => {
      const table = new WorkerTable();
      const slot = table.acquire(1n, 0);
      const encoder = new MessageEncoder("r", 1, table);
      encoder.begin(KIND.facts);
      encoder.beginFacts();
      write(encoder, slot);
      return encoder.finish(1, 0);
    };
    const words = new Uint32Array(4);
    const bodyAt = readHeader(one(() => {})).bodyAt + 8;
    expect(reasonOf(one((w, slot) => w.predicted(slot, words, words, 0, 0)))).toBe(
      "empty_prediction",
    );
    const flagged = one((w, slot) => w.predicted(slot, words, words, 1, 2));
    flagged[bodyAt + 3] = 2;
    expect(reasonOf(flagged)).toBe("flags");
    const surplus = one((w, slot) => w.corrected(slot, false, false, 0, 0));
    surplus[bodyAt + 3] = 2; // a surplus naming a block
    expect(reasonOf(surplus)).toBe("correction");
    // Every cut short of the whole is refused, never half applied.
    for (let end = 0; end < message.length; end++)
      expect(reasonOf(message.subarray(0, end))).not.toMatch(/^ok/);
  });
});
