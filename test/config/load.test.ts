// Goal: configuration precedence (defaults < file < KVEDGE_* < flags), every refusal
// path (one line, naming the key and where the bad value came from), the example
// file, and the --print-config rendering loading back to the same configuration.
// Method: loadConfig with an in-memory file reader, explicit env objects, and flags
// parsed by the real CLI parser (src/cli/args) from the specs config exports.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { parseFlags } from "../../src/cli/args";
import {
  type Config,
  ConfigError,
  configFlagSpecs,
  flagHelp,
  type LoadedConfig,
  loadConfig,
  parseConfigText,
  renderConfig,
  SETTINGS,
  settingsTable,
} from "../../src/config";

const EXAMPLE = join(import.meta.dir, "..", "..", "examples", "kvedge.toml");

const DEFAULTS: Config = {
  server: {
    host: "127.0.0.1",
    port: 8080,
    admin_token: null,
    control_host: "127.0.0.1",
    control_port: 8081,
    body_limit_bytes: 8_388_608,
    buffer_budget_bytes: 1_073_741_824,
    log_level: "info",
    log_format: "auto",
    warmup_routes: 4096,
  },
  index: { block_size: 16, backend: "crtc", memory_budget_bytes: null, lora_adapters: [] },
  route: {
    policy: "ttft",
    prefill_tokens_per_sec: 15_000,
    step_base_ms: 5,
    kv_read_ms_per_million_tokens: 39,
    max_batched_tokens: 8192,
    recompute_weight: 12,
    calibrate: false,
    overlap_score_credit: 1,
    overlap_score_credit_decay: 0,
    prefill_load_scale: 1,
    decode_active_request_weight: 0,
    temperature: 0,
    degraded_overlap_weight: 0.5,
    lower_tiers: true,
    host_cache_hit_weight: 0.75,
    disk_cache_hit_weight: 0.25,
    host_reload_ms_per_million_tokens: 2_600,
    disk_reload_ms_per_million_tokens: 18_700,
    request_ttl_secs: 300,
    max_active_requests: 1_000_000,
    track_output_blocks: false,
    pending_credit: true,
    pending_recompute_weight: 2,
    predict_at: "prefill_done",
    predicted_capacity_blocks: null,
    predicted_ttl_secs: 120,
    predicted_correction: true,
    degraded_fallback: "predictions",
    admission: "off",
    admission_bound_ms: 200,
    admission_max_hold_ms: 10_000,
    admission_max_held: 4096,
    admission_prefill_weight: 4,
    pacing: "off",
    pacing_per_worker: 3,
    pacing_max_hold_ms: 2000,
  },
  ingest: {
    max_message_bytes: 16_777_216,
    heartbeat_interval_ms: 5000,
    heartbeat_timeout_ms: 15_000,
    frame_timeout_ms: 10_000,
    reconnect_min_ms: 100,
    reconnect_max_ms: 5000,
    replay_timeout_ms: 5000,
    replay_deadline_ms: 30_000,
    replay_buffer_bytes: 67_108_864,
    idle_probe_ms: 1000,
    allow_wildcard_endpoints: false,
  },
  proxy: {
    enabled: false,
    tokenizer: null,
    model: null,
    forward_token_ids: false,
    observed_hit_floor: 0.5,
    observed_window: 32,
    connect_timeout_ms: 5000,
    first_byte_timeout_ms: 600_000,
    idle_timeout_ms: 300_000,
    upstream_connections: 4096,
    upstream_queue_timeout_ms: 5000,
    max_prompt_tokens: 1_048_576,
    max_prompt_bytes: 8_388_608,
    tokenizer_threads: 1,
    warmup_streams: 1024,
  },
  state: { dir: null, snapshot_interval_secs: 60 },
  cluster: {
    nats_url: null,
    name: "kvedge",
    replica_id: null,
    lease_ms: 3000,
    join_timeout_ms: 2000,
    stagger_ms: 0,
    token: null,
    user: null,
    password: null,
    credentials_file: null,
    nkey_seed_file: null,
    tls_ca_file: null,
    tls_cert_file: null,
    tls_key_file: null,
  },
  runtime: { cpus: null, numa_node: null, index_threads: null, route_threads: null },
  workers: [],
};

interface Inputs {
  file?: string;
  env?: Record<string, string>;
  argv?: string[];
}

function load({ file, env = {}, argv = [] }: Inputs): LoadedConfig {
  const flags = parseFlags(argv, configFlagSpecs()).flags;
  const withFile = file === undefined ? env : { KVEDGE_CONFIG: "kvedge.toml", ...env };
  return loadConfig({
    flags,
    env: withFile,
    readFile: (path) => {
      if (path !== "kvedge.toml" || file === undefined)
        throw Object.assign(new Error("missing"), { code: "ENOENT" });
      return file;
    },
  });
}

/** The one-line error message loadConfig throws. */
function refusal(inputs: Inputs): string {
  try {
    load(inputs);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    expect(error.message).not.toContain("\n");
    return error.message;
  }
  throw new Error("expected a ConfigError");
}

