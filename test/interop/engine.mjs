// An engine's KV-event publisher on real libzmq (the `zeromq` addon, run with `node`):
// a PUB socket that sends [topic, seq (u64 BE), payload] and a ROUTER that answers
// vLLM's replay protocol from a ring of what was published, as `ZmqEventPublisher`
// does (vLLM vllm/distributed/kv_events.py, SGLang disaggregation/kv_events.py).
// One JSON argument configures it:
//   { pub: endpoint, router?: endpoint | null, topic?: "", replayTopic?: boolean }
// replayTopic: replies carry the topic frame ([identity, "", topic, seq, payload]; vLLM
// from #45177) or not ([identity, "", seq, payload]; earlier vLLM, SGLang).
// It prints `ready <pub endpoint> <router endpoint or ->`, then `replay <start>` for each
// replay request served, and `done <op>` after each command. Commands on stdin, one
// JSON object per line:
//   { op: "publish", seq, payload: base64, lose?: true }   lose: into the ring only,
//                                                         as when the PUB drops it
//                                                         (the same seq again: resent
//                                                         live, kept once in the ring)
//   { op: "exit" }
import { createInterface } from "node:readline";
import * as zmq from "zeromq";

const config = JSON.parse(process.argv[2]);
const topic = Buffer.from(config.topic ?? "");
const pub = new zmq.Publisher({ linger: 0 });
const router = config.router ? new zmq.Router({ linger: 0 }) : null;
/** Published batches, in seq order: the replay ring. */
const ring = [];
const out = (line) => process.stdout.write(`${line}\n`);

function seqBytes(seq) {
  const bytes = Buffer.alloc(8);
  bytes.writeBigInt64BE(BigInt(seq));
  return bytes;
}

async function serveReplay() {
  for await (const [identity, empty, start] of router) {
    const from = Number(start.readBigUInt64BE());
    out(`replay ${from}`);
    const head = config.replayTopic ? [identity, empty, topic] : [identity, empty];
    for (const { seq, payload } of ring)
      if (seq >= from) await router.send([...head, seqBytes(seq), payload]);
    await router.send([...head, seqBytes(-1), Buffer.alloc(0)]);
  }
}

async function main() {
  await pub.bind(config.pub);
  if (router !== null) {
    await router.bind(config.router);
    void serveReplay();
  }
  out(`ready ${pub.lastEndpoint} ${router === null ? "-" : router.lastEndpoint}`);
  for await (const line of createInterface({ input: process.stdin })) {
    if (line.trim() === "") continue;
    const command = JSON.parse(line);
    if (command.op === "exit") break;
    if (command.op === "publish") {
      const payload = Buffer.from(command.payload, "base64");
      // A batch sent again under its seq (a test priming the subscription) is kept once.
      if (ring.length === 0 || ring[ring.length - 1].seq < command.seq)
        ring.push({ seq: command.seq, payload });
      if (command.lose !== true) await pub.send([topic, seqBytes(command.seq), payload]);
    }
    out(`done ${command.op}`);
  }
  pub.close();
  router?.close();
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
