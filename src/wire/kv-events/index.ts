/** KV-event payloads (vLLM / SGLang `KVEventBatch`): decoding into typed arrays, encoding for tests and mock engines. */
export * from "./batch";
export * from "./decode";
export * from "./encode";
export * from "./variants";