describe("defaults and precedence", () => {
  test("no file, no environment, no flags: the documented defaults", () => {
    const loaded = load({});
    expect(loaded.config).toEqual(DEFAULTS);
    expect(loaded.file).toBeNull();
    expect(loaded.warnings).toEqual([]);
    expect(new Set(loaded.origins.values())).toEqual(new Set(["default"]));
  });

  test("file < environment < flags, and each value records its origin", () => {
    const file =
      '[server]\nport = 1000\nhost = "0.0.0.0"\nlog_level = "debug"\n[route]\ntemperature = 0.5\n';
    const loaded = load({
      file,
      env: { KVEDGE_PORT: "2000", KVEDGE_ROUTER_TEMPERATURE: "0.25", KVEDGE_BLOCK_SIZE: "64" },
      argv: ["--port", "3000", "--block-size=32"],
    });
    expect(loaded.config.server.port).toBe(3000);
    expect(loaded.config.server.host).toBe("0.0.0.0");
    expect(loaded.config.server.log_level).toBe("debug");
    expect(loaded.config.route.temperature).toBe(0.25);
    expect(loaded.config.index.block_size).toBe(32);
    expect(loaded.origins.get("server.port")).toBe("--port");
    expect(loaded.origins.get("server.host")).toBe("kvedge.toml");
    expect(loaded.origins.get("route.temperature")).toBe("KVEDGE_ROUTER_TEMPERATURE");
    expect(loaded.origins.get("server.body_limit_bytes")).toBe("default");
    expect(loaded.file).toBe("kvedge.toml");
  });

  test("--config wins over KVEDGE_CONFIG", () => {
    const loaded = loadConfig({
      flags: parseFlags(["--config", "b.toml"], configFlagSpecs()).flags,
      env: { KVEDGE_CONFIG: "a.toml" },
      readFile: (path) => (path === "b.toml" ? "[server]\nport = 7\n" : "[server]\nport = 6\n"),
    });
    expect(loaded.config.server.port).toBe(7);
  });

  test("empty environment values count as unset", () => {
    expect(load({ env: { KVEDGE_PORT: "", KVEDGE_ADMIN_TOKEN: "" } }).config.server).toMatchObject({
      port: 8080,
      admin_token: null,
    });
  });

  test("booleans: --flag / --no-flag, and true/false/1/0/yes/no/on/off in the environment", () => {
    expect(load({ argv: ["--track-output-blocks"] }).config.route.track_output_blocks).toBe(true);
    const file = "[route]\ntrack_output_blocks = true\n";
    expect(
      load({ file, argv: ["--no-track-output-blocks"] }).config.route.track_output_blocks,
    ).toBe(false);
    for (const [text, value] of [
      ["true", true],
      ["1", true],
      ["Yes", true],
      ["on", true],
      ["false", false],
      ["0", false],
      ["no", false],
      ["OFF", false],
    ] as const) {
      expect(
        load({ env: { KVEDGE_TRACK_OUTPUT_BLOCKS: text } }).config.route.track_output_blocks,
      ).toBe(value);
    }
    expect(refusal({ argv: ["--track-output-blocks", "--no-track-output-blocks"] })).toBe(
      "--track-output-blocks and --no-track-output-blocks contradict each other",
    );
  });

  test("every setting can be given by file, environment and flag", () => {
    const sample: Record<string, [toml: string, text: string]> = {
      "server.control_host": ['"10.0.0.2"', "10.0.0.2"],
      "server.control_port": ["9001", "9001"],
      "server.host": ['"::"', "::"],
      "server.port": ["9", "9"],
      "server.admin_token": ['"s3cret-token"', "s3cret-token"],
      "server.body_limit_bytes": ["4096", "4_096"],
      "server.log_level": ['"warn"', "warn"],
      "server.log_format": ['"json"', "json"],
      "server.warmup_routes": ["0", "0"],
      "server.buffer_budget_bytes": ["2097152", "2_097_152"],
      "index.block_size": ["128", "128"],
      "index.backend": ['"crtc"', "crtc"],
      "index.memory_budget_bytes": ["8388608", "8_388_608"],
      "index.lora_adapters": ['["sql-lora=3", "chat"]', "sql-lora=3, chat"],
      "ingest.frame_timeout_ms": ["2500", "2500"],
      "route.policy": ['"dynamo"', "dynamo"],
      "route.prefill_tokens_per_sec": ["20000", "2e4"],
      "route.step_base_ms": ["7.5", "7.5"],
      "route.kv_read_ms_per_million_tokens": ["80", "80"],
      "route.max_batched_tokens": ["2048", "2_048"],
      "route.recompute_weight": ["3", "3"],
      "route.calibrate": ["true", "true"],
      "route.overlap_score_credit": ["2", "2"],
      "route.overlap_score_credit_decay": ["0.5", ".5"],
      "route.prefill_load_scale": ["3.0", "3e0"],
      "route.decode_active_request_weight": ["1.5", "1.5"],
      "route.temperature": ["0.7", "0.7"],
      "route.degraded_overlap_weight": ["0.25", "0.25"],
      "route.lower_tiers": ["false", "false"],
      "route.host_cache_hit_weight": ["0.5", "0.5"],
      "route.disk_cache_hit_weight": ["0.1", "0.1"],
      "route.host_reload_ms_per_million_tokens": ["3000", "3000"],
      "route.disk_reload_ms_per_million_tokens": ["20000", "2e4"],
      "route.request_ttl_secs": ["60", "60"],
      "route.max_active_requests": ["5000", "5_000"],
      "route.track_output_blocks": ["true", "true"],
      "route.pending_credit": ["false", "false"],
      "route.pending_recompute_weight": ["1", "1"],
      "route.predict_at": ['"route"', "route"],
      "route.predicted_capacity_blocks": ["32768", "32_768"],
      "route.predicted_ttl_secs": ["30", "30"],
      "route.predicted_correction": ["false", "false"],
      "route.degraded_fallback": ['"discount"', "discount"],
      "route.admission": ['"hold"', "hold"],
      "route.admission_bound_ms": ["500", "500"],
      "route.admission_max_hold_ms": ["2500", "2500"],
      "route.admission_max_held": ["64", "64"],
      "route.admission_prefill_weight": ["0.5", "0.5"],
      "route.pacing": ['"on"', "on"],
      "route.pacing_per_worker": ["2", "2"],
      "route.pacing_max_hold_ms": ["500", "500"],
      "ingest.max_message_bytes": ["65536", "65536"],
      "ingest.heartbeat_interval_ms": ["1000", "1000"],
      "ingest.heartbeat_timeout_ms": ["30000", "30_000"],
      "ingest.reconnect_min_ms": ["50", "50"],
      "ingest.reconnect_max_ms": ["800", "800"],
      "ingest.replay_timeout_ms": ["250", "250"],
      "ingest.replay_deadline_ms": ["9000", "9_000"],
      "ingest.replay_buffer_bytes": ["1048576", "1048576"],
      "ingest.idle_probe_ms": ["0", "0"],
      "ingest.allow_wildcard_endpoints": ["true", "true"],
      "state.dir": ['"/var/lib/kvedge"', "/var/lib/kvedge"],
      "state.snapshot_interval_secs": ["5", "5"],
      "runtime.cpus": ['"2-3,0"', "0,2-3"],
      "runtime.numa_node": ["1", "1"],
      "runtime.index_threads": ["1", "1"],
      "runtime.route_threads": ["3", "3"],
      "proxy.enabled": ["true", "true"],
      "proxy.tokenizer": ['"/models/qwen3"', "/models/qwen3"],
      "proxy.model": ['"qwen3"', "qwen3"],
      "proxy.forward_token_ids": ["true", "true"],
      "proxy.observed_hit_floor": ["0.25", "0.25"],
      "proxy.observed_window": ["8", "8"],
      "proxy.connect_timeout_ms": ["250", "250"],
      "proxy.first_byte_timeout_ms": ["90000", "90_000"],
      "proxy.idle_timeout_ms": ["1500", "1500"],
      "proxy.upstream_connections": ["32", "32"],
      "proxy.upstream_queue_timeout_ms": ["700", "700"],
      "proxy.max_prompt_tokens": ["4096", "4096"],
      "proxy.max_prompt_bytes": ["65536", "65536"],
      "proxy.tokenizer_threads": ["2", "2"],
      "proxy.warmup_streams": ["256", "256"],
      "cluster.nats_url": [
        '"nats://127.0.0.1:4222,tls://[::1]:4223"',
        "nats://127.0.0.1:4222,tls://[::1]:4223",
      ],
      "cluster.name": ['"fleet-a.eu"', "fleet-a.eu"],
      "cluster.replica_id": ['"numa-0"', "numa-0"],
      "cluster.lease_ms": ["5000", "5000"],
      "cluster.join_timeout_ms": ["0", "0"],
      "cluster.stagger_ms": ["1.5", "1.5"],
      "cluster.token": ['"s3cret"', "s3cret"],
      "cluster.user": ['"kvedge"', "kvedge"],
      "cluster.password": ['"pa55"', "pa55"],
      "cluster.credentials_file": ['"/etc/kvedge/nats.creds"', "/etc/kvedge/nats.creds"],
      "cluster.nkey_seed_file": ['"/etc/kvedge/nkey.seed"', "/etc/kvedge/nkey.seed"],
      "cluster.tls_ca_file": ['"/etc/kvedge/ca.pem"', "/etc/kvedge/ca.pem"],
      "cluster.tls_cert_file": ['"/etc/kvedge/cert.pem"', "/etc/kvedge/cert.pem"],
      "cluster.tls_key_file": ['"/etc/kvedge/key.pem"', "/etc/kvedge/key.pem"],
    };
    expect(Object.keys(sample).sort()).toEqual(SETTINGS.map((s) => s.key).sort());
    const get = (config: Config, key: string) => {
      const [section, field] = key.split(".") as [keyof Config, string];
      return (config[section] as unknown as Record<string, unknown>)[field];
    };
    for (const s of SETTINGS) {
      const [toml, text] = sample[s.key]!;
      const [section, field] = s.key.split(".");
      const fromFile = get(load({ file: `[${section}]\n${field} = ${toml}\n` }).config, s.key);
      const fromEnv = get(
        load({ env: { [`KVEDGE_${s.flag.toUpperCase().replaceAll("-", "_")}`]: text } }).config,
        s.key,
      );
      // A boolean flag sets it, its --no- form clears it (the non-default either way).
      const flag = s.default === true ? `--no-${s.flag}` : `--${s.flag}`;
      const argv = typeof s.default === "boolean" ? [flag] : [`--${s.flag}`, text];
      const fromFlag = get(load({ argv }).config, s.key);
      if (s.key !== "index.backend") expect(fromFile).not.toEqual(s.default); // the only backend so far
      expect(fromEnv).toEqual(fromFile);
      expect(fromFlag).toEqual(fromFile);
    }
  });
});

