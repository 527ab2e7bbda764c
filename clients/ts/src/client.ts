// Client for coordd.v1.CoordinatorService over gRPC (HTTP/2, Connect's
// gRPC transport), and get(), which reassembles a GetOrFetch stream into
// one document. It follows the Go client (clients/go) where it can:
// the same retryable codes, backoff, RetryInfo delays and default deadline,
// without its circuit breaker and retry throttling. The three clients play
// one conformance corpus (testdata/client-conformance).

import { setTimeout as delay } from "node:timers/promises";

import { Code, ConnectError, createClient, type CallOptions, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { CoordinatorService, type Metadata, type Progress } from "./gen/coordd/v1/coordd_pb.js";
import { create } from "@bufbuild/protobuf";
import { DurationSchema, type Duration } from "@bufbuild/protobuf/wkt";

import { retryDelayMs } from "./retryinfo.js";

/** durationFromMs converts milliseconds to a google.protobuf.Duration. */
function durationFromMs(ms: number): Duration {
  const whole = Math.floor(ms / 1000);
  return create(DurationSchema, { seconds: BigInt(whole), nanos: Math.round((ms - whole * 1000) * 1e6) });
}

export { Code, ConnectError };
export * from "./gen/coordd/v1/coordd_pb.js";

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

/**
 * UnreachableError reports that no coordd answered: the connection was
 * refused, reset or lost mid-call, or the name did not resolve. Its code is
 * Unavailable and its cause the transport's error. An Unavailable that
 * coordd sent itself (an upstream down and no stale copy) is a plain
 * ConnectError.
 */
export class UnreachableError extends ConnectError {
  constructor(addr: string, cause: ConnectError) {
    super(`coordd at ${addr} is unreachable: ${cause.rawMessage}`, Code.Unavailable, undefined, undefined, cause);
  }

  // ConnectError's own check, inherited, would take every ConnectError for
  // an UnreachableError; this one follows the prototype chain.
  static override [Symbol.hasInstance](v: unknown): boolean {
    return Function.prototype[Symbol.hasInstance].call(this, v);
  }
}

/**
 * BodyTooLargeError reports a document whose metadata announces a body
 * larger than the client's maxBodyBytes: get fails as soon as the metadata
 * arrives, before any of the body, and cancels the stream, so that coordd
 * stops sending. Its code is FailedPrecondition, the code coordd gives a
 * body above its own max_body_bytes; it is not retried.
 */
export class BodyTooLargeError extends ConnectError {
  /** size is the body's size, as the metadata announced it. */
  readonly size: bigint;
  /** limit is the client's maxBodyBytes. */
  readonly limit: number;

  constructor(size: bigint, limit: number) {
    super(`coordd: body too large: metadata says ${size} bytes; the limit is ${limit} (maxBodyBytes)`, Code.FailedPrecondition);
    this.size = size;
    this.limit = limit;
  }

  // As for UnreachableError: ConnectError's own check would take every
  // ConnectError for a BodyTooLargeError.
  static override [Symbol.hasInstance](v: unknown): boolean {
    return Function.prototype[Symbol.hasInstance].call(this, v);
  }
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

/** GetOptions configure one get. */
export interface GetOptions {
  /** key is the cache key. Default: coordd uses the canonical url. */
  key?: string;
  /** noStale refuses stale copies. */
  noStale?: boolean;
  /** maxAgeMs refuses copies fetched longer ago than this many
   * milliseconds, fresh or stale: coordd fetches a newer one. */
  maxAgeMs?: number;
  /** signal cancels the call, backoff included; the call then rejects
   * with Canceled. */
  signal?: AbortSignal;
  /** timeoutMs overrides the client's deadline for this call. */
  timeoutMs?: number;
  /** headers are sent with each attempt as gRPC metadata. */
  headers?: CallOptions["headers"];
  /** onProgress is called with each progress event as it arrives, also
   * for attempts that are later retried. */
  onProgress?: (p: Progress) => void;
  /** retry overrides the client's RetryOptions. */
  retry?: RetryOptions;
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
    const interceptors: Interceptor[] = [];
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
    const r = { ...this.retry, ...opts.retry };
    const attempts = Math.max(1, r.attempts ?? 4);
    const base = r.baseDelayMs ?? 100;
    const cap = r.maxDelayMs ?? 2000;
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    for (let n = 1; ; n++) {
      try {
        return await this.getOnce(url, opts, deadline);
      } catch (err) {
        const ce = ConnectError.from(err);
        if (!retryable(ce.code) || n >= attempts || opts.signal?.aborted) throw ce;
        const backoff = Math.random() * Math.min(cap, base * 2 ** (n - 1));
        const wait = Math.max(backoff, Math.min(retryDelayMs(ce) ?? 0, MAX_RETRY_DELAY_MS));
        if (Date.now() + wait >= deadline) throw ce;
        await sleep(wait, opts.signal);
      }
    }
  }

  private async getOnce(url: string, opts: GetOptions, deadline: number): Promise<Document> {
    const progress: Progress[] = [];
    let metadata: Metadata | undefined;
    let body: BodyBuilder | undefined;
    const timeoutMs = deadline === Infinity ? undefined : Math.max(1, deadline - Date.now());
    // Connect's stream iterator has no return(): leaving the loop early, on
    // an error thrown below, would leave the HTTP/2 stream open, coordd
    // still sending, until the deadline. So each attempt has its own
    // signal, aborted when the attempt ends.
    const attempt = new AbortController();
    const cancel = (): void => attempt.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", cancel);
    if (opts.signal?.aborted) cancel();
    try {
      const stream = this.rpc.getOrFetch(
        {
          url,
          key: opts.key ?? "",
          noStale: opts.noStale ?? false,
          maxAge: opts.maxAgeMs === undefined ? undefined : durationFromMs(opts.maxAgeMs),
        },
        { signal: attempt.signal, timeoutMs, headers: opts.headers },
      );
      for await (const res of stream) {
        const ev = res.event;
        switch (ev.case) {
          case "progress":
            if (metadata) throw badStream("progress after metadata");
            progress.push(ev.value);
            opts.onProgress?.(ev.value);
            break;
          case "metadata":
            if (metadata) throw badStream("second metadata");
            if (ev.value.size < 0n) throw badStream(`metadata says size ${ev.value.size}`);
            if (this.maxBodyBytes > 0n && ev.value.size > this.maxBodyBytes) {
              throw new BodyTooLargeError(ev.value.size, Number(this.maxBodyBytes));
            }
            metadata = ev.value;
            body = new BodyBuilder(Number(metadata.size));
            break;
          case "chunk":
            if (!body) throw badStream("chunk before metadata");
            body.append(ev.value.data);
            break;
          default:
            // An event this client does not know, added to the protocol
            // after it: skipped, as the Go and Python clients do.
            break;
        }
      }
    } catch (err) {
      const ce = ConnectError.from(err);
      throw lostConnection(ce, opts.signal) ? new UnreachableError(this.addr, ce) : ce;
    } finally {
      opts.signal?.removeEventListener("abort", cancel);
      attempt.abort();
    }
    if (!metadata || !body) throw badStream("stream ended without metadata");
    const bytes = body.bytes();
    if (BigInt(bytes.length) !== metadata.size) {
      throw badStream(`body is ${bytes.length} bytes; metadata says ${metadata.size}`);
    }
    return { body: bytes, metadata, progress, text: () => new TextDecoder().decode(bytes) };
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
