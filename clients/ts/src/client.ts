// Client for coordd.v1.CoordinatorService over gRPC (HTTP/2, Connect's
// gRPC transport): get(), which reassembles a GetOrFetch stream into one
// document, and stream(), which hands its body over as it arrives (the
// fetch drop-in, fetch.ts, is built on it). It follows the Go client
// (clients/go) where it can: the same retryable codes, backoff, RetryInfo
// delays and default deadline, without its circuit breaker and retry
// throttling. The three clients play
// one conformance corpus (testdata/client-conformance).

import { setTimeout as delay } from "node:timers/promises";

import { Code, ConnectError, createClient, type CallOptions, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { CoordinatorService, Priority, type GetOrFetchResponse, type Metadata, type Progress } from "./gen/coordd/v1/coordd_pb.js";
import { create } from "@bufbuild/protobuf";
import { DurationSchema, type Duration } from "@bufbuild/protobuf/wkt";

import { BodyTooLargeError, UnreachableError } from "./errors.js";
import { retryDelayMs } from "./retryinfo.js";
import { activeTraceContext } from "./trace.js";

/** durationFromMs converts milliseconds to a google.protobuf.Duration. */
function durationFromMs(ms: number): Duration {
  const whole = Math.floor(ms / 1000);
  return create(DurationSchema, { seconds: BigInt(whole), nanos: Math.round((ms - whole * 1000) * 1e6) });
}

export { Code, ConnectError };
export * from "./gen/coordd/v1/coordd_pb.js";
export { BodyTooLargeError, UnreachableError } from "./errors.js";

/** DEFAULT_ADDR is where coordd listens by default. */
export const DEFAULT_ADDR = "127.0.0.1:50051";

/** DEFAULT_TIMEOUT_MS is the deadline of a call, retries included. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/** MAX_RETRY_DELAY_MS caps the wait a RetryInfo from coordd can impose
 * before a retry. */
export const MAX_RETRY_DELAY_MS = 60_000;

/** Document is a document reassembled from a GetOrFetch stream. */
export interface Document {
  /** body is every chunk, concatenated. */
  readonly body: Uint8Array;
  /** metadata is the stream's one metadata event. statusCode is the
   * upstream's HTTP status: a 404 is a document, not an error. */
  readonly metadata: Metadata;
  /** progress holds the progress events of the attempt that produced the
   * document, in the order they arrived. */
  readonly progress: readonly Progress[];
  /** text decodes body as UTF-8. */
  text(): string;
}

/** RetryOptions say how a call is retried. Semantics of gRPC's retry design
 * (gRFC A6): an attempt failing with Unavailable or ResourceExhausted is
 * retried after a random wait in [0, min(baseDelayMs·2^(n-1), maxDelayMs))
 * (capped exponential backoff, full jitter), or after the delay coordd
 * asked for in a google.rpc.RetryInfo detail if that is longer (capped at
 * MAX_RETRY_DELAY_MS); any other code is final. A wait that would outlast
 * the call's deadline ends the call with the last error instead. */
export interface RetryOptions {
  /** attempts is the most attempts per call, the first included.
   * Default: 4. 1 turns retries off. */
  attempts?: number;
  /** baseDelayMs bounds the wait before the first retry. Default: 100. */
  baseDelayMs?: number;
  /** maxDelayMs caps the bound of any wait. Default: 2000. */
  maxDelayMs?: number;
  /** maxRetryInfoWaitMs is the longest RetryInfo delay a retry waits
   * for: an error asking for a longer one is final, for a caller that
   * would rather pass coordd's "not before" on (createFetch answers it as
   * a 503 with Retry-After) than wait. Default: no such limit. */
  maxRetryInfoWaitMs?: number;
}

/** TLSOptions configure TLS to coordd: PEM strings or bytes (a Buffer is
 * a Uint8Array). Typed as Uint8Array rather than Buffer so that the
 * package's types need no @types/node. */
export interface TLSOptions {
  /** ca replaces the system's roots: the CAs that sign coordd's
   * certificate. */
  ca?: string | Uint8Array;
  /** cert and key are a client certificate, for a coordd that requires
   * one (mutual TLS). */
  cert?: string | Uint8Array;
  key?: string | Uint8Array;
  /** servername is the name coordd's certificate must carry. Default: the
   * address's host. */
  servername?: string;
}

/** ClientOptions configure a CoorddClient. */
export interface ClientOptions {
  /** token is sent on every call as "authorization: Bearer <token>", for
   * a coordd that requires one (its tenants). Without TLS it crosses the
   * network in clear text. Default: none. */
  token?: string;
  /** tls dials coordd over TLS: true for the system's roots, or options
   * with a private CA and a client certificate. An addr of
   * https://host:port turns TLS on too. Default: plaintext. */
  tls?: boolean | TLSOptions;
  /** retry is the default for every call. */
  retry?: RetryOptions;
  /** timeoutMs is the default deadline of a call, every attempt and
   * backoff included. Default: DEFAULT_TIMEOUT_MS. 0: none. */
  timeoutMs?: number;
  /** maxBodyBytes makes get refuse a document whose body is larger, with
   * a BodyTooLargeError, before receiving any of it: for a caller that
   * cannot hold more in memory. Default: 0, no limit. */
  maxBodyBytes?: number;
}

/** CallPriority is a call's priority by name: see GetOptions.priority. */
export type CallPriority = "interactive" | "background";

// priorityOf is the wire value of a CallPriority; undefined: none
// (PRIORITY_UNSPECIFIED). Any other value (from JavaScript) throws a
// TypeError.
function priorityOf(p: CallPriority | undefined): Priority {
  switch (p) {
    case undefined:
      return Priority.UNSPECIFIED;
    case "interactive":
      return Priority.INTERACTIVE;
    case "background":
      return Priority.BACKGROUND;
  }
  throw new TypeError(`coordd: priority ${JSON.stringify(p)}: want "interactive" or "background"`);
}

/** GetOptions configure one get. */
export interface GetOptions {
  /** key is the cache key. Default: coordd uses the canonical url. */
  key?: string;
  /** noStale refuses stale copies. */
  noStale?: boolean;
  /** maxAgeMs refuses copies fetched longer ago than this many
   * milliseconds, fresh or stale: coordd fetches a newer one. */
  maxAgeMs?: number;
  /** priority is whether a caller is waiting on the call
   * (GetOrFetchRequest.priority): "interactive", or "background" for a
   * prefetch or a warm-up job, whose fetch takes the upstream's slots
   * after every fetch an interactive call of its tenant waits for.
   * Default: none sent, which coordd takes for "interactive". Any other
   * value rejects with a TypeError before any call. */
  priority?: CallPriority;
  /** signal cancels the call, backoff included; the call then rejects
   * with Canceled. */
  signal?: AbortSignal;
  /** timeoutMs overrides the client's deadline for this call. */
  timeoutMs?: number;
  /** headers are sent with each attempt as gRPC metadata. */
  headers?: CallOptions["headers"];
  /** requestHeaders are the caller's HTTP request headers for the
   * upstream (GetOrFetchRequest.headers): coordd forwards those the
   * upstream lists in forward_headers, which also tell cached variants
   * apart, and drops the rest, so a caller may pass all of its own. A
   * Headers object, a Map, or a record. */
  requestHeaders?: Iterable<readonly [string, string]> | Record<string, string>;
  /** credential is the caller's own credential for the upstream: the
   * whole value of its credential header, such as "Bearer ghp_...". Used
   * for this call's fetch and never stored; callers with the same one
   * share a fetch and a cached copy, callers with different ones never
   * see each other's. An upstream without caller_credentials: true
   * refuses it (PermissionDenied). */
  credential?: string;
  /** onProgress is called with each progress event as it arrives, also
   * for attempts that are later retried. */
  onProgress?: (p: Progress) => void;
  /** retry overrides the client's RetryOptions. */
  retry?: RetryOptions;
}

/** StreamOptions configure one stream. */
export interface StreamOptions extends GetOptions {
  /** head asks for the metadata only, as HTTP's HEAD: the document is
   * fetched and cached as for any call, and the stream has no body. */
  head?: boolean;
}

/**
 * DocumentStream is a GetOrFetch call whose metadata has arrived, its body
 * still coming. Read it to the end, or cancel it: until then the call
 * holds its HTTP/2 stream open (up to the call's deadline). It is not
 * safe for concurrent reads.
 */
export interface DocumentStream extends AsyncIterable<Uint8Array> {
  /** metadata is the stream's one metadata event. */
  readonly metadata: Metadata;
  /** progress holds the progress events that came before it. */
  readonly progress: readonly Progress[];
  /**
   * read returns the next piece of the body as it arrives, or undefined
   * after the last one. It rejects as get does: with Internal when the
   * stream breaks its order or the body differs from metadata.size (a
   * longer body as soon as its excess arrives, a shorter one at its end),
   * with an UnreachableError when the connection is lost, with Canceled
   * when the signal aborts or after cancel, and with coordd's code
   * otherwise; a stream is never retried once its metadata has arrived.
   */
  read(): Promise<Uint8Array | undefined>;
  /** cancel ends the call, so that coordd stops sending; a read then
   * rejects with Canceled. Idempotent; nothing after the last read. */
  cancel(): void;
}

/**
 * CoorddClient calls one coordd over a single HTTP/2 connection, made on
 * first use and shared by concurrent calls. It is safe to share; it does
 * not keep the process alive while idle. close() drops the connection.
 */
export class CoorddClient {
  /** rpc is the generated client, for calls that get() does not cover,
   * such as invalidate. It neither retries nor sets deadlines. */
  readonly rpc: Client<typeof CoordinatorService>;
  /** addr is the address given to the constructor. */
  readonly addr: string;
  private readonly session: Http2SessionManager;
  private readonly retry: RetryOptions;
  private readonly timeoutMs: number;
  private readonly maxBodyBytes: bigint; // 0n: no limit

  /** addr is host:port, or a base URL such as http://host:port. */
  constructor(addr: string = DEFAULT_ADDR, opts: ClientOptions = {}) {
    this.addr = addr;
    const scheme = opts.tls ? "https" : "http";
    const baseUrl = /^https?:\/\//.test(addr) ? addr : `${scheme}://${addr}`;
    const tls = typeof opts.tls === "object" ? opts.tls : {};
    this.session = new Http2SessionManager(baseUrl, undefined, {
      ...tls,
      ca: pem(tls.ca),
      cert: pem(tls.cert),
      key: pem(tls.key),
    });
    // Every call carries the caller's active OpenTelemetry span, when
    // @opentelemetry/api is installed and one is active, unless the call
    // names its own traceparent.
    const interceptors: Interceptor[] = [
      (next) => async (req) => {
        if (!req.header.has("traceparent")) {
          const tc = await activeTraceContext();
          if (tc) {
            req.header.set("traceparent", tc.traceparent);
            if (tc.tracestate) req.header.set("tracestate", tc.tracestate);
          }
        }
        return next(req);
      },
    ];
    if (opts.token) {
      const authorization = `Bearer ${opts.token}`;
      interceptors.push((next) => (req) => {
        req.header.set("authorization", authorization);
        return next(req);
      });
    }
    this.rpc = createClient(
      CoordinatorService,
      createGrpcTransport({ baseUrl, sessionManager: this.session, interceptors }),
    );
    this.retry = opts.retry ?? {};
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const max = opts.maxBodyBytes ?? 0;
    this.maxBodyBytes = Number.isFinite(max) && max > 0 ? BigInt(Math.floor(max)) : 0n;
  }

  /**
   * get returns the document at url, an absolute http(s) URL inside one of
   * coordd's upstreams. The stream carries zero or more progress events,
   * exactly one metadata event, then the body in chunks.
   *
   * It rejects with a ConnectError carrying coordd's code: InvalidArgument
   * (malformed url), Unauthenticated (no valid token, for a coordd that
   * requires one), PermissionDenied (outside every upstream, or one the
   * token's tenant is not granted), Unavailable
   * (upstream down, no stale copy), ResourceExhausted, FailedPrecondition,
   * DeadlineExceeded; with an UnreachableError (Unavailable) when no coordd
   * answered (the TLS handshake failing included); with Canceled when
   * signal aborts; with Internal when the
   * stream breaks its order or its body differs from the size its metadata
   * announced (a longer body fails as soon as its excess arrives; the body
   * is allocated once from that size); with a BodyTooLargeError
   * (FailedPrecondition) when the metadata announces more than
   * maxBodyBytes. Unavailable and ResourceExhausted are retried, no
   * sooner than a RetryInfo from coordd asks (see RetryOptions); an
   * attempt that fails part-way is discarded whole.
   */
  async get(url: string, opts: GetOptions = {}): Promise<Document> {
    return this.retrying(opts, async (deadline) => {
      const s = await this.open(url, opts, deadline);
      const body = new BodyBuilder(Number(s.metadata.size));
      for (let c = await s.read(); c !== undefined; c = await s.read()) body.append(c);
      const bytes = body.bytes();
      return { body: bytes, metadata: s.metadata, progress: s.progress, text: () => new TextDecoder().decode(bytes) };
    });
  }

  /**
   * stream is get that returns as soon as the metadata arrives, with the
   * body to read as it comes (see DocumentStream): for a caller that
   * passes the body on rather than holding it whole. Before the metadata,
   * it fails and retries as get does (signal, deadline, maxBodyBytes and
   * RetryOptions included); after it, nothing is retried. The call's
   * deadline (timeoutMs) covers reading the body too.
   */
  async stream(url: string, opts: StreamOptions = {}): Promise<DocumentStream> {
    return this.retrying(opts, (deadline) => this.open(url, opts, deadline));
  }

  // retrying runs attempt until it succeeds, or fails with a code that is
  // final, or retries are spent (see RetryOptions).
  private async retrying<T>(opts: GetOptions, attempt: (deadline: number) => Promise<T>): Promise<T> {
    priorityOf(opts.priority); // a priority it does not know throws before any call
    const r = { ...this.retry, ...opts.retry };
    const attempts = Math.max(1, r.attempts ?? 4);
    const base = r.baseDelayMs ?? 100;
    const cap = r.maxDelayMs ?? 2000;
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    for (let n = 1; ; n++) {
      try {
        return await attempt(deadline);
      } catch (err) {
        const ce = ConnectError.from(err);
        if (!retryable(ce.code) || n >= attempts || opts.signal?.aborted) throw ce;
        const asked = retryDelayMs(ce) ?? 0;
        if (r.maxRetryInfoWaitMs !== undefined && asked > r.maxRetryInfoWaitMs) throw ce;
        const backoff = Math.random() * Math.min(cap, base * 2 ** (n - 1));
        const wait = Math.max(backoff, Math.min(asked, MAX_RETRY_DELAY_MS));
        if (Date.now() + wait >= deadline) throw ce;
        await sleep(wait, opts.signal);
      }
    }
  }

  // open makes one attempt: it starts the call and reads it up to its
  // metadata.
  private async open(url: string, opts: StreamOptions, deadline: number): Promise<DocumentStream> {
    const progress: Progress[] = [];
    const timeoutMs = deadline === Infinity ? undefined : Math.max(1, deadline - Date.now());
    const call = new Call(this.addr, opts.signal);
    try {
      call.start(
        this.rpc.getOrFetch(
          {
            url,
            key: opts.key ?? "",
            noStale: opts.noStale ?? false,
            maxAge: opts.maxAgeMs === undefined ? undefined : durationFromMs(opts.maxAgeMs),
            headers: headerList(opts.requestHeaders),
            credential: opts.credential ?? "",
            head: opts.head ?? false,
            priority: priorityOf(opts.priority),
          },
          { signal: call.signal, timeoutMs, headers: opts.headers },
        ),
      );
      for (;;) {
        const next = await call.next();
        if (next.done) throw badStream("stream ended without metadata");
        const ev = next.value.event;
        switch (ev.case) {
          case "progress":
            progress.push(ev.value);
            opts.onProgress?.(ev.value);
            break;
          case "metadata": {
            const md = ev.value;
            if (md.size < 0n) throw badStream(`metadata says size ${md.size}`);
            if (!opts.head && this.maxBodyBytes > 0n && md.size > this.maxBodyBytes) {
              throw new BodyTooLargeError(md.size, Number(this.maxBodyBytes));
            }
            return new BodyStream(md, progress, opts.head ?? false, call);
          }
          case "chunk":
            throw badStream("chunk before metadata");
          default:
            // An event this client does not know, added to the protocol
            // after it: skipped, as the Go and Python clients do.
            break;
        }
      }
    } catch (err) {
      throw call.fail(err);
    }
  }

  /** close drops the connection; calls in flight fail. */
  close(): void {
    this.session.abort();
  }
}

// pem hands node:tls, whose types want a Buffer, a string or a view of the
// same bytes (no copy).
function pem(v: string | Uint8Array | undefined): string | Buffer | undefined {
  if (v === undefined || typeof v === "string" || Buffer.isBuffer(v)) return v;
  return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
}

function retryable(code: Code): boolean {
  return code === Code.Unavailable || code === Code.ResourceExhausted;
}

// Node's error codes for a peer that cannot be reached or went away.
const NETWORK_ERRORS = new Set([
  "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ETIMEDOUT",
  "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND", "EAI_AGAIN",
]);

// Node's error codes for a certificate it does not trust, besides those
// starting with ERR_TLS_ or ERR_SSL_.
const TLS_VERIFY_ERRORS = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "UNABLE_TO_GET_ISSUER_CERT", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN", "DEPTH_ZERO_SELF_SIGNED_CERT", "CERT_HAS_EXPIRED", "CERT_NOT_YET_VALID",
  "CERT_UNTRUSTED", "CERT_REJECTED", "HOSTNAME_MISMATCH",
]);

