/**
 * The entry of every kvedge Worker thread (threads.ts starts them): takes its start
 * message, pins itself to its CPUs, sets its role up and reports ready. A role that throws
 * is reported as `failed`; the main thread decides what that means.
 */
import { getAffinity, pinThread } from "./affinity";
import type { ThreadMessage, ThreadStart } from "./threads";

declare const self: Worker;

const send = (message: ThreadMessage): void => self.postMessage(message);

self.onmessage = (event: MessageEvent<ThreadStart>) => {
  const start = event.data;
  try {
    if (start.cpus !== null) pinThread(start.cpus);
    runRole(start);
    send({ kind: "ready", ready: { role: start.role, cpus: getAffinity(0) } });
  } catch (error) {
    send({ kind: "failed", error: error instanceof Error ? error.message : String(error) });
  }
};

function runRole(start: ThreadStart): void {
  switch (start.role) {
    case "probe":
      // Answers every message with itself: proves a thread runs (and where).
      self.onmessage = (event) => send({ kind: "role", body: event.data });
      return;
    default:
      throw new Error(`no such thread role '${start.role}'`);
  }
}
