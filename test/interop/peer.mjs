// A real libzmq peer for interop tests, run with `node` (the zeromq addon does not load
// under Bun). One JSON argument configures it:
//   { role: "pub" | "sub" | "router" | "dealer", bind?: endpoint, connect?: endpoint,
//     options?: { <zeromq.js socket option>: value }, subscribe?: [prefix...],
//     replay?: { topic, count, withTopic } }   (router: answer vLLM replay requests)
// It prints one line per fact on stdout:
//   ready <endpoint>              after bind/connect
//   msg <frame> <frame> ...       a received message; each frame is `b64:<base64>` when
//                                 at most 1 KiB, else `big:<length>:<sha256 hex>`
//   event <type>                  a socket event (connect, accept, disconnect, ...)
// and takes JSON commands on stdin, one per line:
//   { op: "send", frames: [base64...] }
//   { op: "burst", count, topic, size, from? }  -> [topic, seq u64 BE, payload of size bytes]
//   { op: "subscribe" | "unsubscribe", prefix }   (sub)
//   { op: "exit" }
import { createHash } from "node:crypto";
import { createInterface } from "node:readline";
import * as zmq from "zeromq";

const config = JSON.parse(process.argv[2]);
const sockets = { pub: zmq.Publisher, sub: zmq.Subscriber, router: zmq.Router, dealer: zmq.Dealer };
const Socket = sockets[config.role];
if (Socket === undefined) throw new Error(`unknown role ${config.role}`);
const socket = new Socket({ linger: 0, ...(config.options ?? {}) });

const out = (line) => process.stdout.write(`${line}\n`);
const describe = (frame) =>
  frame.length <= 1024
    ? `b64:${Buffer.from(frame).toString("base64")}`
    : `big:${frame.length}:${createHash("sha256").update(frame).digest("hex")}`;

async function watchEvents() {
  for await (const event of socket.events) out(`event ${event.type}`);
}

function seqBytes(seq) {
  const bytes = Buffer.alloc(8);
  bytes.writeBigInt64BE(BigInt(seq));
  return bytes;
}

// vLLM's replay side channel: [identity, "", start_seq] -> one reply per buffered batch
// with seq >= start, then an end marker (seq -1, empty payload).
async function serveReplay(replay) {
  for await (const [identity, empty, start] of socket) {
    const from = Number(start.readBigUInt64BE());
    for (let seq = from; seq < replay.count; seq++) {
      const body = [seqBytes(seq), Buffer.from(`payload-${seq}`)];
      await socket.send(
        replay.withTopic
          ? [identity, empty, Buffer.from(replay.topic), ...body]
          : [identity, empty, ...body],
      );
    }
    const end = [seqBytes(-1), Buffer.alloc(0)];
    await socket.send(
      replay.withTopic
        ? [identity, empty, Buffer.from(replay.topic), ...end]
        : [identity, empty, ...end],
    );
  }
}

async function printMessages() {
  for await (const frames of socket) out(`msg ${frames.map(describe).join(" ")}`);
}

async function burst({ count, topic, size, from = 0 }) {
  const payload = Buffer.alloc(size, 0x61);
  const topicBytes = Buffer.from(topic);
  for (let i = 0; i < count; i++) await socket.send([topicBytes, seqBytes(from + i), payload]);
}

async function main() {
  void watchEvents();
  if (config.role === "sub")
    for (const prefix of config.subscribe ?? [""]) socket.subscribe(prefix);
  if (config.bind !== undefined) {
    await socket.bind(config.bind);
    out(`ready ${socket.lastEndpoint}`);
  } else {
    socket.connect(config.connect);
    out(`ready ${config.connect}`);
  }
  if (config.role === "router" && config.replay !== undefined) void serveReplay(config.replay);
  else if (config.role !== "pub") void printMessages();

  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line.trim() === "") continue;
    const command = JSON.parse(line);
    if (command.op === "send")
      await socket.send(command.frames.map((frame) => Buffer.from(frame, "base64")));
    else if (command.op === "burst") await burst(command);
    else if (command.op === "subscribe") socket.subscribe(command.prefix);
    else if (command.op === "unsubscribe") socket.unsubscribe(command.prefix);
    else if (command.op === "exit") break;
    out(`done ${command.op}`);
  }
  socket.close();
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
