/**
 * The KV-event wire layouts engines publish, one per producer era (./README.md has the
 * table with releases and sources). The decoder reads all of them without being told
 * which; the encoder writes exactly one, byte for byte as that producer's msgspec
 * structs do: array events always at their full length (msgspec's `omit_defaults`
 * never shortens an array), map events with the fields that have no default always
 * present and the others only when not nil.
 */

export const WIRE_VARIANTS = [
  "vllm-v1",
  "vllm-v2",
  "vllm-v3",
  "vllm-v4",
  "vllm-v5",
  "vllm-v6",
  "vllm-v7",
  "vllm-v8",
  "vllm-v9",
  "sglang-s1",
  "sglang-s2",
  "sglang-s3",
  "sglang-s4",
  "sglang-s5",
  "fork-f1",
  "vllm-f2",
] as const;
export type WireVariant = (typeof WIRE_VARIANTS)[number];

/** Event fields by their wire names. */
export type WireField =
  | "block_hashes"
  | "parent_block_hash"
  | "token_ids"
  | "block_size"
  | "lora_id"
  | "medium"
  | "lora_name"
  | "extra_keys"
  | "group_idx"
  | "kv_cache_spec_kind"
  | "kv_cache_spec_sliding_window"
  | "locality"
  | "ownership"
  | "cache_salt"
  | "session_id";

/** How one kind of event is laid out. */
export interface EventLayout {
  /** Array form: the fields after the tag, every one always written. Map form: the fields always written. */
  readonly fields: readonly WireField[];
  /** Map form only: fields written only when not nil (msgspec `omit_defaults`). */
  readonly optional: readonly WireField[];
}

export interface WireLayout {
  /** `[ts, events]`, `[ts, events, dp rank]`, or a map with `ts`, `events`, `data_parallel_rank`. */
  readonly batch: "array2" | "array3" | "map";
  readonly events: "array" | "map";
  readonly stored: EventLayout;
  readonly removed: EventLayout;
  readonly cleared: EventLayout;
  /**
   * Where a store's salt goes besides the fields above: SGLang's metadata map
   * `{"cache_salt": ...}` appended to a salted store's array (SGLang #30827; a
   * Dynamo-aligned fork appends it after its 14 fields too), or nowhere.
   */
  readonly metadata: "appended" | "none";
}

const BASE: readonly WireField[] = [
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
];
const SPEC: readonly WireField[] = ["kv_cache_spec_kind", "kv_cache_spec_sliding_window"];
const NONE: EventLayout = { fields: [], optional: [] };

function arrays(
  batch: WireLayout["batch"],
  stored: readonly WireField[],
  removed: readonly WireField[],
  metadata: WireLayout["metadata"] = "none",
  cleared: EventLayout = NONE,
): WireLayout {
  return {
    batch,
    events: "array",
    stored: { fields: stored, optional: [] },
    removed: { fields: removed, optional: [] },
    cleared,
    metadata,
  };
}

/** vLLM from #42892 (v0.24): tagged maps; `extra_keys` and later fields have defaults. */
const VLLM_MAP: WireLayout = {
  batch: "array3",
  events: "map",
  stored: {
    fields: [...BASE, "medium", "lora_name"],
    optional: ["extra_keys", "group_idx", ...SPEC],
  },
  removed: { fields: ["block_hashes", "medium"], optional: ["group_idx"] },
  cleared: NONE,
  metadata: "none",
};

export const WIRE_LAYOUTS: Readonly<Record<WireVariant, WireLayout>> = {
  "vllm-v1": arrays("array2", BASE, ["block_hashes"]),
  "vllm-v2": arrays("array3", BASE, ["block_hashes"]),
  "vllm-v3": arrays("array3", [...BASE, "medium"], ["block_hashes", "medium"]),
  "vllm-v4": arrays("array3", [...BASE, "medium", "lora_name"], ["block_hashes", "medium"]),
  "vllm-v5": arrays(
    "array3",
    [...BASE, "medium", "lora_name", "extra_keys"],
    ["block_hashes", "medium"],
  ),
  "vllm-v6": arrays(
    "array3",
    [...BASE, "medium", "lora_name", "extra_keys", "group_idx"],
    ["block_hashes", "medium", "group_idx"],
  ),
  "vllm-v7": arrays(
    "array3",
    [...BASE, "medium", "lora_name", "extra_keys", "group_idx", ...SPEC],
    ["block_hashes", "medium", "group_idx"],
  ),
  "vllm-v8": VLLM_MAP,
  "vllm-v9": {
    ...VLLM_MAP,
    stored: {
      fields: VLLM_MAP.stored.fields,
      optional: [...VLLM_MAP.stored.optional, "locality", "ownership", "session_id"],
    },
    removed: {
      fields: VLLM_MAP.removed.fields,
      optional: [...VLLM_MAP.removed.optional, "locality", "ownership"],
    },
  },
  "sglang-s1": arrays("array2", BASE, ["block_hashes"]),
  "sglang-s2": arrays("array3", BASE, ["block_hashes"]),
  "sglang-s3": arrays("array3", [...BASE, "medium"], ["block_hashes", "medium"]),
  "sglang-s4": arrays("array3", [...BASE, "medium"], ["block_hashes", "medium"], "appended"),
  "sglang-s5": {
    batch: "array3",
    events: "map",
    stored: { fields: BASE, optional: ["medium", "cache_salt", "session_id"] },
    removed: { fields: ["block_hashes"], optional: ["medium"] },
    cleared: NONE,
    metadata: "none",
  },
  "fork-f1": arrays(
    "array3",
    [...BASE, "medium", "lora_name", "extra_keys", "group_idx", ...SPEC, "locality", "ownership"],
    ["block_hashes", "medium", "group_idx", ...SPEC, "locality", "ownership"],
    "appended",
    { fields: ["ownership"], optional: [] },
  ),
  "vllm-f2": { ...VLLM_MAP, batch: "map" },
};
