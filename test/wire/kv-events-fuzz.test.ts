// Goal: no input makes the walker throw, allocate past its bounds, or accept
// something the reference decoder (msgpackr + a plain conversion) reads differently;
// a valid batch after garbage still decodes. Method: seeded random bytes and
// mutations of valid batches (truncations, byte flips, spliced type bytes, huge
// length headers, deep nesting). For each input:
// - msgpackr throws -> the walker may say anything but must not throw;
// - the reference refuses -> the walker must refuse too;
// - the reference accepts -> the walker returns the same batch, or refuses (the batch,
//   or one event it skips alone) for a reason msgpackr cannot see: invalid UTF-8,
//   nesting depth, a repeated map key, or a float where an int belongs (msgpackr
//   returns both as JS numbers). An event skipped for such a reason is excused: the
//   walker's other events must then be the reference's, in order, minus some.
// ("msgpackr throws" includes msgpackr returning objects of its own for extension
// types, records or the byte 0xc1: no reference for those inputs.)
// KVEDGE_FUZZ_ROUNDS scales the run (default keeps the suite fast).
import { expect, test } from "bun:test";
import {
  DECODE_ERROR_KINDS,
  DECODE_OK,
  DecodedBatch,
  decodeKvBatch,
  encodeKvBatch,
  EVENT_SKIPPED,
  WIRE_LAYOUTS,
  WIRE_VARIANTS,
} from "../../src/wire/kv-events";
import {
  type EventSnapshot,
  randomBatch,
  referenceDecode,
  snapshotBatch,
  xorshift,
} from "../support/kv-events";

const ROUNDS = Number(process.env.KVEDGE_FUZZ_ROUNDS ?? 4000);
const INVISIBLE_TO_MSGPACKR = new Set(["bad_string", "too_deep", "duplicate_key"]);

interface Tally {
  inputs: number;
  walkerOk: number;
  msgpackrThrew: number;
  equal: number;
  excused: Map<string, number>;
}

function check(payload: Uint8Array, batch: DecodedBatch, tally: Tally): void {
  tally.inputs++;
  let status: number;
  try {
    status = decodeKvBatch(payload, batch);
  } catch (error) {
    throw new Error(`walker threw on ${Buffer.from(payload).toString("hex")}: ${error}`);
  }
  // Bounded memory: nothing ever grows past what the limits allow.
  expect(batch.hashes.length).toBeLessThanOrEqual(2 * 2 * batch.limits.blocksMax);
  expect(batch.tokens.length).toBeLessThanOrEqual(2 * batch.limits.tokensMax);
  if (status === DECODE_OK) tally.walkerOk++;
  const reference = referenceDecode(payload, batch.limits);
  if (!reference.ok && reference.msgpackrThrew) {
    tally.msgpackrThrew++;
    return;
  }
  const hex = Buffer.from(payload).toString("hex");
  if (!reference.ok) {
    if (status === DECODE_OK) {
      throw new Error(`walker accepted what the reference refuses (${reference.reason}): ${hex}`);
    }
    return;
  }
  if (status === DECODE_OK) {
    const walker = snapshotBatch(batch);
    const excused = excusedSkips(payload, batch);
    if (excused.length === 0) {
      expect(walker).toEqual(reference.batch);
      tally.equal++;
      return;
    }
    // Excused skips: the rest must be what the reference read, in order, minus some.
    const kept = walker.events.filter((_, e) => !excused.includes(e));
    if (!isSubsequence(kept, reference.batch.events))
      throw new Error(`walker events differ from the reference beyond excused skips: ${hex}`);
    for (const e of excused) excuse(tally, `event_${excuseOf(payload, batch, e)}`);
    return;
  }
  const kind = DECODE_ERROR_KINDS[status]!;
  const atFloat = payload[batch.errorOffset] === 0xca || payload[batch.errorOffset] === 0xcb;
  if (!INVISIBLE_TO_MSGPACKR.has(kind) && !atFloat) {
    throw new Error(
      `walker refused (${kind} at ${batch.errorOffset}) what the reference accepts: ${hex}`,
    );
  }
  excuse(tally, atFloat ? "float_where_int" : kind);
}

function excuse(tally: Tally, reason: string): void {
  tally.excused.set(reason, (tally.excused.get(reason) ?? 0) + 1);
}

/** Why skipped event `e` is excused ("" if it is not: msgpackr could have seen it). */
function excuseOf(payload: Uint8Array, batch: DecodedBatch, e: number): string {
  const kind = DECODE_ERROR_KINDS[batch.skipError[e]!]!;
  if (INVISIBLE_TO_MSGPACKR.has(kind)) return kind;
  const byte = payload[batch.skipAt[e]!];
  return byte === 0xca || byte === 0xcb ? "float_where_int" : "";
}

