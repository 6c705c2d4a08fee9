/**
 * ZMTP receive throughput: a publisher in its own process (our PubSocket under Bun, or
 * libzmq's PUB through the `zeromq` addon under node) streams into our SubSocket.
 *
 *   bun bench/zmtp.ts [--runs 3] [--quick] [--only <scenario substring>] [--json]
 *
 * Every run is a fresh receiver process that spawns a fresh publisher process. Timed
 * region: from the first message the SUB delivers to the last (publisher start-up and
 * connection set-up are outside it). Reported per scenario (median of the runs):
 * messages/s and payload MB/s (wall clock), and the receiver's CPU seconds per wall
 * second (user + system), since on a shared 2-core machine the wall numbers are noisy.
 * Also a decoder-only microbench (mitata): frames/s parsed from a pre-built 512 KiB chunk
 * (`--only decode` runs just that).
 */
import { join } from "node:path";
import { bench, do_not_optimize, run as mitata } from "mitata";
import { PubSocket, SubSocket } from "../src/wire/zmtp";
import { FrameDecoder, NEED_MORE } from "../src/wire/zmtp/decoder";
import { benchFlags, formatRate, killWithBench, median, provenance } from "./lib";

const ROOT = join(import.meta.dir, "..");
const TOPIC = new TextEncoder().encode("kv@bench"); // vLLM-shaped: [topic, seq u64 BE, payload]

interface Scenario {
  readonly name: string;
  readonly publisher: "ours" | "libzmq";
  readonly transport: "tcp" | "ipc";
  /** 1: [payload]; 3: [topic, seq, payload] */
  readonly frames: 1 | 3;
  readonly size: number;
  readonly count: number;
  /** How the SUB hands messages over: FrameList locations (onFrames) or views (onMessage). */
  readonly api: "frames" | "views";
}

interface RunResult {
  readonly messages: number;
  readonly seconds: number;
  readonly messagesPerSecond: number;
  readonly payloadMBps: number;
  readonly receiverCpu: number;
}

// `--role pub ENDPOINT COUNT SIZE FRAMES` and `--role recv --scenario JSON`: the
// publisher and receiver processes, started by the parent run.
const flags = benchFlags(
  "bun bench/zmtp.ts [--runs 3] [--quick] [--only <scenario substring>] [--json]",
  {
    runs: { type: "string" },
    quick: { type: "boolean" },
    only: { type: "string" },
    json: { type: "boolean" },
    role: { type: "string" },
    scenario: { type: "string" },
  },
  true,
);

// ---- publisher processes --------------------------------------------------------------

/** Our PUB: connect, wait for the subscription, then publish `count` messages. */
async function ourPublisher(
  endpoint: string,
  count: number,
  size: number,
  frames: number,
): Promise<void> {
  const pub = new PubSocket({ hwm: 1_000_000 });
  pub.connect(endpoint);
  const payload = new Uint8Array(size).fill(0x61);
  const seq = new Uint8Array(8);
  const seqView = new DataView(seq.buffer);
  const message = frames === 1 ? [payload] : [TOPIC, seq, payload];
  // The SUB subscribed to "" sends SUBSCRIBE right after the handshake: probe until a
  // probe is not unroutable, i.e. the subscription has arrived.
  for (;;) {
    const before = pub.counters.unroutable;
    pub.send([TOPIC]);
    if (pub.counters.unroutable === before) break;
    await Bun.sleep(5);
  }
  // Hand the kernel ~4 MB at a time, then wait until it took everything, so the queue
  // never reaches the HWM (no drops) and the receiver always has data waiting.
  const batch = Math.max(1, Math.floor(4_000_000 / (size + 32)));
  for (let sent = 0; sent < count; ) {
    const end = Math.min(count, sent + batch);
    for (; sent < end; sent++) {
      seqView.setUint32(4, sent);
      pub.send(message);
    }
    await pub.flushed();
  }
  if (pub.counters.hwmDrops !== 0)
    throw new Error(`publisher dropped ${pub.counters.hwmDrops} messages`);
  await Bun.sleep(200);
  await pub.close();
}

/**
 * libzmq's PUB under node: an XPUB, so it can wait for the subscription, with NODROP and
 * a finite HWM so that send() waits for room instead of dropping (or queueing gigabytes),
 * and linger -1 so closing waits until everything was delivered.
 */
const LIBZMQ_PUBLISHER = `
import * as zmq from "zeromq";
const [endpoint, count, size, frames] = process.argv.slice(1);
const pub = new zmq.XPublisher({ linger: -1, sendHighWaterMark: 10000, noDrop: true });
pub.connect(endpoint);
await pub.receive(); // the subscription
const topic = Buffer.from("kv@bench"), payload = Buffer.alloc(Number(size), 0x61), seq = Buffer.alloc(8);
for (let i = 0; i < Number(count); i++) {
  seq.writeUInt32BE(i, 4);
  for (;;) {
    try {
      await pub.send(frames === "1" ? payload : [topic, seq, payload]);
      break;
    } catch (error) {
      if (error.code !== "EAGAIN") throw error; // NODROP at the HWM: wait for room
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
  }
}
await new Promise((resolve) => setTimeout(resolve, 200));
pub.close();
`;

