/**
 * The entry of every kvedge Worker thread (threads.ts starts them): takes its start
 * message, pins itself to its CPUs, reports ready, then runs its role. A failure
 * before ready fails the start; one after is reported as `failed` (the main thread
 * decides what that means).
 */
import { type LaneStart, runLane } from "../server/lane";
import { runTokenizerThread, type TokenizerThreadStart } from "../proxy/preparer";
import { getAffinity, pinThread } from "../runtime/affinity";
import { IndexWriter, type WriterStart } from "../runtime/writer";
import type { ThreadMessage, ThreadRole, ThreadStart } from "../runtime/threads";

declare const self: Worker;

const send = (message: ThreadMessage, transfer: ArrayBuffer[] = []): void =>
  self.postMessage(message, transfer);
const ROLES: readonly ThreadRole[] = ["probe", "lane", "writer", "tokenizer"];

self.onmessage = (event: MessageEvent<ThreadStart>) => {
  const start = event.data;
  try {
    if (!ROLES.includes(start.role)) throw new Error(`no such thread role '${start.role}'`);
    if (start.cpus !== null) pinThread(start.cpus);
    send({ kind: "ready", ready: { role: start.role, cpus: getAffinity(0) } });
    runRole(start);
  } catch (error) {
    send({ kind: "failed", error: error instanceof Error ? error.message : String(error) });
  }
};

/** Role messages from the main thread go to `handler` from now on. */
function listen(handler: (body: never) => void): void {
  self.onmessage = (event: MessageEvent) => handler(event.data as never);
}

function runRole(start: ThreadStart): void {
  const reply = (body: unknown): void => send({ kind: "role", body });
  if (start.role === "probe") {
    // Answers every message with itself: proves a thread runs (and where).
    listen(reply as (body: never) => void);
  } else if (start.role === "lane") {
    runLane(
      start.data as LaneStart,
      (body, transfer) => send({ kind: "role", body }, transfer),
      listen,
    ).catch((error: unknown) => {
      send({ kind: "failed", error: error instanceof Error ? error.message : String(error) });
    });
  } else if (start.role === "tokenizer") {
    const answer = (body: unknown, transfer: ArrayBuffer[]) =>
      send({ kind: "role", body }, transfer);
    runTokenizerThread(start.data as TokenizerThreadStart, answer, listen);
  } else {
    const writer = new IndexWriter(start.data as WriterStart, reply);
    writer.run().catch((error: unknown) => {
      const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
      send({ kind: "failed", error: text });
    });
  }
}
