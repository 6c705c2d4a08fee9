/**
 * Parsing a route request body: JSON.parse + `tokenIds` (the array checked and copied
 * into a Uint32Array), against `parseRequestJson`, which reads token_ids straight into
 * a Uint32Array (its digits read in JavaScript, or natively). Bodies of 1,024 and 4,096 tokens in a 128k vocabulary, plus a few
 * other fields, as bench/http.ts sends them.
 *
 *   bun bench/request-json.bench.ts [--json]
 */
import { bench, do_not_optimize, group, run } from "mitata";
import { asObject, tokenIds } from "../src/http/http";
import { parseRequestJson } from "../src/http/request-json";
import { benchFlags, prng, provenance } from "./lib";

const json =
  benchFlags("bun bench/request-json.bench.ts [--json]", { json: { type: "boolean" } }).json ===
  true;
const random = prng(7);
const bodies = [1024, 4096].map((tokens) => ({
  tokens,
  text: JSON.stringify({
    candidates: 4,
    token_ids: Array.from({ length: tokens }, () => random() % 128_000),
    request_id: "req-1",
  }),
}));

for (const body of bodies) {
  const reference = tokenIds(asObject(JSON.parse(body.text)));
  for (const scanner of ["js", "native"] as const) {
    const ours = tokenIds(asObject(parseRequestJson(body.text, scanner)));
    if (reference.length !== ours.length || reference.some((token, i) => token !== ours[i]))
      throw new Error(`parsers disagree (${scanner})`);
  }
  group(`${body.tokens} tokens (${body.text.length} bytes)`, () => {
    bench(`JSON.parse + tokenIds ${body.tokens}`, () =>
      do_not_optimize(tokenIds(asObject(JSON.parse(body.text)))),
    );
    bench(`parseRequestJson js ${body.tokens}`, () =>
      do_not_optimize(tokenIds(asObject(parseRequestJson(body.text, "js")))),
    );
    bench(`parseRequestJson native ${body.tokens}`, () =>
      do_not_optimize(tokenIds(asObject(parseRequestJson(body.text, "native")))),
    );
  });
}

const result = await run({ format: json ? "quiet" : "mitata" });
if (json) {
  const rows = result.benchmarks
    .flatMap((trial) => trial.runs)
    .map((entry) => ({ name: entry.name, p50Ns: entry.stats!.p50, p99Ns: entry.stats!.p99 }));
  console.log(
    JSON.stringify({
      bench: "request-json",
      provenance: provenance(),
      bodies: bodies.map((b) => ({ tokens: b.tokens, bytes: b.text.length })),
      rows,
    }),
  );
}
