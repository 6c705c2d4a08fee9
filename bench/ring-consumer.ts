// The consumer Worker of bench/ring.ts: drains until a CONTROL record, timing its drains.
import { RecordKind, type RingBuffers, RingConsumer } from "../src/runtime/ring";

declare const self: Worker;

self.onmessage = (event: MessageEvent<RingBuffers>) => {
  const consumer = new RingConsumer(event.data);
  let sum = 0;
  let stop = false;
  let busyNs = 0;
  const handler = (
    kind: RecordKind,
    _stream: number,
    _generation: number,
    _seq: number,
    payload: Uint8Array,
  ) => {
    if (kind === RecordKind.CONTROL) stop = true;
    else sum += payload[0]! + payload[payload.length - 1]!;
  };
  void (async () => {
    for (;;) {
      const started = Bun.nanoseconds();
      consumer.drain(handler);
      busyNs += Bun.nanoseconds() - started;
      if (stop) break;
      const sleeping = consumer.sleep();
      if (sleeping !== null) await sleeping;
      consumer.awake();
    }
    self.postMessage({ sum, busyNs, counters: { ...consumer.counters } });
  })();
  self.postMessage("ready");
};
