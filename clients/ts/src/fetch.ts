// createFetch: the WHATWG fetch function over coordd, so that code written
// for fetch (an SDK, a server's own calls) gets through coordd with one
// line: globalThis.fetch = createFetch(client). It answers as Node's fetch
// does: the upstream's status, headers and body (a 404 is a response, not
// an error), a 503, 429 or 504 when coordd cannot answer (render.ts: the
// rendering coordd's HTTP door gives too), a TypeError("fetch failed")
// when coordd itself cannot be reached.

import { STATUS_CODES } from "node:http";

import { ConnectError } from "@connectrpc/connect";

import type { CallPriority, CoorddClient, DocumentStream, RetryOptions } from "./client.js";
import { UnreachableError } from "./errors.js";
import { answered, codeName, notCarried as isNotCarried, renderDocument, renderError } from "./render.js";

/** FetchFunction is fetch's signature: globalThis.fetch can be one. */
export type FetchFunction = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/** FetchOptions configure createFetch. */
export interface FetchOptions {
  /** fallback gets every request coordd cannot carry, with the caller's
   * own arguments: another method than GET or HEAD, a body, a URL that is
   * not http(s), or one outside every upstream coordd fronts (coordd's
   * PermissionDenied says so). Default: none, and those requests reject
   * with a NotCarriedError. To send them straight to the network, pass
   * fetch as it was before: globalThis.fetch = createFetch(client,
   * { fallback: globalThis.fetch }). */
  fallback?: FetchFunction;
  /** credentialHeader is the request header whose value is the caller's
   * own credential (GetOrFetchRequest.credential), sent to coordd apart
   * from the other headers: the upstream's credential header. Default:
   * "authorization". */
  credentialHeader?: string;
  /** timeoutMs is the deadline of each call, reading the body included.
   * Default: the client's (timeoutMs, DEFAULT_TIMEOUT_MS). */
  timeoutMs?: number;
  /** retry overrides the client's RetryOptions for these calls. Default:
   * the client's, with maxRetryInfoWaitMs 0: an error from coordd that
   * says when to ask again (a RetryInfo: its breaker open, its rate limit)
   * is answered at once, as a 503 or 429 whose Retry-After says it, for
   * the caller to decide; other Unavailable errors, and an unreachable
   * coordd, are retried as the client says before the 503 or the
   * TypeError. */
  retry?: RetryOptions;
  /** priority is that of the requests without an X-Coordd-Priority
   * header (PRIORITY_HEADER): "background" for a fetch that only a
   * prefetch or a warm-up job uses. Default: none sent, which coordd
   * takes for "interactive". */
  priority?: CallPriority;
}

/** PRIORITY_HEADER is the request header that sets one request's
 * priority through createFetch: "interactive" or "background" (in any
 * case), as GetOptions.priority. createFetch removes it: it goes neither
 * to coordd's headers nor to the fallback. Any other value rejects the
 * request with a TypeError. coordd's HTTP door reads the same header. */
export const PRIORITY_HEADER = "x-coordd-priority";

/** NotCarriedError rejects a request that coordd cannot carry when no
 * fallback was given. It is a TypeError, as fetch's own refusals are. */
export class NotCarriedError extends TypeError {
  /** method is the request's method. */
  readonly method: string;
  /** url is the request's origin and path (its query left out). */
  readonly url: string;

  constructor(method: string, url: string, why: string, cause?: unknown) {
    super(
      `coordd fetch: ${method} ${url}: ${why}; coordd carries GET and HEAD without a body, inside its upstreams ` +
        `(createFetch's fallback option sends the others elsewhere)`,
      cause === undefined ? undefined : { cause },
    );
    this.name = "NotCarriedError";
    this.method = method;
    this.url = url;
  }
}

