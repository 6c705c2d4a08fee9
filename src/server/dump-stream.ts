/**
 * GET /v1/dump: the index's events as NDJSON, written in slices a turn apart so that
 * routing runs between them (a 3M-block index is ~100 MB of text: built at once it
 * blocked every route for seconds and held it all in memory). The stream is pulled:
 * a client that reads slowly makes kvedge write slowly, never buffer ahead. One dump
 * at a time (each holds a copy of the index while it runs).
 */
import type { IndexOp } from "../index";
import { HttpError } from "../http/http";

/** A slice ends at this much text, or after this much time (the index copy at the start excepted). */
export const DUMP_SLICE_BYTES = 64 * 1024;
const DUMP_SLICE_MS = 2;

const utf8 = new TextEncoder();
const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export class DumpWriter {
  private running = false;

  /** A streamed dump of `events()`, or 503 while another dump is being written. */
  response(events: () => IterableIterator<IndexOp | null>): Response {
    if (this.running) throw new HttpError(503, "a dump is being written already; try again when it is done");
    this.running = true;
    let source: IterableIterator<IndexOp | null>;
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
        let text = "";
        // A stream's pull must enqueue or end: slices without text (preparation) repeat.
        while (text.length === 0) {
          await nextTurn();
          const started = performance.now();
          for (;;) {
            const next = source.next();
            if (next.done === true) {
              if (text.length > 0) controller.enqueue(utf8.encode(text));
              controller.close();
              done();
              return;
            }
            if (next.value !== null) text += `${JSON.stringify(next.value)}\n`;
            if (text.length >= DUMP_SLICE_BYTES || performance.now() - started >= DUMP_SLICE_MS) break;
          }
        }
        controller.enqueue(utf8.encode(text));
      },
      cancel: done,
    }, { highWaterMark: 1 });
    return new Response(stream, { headers: { "content-type": "application/x-ndjson" } });
  }
}
