// Package logctx carries the log attributes of one call (a request id, a
// cache key) in its context, and Handler adds them to every record logged
// with that context (Logger.InfoContext and the like), so that each line
// of a call names it without every log call site passing them.
//
// A call's attributes are one mutable set, shared by every context derived
// from the one New returned, as go-grpc-middleware v1's ctxtags were: an
// interceptor starts the set, and the handler, once it has resolved the
// key, adds it with Add, where the interceptor's own closing line sees it.
package logctx

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

type setKey struct{}

// set is one call's attributes. It is safe for concurrent use.
type set struct {
	mu    sync.Mutex // protects attrs
	attrs []slog.Attr
}

// New returns ctx carrying a new attribute set holding args (alternating
// keys and values, or slog.Attrs, as for slog.Logger.Log), and whatever
// attributes ctx already carried.
func New(ctx context.Context, args ...any) context.Context {
	s := &set{attrs: attrs(ctx, len(args)/2+spare)}
	s.add(args)
	return context.WithValue(ctx, setKey{}, s)
}

// Add adds args to the attribute set ctx carries, where every context
// sharing the set, the ones it was derived from included, sees them. An
// attribute whose key is already in the set replaces it. Without a set in
// ctx, Add does nothing.
func Add(ctx context.Context, args ...any) {
	if s, _ := ctx.Value(setKey{}).(*set); s != nil {
		s.add(args)
	}
}

func (s *set) add(args []any) {
	r := slog.NewRecord(time.Time{}, 0, "", 0)
	r.Add(args...) // slog's own parsing of key-value pairs
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		for i := range s.attrs {
			if s.attrs[i].Key == a.Key {
				s.attrs[i] = a
				return true
			}
		}
		s.attrs = append(s.attrs, a)
		return true
	})
}

// spare is the room New leaves for attributes added later (a call's key),
// so that the first Add does not grow the slice.
const spare = 1

// Attrs returns a copy of the attributes ctx carries.
func Attrs(ctx context.Context) []slog.Attr { return attrs(ctx, 0) }

// attrs returns a copy of the attributes ctx carries, with room for extra
// more (nil if none and extra is 0).
func attrs(ctx context.Context, extra int) []slog.Attr {
	s, _ := ctx.Value(setKey{}).(*set)
	if s == nil {
		if extra == 0 {
			return nil
		}
		return make([]slog.Attr, 0, extra)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(make([]slog.Attr, 0, len(s.attrs)+extra), s.attrs...)
}

// Args is Attrs as arguments for slog.Logger.With.
func Args(ctx context.Context) []any {
	as := Attrs(ctx)
	args := make([]any, len(as))
	for i, a := range as {
		args[i] = a
	}
	return args
}

// Has reports whether ctx carries an attribute named key.
func Has(ctx context.Context, key string) bool {
	for _, a := range Attrs(ctx) {
		if a.Key == key {
			return true
		}
	}
	return false
}

// Handler is a slog.Handler that adds the attributes of a record's context
// to the record, except those whose key the record already has, then
// passes it on. Attributes from the context go into the logger's current
// group, like the record's own.
type Handler struct {
	next slog.Handler
}

// NewHandler returns a Handler passing records on to next.
func NewHandler(next slog.Handler) *Handler { return &Handler{next: next} }

// Enabled reports whether next handles level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// Handle adds ctx's attributes to r and passes it on.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if as := Attrs(ctx); len(as) > 0 {
		r = r.Clone()
		r.Attrs(func(a slog.Attr) bool {
			for i := range as {
				if as[i].Key == a.Key {
					as = append(as[:i], as[i+1:]...)
					break
				}
			}
			return len(as) > 0
		})
		r.AddAttrs(as...)
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a Handler over next.WithAttrs(as).
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as)}
}

// WithGroup returns a Handler over next.WithGroup(name).
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name)}
}
