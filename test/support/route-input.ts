/** A route call's input with nothing but its tokens (and request id) set, as tests route. */
import type { RouteInput } from "../../src/core/core";

export function routeInput(tokens: Uint32Array, requestId: string | null = null): RouteInput {
  return {
    tokens,
    requestId,
    loraName: null,
    cacheSalt: null,
    expectedOutputTokens: null,
    overlapScoreCredit: null,
    prefillLoadScale: null,
    temperature: null,
  };
}
