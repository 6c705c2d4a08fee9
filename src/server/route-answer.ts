/**
 * A route's answer, from one list of its fields: the object JSON (and generic
 * MessagePack) answers carry, and the same map written straight into MessagePack with
 * its keys encoded once (every binary WebSocket route: building the answer's objects
 * and walking them were among the largest costs, and most of the garbage, per route).
 * A field is added here once and appears in both, in the same order.
 */
import type { KvedgeCore, RouteOutcome } from "../core/core";
import {
  type CandidateList,
  OVERLAP_KINDS,
  type OverlapKind,
  type RouteDecision,
} from "../route/router";
import { encodeMsgpack, type MsgpackEncoder } from "../wire/msgpack";

/** How a value is answered: a number, a flag (1 = true), an index in OVERLAP_KINDS. */
type As = "number" | "flag" | "kind";
/** The CandidateList columns that hold numbers. */
type Column = {
  [K in keyof CandidateList]: CandidateList[K] extends ArrayLike<number> ? K : never;
}[keyof CandidateList];
/** The RouteDecision members that are numbers, and the outcome's query_blocks. */
type DecisionMember =
  | { [K in keyof RouteDecision]: RouteDecision[K] extends number ? K : never }[keyof RouteDecision]
  | "queryBlocks";

interface Field<Name extends string, A extends As, From extends string> {
  readonly name: Name;
  /** The name as an encoded MessagePack string. */
  readonly key: Uint8Array;
  readonly as: A;
  /** Where the value is read: a RouteDecision member, or a CandidateList column. */
  readonly from: From;
}

function field<const Name extends string, const From extends string, const A extends As>(
  name: Name,
  from: From,
  as: A,
): Field<Name, A, From> {
  return { name, key: encodeMsgpack(name), as, from };
}
const decisionField = <const Name extends string>(name: Name, from: DecisionMember) =>
  field(name, from, "number");
const candidateField = <const Name extends string, const A extends As = "number">(
  name: Name,
  from: Column,
  as?: A,
) => field(name, from, as ?? ("number" as A));

/** After request_id and worker_id, before candidates. */
const DECISION_FIELDS = [
  decisionField("dp_rank", "dpRank"),
  decisionField("query_blocks", "queryBlocks"),
  decisionField("overlap_blocks", "overlapBlocks"),
  decisionField("host_pinned_blocks", "hostBlocks"),
  decisionField("disk_blocks", "diskBlocks"),
  decisionField("external_blocks", "externalBlocks"),
  decisionField("cost", "cost"),
  decisionField("predicted_ttft_ms", "predictedTtftMs"),
] as const;

/** A candidate's fields after worker_id. */
const CANDIDATE_FIELDS = [
  candidateField("dp_rank", "dpRanks"),
  candidateField("overlap_blocks", "overlapBlocks"),
  candidateField("overlap_kind", "overlapKinds", "kind"),
  candidateField("pending_blocks", "pendingBlocks"),
  candidateField("host_pinned_blocks", "hostBlocks"),
  candidateField("disk_blocks", "diskBlocks"),
  candidateField("external_blocks", "externalBlocks"),
  candidateField("cost", "costs"),
  candidateField("degraded", "degraded", "flag"),
  candidateField("active_prefill_tokens", "activePrefillTokens"),
  candidateField("active_decode_blocks", "activeDecodeBlocks"),
  candidateField("active_requests", "activeRequests"),
  candidateField("predicted_ttft_ms", "predictedTtftMs"),
  candidateField("queue_ms", "queueMs"),
  candidateField("reload_ms", "reloadMs"),
  candidateField("prefill_ms", "prefillMs"),
  candidateField("steps_ms", "stepsMs"),
] as const;

type JsonOf<A extends As> = A extends "number" ? number : A extends "flag" ? boolean : OverlapKind;
type JsonFields<Fields extends readonly Field<string, As, string>[]> = {
  [F in Fields[number] as F["name"]]: JsonOf<F["as"]>;
};
/** A candidate as JSON: the fields above, after `worker_id`. */
export type CandidateJson = { worker_id: string } & JsonFields<typeof CANDIDATE_FIELDS>;
/** A route answer as JSON: `request_id`, `worker_id`, the decision's fields, its candidates. */
export type RouteAnswerJson = { request_id: string; worker_id: string } & JsonFields<
  typeof DECISION_FIELDS
> & { candidates: CandidateJson[] };

/*
 * Both answers are built by functions compiled once from the lists above, as a
 * hand-written writer would be: one object literal per candidate, one straight run of
 * writes with every key a constant. Filled by computed keys, a JSON answer of 64
 * candidates took 5x as long (every key a generic property store); a loop over the
 * fields made the MessagePack answer 15-20% slower. Names and members are this file's
 * constants, never input.
 */
