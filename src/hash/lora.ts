/**
 * LoRA identity: what names the adapter a block was computed under, in the block-hash
 * seed (blockSeed). Engines name it by `lora_name` (vLLM from #27577), by `lora_id`
 * only (vLLM before it: the adapter's int id), or not at all (SGLang). kvedge keys
 * blocks by the name; an id becomes its name through the configured adapters
 * (`index.lora_adapters`), and an id with no configured name keys its blocks by the id
 * itself: apart from every name and from the base model, so a LoRA block is never
 * matched by a query for another adapter or for the base model. Queries (route, match,
 * the proxy's `model`) name adapters the same two ways and go through the same table.
 */

/** One configured adapter: its name and, for engines that send only ids, its int id. */
export interface LoraAdapter {
  readonly name: string;
  readonly id: number | null;
}

/** Ids no name is configured for key their blocks by this (a NUL: no adapter name has one). */
const ID_KEY_PREFIX = "\u0000lora_id:";

export class LoraAdapters {
  private readonly nameOfId = new Map<number, string>();
  private readonly names = new Set<string>();
  private readonly idKeys = new Map<number, string>();

  constructor(readonly adapters: readonly LoraAdapter[] = []) {
    for (const { name, id } of adapters) {
      this.names.add(name);
      if (id !== null) this.nameOfId.set(id, name);
    }
  }

  /** The adapter a block or query names (null: the base model); a name wins over an id. */
  identity(name: string | null, id: number | null): string | null {
    if (name !== null && name !== "") return name;
    if (id === null) return null;
    const named = this.nameOfId.get(id);
    if (named !== undefined) return named;
    let key = this.idKeys.get(id);
    if (key === undefined) {
      key = `${ID_KEY_PREFIX}${id}`;
      // Ids are the engine's (hostile input): a bounded cache, the key made again after.
      if (this.idKeys.size < ID_KEYS_MAX) this.idKeys.set(id, key);
    }
    return key;
  }

  /** Whether `name` is a configured adapter (the proxy serves those as models). */
  has(name: string): boolean {
    return this.names.has(name);
  }

  /** Whether an identity keys blocks by an id no name is configured for. */
  static isIdKey(identity: string): boolean {
    return identity.startsWith(ID_KEY_PREFIX);
  }
}

const ID_KEYS_MAX = 1024;

export const NO_LORA_ADAPTERS = new LoraAdapters();
