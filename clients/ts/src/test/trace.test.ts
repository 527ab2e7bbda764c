// Trace context: with @opentelemetry/api installed (a devDependency here)
// every call carries the active span as W3C traceparent (and tracestate)
// gRPC metadata, which coordd's otelgrpc reads. Without it installed,
// package.test.ts shows the client loads and calls as before.

import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { after, before, test } from "node:test";

import { context, createTraceState, ROOT_CONTEXT, trace, TraceFlags, type Context, type ContextManager } from "@opentelemetry/api";

import { CoorddClient, createFetch } from "../index.js";
import { document, startStub, type Stub } from "./stubcoordd.js";

/** AsyncLocalContextManager is the SDK's AsyncLocalStorage context manager
 * (@opentelemetry/context-async-hooks) in a few lines: its releases for
 * this API version need Node 22. */
class AsyncLocalContextManager implements ContextManager {
  private readonly als = new AsyncLocalStorage<Context>();
  active(): Context {
    return this.als.getStore() ?? ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.als.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind<T>(_ctx: Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    this.als.disable();
    return this;
  }
}

const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID = "00f067aa0ba902b7";

let stub: Stub;
let client: CoorddClient;

before(async () => {
  assert.ok(context.setGlobalContextManager(new AsyncLocalContextManager()), "a context manager was already registered");
  stub = await startStub({ "/doc": document({ contentType: "text/plain" }, "hello") });
  client = new CoorddClient(stub.addr, { retry: { attempts: 1 } });
});

after(async () => {
  client?.close();
  await stub?.close();
  context.disable();
});

function inSpan<T>(spanId: string, fn: () => Promise<T>, flags = TraceFlags.SAMPLED, state?: string): Promise<T> {
  const ctx = trace.setSpanContext(ROOT_CONTEXT, {
    traceId: TRACE_ID,
    spanId,
    traceFlags: flags,
    traceState: state ? createTraceState(state) : undefined,
  });
  return context.with(ctx, fn);
}

function sent(url: string) {
  const c = stub.calls.filter((c) => c.req.url === url).at(-1);
  assert.ok(c, `no call for ${url}`);
  return { traceparent: c.header.get("traceparent"), tracestate: c.header.get("tracestate") };
}

test("a call outside any span carries no trace context", async () => {
  await client.get("http://api.test/doc?outside");
  assert.deepEqual(sent("http://api.test/doc?outside"), { traceparent: null, tracestate: null });
});

test("get, stream and fetch carry the active span as traceparent and tracestate", async () => {
  await inSpan(SPAN_ID, () => client.get("http://api.test/doc?get"), TraceFlags.SAMPLED, "vendor=abc");
  assert.deepEqual(sent("http://api.test/doc?get"), { traceparent: `00-${TRACE_ID}-${SPAN_ID}-01`, tracestate: "vendor=abc" });

  await inSpan(SPAN_ID, async () => (await client.stream("http://api.test/doc?stream")).cancel(), TraceFlags.NONE);
  assert.deepEqual(sent("http://api.test/doc?stream"), { traceparent: `00-${TRACE_ID}-${SPAN_ID}-00`, tracestate: null });

  const fetch = createFetch(client);
  await inSpan(SPAN_ID, async () => (await fetch("http://api.test/doc?fetch")).text());
  assert.equal(sent("http://api.test/doc?fetch").traceparent, `00-${TRACE_ID}-${SPAN_ID}-01`);
});

test("concurrent calls in different spans carry their own", async () => {
  const spans = ["0000000000000001", "0000000000000002", "0000000000000003", "0000000000000004"];
  await Promise.all(spans.map((id) => inSpan(id, () => client.get(`http://api.test/doc?span=${id}`))));
  for (const id of spans) assert.equal(sent(`http://api.test/doc?span=${id}`).traceparent, `00-${TRACE_ID}-${id}-01`);
});

test("an invalid span context is not sent; a call's own traceparent wins", async () => {
  await context.with(trace.setSpanContext(ROOT_CONTEXT, { traceId: "0".repeat(32), spanId: SPAN_ID, traceFlags: 1 }), () =>
    client.get("http://api.test/doc?invalid"),
  );
  assert.equal(sent("http://api.test/doc?invalid").traceparent, null);

  const own = `00-${"a".repeat(32)}-${"b".repeat(16)}-01`;
  await inSpan(SPAN_ID, () => client.get("http://api.test/doc?own", { headers: { traceparent: own } }));
  assert.equal(sent("http://api.test/doc?own").traceparent, own);
});
