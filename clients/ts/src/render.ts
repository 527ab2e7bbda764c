// coordd's one rendering of an answer as HTTP (docs/api.md, "One
// rendering"), as coordd's HTTP door and the Go and Python drop-ins give
// it: a document's status and X-Coordd-* fields, an error's status,
// Retry-After, X-Coordd-Error and JSON body. Internal to the package:
// fetch.ts uses it, and its tests run it on testdata/http-rendering.

import { Code, type ConnectError } from "@connectrpc/connect";
import { Source, type Metadata } from "./gen/coordd/v1/coordd_pb.js";
import { errorReason, retryDelayMs } from "./retryinfo.js";

/** The reasons of coordd's ErrorInfo for a request a drop-in does not carry. */
const NOT_CARRIED = new Set(["OUTSIDE_UPSTREAMS", "CALLER_CREDENTIALS_REFUSED"]);

/** OWNED are the fields coordd sets on a document's answer, never the upstream's. */
const OWNED = new Set([
  "content-type", "etag", "last-modified", "cache-control", "age", "content-length",
  "x-coordd-source", "x-coordd-stale", "x-coordd-age", "x-coordd-key", "x-coordd-upstream", "x-coordd-error",
]);

/** A rendered answer: its status and header fields, in order. */
export interface Rendered {
  status: number;
  headers: [string, string][];
  body?: string;
}

/**
 * renderDocument is the status and header fields of a document's answer:
 * the upstream's fields but those coordd sets, then coordd's.
 */
export function renderDocument(md: Metadata): Rendered {
  const headers: [string, string][] = [];
  for (const f of md.headers) {
    const name = f.name.toLowerCase();
    // The upstream's Cache-Control only from a coordd that renders none.
    if (!OWNED.has(name) || (name === "cache-control" && !md.cacheControl)) headers.push([f.name, f.value]);
  }
  if (md.contentType) headers.push(["content-type", md.contentType]);
  if (md.etag) headers.push(["etag", md.etag]);
  if (md.lastModified) headers.push(["last-modified", md.lastModified]);
  if (md.cacheControl) headers.push(["cache-control", md.cacheControl]);
  headers.push(["content-length", md.size.toString()]);
  const age = md.age && md.age.seconds > 0n ? md.age.seconds.toString() : "0"; // whole seconds, rounded down
  headers.push(["age", age], ["x-coordd-age", age]);
  const source = md.source === Source.UNSPECIFIED ? "" : (Source[md.source] ?? "").toLowerCase();
  if (source) headers.push(["x-coordd-source", source]);
  headers.push(["x-coordd-stale", String(md.stale)]);
  if (md.key) headers.push(["x-coordd-key", md.key]);
  if (md.upstream) headers.push(["x-coordd-upstream", md.upstream]);
  let status = md.statusCode;
  if (status < 200 || status > 599) status = 502; // coordd never delivers a 1xx
  return { status, headers };
}

/** answered reports whether a drop-in answers an error of code c as a response. */
export function answered(c: Code): boolean {
  return c === Code.Unavailable || c === Code.ResourceExhausted || c === Code.DeadlineExceeded;
}

/** notCarried reports whether coordd's refusal says a drop-in does not carry the request. */
export function notCarried(ce: ConnectError): boolean {
  const r = errorReason(ce);
  return r !== undefined && NOT_CARRIED.has(r);
}

/** httpStatus is the HTTP status for a gRPC code. */
export function httpStatus(c: Code): number {
  switch (c) {
    case Code.InvalidArgument: return 400;
    case Code.Unauthenticated: return 401;
    case Code.PermissionDenied: return 403;
    case Code.NotFound: return 404;
    case Code.FailedPrecondition: return 413;
    case Code.ResourceExhausted: return 429;
    case Code.Unavailable: return 503;
    case Code.DeadlineExceeded: return 504;
    case Code.Canceled: return 499;
    case Code.Unimplemented: return 405;
    default: return 500;
  }
}

/** renderError is the answer for a coordd error. */
export function renderError(ce: ConnectError): Rendered {
  const status = httpStatus(ce.code);
  const name = codeName(ce.code);
  const reason = errorReason(ce);
  const error: Record<string, unknown> = { code: status, status: name };
  if (reason !== undefined) error.reason = reason;
  error.message = ce.rawMessage;
  const headers: [string, string][] = [];
  if (status === 429 || status === 503) {
    // Whole seconds, rounded up: never sooner than coordd asked; 1 without a RetryInfo.
    const secs = Math.max(1, Math.ceil((retryDelayMs(ce) ?? 0) / 1000));
    error.retry_after_seconds = secs;
    headers.push(["retry-after", String(secs)]);
  }
  if (ce.code === Code.Unauthenticated) headers.push(["www-authenticate", 'Bearer realm="coordd"']);
  const body = `${JSON.stringify({ message: `coordd: ${name}: ${ce.rawMessage}`, error })}\n`;
  headers.push(
    ["content-type", "application/json"],
    ["content-length", String(new TextEncoder().encode(body).length)],
    ["x-coordd-error", headerValue(`${name}: ${ce.rawMessage}`)],
  );
  return { status, headers, body };
}

/** codeName is a gRPC code's name as in google.rpc.Code: RESOURCE_EXHAUSTED. */
export function codeName(c: Code): string {
  return (Code[c] ?? String(c)).replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

// headerValue is v fit for a header value: control characters replaced by
// spaces, at most 1024 bytes of UTF-8.
function headerValue(v: string): string {
  const s = v.replace(/[\u0000-\u001f\u007f]/g, " ");
  const b = new TextEncoder().encode(s);
  if (b.length <= 1024) return s;
  return new TextDecoder().decode(b.subarray(0, 1024)).replace(/\uFFFD+$/, "");
}
