/**
 * What each listener serves. Without the proxy, kvedge has one listener and serves
 * everything on it: its clients are gateways the operator runs. With `serve --proxy`
 * the proxy's port is open to every client of the OpenAI API, so it serves only what
 * they need (the OpenAI endpoints and health); the control plane (the decision API,
 * the lifecycle calls, workers, dump, status and metrics) is served on the control
 * listener (`server.control_host`, loopback by default) and refused on the proxy's
 * port with 403. docs/operations.md ("Ports and who may call what") is the model.
 */
import { KvedgeError } from "../domain/errors";
import { CHAT_PATH, COMPLETIONS_PATH } from "../proxy/openai";

/** `all`: every endpoint (no proxy, or the control listener); `proxy`: the proxy's port. */
export type Surface = "all" | "proxy";

/** What the proxy's port serves. */
export const PROXY_PORT_PATHS: ReadonlySet<string> = new Set([
  COMPLETIONS_PATH,
  CHAT_PATH,
  "/v1/models",
  "/healthz",
  "/readyz",
]);

/** The control plane: every other endpoint (templates as in app.ts's table). */
export const CONTROL_PATHS: readonly string[] = [
  "/v1/route",
  "/v1/match",
  "/v1/ws",
  "/v1/requests/:id/prefill_done",
  "/v1/requests/:id/done",
  "/v1/workers",
  "/v1/workers/:id",
  "/v1/dump",
  "/v1/status",
  "/metrics",
  "/",
];

const CONTROL_PATTERNS = CONTROL_PATHS.map(
  (template) => new RegExp(`^${template.replace(/:[a-z]+/g, "[^/]+")}$`),
);

export function isControlPath(path: string): boolean {
  return CONTROL_PATTERNS.some((pattern) => pattern.test(path));
}

/** The 403 a control-plane path gets on the proxy's port. */
export function controlRefusal(): KvedgeError {
  return new KvedgeError(
    "forbidden",
    "this endpoint is not served on the proxy's port: the control plane is served on the " +
      "control listener (server.control_host:server.control_port)",
  );
}
