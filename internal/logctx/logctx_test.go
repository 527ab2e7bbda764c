package logctx_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"

	"github.com/coordd/coordd/internal/logctx"
)

func TestHandler(t *testing.T) {
	tests := []struct {
		name string
		log  func(l *slog.Logger)
		want map[string]any
	}{
		{"no attributes", func(l *slog.Logger) {
			l.InfoContext(context.Background(), "m")
		}, map[string]any{}},
		{"request id", func(l *slog.Logger) {
			l.InfoContext(logctx.New(context.Background(), "request_id", "r1"), "m")
		}, map[string]any{"request_id": "r1"}},
		{"added later, seen by the outer context", func(l *slog.Logger) {
			outer := logctx.New(context.Background(), "request_id", "r1")
			inner, cancel := context.WithCancel(outer)
			defer cancel()
			logctx.Add(inner, "key", "k")
			l.InfoContext(outer, "m")
		}, map[string]any{"request_id": "r1", "key": "k"}},
		{"Add replaces a key", func(l *slog.Logger) {
			ctx := logctx.New(context.Background(), "key", "old")
			logctx.Add(ctx, "key", "new")
			l.InfoContext(ctx, "m")
		}, map[string]any{"key": "new"}},
		{"the record's own attribute wins", func(l *slog.Logger) {
			l.InfoContext(logctx.New(context.Background(), "key", "ctx", "request_id", "r1"), "m", "key", "record")
		}, map[string]any{"request_id": "r1", "key": "record"}},
		{"New copies, Add on the copy leaves the parent alone", func(l *slog.Logger) {
			parent := logctx.New(context.Background(), "request_id", "r1")
			child := logctx.New(parent, "key", "k")
			logctx.Add(child, "extra", "x")
			l.InfoContext(parent, "m")
		}, map[string]any{"request_id": "r1"}},
		{"Add without a set does nothing", func(l *slog.Logger) {
			ctx := context.Background()
			logctx.Add(ctx, "key", "k")
			l.InfoContext(ctx, "m")
		}, map[string]any{}},
		{"logger attributes kept", func(l *slog.Logger) {
			l.With("component", "c").InfoContext(logctx.New(context.Background(), "request_id", "r1"), "m")
		}, map[string]any{"component": "c", "request_id": "r1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.log(slog.New(logctx.NewHandler(slog.NewJSONHandler(&buf, nil))))
			var got map[string]any
			if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, buf.Bytes())
			}
			delete(got, "time")
			delete(got, "level")
			delete(got, "msg")
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v; want %v", got, tt.want)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	ctx := logctx.New(context.Background(), "request_id", "r1", "key", "k")
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).With(logctx.Args(ctx)...).Info("m")
	if got, want := buf.String(), "request_id=r1 key=k"; !bytes.Contains([]byte(got), []byte(want)) {
		t.Fatalf("got %q; want it to contain %q", got, want)
	}
	if !logctx.Has(ctx, "key") || logctx.Has(ctx, "nope") {
		t.Fatalf("Has: got %v, %v; want true, false", logctx.Has(ctx, "key"), logctx.Has(ctx, "nope"))
	}
}
