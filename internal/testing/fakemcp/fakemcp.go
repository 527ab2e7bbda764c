// Package fakemcp is a remote MCP server (Streamable HTTP, the Go SDK's)
// on loopback, for the gateway's tests of remote backends: a read-only
// tool that counts its executions, one that holds its answer until the
// test releases it (and counts the calls cancelled while held), and the limits a hosted
// server has (429 with Retry-After past a number of calls in flight, a
// required bearer token).
package fakemcp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options shape a Server.
type Options struct {
	// MaxInFlight, when positive, answers 429 (Retry-After: 1) to a POST
	// past that many in progress.
	MaxInFlight int
	// Token, when set, is required as "Authorization: Bearer TOKEN".
	Token string
	// Delay is how long each tool call takes.
	Delay time.Duration
	// RefuseFirst answers the first RefuseFirst tool calls 429
	// (Retry-After: 1), as a hosted server's rate limit does.
	RefuseFirst int
}

// Server is a running fake.
type Server struct {
	URL string // the endpoint

	opt          Options
	inFlight     atomic.Int64
	peak         atomic.Int64
	executions   atomic.Int64
	refused      atomic.Int64
	refusedFirst atomic.Int64
	cancelled    atomic.Int64
	mu           sync.Mutex
	byArg        map[string]int
	held         map[string]chan struct{} // hold's calls by q, closed by Release
	holding      map[string]int           // hold's calls of q in progress
	releasedAll  bool
}

type lookupArgs struct {
	Q string `json:"q"`
}

// Start starts a server, stopped when t ends.
func Start(t testing.TB, opt Options) *Server {
	s := &Server{opt: opt, byArg: map[string]int{}, held: map[string]chan struct{}{}, holding: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "fake-remote", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "lookup", Description: "looks q up", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in lookupArgs) (*mcp.CallToolResult, any, error) {
			s.executions.Add(1)
			s.mu.Lock()
			s.byArg[in.Q]++
			s.mu.Unlock()
			if s.opt.Delay > 0 {
				select {
				case <-time.After(s.opt.Delay):
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answer to " + in.Q}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "hold", Description: "answers q once released", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in lookupArgs) (*mcp.CallToolResult, any, error) {
			s.executions.Add(1)
			s.mu.Lock()
			s.byArg[in.Q]++
			s.holding[in.Q]++
			rel := s.releaseOf(in.Q)
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				s.holding[in.Q]--
				s.mu.Unlock()
			}()
			select {
			case <-rel:
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held " + in.Q}}}, nil, nil
			case <-ctx.Done():
				s.cancelled.Add(1)
				return nil, nil, ctx.Err()
			}
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opt.Token != "" && r.Header.Get("Authorization") != "Bearer "+s.opt.Token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			n := s.inFlight.Add(1)
			defer s.inFlight.Add(-1)
			for {
				p := s.peak.Load()
				if n <= p || s.peak.CompareAndSwap(p, n) {
					break
				}
			}
			if s.opt.RefuseFirst > 0 && isToolCall(r) && s.refusedFirst.Add(1) <= int64(s.opt.RefuseFirst) {
				s.refused.Add(1)
				w.Header().Set("Retry-After", "1")
				http.Error(w, "too many requests", http.StatusTooManyRequests)
				return
			}
			if s.opt.MaxInFlight > 0 && n > int64(s.opt.MaxInFlight) {
				s.refused.Add(1)
				w.Header().Set("Retry-After", "1")
				http.Error(w, "too many requests", http.StatusTooManyRequests)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	s.URL = hs.URL + "/mcp"
	return s
}

// isToolCall reports whether r's body is a tools/call, leaving the body
// readable.
func isToolCall(r *http.Request) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(bytes.NewReader(b))
	return err == nil && bytes.Contains(b, []byte(`"tools/call"`))
}

// Executions returns how many tool calls ran.
func (s *Server) Executions() int { return int(s.executions.Load()) }

// ExecutionsOf returns how many calls of lookup ran with q.
func (s *Server) ExecutionsOf(q string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byArg[q]
}

// releaseOf returns the channel that releases hold's calls of q. s.mu
// must be held.
func (s *Server) releaseOf(q string) chan struct{} {
	c := s.held[q]
	if c == nil {
		c = make(chan struct{})
		if s.releasedAll {
			close(c)
		}
		s.held[q] = c
	}
	return c
}

// Release answers hold's calls of q, present and future.
func (s *Server) Release(q string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.releaseOf(q)
	select {
	case <-c:
	default:
		close(c)
	}
}

// ReleaseAll answers every call of hold, present and future: a test
// defers it, so that no call is left held when the server stops.
func (s *Server) ReleaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releasedAll = true
	for _, c := range s.held {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

// Holding returns how many calls of hold with q are in progress.
func (s *Server) Holding(q string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding[q]
}

// Cancelled returns how many calls of hold ended cancelled (the client
// sent notifications/cancelled) before they were released.
func (s *Server) Cancelled() int { return int(s.cancelled.Load()) }

// Refused returns how many POSTs were answered 429.
func (s *Server) Refused() int { return int(s.refused.Load()) }

// Peak returns the most POSTs seen in progress at once.
func (s *Server) Peak() int { return int(s.peak.Load()) }