// lostConnection reports whether err is the transport failing rather than
// an answer from coordd. Connect maps a refused connection to Unavailable
// but a reset one to Aborted, a connection that dies mid-stream to
// Canceled, and a failed TLS handshake (an untrusted certificate, or a
// client certificate refused) to Internal, all of which grpc-go (and so
// the Go client) reports as Unavailable.
function lostConnection(err: ConnectError, signal?: AbortSignal): boolean {
  if (err instanceof UnreachableError) return false;
  for (let e: unknown = err.cause; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "string") continue;
    if (NETWORK_ERRORS.has(code) || TLS_VERIFY_ERRORS.has(code)) return true;
    if (code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_")) return true;
  }
  return err.code === Code.Canceled && !signal?.aborted;
}

// headerList turns request headers into the wire's Header list.
function headerList(h: GetOptions["requestHeaders"]): { name: string; value: string }[] {
  if (!h) return [];
  const pairs = Symbol.iterator in h ? (h as Iterable<readonly [string, string]>) : Object.entries(h);
  return Array.from(pairs, ([name, value]) => ({ name, value }));
}

/**
 * Call is one attempt's lifetime: its own AbortController, aborted when
 * the caller's signal aborts or the attempt ends, and its stream iterator.
 * Connect's stream iterator has no return(): an attempt given up early
 * would otherwise leave its HTTP/2 stream open, coordd still sending,
 * until the deadline. Nor does aborting release the call: Connect clears
 * its deadline timer (which keeps the process alive) only when the
 * iterator ends, so an attempt ended with no read pending reads the
 * aborted iterator to its end.
 */
