// The errors of the client that are not a code alone: no coordd answered,
// or a body over the client's limit. Their own module so that the fetch
// drop-in (fetch.ts) can tell them apart without importing the client.

import { Code, ConnectError } from "@connectrpc/connect";

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
