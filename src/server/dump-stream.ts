/**
 * GET /v1/dump: the index's events as NDJSON, written in slices a turn apart so that
 * routing runs between them (a 3M-block index is ~100 MB of text: built at once it
 * blocked every route for seconds and held it all in memory). Each slice works for at
 * most DUMP_SLICE_MS: first the copy of the index (index writes paused meanwhile,
 * src/index/write-pause.ts: the dump is one instant's state), then its packing into
 * words, then text written from the words into one slice's bytes (src/index/dump.ts:
 * no string per entry). The stream is pulled: a client that reads slowly makes kvedge
 * write slowly, never buffer ahead. One dump at a time (each holds a copy of the index),
 * so a client that stops reading must not hold it: one that takes no slice for
 * `stallMs` gives the copy and the lock back at once (the stream errors), and the
 * connection is cut by Bun's idle timeout, which the server sets to the same bound for
 * a dump (`idleSecs`: Bun closes a connection only on its own timeout, not when a
 * response's stream errors while the socket is full).
 */
import { KvedgeError } from "../domain/errors";
import { DumpText } from "../index/dump";
import type { KvIndex } from "../index";
import { PackJob, type WritePause, yieldTurn } from "../index/write-pause";

/** A slice ends at this much text, or after this much time. */
export const DUMP_SLICE_BYTES = 64 * 1024;
const DUMP_SLICE_MS = 1;

/** A dump whose client has not taken the last slice within this long is cut. */
export const DUMP_STALL_MS = 10_000;

export class DumpStreamer {
  private running = false;

  constructor(private readonly stallMs = DUMP_STALL_MS) {}

  /** The idle timeout (whole seconds, as Bun takes it) of a dump's connection. */
  get idleSecs(): number {
    return Math.max(1, Math.ceil(this.stallMs / 1000));
  }

  /** Whether a dump is being written (it holds the lock and a copy of the index). */
  get busy(): boolean {
    return this.running;
  }

  /** A streamed dump of the index, or 503 while another dump is being written. */
  response(index: KvIndex, writes: WritePause): Response {
    if (this.running)
      throw new KvedgeError("busy", "a dump is being written already; try again when it is done");
    this.running = true;
    let job: PackJob | null = new PackJob(index, writes);
    let text: DumpText | null = null;
    let ended = false;
    let stall: ReturnType<typeof setTimeout> | null = null;
    const done = (): void => {
      if (ended) return;
      ended = true;
      if (stall !== null) clearTimeout(stall);
      this.running = false;
      // The copy of the index goes now, not when the stream is collected.
      job?.cancel();
      job = null;
      text = null;
    };
    const stream = new ReadableStream<Uint8Array>(
      {
        // A stream's pull must enqueue or end: the copy and the pack run first, in slices.
        pull: async (controller) => {
          if (stall !== null) clearTimeout(stall);
          stall = null;
          await job?.run(DUMP_SLICE_MS);
          for (;;) {
            if (job === null || !job.done) return; // cancelled: the client went away
            await yieldTurn();
            if (job === null) return;
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
              return;
            }
            if (bytes.length === 0) continue;
            // The client must take this slice within stallMs, else it is cut.
            stall = setTimeout(() => {
              controller.error(new Error("the client stopped reading the dump"));
              done();
            }, this.stallMs);
            return;
          }
        },
        cancel: done,
      },
      { highWaterMark: 1 },
    );
    return new Response(stream, { headers: { "content-type": "application/x-ndjson" } });
  }
}
