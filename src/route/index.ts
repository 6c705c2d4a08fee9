export { ActiveBlocks, type ChainHolder } from "./active-blocks";
export { Calibration, type LearnedTimes } from "./calibration";
export {
  overlapsOf,
  PromptHasher,
  type PromptHashes,
  promptHashes,
  type WorkerOverlap,
} from "./input";
export {
  DEFAULT_MAX_ACTIVE_REQUESTS,
  DEFAULT_REQUEST_TTL_MS,
  EXPIRE_PER_DECISION,
  FINISHED_REMEMBERED_MAX,
  INITIAL_RECORDS,
  type LifecycleResult,
  type LoadCounters,
  LoadTracker,
  type LoadTrackerOptions,
  REQUEST_ID_LENGTH_MAX,
  type WorkerLoad,
} from "./load";
export {
  type Candidate,
  CandidateList,
  DEFAULT_ROUTE_WEIGHTS,
  type EngineTimes,
  NO_OVERLAPS,
  type Overlaps,
  type RouteDecision,
  type RouteRequest,
  Router,
  type RouterOptions,
  type RouteWeights,
} from "./router";
export {
  DEFAULT_TTFT_SETTINGS,
  type EngineTimeModel,
  ROUTE_POLICIES,
  type RoutePolicy,
  type TtftSettings,
} from "./ttft";
