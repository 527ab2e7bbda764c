// Trace context for coordd's calls: the caller's active OpenTelemetry span,
// as W3C Trace Context, so that coordd's spans (otelgrpc on the server)
// join the caller's trace. @opentelemetry/api is an optional peer
// dependency: it is imported on a call's first need of it, never when the
// client is imported, and a process without it sends no trace context.

import type * as otel from "@opentelemetry/api";

/** TraceContext is the W3C Trace Context of a call. */
export interface TraceContext {
  /** traceparent is "00-<trace id>-<span id>-<flags>". */
  traceparent: string;
  /** tracestate is the span's trace state, when it has one. */
  tracestate?: string;
}

type Api = Pick<typeof otel, "context" | "trace" | "isSpanContextValid">;

let api: Promise<Api | undefined> | undefined;

// loadApi imports @opentelemetry/api once per process: undefined when it
// is not installed (or fails to load: tracing is never worth failing a
// call for).
function loadApi(): Promise<Api | undefined> {
  api ??= import("@opentelemetry/api").then(
    (m: Partial<Api> & { default?: Partial<Api> }) => {
      // Its ESM build has named exports; a CommonJS one seen through
      // Node's interop may have them on default only.
      const a = m.trace ? m : m.default;
      return a?.trace && a.context && a.isSpanContextValid ? (a as Api) : undefined;
    },
    () => undefined,
  );
  return api;
}

/**
 * activeTraceContext returns the trace context of the span active in the
 * caller's OpenTelemetry context, or undefined when there is none (no span,
 * an invalid one, or @opentelemetry/api absent). It reads the context
 * after one await, which AsyncLocalStorage-based context managers (the
 * SDK's) carry across.
 */
export async function activeTraceContext(): Promise<TraceContext | undefined> {
  const a = await loadApi();
  if (!a) return undefined;
  const sc = a.trace.getSpanContext(a.context.active());
  if (!sc || !a.isSpanContextValid(sc)) return undefined;
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
  const tc: TraceContext = { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}` };
  const state = sc.traceState?.serialize();
  if (state) tc.tracestate = state;
  return tc;
}
