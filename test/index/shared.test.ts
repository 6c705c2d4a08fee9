// Goal: the shared-memory crtc (src/index/crtc/shared.ts) is the same index as the
// private one: its writer and a reader attached by descriptor both equal the reference
// model on the seeded streams; readers hold freed ids back until they leave.
import { createSharedIndex, attach } from "../../src/index/crtc/shared";
import { differentialSuite } from "../harness/suite";

/** The writer in shared memory, answering findMatches through a reader on this thread. */
differentialSuite({
  name: "crtc in shared memory, read through a reader",
  create: (options) => {
    const shared = createSharedIndex(1, { ...options, budgetBytes: 8 * 2 ** 20, maxReaders: 1 });
    const reader = attach(shared.descriptor);
    const index = shared.index;
    index.findMatches = (local, count, out) => reader.findMatches(local, count, out);
    index.workerIdOf = (handle) => reader.workerIdOf(handle);
    index.dpRankOf = (handle) => reader.dpRankOf(handle);
    return index;
  },
});