class Call {
  private readonly ctl = new AbortController();
  private readonly onAbort: () => void;
  private ended = false;
  private it: AsyncIterator<GetOrFetchResponse> | undefined;
  private pending = false; // a next() is in progress
  private finished = false; // the iterator has ended or failed

  constructor(
    private readonly addr: string,
    private readonly caller: AbortSignal | undefined,
  ) {
    this.onAbort = () => this.ctl.abort(caller?.reason);
    caller?.addEventListener("abort", this.onAbort);
    if (caller?.aborted) this.onAbort();
  }

  /** signal is the attempt's, for Connect. */
  get signal(): AbortSignal {
    return this.ctl.signal;
  }

  /** start gives the call its stream. */
  start(stream: AsyncIterable<GetOrFetchResponse>): void {
    this.it = stream[Symbol.asyncIterator]();
  }

  /** next is the stream's next event; not to be called concurrently. */
  async next(): Promise<IteratorResult<GetOrFetchResponse>> {
    this.pending = true;
    try {
      const r = await this.it!.next();
      if (r.done) this.finished = true;
      return r;
    } catch (err) {
      this.finished = true;
      throw err;
    } finally {
      this.pending = false;
      if (this.ended) this.drain();
    }
  }

  /** end releases the attempt; idempotent. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.caller?.removeEventListener("abort", this.onAbort);
    this.ctl.abort();
    this.drain();
  }

  // drain reads an ended call's iterator to its end, which comes at once:
  // the call is aborted.
  private drain(): void {
    if (!this.it || this.pending || this.finished) return;
    const it = this.it;
    this.finished = true;
    void (async () => {
      try {
        while (!(await it.next()).done);
      } catch {
        // the abort's Canceled, expected
      }
    })();
  }

  /** fail ends the attempt and returns err as the caller sees it: a lost
   * connection is an UnreachableError, unless the attempt was ended on
   * purpose first (then the Canceled is the caller's). */
  fail(err: unknown): ConnectError {
    const cancelled = this.ended || (this.caller?.aborted ?? false);
    this.end();
    const ce = ConnectError.from(err);
    return !cancelled && lostConnection(ce, this.caller) ? new UnreachableError(this.addr, ce) : ce;
  }
}

