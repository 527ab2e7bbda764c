package upstream

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the upstream attempt spans.
const TracerName = "github.com/coordd/coordd/internal/upstream"

// SpanAttempt is the span of one HTTP request to an upstream: the first
// attempt, a retry, or a redirect hop.
const SpanAttempt = "coordd.upstream.attempt"

// Tracing follows the span in Fetch's context, the caller's fetch span:
// with none recording there (tracing off), nothing below does any work.
// Attempt spans come from that span's own provider, so the Client needs no
// tracer of its own.

// tracedReport returns report, also recording each event (a rate-limit or
// Retry-After wait, a scheduled retry, an open breaker) on the span in ctx.
func tracedReport(ctx context.Context, report func(Event)) func(Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return report
	}
	return func(e Event) {
		span.AddEvent(e.Stage.String(), trace.WithAttributes(
			attribute.String("coordd.detail", e.Detail),
			attribute.Int("coordd.attempt", e.Attempt),
			attribute.Int64("coordd.wait_ms", e.Wait.Milliseconds()),
		))
		report(e)
	}
}

// attemptTrace is one attempt's span; its zero value does nothing.
type attemptTrace struct{ span trace.Span }

// startAttempt starts the span of attempt number attempt (1: the first) of
// redirect hop hop (0: the url asked for) at fr.URL, as a child of the span
// in ctx.
func (p *Client) startAttempt(ctx context.Context, fr FetchRequest, attempt, hop int) (context.Context, attemptTrace) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, attemptTrace{}
	}
	ctx, s := parent.TracerProvider().Tracer(TracerName).Start(ctx, SpanAttempt,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", http.MethodGet),
			attribute.String("url.full", fr.URL),
			attribute.String("coordd.upstream", p.up.Name),
			attribute.Int("coordd.attempt", attempt),
			attribute.Int("coordd.redirect_hop", hop),
			attribute.Bool("coordd.conditional", fr.ETag != "" || fr.LastModified != ""),
		))
	return ctx, attemptTrace{span: s}
}

// end records the attempt's answer or error.
func (at attemptTrace) end(resp *Response, err error) {
	if at.span == nil {
		return
	}
	if resp != nil {
		at.span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			at.span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
		}
	}
	if err != nil {
		at.span.RecordError(err)
		at.span.SetStatus(codes.Error, "no answer")
	}
	at.span.End()
}