/**
 * createFetch returns a fetch function that gets GET and HEAD requests
 * without a body through client, with coordd's GetOrFetch. Every request
 * header goes to coordd, which forwards those the upstream lists in
 * forward_headers and drops the rest; the credential header
 * (Authorization) goes as the call's credential. A HEAD asks for the
 * metadata only.
 *
 * The response has the upstream's status and headers (as coordd kept them:
 * no Set-Cookie, no hop-by-hop fields), Content-Type, ETag and
 * Last-Modified from the metadata, Content-Length (the body's size),
 * coordd's Cache-Control and Age, and coordd's own X-Coordd-Source (l1,
 * l2 or upstream), X-Coordd-Stale (true or false), X-Coordd-Age (whole
 * seconds), X-Coordd-Upstream and X-Coordd-Key: coordd's one rendering
 * (docs/api.md), as its HTTP door gives it. The promise
 * resolves when the metadata arrives; the body is a ReadableStream fed by
 * the chunks as they arrive, which fails with a TypeError("terminated")
 * if the call breaks part-way.
 *
 * When coordd cannot answer (Unavailable: the upstream down and no stale
 * copy, or its breaker open; ResourceExhausted: its rate limit; the
 * deadline passed) the response is a 503, 429 or 504 with Retry-After on a
 * 503 or 429 (whole seconds, rounded up, from coordd's RetryInfo; 1
 * without one), X-Coordd-Error
 * (the code and coordd's message) and a JSON body shaped as coordd's HTTP
 * door's errors. When no coordd answers (an UnreachableError) the promise
 * rejects with a TypeError("fetch failed") whose cause is that error, as
 * Node's fetch does on a network error. The client's retries come first
 * in both cases, but for an error with a RetryInfo (see
 * FetchOptions.retry). The signal aborts the call, before the
 * response (the promise rejects with its reason) or while the body is
 * read (the body fails with it); cancelling the body ends the call too.
 * Any other error from coordd rejects with a TypeError whose cause is the
 * ConnectError. redirect, cache, credentials, mode and keepalive are
 * ignored: coordd follows redirects within the upstream, and caches.
 */
export function createFetch(client: CoorddClient, options: FetchOptions = {}): FetchFunction {
  const credentialHeader = (options.credentialHeader ?? "authorization").toLowerCase();
  const retry: RetryOptions = { maxRetryInfoWaitMs: 0, ...options.retry };
  if (options.priority !== undefined) callPriority(options.priority, "createFetch's priority option");

  const notCarried = (input: string | URL | Request, init: RequestInit | undefined, method: string, url: string, why: string, cause?: unknown) => {
    if (options.fallback) return options.fallback(input, withoutPriority(input, init));
    throw new NotCarriedError(method, shown(url), why, cause);
  };

  return async function coorddFetch(input: string | URL | Request, init?: RequestInit): Promise<Response> {
    // The priority header is read, and refused if it is none of the
    // known values, before anything else.
    const asked = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined)).get(PRIORITY_HEADER);
    const priority = asked === null ? options.priority : callPriority(asked, `${PRIORITY_HEADER} header`);
    // Method and body are read before any Request is made from input: a
    // Request made from one with a body would take that body, and the
    // fallback would get it used.
    const asRequest = input instanceof Request ? input : undefined;
    const method = (init?.method ?? asRequest?.method ?? "GET").toUpperCase();
    const body = init?.body !== undefined ? init.body : asRequest?.body;
    if (method !== "GET" && method !== "HEAD") {
      return notCarried(input, init, method, String(asRequest?.url ?? input), `a ${method} is not carried`);
    }
    if (body !== null && body !== undefined) {
      return notCarried(input, init, method, String(asRequest?.url ?? input), `a ${method} with a body is not carried`);
    }
    const req = new Request(input, init); // throws fetch's TypeError on a malformed URL
    const u = new URL(req.url);
    u.hash = "";
    const url = u.href;
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      return notCarried(input, init, method, url, `a ${u.protocol} URL is not carried`);
    }
    const { signal } = req;
    if (signal.aborted) throw signal.reason;

    const requestHeaders: [string, string][] = [];
    let credential: string | undefined;
    for (const [name, value] of req.headers) {
      if (name === PRIORITY_HEADER) continue; // createFetch's own, read above
      if (name === credentialHeader) credential = fromByteString(value);
      else requestHeaders.push([name, fromByteString(value)]);
    }

    let s: DocumentStream;
    try {
      s = await client.stream(url, {
        requestHeaders,
        credential,
        head: method === "HEAD",
        priority,
        signal,
        timeoutMs: options.timeoutMs,
        retry,
      });
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      if (err instanceof UnreachableError) throw new TypeError("fetch failed", { cause: err });
      const ce = ConnectError.from(err);
      if (answered(ce.code)) return errorResponse(ce, url);
      if (isNotCarried(ce)) {
        // coordd's message, the cause, quotes the whole url.
        return notCarried(input, init, method, url, "coordd does not carry it", ce);
      }
      throw new TypeError(`fetch failed: coordd answered ${codeName(ce.code)}: ${ce.rawMessage}`, { cause: ce });
    }
    return respond(s, url, method, signal);
  };
}

