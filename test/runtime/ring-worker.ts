// A ring consumer on a real Worker thread: drains records until a CONTROL record,
// then posts what it saw (counts, a checksum over every field and byte, its counters).
import { RecordKind, type RingBuffers, RingConsumer } from "../../src/runtime/ring";

declare const self: Worker;

self.onmessage = (event: MessageEvent<RingBuffers>) => {
  const consumer = new RingConsumer(event.data);
  let records = 0;
  let sum = 0;
  let stop = false;
  const seen: number[] = [];
  void consumer
    .run(
      (kind, stream, generation, seq, payload) => {
        if (kind === RecordKind.CONTROL) {
          stop = true;
          return;
        }
        records++;
        seen.push(kind, stream, seq);
        sum = (sum * 31 + kind + stream * 7 + generation * 13 + seq) >>> 0;
        for (let i = 0; i < payload.length; i++) sum = (sum * 31 + payload[i]!) >>> 0;
      },
      () => stop,
    )
    .then(() => {
      self.postMessage({ records, sum, seen, counters: { ...consumer.counters } });
    });
  self.postMessage("ready");
};