const decisionRead = (from: DecisionMember) => (from === "queryBlocks" ? from : `d.${from}`);
const jsonOf = (as: As, read: string) =>
  as === "number" ? read : as === "flag" ? `${read} === 1` : `kinds[${read}]`;
const candidateJson = new Function(
  "list",
  "i",
  "workerId",
  "kinds",
  `return { worker_id: workerId, ${CANDIDATE_FIELDS.map((f) => `${f.name}: ${jsonOf(f.as, `list.${f.from}[i]`)}`).join(", ")} };`,
) as (
  list: CandidateList,
  i: number,
  workerId: string,
  kinds: typeof OVERLAP_KINDS,
) => CandidateJson;
const decisionJson = new Function(
  "d",
  "queryBlocks",
  "workerId",
  "candidates",
  `return { request_id: d.requestId, worker_id: workerId, ${DECISION_FIELDS.map((f) => `${f.name}: ${decisionRead(f.from)}`).join(", ")}, candidates };`,
) as (
  d: RouteDecision,
  queryBlocks: number,
  workerId: string,
  candidates: CandidateJson[],
) => RouteAnswerJson;

const writeOf = (as: As, read: string) =>
  as === "number"
    ? `enc.number(${read});`
    : as === "flag"
      ? `enc.bool(${read} === 1);`
      : `switch (${read}) { ${OVERLAP_KINDS.map((_, k) => `case ${k}: enc.encoded(kind${k}); break;`).join(" ")} }`;
const writeAnswer = new Function(
  "keys",
  "kinds",
  `"use strict";
const [kRequestId, kWorkerId, kCandidates] = [keys.request_id, keys.worker_id, keys.candidates];
const [${DECISION_FIELDS.map((_, j) => `d${j}`).join(", ")}] = keys.decision;
const [${CANDIDATE_FIELDS.map((_, j) => `c${j}`).join(", ")}] = keys.candidate;
const [${OVERLAP_KINDS.map((_, k) => `kind${k}`).join(", ")}] = kinds;
return function writeAnswer(enc, core, d, queryBlocks) {
  enc.mapHeader(${DECISION_FIELDS.length + 3});
  enc.encoded(kRequestId); enc.string(d.requestId);
  enc.encoded(kWorkerId); enc.string(core.workerIdTextOf(d.slot));
  ${DECISION_FIELDS.map((f, j) => `enc.encoded(d${j}); enc.number(${decisionRead(f.from)});`).join("\n  ")}
  enc.encoded(kCandidates);
  const list = d.candidates;
  enc.arrayHeader(list.count);
  for (let i = 0; i < list.count; i++) {
    enc.mapHeader(${CANDIDATE_FIELDS.length + 1});
    enc.encoded(kWorkerId); enc.string(core.workerIdTextOf(list.slots[i]));
    ${CANDIDATE_FIELDS.map((f, j) => `enc.encoded(c${j}); ${writeOf(f.as, `list.${f.from}[i]`)}`).join("\n    ")}
  }
};`,
)(
  {
    request_id: encodeMsgpack("request_id"),
    worker_id: encodeMsgpack("worker_id"),
    candidates: encodeMsgpack("candidates"),
    decision: DECISION_FIELDS.map((f) => f.key),
    candidate: CANDIDATE_FIELDS.map((f) => f.key),
  },
  OVERLAP_KINDS.map((kind) => encodeMsgpack(kind)),
) as (enc: MsgpackEncoder, core: KvedgeCore, d: RouteDecision, queryBlocks: number) => void;

/** The answer to a route, as the object JSON and generic MessagePack answers carry. */
export function routeAnswer(
  core: KvedgeCore,
  { decision, queryBlocks }: RouteOutcome,
): RouteAnswerJson {
  const list = decision.candidates;
  const candidates: CandidateJson[] = [];
  for (let i = 0; i < list.count; i++)
    candidates.push(candidateJson(list, i, core.workerIdTextOf(list.slots[i]!), OVERLAP_KINDS));
  return decisionJson(decision, queryBlocks, core.workerIdTextOf(decision.slot), candidates);
}

/** The route answer as MessagePack: the same map `encoder.value(routeAnswer(...))` writes. */
export function writeRouteAnswer(
  encoder: MsgpackEncoder,
  core: KvedgeCore,
  { decision, queryBlocks }: RouteOutcome,
): void {
  writeAnswer(encoder, core, decision, queryBlocks);
}
