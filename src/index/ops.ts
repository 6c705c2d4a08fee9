/**
 * The `kvedge apply` operations as JSON objects (README.md in this folder documents
 * the format). 64-bit ids and hashes are unsigned decimal strings.
 */

export interface StoredOp {
  op: "stored";
  worker_id: string;
  dp_rank: number;
  /** The storage tier (default "device"): device, host_pinned, disk or external. */
  tier?: string;
  parent_block_hash: string | null;
  /** A lower tier's store under a sequence hash instead of a parent (what dump() emits for them). */
  parent_sequence_hash?: string | null;
  block_hashes: string[];
  /** Either token_ids (hashed by kvedge) or local_hashes (what dump() emits). */
  token_ids?: number[];
  local_hashes?: string[];
  block_size?: number;
  lora_name?: string | null;
  cache_salt?: string | null;
}

export interface RemovedOp {
  op: "removed";
  worker_id: string;
  dp_rank: number;
  /** The storage tier (default "device"), or "any": every tier (a medium kvedge does not know). */
  tier?: string;
  block_hashes: string[];
}

export interface ClearedOp {
  op: "cleared";
  worker_id: string;
  dp_rank: number;
}

export interface RemoveWorkerOp {
  op: "remove_worker";
  worker_id: string;
}

export interface MatchOp {
  op: "match";
  token_ids?: number[];
  local_hashes?: string[];
  lora_name?: string | null;
  cache_salt?: string | null;
}

export interface StatsOp {
  op: "stats";
}

/** Operations that change an index (what dump() emits). */
export type IndexOp = StoredOp | RemovedOp | ClearedOp | RemoveWorkerOp;
export type ApplyOp = IndexOp | MatchOp | StatsOp;

export interface MatchScore {
  worker_id: string;
  dp_rank: number;
  blocks: number;
  /** Lower-tier blocks right after the device's (present when any tier has some). */
  host_pinned?: number;
  disk?: number;
  external?: number;
}

export interface MatchOutput {
  op: "match";
  scores: MatchScore[];
}

export interface StatsOutput {
  op: "stats";
  workers: number;
  blocks: number;
  nodes: number;
  lookup_entries: number;
  rejected: number;
  bytes: number;
}
