/**
 * GET /v1/dump: the index's events as NDJSON, written in slices a turn apart so that
 * routing runs between them (a 3M-block index is ~100 MB of text: built at once it
 * blocked every route for seconds and held it all in memory). Each slice works for at
 * most DUMP_SLICE_MS: first the copy of the index (index writes paused meanwhile,
 * src/index/write-pause.ts: the dump is one instant's state), then its packing into
 * words, then text written from the words into one slice's bytes (src/index/dump.ts:
 * no string per entry). The stream is pulled: a client that reads slowly makes kvedge
 * write slowly, never buffer ahead. One dump at a time (each holds a copy of the index).
 */
import { KvedgeError } from "../domain/errors";
import { DumpText } from "../index/dump";
import type { KvIndex } from "../index";
import { PackJob, type WritePause, yieldTurn } from "../index/write-pause";

/** A slice ends at this much text, or after this much time. */
export const DUMP_SLICE_BYTES = 64 * 1024;
const DUMP_SLICE_MS = 1;

export class DumpWriter {
  private running = false;

  /** A streamed dump of the index, or 503 while another dump is being written. */
  response(index: KvIndex, writes: WritePause): Response {
    if (this.running)
      throw new KvedgeError("busy", "a dump is being written already; try again when it is done");
    this.running = true;
    const job = new PackJob(index, writes);
    let text: DumpText | null = null;
    const done = (): void => {
      this.running = false;
      job.cancel();
    };
    const stream = new ReadableStream<Uint8Array>(
      {
        // A stream's pull must enqueue or end: the copy and the pack run first, in slices.
        pull: async (controller) => {
          await job.run(DUMP_SLICE_MS);
          if (!job.done) return; // cancelled: the client went away
          for (;;) {
            await yieldTurn();
            if (text === null) {
              const { words, workerIds } = job.result();
              text = new DumpText(words, workerIds, index.blockSize, DUMP_SLICE_BYTES);
            }
            const deadline = performance.now() + DUMP_SLICE_MS;
            const bytes = text.next(DUMP_SLICE_BYTES, () => performance.now() >= deadline);
            if (bytes.length > 0) controller.enqueue(bytes);
            if (text.done) {
              controller.close();
              done();
            }
            if (bytes.length > 0 || text.done) return;
          }
        },
        cancel: done,
      },
      { highWaterMark: 1 },
    );
    return new Response(stream, { headers: { "content-type": "application/x-ndjson" } });
  }
}
