/**
 * ZeroMQ (ZMTP 3.1, interoperating with 3.0) over Bun TCP and Unix sockets, NULL
 * security. See README.md beside this file for the contract (lifetimes, bounds, counters).
 */
export { PubSocket } from "./pub";
export { SubSocket, type FramesListener, type MessageListener } from "./sub";
export { FrameList } from "./frames";
export { DealerSocket } from "./dealer";
export { RouterSocket, type RoutedMessageListener } from "./router";
export { ZmtpSocket, type PeerListener } from "./socket";
export type { PeerEvent, PeerInfo } from "./connection";
export type { ZmtpCounters } from "./counters";
export { ZmtpError, PROTOCOL_ERROR_KINDS, type ProtocolErrorKind } from "./errors";
export { EndpointError, parseEndpoint, type Endpoint } from "./endpoint";
export { DEFAULTS as ZMTP_DEFAULTS, type ZmtpOptions } from "./options";