// ---- receiver process -----------------------------------------------------------------

async function receiver(scenario: Scenario): Promise<RunResult> {
  const sub = new SubSocket();
  sub.subscribe("");
  const endpoint = await sub.bind(
    scenario.transport === "tcp"
      ? "tcp://127.0.0.1:0"
      : `ipc:///tmp/kvedge-bench-${process.pid}.sock`,
  );
  let received = 0;
  let payloadBytes = 0;
  let started = 0;
  let cpuAtStart = process.cpuUsage();
  const done = new Promise<void>((resolve) => {
    const count = (frameCount: number, payloadSize: number): void => {
      // Probes are 1-frame "kv@bench" messages of our publisher; skip them.
      if (frameCount !== scenario.frames || payloadSize !== scenario.size) return;
      if (received === 0) {
        started = performance.now();
        cpuAtStart = process.cpuUsage();
      }
      received++;
      payloadBytes += payloadSize;
      if (received === scenario.count) resolve();
    };
    if (scenario.api === "frames")
      sub.onFrames = (frames) => count(frames.count, frames.size(frames.count - 1));
    else sub.onMessage = (frames) => count(frames.length, frames[frames.length - 1]!.length);
  });
  const args = [endpoint, String(scenario.count), String(scenario.size), String(scenario.frames)];
  const publisher =
    scenario.publisher === "ours"
      ? killWithBench(
          Bun.spawn([process.execPath, import.meta.path, "--role", "pub", ...args], {
            stdout: "inherit",
            stderr: "inherit",
          }),
        )
      : killWithBench(
          Bun.spawn(["node", "--input-type=module", "-e", LIBZMQ_PUBLISHER, ...args], {
            cwd: ROOT,
            stdout: "inherit",
            stderr: "inherit",
          }),
        );
  const failed = publisher.exited.then((code) => {
    if (code !== 0) throw new Error(`publisher exited with ${code}`);
    return new Promise<never>(() => {});
  });
  await Promise.race([done, failed]);
  const seconds = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpuAtStart);
  await publisher.exited;
  await sub.close();
  return {
    messages: received,
    seconds,
    messagesPerSecond: received / seconds,
    payloadMBps: payloadBytes / seconds / 1e6,
    receiverCpu: (cpu.user + cpu.system) / 1e6 / seconds,
  };
}

// ---- decoder-only microbench ----------------------------------------------------------

const DECODER_FRAME_BYTES = 100;

/** Registers the decoder bench; returns frames per 512 KiB chunk. */
function decoderBench(): number {
  const frame = new Uint8Array(2 + DECODER_FRAME_BYTES);
  frame[1] = DECODER_FRAME_BYTES;
  const chunk = new Uint8Array(Math.floor((512 * 1024) / frame.length) * frame.length);
  for (let at = 0; at < chunk.length; at += frame.length) chunk.set(frame, at);
  const greeting = new Uint8Array(64);
  greeting.set([0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1, 0x4e, 0x55, 0x4c, 0x4c]);
  const decoder = new FrameDecoder(16 << 20, 1024);
  decoder.feed(greeting);
  decoder.next();
  bench("decode 512 KiB chunk", () => {
    let sink = 0;
    decoder.feed(chunk);
    for (let kind = decoder.next(); kind !== NEED_MORE; kind = decoder.next())
      sink += decoder.frameEnd - decoder.frameStart;
    return do_not_optimize(sink);
  });
  return chunk.length / frame.length;
}

// ---- driver ---------------------------------------------------------------------------