// callPriority is v, a priority by name in any case, as a CallPriority;
// any other value throws a TypeError naming where it came from.
function callPriority(v: string, where: string): CallPriority {
  const p = String(v).trim().toLowerCase();
  if (p === "interactive" || p === "background") return p;
  throw new TypeError(`coordd fetch: ${where} ${JSON.stringify(String(v).slice(0, 64))}: want "interactive" or "background"`);
}

// withoutPriority is init for the fallback, without the priority header
// wherever the request's headers come from (init's, or else those of the
// Request input); init as it is when there is none.
function withoutPriority(input: string | URL | Request, init: RequestInit | undefined): RequestInit | undefined {
  const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined));
  if (!headers.has(PRIORITY_HEADER)) return init;
  headers.delete(PRIORITY_HEADER);
  return { ...init, headers };
}

// NULL_BODY_STATUSES have no body in a Response (fetch's null body
// statuses that a Response can have).
const NULL_BODY_STATUSES = new Set([204, 205, 304]);

// respond makes the Response of a stream whose metadata has arrived.
function respond(s: DocumentStream, url: string, method: string, signal: AbortSignal): Response {
  const r = renderDocument(s.metadata);
  const status = r.status;
  const headers = responseHeaders(r.headers);
  let body: ReadableStream<Uint8Array> | null = null;
  if (method === "HEAD" || NULL_BODY_STATUSES.has(status)) {
    s.cancel();
  } else {
    body = bodyStream(s, signal);
  }
  const res = new Response(body, { status, statusText: STATUS_CODES[status] ?? "", headers });
  // Node's fetch gives the URL fetched; a Response made here has "".
  Object.defineProperty(res, "url", { value: url, enumerable: true });
  return res;
}

// responseHeaders is fetch's Headers of rendered fields.
function responseHeaders(fields: [string, string][]): Headers {
  const h = new Headers();
  for (const [name, value] of fields) {
    try {
      h.append(name, toByteString(value));
    } catch {
      // A field fetch's Headers refuses; coordd sends none such (it drops
      // control characters), so only a newer coordd's oddity lands here.
    }
  }
  return h;
}

// bodyStream is the Response body: each read takes the stream's next
// chunk, so that a chunk is asked of coordd only when the reader wants one
// (and HTTP/2's flow control holds coordd back meanwhile).
function bodyStream(s: DocumentStream, signal: AbortSignal): ReadableStream<Uint8Array> {
  let onAbort: (() => void) | undefined;
  const release = () => {
    if (onAbort) signal.removeEventListener("abort", onAbort);
    onAbort = undefined;
  };
  return new ReadableStream<Uint8Array>({
    start(ctl) {
      // As Node's fetch: an abort fails the body at once, chunks queued
      // or not.
      onAbort = () => {
        release();
        ctl.error(signal.reason);
        s.cancel();
      };
      signal.addEventListener("abort", onAbort);
    },
    async pull(ctl) {
      try {
        const chunk = await s.read();
        if (chunk === undefined) {
          release();
          ctl.close();
        } else {
          ctl.enqueue(chunk);
        }
      } catch (err) {
        if (signal.aborted) return; // onAbort has failed the body
        release();
        ctl.error(new TypeError("terminated", { cause: err }));
      }
    },
    cancel() {
      release();
      s.cancel();
    },
  });
}

// errorResponse is the answer to a call coordd could not answer now:
// coordd's one rendering of its error (render.ts).
function errorResponse(ce: ConnectError, url: string): Response {
  const r = renderError(ce);
  const res = new Response(r.body, { status: r.status, statusText: STATUS_CODES[r.status] ?? "", headers: responseHeaders(r.headers) });
  Object.defineProperty(res, "url", { value: url, enumerable: true });
  return res;
}

// toByteString turns a header value from the wire (UTF-8, a proto string)
// into the ByteString fetch's Headers hold: its UTF-8 bytes, one character
// each, as Node's fetch reads the bytes of a header it receives.
function toByteString(v: string): string {
  return /^[\x00-\x7f]*$/.test(v) ? v : Buffer.from(v, "utf8").toString("latin1");
}

const strictUTF8 = new TextDecoder("utf-8", { fatal: true });

// fromByteString is toByteString's inverse, for request headers: a value
// whose characters are the bytes of UTF-8 text is that text; any other
// (such as "Zoë" set as it is) is taken as written.
function fromByteString(v: string): string {
  if (/^[\x00-\x7f]*$/.test(v)) return v;
  try {
    return strictUTF8.decode(Buffer.from(v, "latin1"));
  } catch {
    return v;
  }
}

// shown is url without its query, fragment or user info, for an error
// message: a query may hold a token.
function shown(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return "(malformed URL)";
  }
}