/** The walker's skipped events whose reason msgpackr cannot see. */
function excusedSkips(payload: Uint8Array, batch: DecodedBatch): number[] {
  const excused: number[] = [];
  for (let e = 0; e < batch.eventCount; e++)
    if (batch.kind[e] === EVENT_SKIPPED && excuseOf(payload, batch, e) !== "") excused.push(e);
  return excused;
}

function isSubsequence(part: EventSnapshot[], whole: EventSnapshot[]): boolean {
  let at = 0;
  for (const event of part) {
    while (at < whole.length && !Bun.deepEquals(whole[at], event)) at++;
    if (at++ >= whole.length) return false;
  }
  return true;
}

const newTally = (): Tally => ({
  inputs: 0,
  walkerOk: 0,
  msgpackrThrew: 0,
  equal: 0,
  excused: new Map(),
});

test("random bytes", () => {
  const next = xorshift(1);
  const batch = new DecodedBatch();
  const tally = newTally();
  for (let round = 0; round < ROUNDS; round++) {
    const length = next() % 64;
    // Half start like a batch (fixarray of 2 or 3, or a small map), so the walker gets past the envelope.
    const prefix = next() % 2 === 0 ? [0x92 + (next() % 2), 0xcb, 0, 0, 0, 0, 0, 0, 0, 0] : [];
    check(
      Uint8Array.from([...prefix, ...Array.from({ length }, () => next() & 0xff)]),
      batch,
      tally,
    );
  }
  expect(tally.inputs).toBe(ROUNDS);
});

/** Bytes that change a value's type or claim a huge length. */
const SPLICES = [
  [0xc0],
  [0xc1],
  [0xc3],
  [0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0],
  [0xa1, 0x78],
  [0xc4, 0x01, 0x07],
  [0x90],
  [0x80],
  [0xdd, 0xff, 0xff, 0xff, 0xff],
  [0xdf, 0x7f, 0xff, 0xff, 0xff],
  [0xdb, 0xff, 0xff, 0xff, 0xf0],
  [0xc6, 0x7f, 0xff, 0xff, 0xff],
  [0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
  [0xff],
  [0xd4, 0x01, 0x00],
  Array.from({ length: 40 }, () => 0x91),
];

function mutate(valid: Uint8Array, next: () => number): Uint8Array {
  const bytes = Array.from(valid);
  const at = next() % bytes.length;
  switch (next() % 5) {
    case 0:
      return valid.subarray(0, at);
    case 1:
      for (let flips = 1 + (next() % 3); flips > 0; flips--)
        bytes[next() % bytes.length] = next() & 0xff;
      return Uint8Array.from(bytes);
    case 2:
      bytes.splice(at, 1 + (next() % 9), ...SPLICES[next() % SPLICES.length]!);
      return Uint8Array.from(bytes);
    case 3:
      bytes.splice(at, 0, ...SPLICES[next() % SPLICES.length]!);
      return Uint8Array.from(bytes);
    default:
      bytes[at] = (bytes[at]! + (next() % 2 === 0 ? 1 : -1)) & 0xff;
      return Uint8Array.from(bytes);
  }
}

for (const form of ["array", "map"] as const) {
  test(`mutations of valid batches (events as ${form}s, every variant of that form)`, () => {
    const next = xorshift(form === "array" ? 2 : 3);
    const variants = WIRE_VARIANTS.filter(
      (variant) => (WIRE_LAYOUTS[variant].events === "array") === (form === "array"),
    );
    const batch = new DecodedBatch();
    const tally = newTally();
    for (let round = 0; round < ROUNDS; round++) {
      const variant = variants[next() % variants.length]!;
      const source = randomBatch(next, { variant, maxEvents: 4, maxBlocks: 4 });
      const valid = encodeKvBatch(source, { variant });
      check(mutate(valid, next), batch, tally);
      // The next valid batch after garbage still decodes.
      expect(decodeKvBatch(valid, batch)).toBe(DECODE_OK);
    }
    // The run exercised both sides: accepted mutations compared equal, many refused.
    expect(tally.equal).toBeGreaterThan(ROUNDS / 20);
    expect(tally.walkerOk).toBeLessThan(ROUNDS);
  });
}

test("every truncation of a batch is refused as truncated", () => {
  const next = xorshift(4);
  const batch = new DecodedBatch();
  for (let round = 0; round < 20; round++) {
    const variant = WIRE_VARIANTS[round % WIRE_VARIANTS.length]!;
    const valid = encodeKvBatch(randomBatch(next, { variant }), { variant });
    for (let length = 0; length < valid.length; length++) {
      expect(DECODE_ERROR_KINDS[decodeKvBatch(valid.subarray(0, length), batch)]).toBe("truncated");
    }
  }
});