describe("refusals name the key and the source, in one line", () => {
  test("the file: missing, unreadable syntax with line and column", () => {
    expect(refusal({ env: { KVEDGE_CONFIG: "kvedge.toml" } })).toBe(
      "config file kvedge.toml: cannot read it (no such file)",
    );
    expect(refusal({ file: "[server]\nport = 80\nhost = = 1\n" })).toMatch(
      /^config file kvedge\.toml: line 3, column 8: /,
    );
    expect(refusal({ file: "[server]\nport = 80\nport = 81\n" })).toMatch(
      /^config file kvedge\.toml: line 3, /,
    );
  });

  test("unknown keys and sections, with the closest valid key", () => {
    expect(refusal({ file: "[route]\ntemprature = 1.0\n" })).toBe(
      "config file kvedge.toml: unknown key route.temprature (did you mean route.temperature?)",
    );
    expect(refusal({ file: "[server]\nblock_size = 16\n" })).toBe(
      "config file kvedge.toml: unknown key server.block_size (did you mean index.block_size?)",
    );
    expect(refusal({ file: "[sever]\nport = 1\n" })).toBe(
      "config file kvedge.toml: unknown key sever (did you mean server?)",
    );
    expect(refusal({ file: "port = 1\n" })).toBe(
      "config file kvedge.toml: unknown key port (did you mean server.port?)",
    );
    expect(refusal({ file: '[server.tls]\ncert = "x"\n' })).toBe(
      "config file kvedge.toml: unknown key server.tls",
    );
    expect(refusal({ file: "[telemetry]\nx = 1\n" })).toBe(
      "config file kvedge.toml: unknown key telemetry",
    );
    expect(refusal({ file: "server = 5\n" })).toBe(
      "config file kvedge.toml: server must be a table ([server]), got an integer",
    );
  });

  test("wrong types and ranges in the file", () => {
    const cases: [string, string][] = [
      ['[server]\nport = "80"', "server.port must be an integer in [0, 65535], got a string"],
      ["[server]\nport = 70000", "server.port must be an integer in [0, 65535], got 70000"],
      ["[server]\nport = 80.5", "server.port must be an integer in [0, 65535], got 80.5"],
      [
        "[server]\nport = 9223372036854775807",
        "server.port must be an integer in [0, 65535], got 9223372036854775807",
      ],
      [
        '[server]\nhost = "http://x"',
        'server.host must be a host name or IP address, got "http://x"',
      ],
      [
        '[server]\nadmin_token = "a b"',
        'server.admin_token must be printable ASCII without spaces, got "a b"',
      ],
      [
        '[server]\nlog_level = "verbose"',
        'server.log_level must be one of debug|info|warn|error, got "verbose"',
      ],
      [
        '[route]\ntemperature = "hot"',
        "route.temperature must be a number in [0, 100], got a string",
      ],
      ["[route]\ntemperature = nan", "route.temperature must be a number in [0, 100], got NaN"],
      [
        "[route]\ndegraded_overlap_weight = 1.5",
        "route.degraded_overlap_weight must be a number in [0, 1], got 1.5",
      ],
      [
        "[route]\ntrack_output_blocks = 1",
        "route.track_output_blocks must be true or false, got an integer",
      ],
      [
        "[route]\nrequest_ttl_secs = 1979-05-27",
        "route.request_ttl_secs must be a number in [0.01, 604800], got a date/time",
      ],
      ['[runtime]\ncpus = "3-1"', 'runtime.cpus has a reversed range "3-1"'],
      ['[runtime]\ncpus = "0-9000"', "runtime.cpus names CPU 9000, above the maximum 8191"],
      ['[runtime]\ncpus = "0,x"', 'runtime.cpus must be a CPU list such as "0-3,8", got "0,x"'],
      ["[runtime]\ncpus = []", "runtime.cpus must list at least one CPU"],
      ["[runtime]\nnuma_node = -1", "runtime.numa_node must be an integer in [0, 1023], got -1"],
    ];
    for (const [file, message] of cases)
      expect(refusal({ file })).toBe(`config file kvedge.toml: ${message}`);
  });

  test("bad values from the environment and from flags", () => {
    expect(refusal({ env: { KVEDGE_PORT: "80a" } })).toBe(
      'KVEDGE_PORT (server.port) must be an integer in [0, 65535], got "80a"',
    );
    expect(refusal({ env: { KVEDGE_BLOCK_SIZE: "0" } })).toBe(
      'KVEDGE_BLOCK_SIZE (index.block_size) must be an integer in [1, 65536], got "0"',
    );
    expect(refusal({ argv: ["--router-temperature", "-1"] })).toBe(
      '--router-temperature (route.temperature) must be a number in [0, 100], got "-1"',
    );
    expect(refusal({ argv: ["--log-format", "xml"] })).toBe(
      '--log-format (server.log_format) must be one of auto|json|pretty, got "xml"',
    );
    expect(refusal({ env: { KVEDGE_TRACK_OUTPUT_BLOCKS: "maybe" } })).toBe(
      'KVEDGE_TRACK_OUTPUT_BLOCKS (route.track_output_blocks) must be true or false (or 1/0, yes/no, on/off), got "maybe"',
    );
  });

  test("settings that must agree with each other", () => {
    expect(refusal({ argv: ["--heartbeat-timeout-ms", "5000"] })).toBe(
      "ingest.heartbeat_timeout_ms (from --heartbeat-timeout-ms) = 5000 must exceed ingest.heartbeat_interval_ms (default) = 5000",
    );
    expect(
      load({ argv: ["--heartbeat-interval-ms", "0", "--heartbeat-timeout-ms", "10"] }).config.ingest
        .heartbeat_interval_ms,
    ).toBe(0);
    expect(refusal({ file: "[ingest]\nreconnect_min_ms = 6000\n" })).toBe(
      "ingest.reconnect_max_ms (default) = 5000 is below ingest.reconnect_min_ms (from kvedge.toml) = 6000",
    );
    expect(refusal({ argv: ["--index-threads", "1", "--index-backend", "positional"] })).toBe(
      "runtime.index_threads (from --index-threads) needs index.backend = crtc " +
        "(the index threads share), not index.backend (from --index-backend) = positional",
    );
    const env = { KVEDGE_ROUTE_THREADS: "2", KVEDGE_INDEX_BACKEND: "reference" };
    expect(refusal({ env })).toContain(
      "runtime.route_threads (from KVEDGE_ROUTE_THREADS) needs index.backend = crtc",
    );
    expect(refusal({ argv: ["--index-threads", "2"] })).toContain("runtime.index_threads");
    expect(refusal({ argv: ["--index-threads", "1", "--workers", "3=none"] })).toBe(
      "worker 3 has no endpoint (an approximate worker), which needs runtime.index_threads " +
        "(from --index-threads) = 0: predictions are written on the main thread",
    );
  });

  test("cluster settings: pairs, one way to authenticate, no credentials in the URL", () => {
    const url = ["--cluster-nats", "nats://127.0.0.1:4222"];
    expect(refusal({ argv: [...url, "--cluster-user", "u"] })).toBe(
      "cluster.user (from --cluster-user) needs cluster.password too",
    );
    expect(refusal({ argv: [...url, "--cluster-tls-key", "k.pem"] })).toBe(
      "cluster.tls_key_file (from --cluster-tls-key) needs cluster.tls_cert_file too",
    );
    expect(
      refusal({ argv: [...url, "--cluster-token", "t", "--cluster-credentials", "c"] }),
    ).toContain("set one of cluster.token");
    expect(refusal({ argv: ["--cluster-nats", "nats://user:pass@127.0.0.1:4222"] })).toContain(
      "without credentials",
    );
    expect(refusal({ argv: ["--cluster-name", "a.*"] })).toContain("cluster.name");
    expect(refusal({ argv: ["--cluster-replica-id", "a b"] })).toContain("cluster.replica_id");
    const alone = load({ argv: ["--cluster-token", "t"] });
    expect(alone.warnings).toEqual([
      "cluster.token is set but does nothing without cluster.nats_url",
    ]);
    expect(
      load({ argv: [...url, "--cluster-user", "u", "--cluster-password", "p"] }).warnings,
    ).toEqual([]);
  });

  test("unknown KVEDGE_* variables are warnings with a suggestion, not refusals", () => {
    const loaded = load({
      env: { KVEDGE_PROT: "1", KVEDGE_VERIFY: "1", KVEDGE_NATIVE: "0", OTHER: "x" },
    });
    expect(loaded.warnings).toEqual([
      "unknown environment variable KVEDGE_PROT ignored (did you mean KVEDGE_PORT?)",
    ]);
  });
});

