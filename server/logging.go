package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
)

// Limits on the log lines of finished calls.
const (
	// refusedLogRate and refusedLogBurst bound the lines of calls refused
	// for what the caller sent or did (see callerCode): refusedLogBurst at
	// once, then refusedLogRate a second. The rest are counted, and the
	// count is logged with the next line as "suppressed".
	refusedLogRate  = 10
	refusedLogBurst = 20
	// maxLogValue is the most bytes of one logged string value: a longer
	// one (an error quoting a caller's 2 KiB url) is cut, and says so.
	maxLogValue = 256
)

// callerCode reports whether c is the code of a call refused for what the
// caller sent or did. A caller can produce these as fast as it can send.
func callerCode(c codes.Code) bool {
	switch c {
	case codes.Canceled, codes.InvalidArgument, codes.DeadlineExceeded, codes.NotFound,
		codes.AlreadyExists, codes.PermissionDenied, codes.ResourceExhausted,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return true
	}
	return false
}

// callLevel is the level of a finished call's line: debug for a success
// (the hot path) and for a caller that canceled or hung up (nothing went
// wrong in coordd, and no one is left to tell), at most WARN for a
// caller's error, and the middleware's default otherwise (ERROR for
// INTERNAL, UNAVAILABLE, ...).
func callLevel(c codes.Code) logging.Level {
	switch {
	case c == codes.OK, c == codes.Canceled:
		return logging.LevelDebug
	case callerCode(c):
		return min(logging.DefaultServerCodeToLevel(c), logging.LevelWarn)
	}
	return logging.DefaultServerCodeToLevel(c)
}

// callLogger is the logging interceptor's logger: it writes to log, cuts
// long string values and rate-limits the lines of callers' errors. It is
// safe for concurrent use.
type callLogger struct {
	log        *slog.Logger
	refused    *rate.Limiter // lines of callers' errors
	suppressed atomic.Int64  // callers' error lines dropped since the last one written
}

func newCallLogger(log *slog.Logger) *callLogger {
	return &callLogger{log: log, refused: rate.NewLimiter(refusedLogRate, refusedLogBurst)}
}

func (l *callLogger) enabled(ctx context.Context, lvl logging.Level) bool {
	return l.log.Enabled(ctx, slog.Level(lvl))
}

// Log implements logging.Logger.
func (l *callLogger) Log(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
	if !l.enabled(ctx, lvl) {
		return
	}
	fields = slices.Clone(fields)
	if c, ok := fieldCode(fields); ok && callerCode(c) {
		if !l.refused.Allow() {
			l.suppressed.Add(1)
			return
		}
		if n := l.suppressed.Swap(0); n > 0 {
			fields = append(fields, "suppressed", n)
		}
	}
	for i := 1; i < len(fields); i += 2 {
		if s, ok := fields[i].(string); ok && len(s) > maxLogValue {
			n := maxLogValue
			for n > 0 && !utf8.RuneStart(s[n]) {
				n--
			}
			fields[i] = fmt.Sprintf("%s… (%d bytes)", s[:n], len(s))
		}
	}
	l.log.Log(ctx, slog.Level(lvl), msg, fields...)
}

// codeByName maps codes.Code.String() back to the code.
var codeByName = func() map[string]codes.Code {
	m := make(map[string]codes.Code)
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[c.String()] = c
	}
	return m
}()

// fieldCode returns the code in the middleware's "grpc.code" field.
func fieldCode(fields []any) (codes.Code, bool) {
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "grpc.code" {
			s, _ := fields[i+1].(string)
			c, ok := codeByName[s]
			return c, ok
		}
	}
	return 0, false
}
