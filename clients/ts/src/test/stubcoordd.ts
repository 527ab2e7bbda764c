// A stub coordd served from this process (Connect's Node adapter over
// HTTP/2, gRPC): it answers GetOrFetch from a script chosen by the url's
// path, and records each call, so that the fetch drop-in and the client's
// trace context can be tested against exact streams and errors.

import { createServer, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";

import { BinaryWriter } from "@bufbuild/protobuf/wire";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { HandlerContext } from "@connectrpc/connect";

import { Code, ConnectError, CoordinatorService, Source, type GetOrFetchRequest, type GetOrFetchResponseSchema, type MetadataSchema } from "../client.js";

type Event = MessageInitShape<typeof GetOrFetchResponseSchema>;
type MetadataInit = MessageInitShape<typeof MetadataSchema>;

/** StubCall is one GetOrFetch the stub received. */
export interface StubCall {
  req: GetOrFetchRequest;
  /** header is the call's gRPC metadata. */
  header: Headers;
  /** ended resolves when the call's stream ends, for whatever reason;
   * cancelled says whether the client went away first. */
  ended: Promise<void>;
  cancelled: () => boolean;
}

/** Script answers a call: it yields the stream's events, or throws. */
export type Script = (req: GetOrFetchRequest, ctx: HandlerContext) => AsyncGenerator<Event>;

/** Stub is a running stub coordd. */
export interface Stub {
  addr: string;
  /** calls are the calls received, in order. */
  calls: StubCall[];
  close(): Promise<void>;
}

/** metadata is a metadata event; size defaults to body's length. */
export function metadata(m: MetadataInit): Event {
  return { event: { case: "metadata", value: { source: Source.UPSTREAM, statusCode: 200, ...m } } };
}

/** chunk is a chunk event. */
export function chunk(data: string | Uint8Array): Event {
  return { event: { case: "chunk", value: { data: typeof data === "string" ? new TextEncoder().encode(data) : data } } };
}

/** document is a whole answer: metadata then the body in chunks (none for
 * a head call). */
export function document(m: MetadataInit, ...chunks: string[]): Script {
  return async function* (req) {
    const size = chunks.reduce((n, c) => n + new TextEncoder().encode(c).length, 0);
    yield metadata({ size: BigInt(size), ...m });
    if (req.head) return;
    for (const c of chunks) yield chunk(c);
  };
}

/** failure is an error with a google.rpc.RetryInfo of retryDelayMs and a
 * google.rpc.ErrorInfo of reason (domain coordd), as coordd sends them. */
export function failure(code: Code, message: string, retryDelayMs?: number, reason?: string): ConnectError {
  const err = new ConnectError(message, code);
  if (reason !== undefined) {
    err.details.push({ type: "google.rpc.ErrorInfo", value: new BinaryWriter().uint32(10).string(reason).uint32(18).string("coordd").finish() });
  }
  if (retryDelayMs !== undefined) {
    const secs = Math.floor(retryDelayMs / 1000);
    const duration = new BinaryWriter().uint32(8).int64(secs).uint32(16).int32(Math.round((retryDelayMs - secs * 1000) * 1e6)).finish();
    const retryInfo = new BinaryWriter().uint32(10).bytes(duration).finish();
    err.details.push({ type: "google.rpc.RetryInfo", value: retryInfo });
  }
  return err;
}

/** startStub serves scripts, chosen by the path of the call's url; a path
 * without one fails the call with NotFound. */
export async function startStub(scripts: Record<string, Script>): Promise<Stub> {
  const calls: StubCall[] = [];
  const handler = connectNodeAdapter({
    grpcWeb: false,
    connect: false,
    routes: (router) =>
      router.service(CoordinatorService, {
        async *getOrFetch(req, ctx) {
          let end!: () => void;
          const ended = new Promise<void>((resolve) => (end = resolve));
          let cancelled = false;
          const onAbort = () => {
            cancelled = true;
            end();
          };
          ctx.signal.addEventListener("abort", onAbort);
          calls.push({ req, header: new Headers(ctx.requestHeader), ended, cancelled: () => cancelled });
          try {
            const script = scripts[new URL(req.url).pathname];
            if (!script) throw new ConnectError(`stub: no script for ${req.url}`, Code.NotFound);
            yield* script(req, ctx);
          } finally {
            ctx.signal.removeEventListener("abort", onAbort);
            end();
          }
        },
      }),
  });
  const server: Http2Server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    addr: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    calls,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Gate is a promise a test opens. */
export interface Gate {
  wait: Promise<void>;
  open(): void;
}

export function gate(): Gate {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/** untilAborted resolves when ctx's call is cancelled by the client. */
export function untilAborted(ctx: HandlerContext): Promise<void> {
  return new Promise((resolve) => {
    if (ctx.signal.aborted) resolve();
    ctx.signal.addEventListener("abort", () => resolve());
  });
}