describe("workers", () => {
  test("[[workers]] tables: defaults, u64 ids as strings or big integers", () => {
    const file =
      `[[workers]]\nworker_id = 7\nendpoint = "tcp://engine-1.local:5557"\n` +
      `[[workers]]\nworker_id = "18446744073709551615"\ndp_rank = 3\nendpoint = "ipc:///run/e.sock"\n` +
      `replay_endpoint = "tcp://[::1]:5558"\ntopic = "kv"\n` +
      `[[workers]]\nworker_id = 9007199254740993\nendpoint = "tcp://10.0.0.1:1"\n`;
    expect(load({ file }).config.workers).toEqual([
      {
        worker_id: 7n,
        dp_rank: 0,
        endpoint: "tcp://engine-1.local:5557",
        replay_endpoint: null,
        topic: "",
      },
      {
        worker_id: 2n ** 64n - 1n,
        dp_rank: 3,
        endpoint: "ipc:///run/e.sock",
        replay_endpoint: "tcp://[::1]:5558",
        topic: "kv",
      },
      {
        worker_id: 9007199254740993n,
        dp_rank: 0,
        endpoint: "tcp://10.0.0.1:1",
        replay_endpoint: null,
        topic: "",
      },
    ]);
  });

  test("[[workers]] refusals", () => {
    const entry = (body: string) =>
      `[[workers]]\nworker_id = 1\nendpoint = "tcp://a:1"\n[[workers]]\n${body}\n`;
    const cases: [string, string][] = [
      [
        entry('worker_id = 2\nendpont = "tcp://a:1"'),
        "[[workers]] entry 2: endpont is not a worker setting (did you mean endpoint?)",
      ],
      [entry('endpoint = "tcp://a:1"'), "[[workers]] entry 2: worker_id is required"],
      [
        entry("worker_id = 2\ncapacity_blocks = 0"),
        "[[workers]] entry 2: capacity_blocks must be an integer in [1, 1073741824], got 0",
      ],
      [
        entry('worker_id = -2\nendpoint = "tcp://a:1"'),
        "[[workers]] entry 2: worker_id must be a u64: a decimal string, or an integer below 2^53, got -2",
      ],
      [
        entry('worker_id = "0x10"\nendpoint = "tcp://a:1"'),
        '[[workers]] entry 2: worker_id must be a u64: a decimal string, or an integer below 2^53, got "0x10"',
      ],
      [
        entry('worker_id = "18446744073709551616"\nendpoint = "tcp://a:1"'),
        '[[workers]] entry 2: worker_id must be a u64: a decimal string, or an integer below 2^53, got "18446744073709551616"',
      ],
      [
        entry('worker_id = 2\ndp_rank = 1.5\nendpoint = "tcp://a:1"'),
        "[[workers]] entry 2: dp_rank must be an integer in [0, 4294967295], got 1.5",
      ],
      [
        entry('worker_id = 1\nendpoint = "tcp://b:2"'),
        "[[workers]] entry 2: repeats worker 1 dp_rank 0 (first in [[workers]] entry 1)",
      ],
      [
        entry('worker_id = 2\nendpoint = "http://a:1"'),
        `[[workers]] entry 2: endpoint has scheme 'http' in "http://a:1": only tcp://HOST:PORT and ipc:///PATH are valid`,
      ],
      [
        entry('worker_id = 2\nendpoint = "a:1"'),
        `[[workers]] entry 2: endpoint has no scheme in "a:1": only tcp://HOST:PORT and ipc:///PATH are valid`,
      ],
      [
        entry('worker_id = 2\nendpoint = "tcp://a"'),
        '[[workers]] entry 2: endpoint must be tcp://HOST:PORT, got "tcp://a"',
      ],
      [
        entry('worker_id = 2\nendpoint = "tcp://a:1"\nreplay_endpoint = "tcp://*:5558"'),
        '[[workers]] entry 2: replay_endpoint has a bad host "*" in "tcp://*:5558"',
      ],
      [
        entry('worker_id = 2\nendpoint = "tcp://*:0"'),
        '[[workers]] entry 2: endpoint has a bad port 0 in "tcp://*:0" (1-65535)',
      ],
      [
        entry('worker_id = 2\nendpoint = "tcp://a:70000"'),
        '[[workers]] entry 2: endpoint has a bad port 70000 in "tcp://a:70000" (1-65535)',
      ],
      [
        entry('worker_id = 2\nendpoint = "ipc://rel/path"'),
        '[[workers]] entry 2: endpoint must be ipc:///ABSOLUTE/PATH, got "ipc://rel/path"',
      ],
      [
        entry(`worker_id = 2\nendpoint = "ipc:///${"x".repeat(120)}"`),
        "[[workers]] entry 2: endpoint has a socket path longer than 107 bytes",
      ],
      [
        entry('worker_id = 2\nendpoint = "tcp://a:1"\nreplay_endpoint = 5'),
        "[[workers]] entry 2: replay_endpoint must be a string, got an integer",
      ],
      ["workers = 3\n", "workers: must be an array of tables ([[workers]]), got an integer"],
    ];
    for (const [file, message] of cases)
      expect(refusal({ file }).startsWith(`config file kvedge.toml: ${message}`)).toBe(true);
  });

  test("an engine endpoint tcp://*:PORT is accepted with ingest.allow_wildcard_endpoints (kvedge binds, the engine connects)", () => {
    const loaded = loadConfig({
      flags: new Map<string, string[] | true>([
        ["workers", ["9=tcp://*:5557"]],
        ["allow-wildcard-endpoints", true],
      ]),
      env: {},
    });
    expect(loaded.config.workers.map((w) => w.endpoint)).toEqual(["tcp://*:5557"]);
  });

  test("a wildcard worker endpoint is refused unless ingest.allow_wildcard_endpoints is set", () => {
    for (const [workers, field, shown] of [
      ["9=tcp://*:5557", "endpoint", "tcp://*:5557"],
      ["9=tcp://0.0.0.0:5557", "endpoint", "tcp://0.0.0.0:5557"],
      ["9=tcp://[::]:5557", "endpoint", "tcp://[::]:5557"],
      ["9:2=tcp://[0:0:0:0:0:0:0:0]:5557", "endpoint", "tcp://[0:0:0:0:0:0:0:0]:5557"],
      ["9=tcp://h:1;replay=tcp://0.0.0.0:5558", "replay_endpoint", "tcp://0.0.0.0:5558"],
    ] as const) {
      const message = refusal({ argv: ["--workers", workers] });
      expect(message).toStartWith(`worker 9 dp_rank ${workers.startsWith("9:2") ? 2 : 0}: `);
      expect(message).toContain(`${field} "${shown}" names a wildcard address`);
      expect(message).toContain("ingest.allow_wildcard_endpoints (default) is off");
    }
    // Names and addresses that are not wildcards pass.
    for (const endpoint of ["tcp://10.0.0.1:1", "tcp://[::1]:1", "tcp://h0:1", "ipc:///run/x"]) {
      expect(load({ argv: ["--workers", `1=${endpoint}`] }).config.workers).toHaveLength(1);
    }
  });

  test("with the proxy, the control listener may not share the proxy's port", () => {
    expect(refusal({ argv: ["--proxy", "--port", "9000", "--control-port", "9000"] })).toBe(
      "server.control_port (from --control-port) = 9000 is server.port (from --port): with proxy.enabled the control listener needs a port of its own",
    );
    expect(
      load({ argv: ["--proxy", "--port", "0", "--control-port", "0"] }).config.server,
    ).toMatchObject({ port: 0, control_port: 0 });
    expect(load({ argv: ["--port", "8081"] }).config.server.port).toBe(8081);
  });

  test("--workers compact form: ranks, replay and topic options, several flags", () => {
    const loaded = load({
      argv: [
        "--workers",
        "1=tcp://h:1;replay=tcp://h:2,2:3=ipc:///s;topic=kv",
        "--workers",
        "18446744073709551615=tcp://[::1]:9",
      ],
    });
    expect(loaded.config.workers).toEqual([
      { worker_id: 1n, dp_rank: 0, endpoint: "tcp://h:1", replay_endpoint: "tcp://h:2", topic: "" },
      { worker_id: 2n, dp_rank: 3, endpoint: "ipc:///s", replay_endpoint: null, topic: "kv" },
      {
        worker_id: 2n ** 64n - 1n,
        dp_rank: 0,
        endpoint: "tcp://[::1]:9",
        replay_endpoint: null,
        topic: "",
      },
    ]);
    expect(loaded.origins.get("workers")).toBe("--workers");
  });

  test("http_endpoint: the engine's OpenAI server, in tables and as ;http=; bad ones refused", () => {
    const file =
      '[[workers]]\nworker_id = 1\nendpoint = "tcp://h:1"\nhttp_endpoint = "http://h:8000/"\n';
    expect(load({ file }).config.workers[0]!.http_endpoint).toBe("http://h:8000");
    expect(
      load({ argv: ["--workers", "2=tcp://h:1;http=http://[::1]:8001"] }).config.workers[0]!
        .http_endpoint,
    ).toBe("http://[::1]:8001");
    expect(refusal({ argv: ["--workers", "2=tcp://h:1;http=ftp://h:1"] })).toContain(
      "http_endpoint must be http:// or https://",
    );
    expect(refusal({ argv: ["--workers", "2=tcp://h:1;http=http://h:1/v1"] })).toContain(
      "http_endpoint must be a base URL without path",
    );
    expect(refusal({ argv: ["--workers", "2=tcp://h:1;http=h"] })).toContain(
      "http_endpoint must be http://HOST:PORT",
    );
  });

  test("a list from a higher source replaces the lower one", () => {
    const file = '[[workers]]\nworker_id = 1\nendpoint = "tcp://file:1"\n';
    expect(load({ file }).config.workers.map((w) => w.endpoint)).toEqual(["tcp://file:1"]);
    const env = { KVEDGE_WORKERS: "2=tcp://env:1" };
    expect(load({ file, env }).config.workers.map((w) => w.endpoint)).toEqual(["tcp://env:1"]);
    expect(
      load({ file, env, argv: ["--workers", "3=tcp://flag:1"] }).config.workers.map(
        (w) => w.endpoint,
      ),
    ).toEqual(["tcp://flag:1"]);
  });

  test("--workers / KVEDGE_WORKERS refusals", () => {
    expect(refusal({ argv: ["--workers", "1=tcp://a:1,1=tcp://b:2"] })).toBe(
      "--workers entry 2: repeats worker 1 dp_rank 0 (first in --workers entry 1)",
    );
    expect(refusal({ argv: ["--workers", "1:0=tcp://a:1,1:1=tcp://b:2,1=tcp://c:3"] })).toContain(
      "repeats worker 1 dp_rank 0",
    );
    expect(refusal({ argv: ["--workers", "tcp://a:1"] })).toBe(
      '--workers entry 1 ("tcp://a:1"): must be ID[:DP]=ENDPOINT|none[;replay=ENDPOINT][;topic=TOPIC][;http=URL][;capacity=BLOCKS]',
    );
    expect(refusal({ argv: ["--workers", "x=tcp://a:1"] })).toBe(
      '--workers entry 1 ("x=tcp://a:1"): worker_id must be a u64: a decimal string, or an integer below 2^53, got "x"',
    );
    expect(refusal({ argv: ["--workers", "1:a=tcp://a:1"] })).toContain(
      "dp_rank must be an integer in [0, 4294967295], got a string",
    );
    expect(refusal({ argv: ["--workers", "1:2:3=tcp://a:1"] })).toContain(
      "has more than one ':' before '='",
    );
    expect(refusal({ argv: ["--workers", "1=tcp://a:1;reply=tcp://a:2"] })).toContain(
      'has an unknown option "reply" (valid: replay=, topic=, http=, capacity=)',
    );
    expect(refusal({ argv: ["--workers", "1=none;capacity=-4"] })).toContain(
      "capacity_blocks must be an integer in [1, 1073741824], got a string",
    );
    expect(refusal({ argv: ["--workers", "1=tcp://a:1;replay=udp://a:2"] })).toContain(
      "replay_endpoint has scheme 'udp'",
    );
    expect(refusal({ env: { KVEDGE_WORKERS: "1=zmq://a:1" } })).toBe(
      `KVEDGE_WORKERS entry 1 ("1=zmq://a:1"): endpoint has scheme 'zmq' in "zmq://a:1": only tcp://HOST:PORT and ipc:///PATH are valid`,
    );
  });

  test("approximate workers: no endpoint in a table, `none` in the compact form, a capacity", () => {
    const file = `[[workers]]\nworker_id = 4\nhttp_endpoint = "http://127.0.0.1:8004"\ncapacity_blocks = 32768\n`;
    expect(load({ file }).config.workers).toEqual([
      {
        worker_id: 4n,
        dp_rank: 0,
        endpoint: null,
        replay_endpoint: null,
        topic: "",
        http_endpoint: "http://127.0.0.1:8004",
        capacity_blocks: 32768,
      },
    ]);
    const compact = load({ argv: ["--workers", "5:1=none;capacity=1024,6=tcp://127.0.0.1:5557"] })
      .config.workers;
    expect(compact.map((w) => [w.worker_id, w.dp_rank, w.endpoint, w.capacity_blocks])).toEqual([
      [5n, 1, null, 1024],
      [6n, 0, "tcp://127.0.0.1:5557", undefined],
    ]);
  });
});

