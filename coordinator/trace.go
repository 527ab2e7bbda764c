package coordinator

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/upstream"
)

// TracerName is the instrumentation scope of the engine's spans.
const TracerName = "github.com/coordd/coordd/coordinator"

// Span names of the engine. The call's own span (the gRPC server span, or
// the HTTP door's request span) is the parent of the flight it starts.
const (
	SpanFlight = "coordd.flight" // one fill of one key in this instance
	SpanLock   = "coordd.lock"   // one attempt at the key's fill lock in Redis, which reads L2 too
	SpanFetch  = "coordd.fetch"  // the fetch through the upstream's guard; child spans per attempt
	SpanLand   = "coordd.land"   // storing in L2, releasing the lock and announcing done
)

// tracer is the engine's tracer; off without Options.TracerProvider, and
// then every method below returns at once: the hot path does no tracing
// work, not even a noop span.
type tracer struct {
	t  trace.Tracer
	on bool
}

func newTracer(tp trace.TracerProvider) tracer {
	if tp == nil {
		return tracer{}
	}
	return tracer{t: tp.Tracer(TracerName), on: true}
}

// w3c encodes and decodes the traceparent that a done event carries.
var w3c propagation.TraceContext

// flightTrace is a flight's span and what its attributes count. The zero
// value (tracing off) does nothing.
type flightTrace struct {
	t       trace.Tracer
	span    trace.Span   // nil when tracing is off
	waiters atomic.Int64 // callers that joined, the first included
	role    string       // leader, follower, or "" (answered from L2); set by the fill goroutine only
}

// start starts f's span as a child of the span in ctx, the first caller's.
func (ft *flightTrace) start(tr tracer, ctx context.Context, t Target) {
	if !tr.on {
		return
	}
	ft.t = tr.t
	_, ft.span = tr.t.Start(ctx, SpanFlight, trace.WithAttributes(
		attribute.String("coordd.key", t.Key),
		attribute.String("coordd.url", t.URL),
		attribute.String("coordd.upstream", t.upstream.Name),
	))
	ft.waiters.Store(1)
}

// joined counts a caller that joined the running flight, and links the
// caller's span (in ctx) to the flight's: the caller waits on a fill that
// another call's trace holds.
func (ft *flightTrace) joined(ctx context.Context) {
	if ft.span == nil {
		return
	}
	ft.waiters.Add(1)
	trace.SpanFromContext(ctx).AddLink(trace.Link{
		SpanContext: ft.span.SpanContext(),
		Attributes:  []attribute.KeyValue{attribute.String("coordd.link", "flight")},
	})
}

// ctx returns parent carrying the flight's span, for its child spans.
func (ft *flightTrace) ctx(parent context.Context) context.Context {
	return trace.ContextWithSpan(parent, ft.span)
}

// lockTrace is a lock attempt's span; its zero value does nothing.
type lockTrace struct {
	ft   *flightTrace
	span trace.Span
}

// lock starts the span of an attempt at the fill lock of co; none in
// single-node mode, whose claims take no lock.
func (ft *flightTrace) lock(c context.Context, co coordination) lockTrace {
	if _, local := co.(inProcess); ft.span == nil || local {
		return lockTrace{}
	}
	_, s := ft.t.Start(ft.ctx(c), SpanLock)
	return lockTrace{ft: ft, span: s}
}

// end records the claim's outcome: acquired, contended (and so the
// flight follows), unavailable (Redis did not answer), or found (the
// flight's first look found a copy in L2 and did not ask for the lock).
func (lt lockTrace) end(cl claim) {
	if lt.span == nil {
		return
	}
	outcome := "acquired"
	switch {
	case cl.err != nil:
		outcome = "unavailable"
		lt.span.RecordError(cl.err)
	case cl.found:
		outcome = "found"
	case cl.lease == nil:
		outcome = "contended"
		lt.ft.role = "follower"
		lt.span.SetAttributes(attribute.Int64("coordd.lock.holder_left_ms", cl.holder.Left.Milliseconds()))
	}
	lt.span.SetAttributes(attribute.String("coordd.lock.outcome", outcome))
	lt.span.End()
}