/** BodyStream is a DocumentStream over an attempt's stream iterator. */
class BodyStream implements DocumentStream {
  private received = 0n;
  private done = false;
  private error: ConnectError | undefined;

  constructor(
    readonly metadata: Metadata,
    readonly progress: readonly Progress[],
    private readonly head: boolean,
    private readonly call: Call,
  ) {}

  async read(): Promise<Uint8Array | undefined> {
    if (this.error) throw this.error;
    if (this.done) return undefined;
    try {
      for (;;) {
        const next = await this.call.next();
        if (next.done) {
          if (!this.head && this.received !== this.metadata.size) {
            throw badStream(`body is ${this.received} bytes; metadata says ${this.metadata.size}`);
          }
          this.done = true;
          this.call.end();
          return undefined;
        }
        const ev = next.value.event;
        switch (ev.case) {
          case "progress":
            throw badStream("progress after metadata");
          case "metadata":
            throw badStream("second metadata");
          case "chunk": {
            const data = ev.value.data;
            if (this.head) throw badStream("a chunk in answer to head");
            if (BigInt(data.length) > this.metadata.size - this.received) {
              throw badStream(`body exceeds the ${this.metadata.size} bytes metadata says`);
            }
            this.received += BigInt(data.length);
            if (data.length > 0) return data;
            break;
          }
          default:
            break; // an event this client does not know: skipped
        }
      }
    } catch (err) {
      this.error = this.call.fail(err);
      throw this.error;
    }
  }

