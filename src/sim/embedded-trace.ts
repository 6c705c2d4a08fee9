/**
 * The Mooncake conversation trace shipped in data/traces/ (Apache-2.0, attribution in
 * data/traces/README.md). Imported as a file so `bun build --compile` embeds it in
 * dist/kvedge: the demo needs no download.
 */
import conversationTracePath from "../../data/traces/conversation_trace.jsonl" with {
  type: "file",
};
import { parseTrace, type Trace } from "./trace";

/** sha256 of the shipped file (a test checks it is unchanged). */
export const CONVERSATION_TRACE_SHA256 =
  "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df";

export { conversationTracePath };

/** Parses the embedded conversation trace (12,031 requests, about 59 minutes). */
export async function loadConversationTrace(): Promise<Trace> {
  return parseTrace(await Bun.file(conversationTracePath).text());
}