// fetchTrace is the fetch's span; its zero value does nothing.
type fetchTrace struct{ span trace.Span }

// fetch starts the span of the flight's upstream fetch under lease l
// and returns the context to fetch with: c,
// carrying the span, under which package upstream traces each attempt.
// l's events carry the span's traceparent, for followers elsewhere to
// link to.
func (ft *flightTrace) fetch(c context.Context, l lease) (context.Context, fetchTrace) {
	if ft.span == nil {
		return c, fetchTrace{}
	}
	ft.role = "leader"
	ctx, s := ft.t.Start(ft.ctx(c), SpanFetch, trace.WithSpanKind(trace.SpanKindClient))
	if sc := s.SpanContext(); sc.IsValid() {
		carrier := propagation.MapCarrier{}
		w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
		l.setTrace(carrier.Get("traceparent"))
	}
	return ctx, fetchTrace{span: s}
}

// end records the fetch's last answer or error.
func (ft fetchTrace) end(resp *upstream.Response, err error) {
	if ft.span == nil {
		return
	}
	if resp != nil {
		ft.span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	}
	if err != nil {
		ft.span.RecordError(err)
		ft.span.SetStatus(codes.Error, errorKind(err))
	}
	ft.span.End()
}

// landTrace is the landing's span; its zero value does nothing.
type landTrace struct{ span trace.Span }

// land starts the span of storing in L2, releasing the lock and
// announcing done.
func (ft *flightTrace) land(c context.Context, cacheable bool) landTrace {
	if ft.span == nil {
		return landTrace{}
	}
	_, s := ft.t.Start(ft.ctx(c), SpanLand, trace.WithAttributes(attribute.Bool("coordd.cacheable", cacheable)))
	return landTrace{span: s}
}

// end records whether the landing happened (false: fenced by an
// Invalidate, or Redis failed).
func (lt landTrace) end(landed bool, err error) {
	if lt.span == nil {
		return
	}
	lt.span.SetAttributes(attribute.Bool("coordd.landed", landed))
	if err != nil {
		lt.span.RecordError(err)
		lt.span.SetStatus(codes.Error, "redis")
	}
	lt.span.End()
}

// event records an event pushed to a follower, holder being the token of
// the leader it follows; a done or fail event that carries the leader's
// fetch span (store.Event.Trace) links the flight's span to it.
func (ft *flightTrace) event(ev store.Event, holder string) {
	if ft.span == nil {
		return
	}
	ft.span.AddEvent("coordd.event", trace.WithAttributes(
		attribute.String("coordd.event.type", ev.Type),
		attribute.Bool("coordd.event.from_holder", ev.Token != "" && ev.Token == holder),
	))
	if ev.Trace == "" || (ev.Type != store.EventDone && ev.Type != store.EventFail) {
		return
	}
	sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier{"traceparent": ev.Trace}))
	if sc.IsValid() {
		ft.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attribute.String("coordd.link", "leader_fetch"),
			attribute.String("coordd.event.type", ev.Type),
		}})
	}
}

// end ends the flight's span with its outcome.
func (ft *flightTrace) end(res *Result, err error) {
	if ft.span == nil {
		return
	}
	role := ft.role
	if role == "" {
		role = "reader"
	}
	attrs := []attribute.KeyValue{
		attribute.String("coordd.role", role),
		attribute.Int64("coordd.waiters", ft.waiters.Load()),
	}
	if res != nil {
		attrs = append(attrs, attribute.String("coordd.source", res.Source.String()), attribute.Bool("coordd.stale", res.Stale))
	}
	ft.span.SetAttributes(attrs...)
	if err != nil {
		ft.span.RecordError(err)
		ft.span.SetStatus(codes.Error, errorKind(err))
	}
	ft.span.End()
}