  cancel(): void {
    if (this.done || this.error) return;
    this.error = new ConnectError("coordd: stream cancelled", Code.Canceled);
    this.call.end();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    try {
      for (let c = await this.read(); c !== undefined; c = await this.read()) yield c;
    } finally {
      this.cancel(); // a loop left early ends the call; after the end, nothing
    }
  }
}

function badStream(msg: string): ConnectError {
  return new ConnectError(`coordd: malformed GetOrFetch stream: ${msg}`, Code.Internal);
}

/** MAX_PREALLOC bounds the body allocated up front from the size the
 * metadata announces, so that a size no body follows costs at most this
 * much; a larger body grows as its chunks arrive. */
const MAX_PREALLOC = 16 << 20;

/**
 * BodyBuilder reassembles a body of the size the metadata announced: each
 * chunk is copied, as it arrives, into one buffer allocated from that
 * size, so that the chunks' messages can be collected at once instead of
 * being held until the end and concatenated. A chunk that would take the
 * body past the size fails the stream at once. A body sent in one chunk
 * is that chunk's bytes, not a copy.
 */
class BodyBuilder {
  private buf: Uint8Array = new Uint8Array(0);
  private len = 0;

  constructor(private readonly size: number) {}

  append(data: Uint8Array): void {
    if (data.length > this.size - this.len) {
      throw badStream(`body exceeds the ${this.size} bytes metadata says`);
    }
    if (this.len === 0 && data.length === this.size) {
      this.buf = data;
      this.len = data.length;
      return;
    }
    if (this.len + data.length > this.buf.length) {
      // The first chunk allocates the announced size (up to MAX_PREALLOC);
      // only a larger body grows, doubling, never past that size.
      const want = Math.max(Math.min(this.size, MAX_PREALLOC), 2 * this.buf.length, this.len + data.length);
      const next = new Uint8Array(Math.min(want, this.size));
      next.set(this.buf.subarray(0, this.len));
      this.buf = next;
    }
    this.buf.set(data, this.len);
    this.len += data.length;
  }

  /** bytes returns the body received so far. */
  bytes(): Uint8Array {
    return this.len === this.buf.length ? this.buf : this.buf.subarray(0, this.len);
  }
}

async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  try {
    await delay(ms, undefined, { signal });
  } catch (err) {
    throw ConnectError.from(err); // an AbortError becomes Canceled
  }
}
