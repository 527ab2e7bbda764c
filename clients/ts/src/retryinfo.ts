// The google.rpc.RetryInfo detail of a status, read without the googleapis
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
