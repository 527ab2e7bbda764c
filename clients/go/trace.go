package coordd

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// traceContext is the W3C Trace Context propagator: it writes traceparent
// (and tracestate, when the span has one).
var traceContext propagation.TraceContext

// withTraceparent returns ctx with the W3C trace context of its span in the
// call's outgoing metadata ("traceparent", and "tracestate" if any), so that
// coordd's spans of the call join the caller's trace; ctx as it is when it
// holds no valid span. It reads the span through OpenTelemetry's API only:
// a program that configures no tracing gets no span and sends nothing, and
// the client never needs the SDK. A stats handler such as otelgrpc's (see
// WithDialOptions) overwrites it with the context of its own client span.
func withTraceparent(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	kv := make([]string, 0, 2*len(carrier))
	for k, v := range carrier {
		kv = append(kv, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}
