package gateway_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakemcp"
	"github.com/coordd/coordd/internal/upstream"
)

func remote(t *testing.T, url string) gateway.Server {
	t.Setenv("REMOTE_MCP_TOKEN", "Bearer remote-token-0123456789")
	return gateway.Server{Name: "docs", URL: url, TrustReadOnly: true,
		Credential: &upstream.Credential{Header: "Authorization", ValueEnv: "REMOTE_MCP_TOKEN"}}
}

// TestRemoteCoalesced: a remote server that annotates lookup
// readOnlyHint, marked trust_read_only and reached with coordd's
// credential: 3 instances × 20 identical calls run it once.
func TestRemoteCoalesced(t *testing.T) {
	fm := fakemcp.Start(t, fakemcp.Options{Token: "remote-token-0123456789", Delay: 50 * time.Millisecond})
	s := remote(t, fm.URL)
	s.TTL = time.Minute
	in := fleet(t, 3, []gateway.Server{s}, gateway.Options{})
	var sessions []*mcp.ClientSession
	for _, i := range in {
		for range 20 {
			sessions = append(sessions, agent(t, i.url+"/mcp/docs", nil))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for j, s := range sessions {
		wg.Go(func() {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"q": "same"}})
			if err == nil && (r.IsError || text(t, r) != "answer to same") {
				err = fmt.Errorf("got %v %q", r.IsError, text(t, r))
			}
			errs[j] = err
		})
	}
	wg.Wait()
	for j, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", j, err)
		}
	}
	if n := fm.ExecutionsOf("same"); n != 1 {
		t.Fatalf("executions on the remote server = %d; want 1", n)
	}
}

// TestRemote429: a remote server that answers 429 past 20 calls in
// flight, behind 3 instances with max_in_flight 20: 300 different calls
// at once, none fails, none runs twice.
func TestRemote429(t *testing.T) {
	fm := fakemcp.Start(t, fakemcp.Options{Token: "remote-token-0123456789", MaxInFlight: 20, Delay: 20 * time.Millisecond})
	s := remote(t, fm.URL)
	s.Protection.MaxInFlight = 20
	s.Protection.RateLimit = 1000
	s.Protection.MaxWait = time.Minute
	in := fleet(t, 3, []gateway.Server{s}, gateway.Options{})
	var sessions []*mcp.ClientSession
	for _, i := range in {
		for range 10 {
			sessions = append(sessions, agent(t, i.url+"/mcp/docs", nil))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 300
	var wg sync.WaitGroup
	errs := make([]error, calls)
	for j := range calls {
		s := sessions[j%len(sessions)]
		q := fmt.Sprintf("q%d", j)
		wg.Go(func() {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"q": q}})
			if err == nil && (r.IsError || text(t, r) != "answer to "+q) {
				err = fmt.Errorf("got %v %q", r.IsError, text(t, r))
			}
			errs[j] = err
		})
	}
	wg.Wait()
	failed := 0
	for j, err := range errs {
		if err != nil {
			failed++
			t.Logf("call %d: %v", j, err)
		}
	}
	t.Logf("300 calls: %d failed; the server refused %d POSTs and saw at most %d at once", failed, fm.Refused(), fm.Peak())
	if failed > 0 {
		t.Fatalf("%d of %d calls failed", failed, calls)
	}
	for j := range calls {
		if n := fm.ExecutionsOf(fmt.Sprintf("q%d", j)); n != 1 {
			t.Fatalf("q%d ran %d times; want 1", j, n)
		}
	}
}

// TestRemoteRetryAfter: a remote server that answers a call 429 with
// Retry-After: the call waits it out and runs once; the gateway's
// session with the server survives the refusal.
func TestRemoteRetryAfter(t *testing.T) {
	fm := fakemcp.Start(t, fakemcp.Options{Token: "remote-token-0123456789", RefuseFirst: 1})
	in := fleet(t, 1, []gateway.Server{remote(t, fm.URL)}, gateway.Options{})
	s := agent(t, in[0].url+"/mcp/docs", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{"first", "second"} {
		r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"q": q}})
		if err != nil || r.IsError || text(t, r) != "answer to "+q {
			t.Fatalf("%s: %v %v", q, err, r)
		}
	}
	if fm.Refused() != 1 || fm.ExecutionsOf("first") != 1 {
		t.Fatalf("refused %d, executions of first %d; want 1, 1", fm.Refused(), fm.ExecutionsOf("first"))
	}
}
