// The google.rpc.RetryInfo and ErrorInfo details of a status, read without the googleapis
// protos (coordd's generated code has none). Internal to the package: the
// client's retries and the MCP server's advice both read it.

import type { ConnectError } from "@connectrpc/connect";
import { BinaryReader } from "@bufbuild/protobuf/wire";

/**
 * retryDelayMs is the retry_delay of err's google.rpc.RetryInfo detail, in
 * milliseconds (coordd sends one with RESOURCE_EXHAUSTED and UNAVAILABLE
 * when it knows when asking again is worth it: its breaker turns half-open
 * then, or its rate limit has a slot), or undefined without one, or for one
 * that does not decode.
 */
export function retryDelayMs(err: ConnectError): number | undefined {
  for (const d of err.details) {
    if (!("type" in d) || d.type !== "google.rpc.RetryInfo") continue;
    try {
      // RetryInfo { google.protobuf.Duration retry_delay = 1; }
      // Duration { int64 seconds = 1; int32 nanos = 2; }
      const r = new BinaryReader(d.value);
      let seconds = 0;
      let nanos = 0;
      while (r.pos < r.len) {
        const [field, wire] = r.tag();
        if (field !== 1 || wire !== 2) {
          r.skip(wire);
          continue;
        }
        const dr = new BinaryReader(r.bytes());
        while (dr.pos < dr.len) {
          const [f, w] = dr.tag();
          if (f === 1) seconds = Number(dr.int64());
          else if (f === 2) nanos = dr.int32();
          else dr.skip(w);
        }
      }
      return Math.max(0, seconds * 1000 + nanos / 1e6);
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/** DOMAIN is the domain of coordd's google.rpc.ErrorInfo details. */
export const DOMAIN = "coordd";

/**
 * errorReason is the reason of err's google.rpc.ErrorInfo detail of domain
 * coordd (OUTSIDE_UPSTREAMS, RATE_LIMITED, BREAKER_OPEN, …: docs/api.md),
 * or undefined without one. Clients act on it, never on the message.
 */
export function errorReason(err: ConnectError): string | undefined {
  for (const d of err.details) {
    if (!("type" in d) || d.type !== "google.rpc.ErrorInfo") continue;
    try {
      // ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
      const r = new BinaryReader(d.value);
      let reason = "";
      let domain = "";
      while (r.pos < r.len) {
        const [field, wire] = r.tag();
        if (field === 1 && wire === 2) reason = r.string();
        else if (field === 2 && wire === 2) domain = r.string();
        else r.skip(wire);
      }
      if (domain === DOMAIN && reason !== "") return reason;
    } catch {
      // a detail that does not decode tells nothing
    }
  }
  return undefined;
}
