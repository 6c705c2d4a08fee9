/**
 * A seeded multi-turn conversation workload for index benches, shaped like the
 * Mooncake conversation trace (shared system prompts, conversations that grow turn by
 * turn and mostly stay on one worker): the stored events a fleet of engines would
 * publish, as typed arrays, plus the prompts as queries.
 *
 * - `systemPrompts` prompts of 16..96 blocks, chosen with a skew (a few are hot).
 * - Conversations start on a home worker; each request is the next turn (4..40 new
 *   blocks), sent to the home worker with probability `sticky`, else to a random one.
 * - A worker stores only what it does not hold yet (parent = its last held block),
 *   as engines do. Local hashes are unique per (system prompt | conversation,
 *   position); each worker has its own engine seed for external hashes.
 *
 * Requests are generated until the fleet holds `targetPairs` (block, worker) pairs.
 */
import { prng } from "./lib";

export interface StoredEvent {
  readonly worker: number;
  readonly hasParent: boolean;
  readonly parentHi: number;
  readonly parentLo: number;
  readonly external: Uint32Array;
  readonly local: Uint32Array;
  readonly count: number;
}

export interface WorkloadOptions {
  readonly workers: number;
  readonly targetPairs: number;
  readonly systemPrompts?: number;
  readonly sticky?: number;
  readonly seed?: number;
}

export interface Workload {
  readonly events: StoredEvent[];
  /** Full prompts (local hash pairs) of requests, for findMatches. */
  readonly prompts: Uint32Array[];
  readonly pairs: number;
  /** Distinct blocks stored by anyone. */
  readonly distinctBlocks: number;
}

/** Mixes (a, b, c) into a u32 (two rounds of multiply-xorshift). */
function mix(a: number, b: number, c: number): number {
  let h =
    Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^
    Math.imul(b + 0x7f4a7c15, 0xc2b2ae35) ^
    Math.imul(c, 0x27d4eb2f);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  h = Math.imul(h, 0x297a2d39);
  return (h ^ (h >>> 15)) >>> 0;
}

interface Conversation {
  readonly system: number;
  home: number;
  /** Turn lengths in blocks; the prompt is the system prompt then every turn. */
  readonly turns: number[];
  readonly id: number;
}

export function buildWorkload(options: WorkloadOptions): Workload {
  const random = prng(options.seed ?? 7);
  const uniform = (): number => random() / 4294967296;
  const workers = options.workers;
  const sticky = options.sticky ?? 0.8;
  const systemLengths: number[] = [];
  for (let s = 0; s < (options.systemPrompts ?? 40); s++)
    systemLengths.push(16 + Math.floor(uniform() * 81));
  const conversations: Conversation[] = [];
  /** Per worker: conversation id -> blocks of that conversation's prompt held. */
  const held: Map<number, number>[] = [];
  const heldSystem: Set<number>[] = [];
  for (let w = 0; w < workers; w++) {
    held.push(new Map());
    heldSystem.push(new Set());
  }
  const events: StoredEvent[] = [];
  const prompts: Uint32Array[] = [];
  let pairs = 0;
  let distinct = 0;
  const seenSystem = new Set<number>();
  const seenConversationBlocks = new Map<number, number>();

  // Block identity: (kind, id, position) -> local hash; external = engine(worker) of it.
  const localOf = (
    conversation: Conversation,
    position: number,
    out: Uint32Array,
    at: number,
  ): void => {
    const systemLength = systemLengths[conversation.system]!;
    // The low word chains the high one with the arguments swapped, so the two halves
    // do not collide together (the hash is 64 bits wide, not 32).
    const system = position < systemLength;
    const id = system ? conversation.system : conversation.id;
    const hi = mix(system ? 1 : 3, id, position);
    out[at] = hi;
    out[at + 1] = mix(hi, position, id);
  };

  while (pairs < options.targetPairs) {
    let conversation: Conversation;
    if (conversations.length < 8 || uniform() < 0.3) {
      // Skewed choice of system prompt: squaring a uniform favours the first ones.
      const system = Math.floor(uniform() * uniform() * systemLengths.length);
      conversation = {
        system,
        home: Math.floor(uniform() * workers),
        turns: [],
        id: conversations.length,
      };
      conversations.push(conversation);
    } else {
      conversation = conversations[Math.floor(uniform() * conversations.length)]!;
    }
    conversation.turns.push(4 + Math.floor(uniform() * 37));
    const systemLength = systemLengths[conversation.system]!;
    let length = systemLength;
    for (const turn of conversation.turns) length += turn;
    const worker = uniform() < sticky ? conversation.home : Math.floor(uniform() * workers);
    const prompt = new Uint32Array(2 * length);
    for (let p = 0; p < length; p++) localOf(conversation, p, prompt, 2 * p);
    prompts.push(prompt);

    let have = held[worker]!.get(conversation.id) ?? 0;
    if (have === 0 && heldSystem[worker]!.has(conversation.system)) have = systemLength;
    if (have >= length) continue;
    const count = length - have;
    const external = new Uint32Array(2 * count);
    const local = new Uint32Array(2 * count);
    for (let i = 0; i < count; i++) {
      local[2 * i] = prompt[2 * (have + i)]!;
      local[2 * i + 1] = prompt[2 * (have + i) + 1]!;
      external[2 * i] = mix(worker + 100, local[2 * i]!, 5);
      external[2 * i + 1] = mix(worker + 100, local[2 * i + 1]!, 6);
    }
    const parentHi = have === 0 ? 0 : mix(worker + 100, prompt[2 * (have - 1)]!, 5);
    const parentLo = have === 0 ? 0 : mix(worker + 100, prompt[2 * (have - 1) + 1]!, 6);
    events.push({ worker, hasParent: have > 0, parentHi, parentLo, external, local, count });
    held[worker]!.set(conversation.id, length);
    heldSystem[worker]!.add(conversation.system);
    pairs += count;
    if (!seenSystem.has(conversation.system)) {
      seenSystem.add(conversation.system);
      distinct += systemLength;
    }
    const before = seenConversationBlocks.get(conversation.id) ?? systemLength;
    if (length > before) {
      distinct += length - before;
      seenConversationBlocks.set(conversation.id, length);
    }
  }
  return { events, prompts, pairs, distinctBlocks: distinct };
}
