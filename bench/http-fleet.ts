/**
 * The engine fleet of the serving benchmark: one process, one ZMTP PUB socket per
 * worker (bound on 127.0.0.1), publishing the stored events of bench/http-workload.ts
 * as vLLM KV-event batches (topic "", seq u64 BE, msgpack batch of 8 events).
 *
 *   bun bench/http-fleet.ts SEED WORKERS TARGET_PAIRS
 *
 * stdout, one JSON line each: {"endpoints": [...], "pairsPerWorker": [...], "pairs": N}
 * once bound, then {"published": batches} once every batch went out. It publishes after
 * every worker's subscriber has arrived, and stays up (heartbeats) until stdin closes.
 */
import { encodeKvBatch, type KvEvent } from "../src/wire/kv-events";
import { PubSocket } from "../src/wire/zmtp";
import {
  BLOCK_SIZE,
  blockTokens,
  buildFleet,
  externalHash,
  type Fleet,
  KIND_DOCUMENT,
  KIND_SYSTEM,
  KIND_TAIL,
} from "./http-workload";

const EVENTS_PER_BATCH = 8;
const EMPTY = new Uint8Array(0);

/** The events worker `w` publishes, in order, one per cached sequence. */
function* workerEvents(fleet: Fleet, w: number): Generator<KvEvent> {
  const systems = new Set<number>();
  for (const sequence of fleet.sequences[w]!) {
    const system = fleet.documentSystem[sequence.document]!;
    const hashes: bigint[] = [];
    const tokens: number[] = [];
    const add = (kind: number, id: number, position: number) => {
      hashes.push(externalHash(w, kind, id, position));
      tokens.length += BLOCK_SIZE;
      blockTokens(kind, id, position, tokens, tokens.length - BLOCK_SIZE);
    };
    const systemLength = fleet.systemBlocks[system]!;
    let parent: bigint | null = null;
    if (systems.has(system)) parent = externalHash(w, KIND_SYSTEM, system, systemLength - 1);
    else {
      systems.add(system);
      for (let i = 0; i < systemLength; i++) add(KIND_SYSTEM, system, i);
    }
    for (let i = 0; i < fleet.documentBlocks[sequence.document]!; i++)
      add(KIND_DOCUMENT, sequence.document, i);
    for (let i = 0; i < sequence.tailBlocks; i++) add(KIND_TAIL, sequence.tail, i);
    yield {
      type: "BlockStored",
      blockHashes: hashes,
      parentBlockHash: parent,
      tokenIds: tokens,
      blockSize: BLOCK_SIZE,
      medium: "GPU",
    };
  }
}

async function main(): Promise<void> {
  const [seed, workers, target] = process.argv.slice(2).map(Number);
  const fleet = buildFleet(seed!, workers!, target!);
  const pubs: PubSocket[] = [];
  const endpoints: string[] = [];
  for (let w = 0; w < workers!; w++) {
    const pub = new PubSocket({ hwm: 1 << 20 });
    endpoints.push(await pub.bind("tcp://127.0.0.1:0"));
    pubs.push(pub);
  }
  process.stdout.write(
    `${JSON.stringify({ endpoints, pairsPerWorker: [...fleet.pairsPerWorker], pairs: fleet.pairs })}\n`,
  );

  for (const pub of pubs) while (pub.subscribedPeers === 0) await Bun.sleep(10);
  const seqFrame = new Uint8Array(8);
  const seqView = new DataView(seqFrame.buffer);
  let batches = 0;
  // Round-robin over the workers, a batch each, so every source ingests at once.
  const streams = pubs.map((_, w) => workerEvents(fleet, w));
  const seqs = new Array<number>(workers!).fill(0);
  let open = workers!;
  while (open > 0) {
    open = 0;
    for (let w = 0; w < workers!; w++) {
      const events: KvEvent[] = [];
      for (let i = 0; i < EVENTS_PER_BATCH; i++) {
        const next = streams[w]!.next();
        if (next.done) break;
        events.push(next.value);
      }
      if (events.length === 0) continue;
      open++;
      seqView.setUint32(4, seqs[w]!++);
      if (
        !pubs[w]!.send([
          EMPTY,
          seqFrame,
          encodeKvBatch({ ts: Date.now() / 1000, events }, { form: "array" }),
        ])
      ) {
        throw new Error(`worker ${w} dropped a batch at the high-water mark`);
      }
      batches++;
    }
    await Promise.all(pubs.map((pub) => pub.flushed()));
  }
  process.stdout.write(`${JSON.stringify({ published: batches })}\n`);
  for await (const _ of process.stdin) {
    // Runs until the orchestrator closes stdin.
  }
  await Promise.all(pubs.map((pub) => pub.close()));
}

await main();
