/**
 * The event ring's hand-off cost (src/runtime/ring.ts): the socket thread writes
 * batches of engine-event size, a consumer on a Worker drains them (reading two bytes
 * of each). Reported per record: the producer's time inside `write` and the
 * consumer's inside `drain` (each thread's own busy time, so a descheduled thread does
 * not count), and wakes per record (one per burst that found the consumer asleep).
 *
 *   bun bench/ring.bench.ts [--json] [--records N] [--bytes B] [--burst K] [--wake-after-task]
 *
 * `--wake-after-task`: the producer notifies once per task (a burst), not at the first
 * record that finds the consumer asleep (RingProducer's `wakeAfterTask`).
 */
import { createRingBuffers, RecordKind, RingProducer } from "../src/runtime/ring";
import { benchFlags, median, provenance } from "./lib";

const USAGE =
  "bun bench/ring.bench.ts [--json] [--records N] [--bytes B] [--burst K] " + "[--wake-after-task]";
const flags = benchFlags(USAGE, {
  json: { type: "boolean" },
  records: { type: "string" },
  bytes: { type: "string" },
  burst: { type: "string" },
  "wake-after-task": { type: "boolean" },
});
const RECORDS = Number(flags.records ?? 1_000_000);
const BYTES = Number(flags.bytes ?? 512);
const BURST = Number(flags.burst ?? 64);
const RUNS = 5;

interface RunResult {
  producerNs: number;
  consumerNs: number;
  wakes: number;
  dropped: number;
}

async function oneRun(): Promise<RunResult> {
  const buffers = createRingBuffers(1 << 22);
  const producer = new RingProducer(buffers, flags["wake-after-task"] === true);
  const worker = new Worker(new URL("./ring-consumer.ts", import.meta.url).href);
  let ready!: () => void;
  const started = new Promise<void>((resolve) => {
    ready = resolve;
  });
  const finished = new Promise<{ busyNs: number }>((resolve) => {
    worker.onmessage = (event) => (event.data === "ready" ? ready() : resolve(event.data));
  });
  worker.postMessage(buffers);
  await started;
  const payload = new Uint8Array(BYTES).fill(7);
  let busyNs = 0;
  for (let written = 0; written < RECORDS; written += BURST) {
    // Bursts as a socket read delivers them; the ring never fills (drops would be cheap).
    while (producer.used > buffers.data.byteLength / 2) await Bun.sleep(0);
    const t = Bun.nanoseconds();
    for (let i = 0; i < BURST; i++) {
      producer.write(RecordKind.LIVE, i & 63, 0, written + i, payload);
    }
    busyNs += Bun.nanoseconds() - t;
    if ((written / BURST) % 16 === 15) await Bun.sleep(0);
  }
  producer.write(RecordKind.CONTROL, 0, 0, 0);
  const consumer = await finished;
  worker.terminate();
  return {
    producerNs: busyNs / RECORDS,
    consumerNs: consumer.busyNs / RECORDS,
    wakes: producer.wakes / RECORDS,
    dropped: producer.counters.droppedFull,
  };
}

const results = [];
for (let run = 0; run < RUNS; run++) results.push(await oneRun());
const summary = {
  bench: "ring",
  provenance: provenance(),
  records: RECORDS,
  bytes: BYTES,
  burst: BURST,
  runs: RUNS,
  wakeAfterTask: flags["wake-after-task"] === true,
  producerNsPerRecord: median(results.map((r) => r.producerNs)),
  consumerNsPerRecord: median(results.map((r) => r.consumerNs)),
  wakesPerRecord: median(results.map((r) => r.wakes)),
  dropped: results.reduce((sum, r) => sum + r.dropped, 0),
  raw: results,
};
if (flags.json === true) console.log(JSON.stringify(summary));
else {
  console.log(
    `${RECORDS} records of ${BYTES} bytes in bursts of ${BURST}, ` + `median of ${RUNS} runs:`,
  );
  console.log(
    `  producer ${summary.producerNsPerRecord.toFixed(0)} ns/record (write), ` +
      `consumer ${summary.consumerNsPerRecord.toFixed(0)} ns/record (drain), ` +
      `${summary.wakesPerRecord.toFixed(4)} wakes/record, ${summary.dropped} dropped`,
  );
}
