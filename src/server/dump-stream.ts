/**
 * GET /v1/dump: the index's events as NDJSON, written in slices a turn apart so that
 * routing runs between them (a 3M-block index is ~100 MB of text: built at once it
 * blocked every route for seconds and held it all in memory). The stream is pulled:
 * a client that reads slowly makes kvedge write slowly, never buffer ahead. One dump
 * at a time (each holds a copy of the index while it runs).
 */
import type { IndexOp } from "../index";
import { HttpError } from "./http";

/** Text written per slice: ~1 ms of work. */
export const DUMP_SLICE_BYTES = 64 * 1024;

const utf8 = new TextEncoder();
const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export class DumpWriter {
  private running = false;

  /** A streamed dump of `events()`, or 503 while another dump is being written. */
  response(events: () => IterableIterator<IndexOp>): Response {
    if (this.running) throw new HttpError(503, "a dump is being written already; try again when it is done");
    this.running = true;
    let source: IterableIterator<IndexOp>;
    try {
      source = events();
    } catch (error) {
      this.running = false;
      throw error;
    }
    const done = (): void => {
      this.running = false;
    };
    const stream = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        await nextTurn();
        let text = "";
        for (;;) {
          const next = source.next();
          if (next.done === true) {
            if (text.length > 0) controller.enqueue(utf8.encode(text));
            controller.close();
            done();
            return;
          }
          text += `${JSON.stringify(next.value)}\n`;
          if (text.length >= DUMP_SLICE_BYTES) break;
        }
        controller.enqueue(utf8.encode(text));
      },
      cancel: done,
    }, { highWaterMark: 1 });
    return new Response(stream, { headers: { "content-type": "application/x-ndjson" } });
  }
}