describe("example file, rendering and docs", () => {
  test("examples/kvedge.toml loads; its values are the documented defaults", () => {
    const loaded = loadConfig({ env: {}, flags: new Map([["config", [EXAMPLE]]]) });
    expect({ ...loaded.config, workers: [] as Config["workers"] }).toEqual(DEFAULTS);
    expect(loaded.config.workers).toEqual([
      {
        worker_id: 1n,
        dp_rank: 0,
        endpoint: "tcp://127.0.0.1:5557",
        replay_endpoint: "tcp://127.0.0.1:5558",
        topic: "",
      },
      {
        worker_id: 18446744073709551557n,
        dp_rank: 1,
        endpoint: "ipc:///run/engine-2/kv-events.sock",
        replay_endpoint: null,
        topic: "",
      },
    ]);
  });

  test("the rendered configuration loads back to the same values; secrets are not printed", () => {
    const loaded = load({
      file: '[server]\nadmin_token = "top-secret"\n[[workers]]\nworker_id = "18446744073709551615"\ndp_rank = 2\nendpoint = "tcp://h:1"\ntopic = "t"\n',
      env: { KVEDGE_CPUS: "4-7,1", KVEDGE_DEGRADED_OVERLAP_WEIGHT: "0.125" },
      argv: ["--port", "0", "--track-output-blocks", "--numa-node", "1"],
    });
    const text = renderConfig(loaded);
    expect(text).not.toContain("top-secret");
    expect(text).toContain("# admin_token is set (not shown)\n");
    expect(text).toContain('cpus = "1,4-7"  # from KVEDGE_CPUS');
    expect(text).toContain("port = 0  # from --port");
    const again = loadConfig({
      env: {},
      flags: new Map([["config", ["printed.toml"]]]),
      readFile: () => text,
    });
    expect(again.config).toEqual({
      ...loaded.config,
      server: { ...loaded.config.server, admin_token: null },
    });
    const defaults = renderConfig(load({}));
    expect(parseConfigText(defaults, "defaults.toml").workers).toBeNull();
    expect(defaults).toContain("# numa_node is not set");
  });

  test("flag help lists every flag the specs accept, with its variable and default", () => {
    const help = flagHelp();
    const specs = configFlagSpecs();
    for (const name of Object.keys(specs)) {
      const shown = name.startsWith("no-")
        ? `--[no-]${name.slice(3)}`
        : specs[name]!.kind === "boolean"
          ? `--[no-]${name}`
          : `--${name} `;
      expect(help).toContain(shown);
    }
    expect(help).toContain("  --port N ");
    expect(help).toContain("[KVEDGE_PORT, default 8080]");
    expect(help).toContain("--log-format auto|json|pretty");
    expect(help).toContain("[KVEDGE_ADMIN_TOKEN]");
  });

  test("the settings table lists every key with its flag and environment variable", () => {
    const table = settingsTable();
    for (const s of SETTINGS) {
      const env = `KVEDGE_${s.flag.toUpperCase().replaceAll("-", "_")}`;
      expect(table).toContain(`| \`${s.key}\` | \`--${s.flag}\``);
      expect(table).toContain(`\`${env}\``);
    }
    expect(table).toContain("`KVEDGE_WORKERS`");
    expect(table.split("\n").filter((line) => line.startsWith("| `")).length).toBe(
      SETTINGS.length + 1,
    );
  });
});