const SCENARIOS: Scenario[] = [
  {
    name: "ours -> ours, tcp, 100 B x1",
    publisher: "ours",
    transport: "tcp",
    frames: 1,
    size: 100,
    count: 3_000_000,
    api: "frames",
  },
  {
    name: "ours -> ours, tcp, 100 B x1, views API",
    publisher: "ours",
    transport: "tcp",
    frames: 1,
    size: 100,
    count: 3_000_000,
    api: "views",
  },
  {
    name: "ours -> ours, tcp, vLLM 3 frames, 100 B payload",
    publisher: "ours",
    transport: "tcp",
    frames: 3,
    size: 100,
    count: 2_000_000,
    api: "frames",
  },
  {
    name: "ours -> ours, tcp, 64 KiB x1",
    publisher: "ours",
    transport: "tcp",
    frames: 1,
    size: 65_536,
    count: 40_000,
    api: "frames",
  },
  {
    name: "ours -> ours, ipc, 100 B x1",
    publisher: "ours",
    transport: "ipc",
    frames: 1,
    size: 100,
    count: 3_000_000,
    api: "frames",
  },
  {
    name: "ours -> ours, ipc, 64 KiB x1",
    publisher: "ours",
    transport: "ipc",
    frames: 1,
    size: 65_536,
    count: 40_000,
    api: "frames",
  },
  {
    name: "libzmq -> ours, tcp, 100 B x1",
    publisher: "libzmq",
    transport: "tcp",
    frames: 1,
    size: 100,
    count: 1_000_000,
    api: "frames",
  },
  {
    name: "libzmq -> ours, tcp, vLLM 3 frames, 100 B payload",
    publisher: "libzmq",
    transport: "tcp",
    frames: 3,
    size: 100,
    count: 1_000_000,
    api: "frames",
  },
  {
    name: "libzmq -> ours, tcp, 64 KiB x1",
    publisher: "libzmq",
    transport: "tcp",
    frames: 1,
    size: 65_536,
    count: 40_000,
    api: "frames",
  },
];

async function main(): Promise<void> {
  const role = flags.role;
  if (role === "pub") {
    const [endpoint, count, size, frames] = flags.positionals;
    await ourPublisher(endpoint!, Number(count), Number(size), Number(frames));
    return;
  }
  if (role === "recv") {
    const result = await receiver(JSON.parse(flags.scenario!) as Scenario);
    console.log(JSON.stringify(result));
    return;
  }
  const runs = Number(flags.runs ?? 3);
  const quick = flags.quick === true;
  const only = flags.only;
  const json = flags.json === true;
  const results: Record<string, unknown>[] = [];
  for (const base of SCENARIOS) {
    if (only !== undefined && !base.name.includes(only)) continue;
    const scenario = quick ? { ...base, count: Math.ceil(base.count / 10) } : base;
    const raw: RunResult[] = [];
    for (let i = 0; i < runs; i++) {
      const child = killWithBench(
        Bun.spawn(
          [
            process.execPath,
            import.meta.path,
            "--role",
            "recv",
            "--scenario",
            JSON.stringify(scenario),
          ],
          {
            stdout: "pipe",
            stderr: "inherit",
          },
        ),
      );
      const text = await new Response(child.stdout).text();
      const status = await child.exited;
      if (status !== 0) throw new Error(`${scenario.name}: receiver exited with ${status}`);
      raw.push(JSON.parse(text.trim().split("\n").at(-1)!) as RunResult);
    }
    const row = {
      scenario: scenario.name,
      messages: scenario.count,
      messagesPerSecond: Math.round(median(raw.map((r) => r.messagesPerSecond))),
      payloadMBps: Math.round(median(raw.map((r) => r.payloadMBps))),
      receiverCpu: Number(median(raw.map((r) => r.receiverCpu)).toFixed(2)),
      // Throughput per receiver CPU-second: what one core could take; steadier than wall.
      messagesPerCpuSecond: Math.round(median(raw.map((r) => r.messagesPerSecond / r.receiverCpu))),
      payloadMBPerCpuSecond: Math.round(median(raw.map((r) => r.payloadMBps / r.receiverCpu))),
      raw: raw.map((r) => ({
        mps: Math.round(r.messagesPerSecond),
        MBps: Math.round(r.payloadMBps),
        cpu: Number(r.receiverCpu.toFixed(2)),
      })),
    };
    results.push(row);
    if (!json) {
      console.log(
        `${row.scenario.padEnd(52)} ${formatRate(row.messagesPerSecond).padStart(10)} msgs ${String(row.payloadMBps).padStart(6)} MB/s` +
          ` | recv cpu ${row.receiverCpu} -> per cpu-s ${formatRate(row.messagesPerCpuSecond)} msgs ${row.payloadMBPerCpuSecond} MB` +
          ` | raw ${JSON.stringify(row.raw.map((r) => r.mps))}`,
      );
    }
  }
  let decoder: { framesPerSecond: number; frameBytes: number } | null = null;
  if (only === undefined || only === "decode") {
    const framesPerChunk = decoderBench();
    const result = await mitata({ format: json ? "quiet" : "mitata" });
    const stats = result.benchmarks
      .flatMap((trial) => trial.runs)
      .find((entry) => entry.name === "decode 512 KiB chunk")!.stats!;
    decoder = {
      framesPerSecond: Math.round(framesPerChunk / (stats.p50 / 1e9)),
      frameBytes: DECODER_FRAME_BYTES,
    };
    if (!json)
      console.log(
        `decoder only: ${formatRate(decoder.framesPerSecond)} frames of ${DECODER_FRAME_BYTES} B (p50)`,
      );
  }
  if (json)
    console.log(
      JSON.stringify(
        { bench: "zmtp", provenance: provenance(), runs, quick, results, decoder },
        null,
        2,
      ),
    );
}

await main();
