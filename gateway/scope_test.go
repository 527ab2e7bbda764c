package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
)

// tenantsOf returns gateway options with one tenant per token of
// tokens (token -> the tenant's own GitLab token), each granted gitlab.
func tenantsOf(tokens map[string]string) gateway.Options {
	byToken := map[string]string{}
	var ts []gateway.Tenant
	i := 0
	for bearer, pat := range tokens {
		name := fmt.Sprintf("team-%d", i)
		i++
		byToken[bearer] = name
		ts = append(ts, gateway.Tenant{Name: name, Servers: []string{"gitlab"},
			Env: map[string]map[string]gateway.EnvValue{"gitlab": {"GITLAB_PERSONAL_ACCESS_TOKEN": {Value: pat}}}})
	}
	return gateway.Options{Tenants: ts, Authenticate: func(tok string) (string, bool) {
		n, ok := byToken[tok]
		return n, ok
	}}
}

// TestCredentialScopesNeverShare: two tenants with GitLab tokens of
// their own, 75 agents each over 3 instances, the same call: exactly one
// execution per credential scope, and no agent sees the other scope's
// answer.
func TestCredentialScopesNeverShare(t *testing.T) {
	api := fakegitlab.Start(t)
	tokens := map[string]string{"bearer-of-team-a-0123456789": "glpat-team-a", "bearer-of-team-b-0123456789": "glpat-team-b"}
	in := fleet(t, 3, []gateway.Server{gitlab(t, api, 1, time.Minute)}, tenantsOf(tokens))
	type caller struct {
		s   *mcp.ClientSession
		pat string
	}
	var callers []caller
	for _, i := range in {
		for bearer, pat := range tokens {
			for range 25 {
				callers = append(callers, caller{agent(t, i.url+"/mcp/gitlab", map[string]string{"Authorization": "Bearer " + bearer}), pat})
			}
		}
	}
	release := api.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got := make([]string, len(callers))
	errs := make([]error, len(callers))
	var wg sync.WaitGroup
	for j, c := range callers {
		wg.Go(func() {
			r, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"file_path": "README.md", "project_id": "42", "ref": "main"}})
			if err == nil && r.IsError {
				err = fmt.Errorf("tool error: %s", text(t, r))
			}
			if err == nil {
				got[j] = text(t, r)
			}
			errs[j] = err
		})
	}
	waitFor(t, func() bool { return sum(in, func(c *counts) int64 { return c.calls.Load() }) == int64(len(callers)) })
	release()
	wg.Wait()
	for j, c := range callers {
		if errs[j] != nil {
			t.Fatalf("call %d: %v", j, errs[j])
		}
		if want := fakegitlab.Owner(c.pat); !strings.Contains(got[j], want) {
			t.Fatalf("call %d of %s's scope got %q: another scope's answer", j, want, got[j])
		}
	}
	for _, pat := range tokens {
		if n := api.FilesBy(pat); n != 1 {
			t.Errorf("requests with %s's token = %d; want 1", fakegitlab.Owner(pat), n)
		}
	}
	if got := sum(in, func(c *counts) int64 { return c.executions.Load() }); got != 2 {
		t.Errorf("backend executions = %d; want 2 (one per credential scope)", got)
	}
}

// TestWritesRunOncePerCall: a tool that is not allowed (create_issue)
// runs once per call: 150 concurrent identical calls over 3 instances
// create 150 issues.
func TestWritesRunOncePerCall(t *testing.T) {
	api := fakegitlab.Start(t)
	in := fleet(t, 3, []gateway.Server{gitlab(t, api, 2, time.Minute)}, gateway.Options{})
	var sessions []*mcp.ClientSession
	for _, i := range in {
		for range 5 {
			sessions = append(sessions, agent(t, i.url+"/mcp/gitlab", nil))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 150
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for j := range calls {
		s := sessions[j%len(sessions)]
		wg.Go(func() {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "create_issue", Arguments: map[string]any{"project_id": "42", "title": "the same title"}})
			if err == nil && r.IsError {
				err = fmt.Errorf("tool error: %s", text(t, r))
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
	if got := api.Issues(); got != calls {
		t.Errorf("issues created = %d; want %d", got, calls)
	}
	if got := sum(in, func(c *counts) int64 { return c.executions.Load() }); got != 0 {
		t.Errorf("coalesced executions = %d; want 0", got)
	}
}

// TestSharedPool: 20 agent sessions on a server with processes: 2 run 2
// processes, not 20; without processes, each session has its own.
func TestSharedPool(t *testing.T) {
	api := fakegitlab.Start(t)
	for _, tc := range []struct {
		processes, sessions, want int
	}{{2, 20, 2}, {0, 4, 4}} {
		t.Run(fmt.Sprintf("processes=%d", tc.processes), func(t *testing.T) {
			s := gitlab(t, api, tc.processes, 0)
			if tc.processes == 0 {
				s.Coalesce = nil
			}
			in := fleet(t, 1, []gateway.Server{s}, gateway.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, tc.sessions)
			for j := range tc.sessions {
				a := agent(t, in[0].url+"/mcp/gitlab", nil)
				wg.Go(func() {
					for range 3 {
						r, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "create_issue", Arguments: map[string]any{"project_id": "1", "title": "t"}})
						if err == nil && r.IsError {
							err = fmt.Errorf("tool error: %s", text(t, r))
						}
						if err != nil {
							errs[j] = err
							return
						}
					}
				})
			}
			wg.Wait()
			for j, err := range errs {
				if err != nil {
					t.Fatalf("session %d: %v", j, err)
				}
			}
			in[0].m.mu.Lock()
			peak := in[0].m.peak["gitlab"]
			in[0].m.mu.Unlock()
			if peak != tc.want {
				t.Errorf("processes at most = %d; want %d", peak, tc.want)
			}
		})
	}
}

// post sends one raw body to url and returns the status and the JSON-RPC
// error code of the answer.
func post(t *testing.T, url string, header map[string]string, body []byte) (int, int64, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if i := bytes.Index(b, []byte("data: ")); i >= 0 {
		b = b[i+6:]
	}
	var m struct {
		Error struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m.Error.Code, m.Error.Message + string(m.Result)
}

// TestBadInput: malformed messages, a batch, an unknown server, a tenant
// without a grant, arguments over the bound, non-UTF-8: each gets a
// JSON-RPC error, and none reaches a backend.
func TestBadInput(t *testing.T) {
	api := fakegitlab.Start(t)
	opt := tenantsOf(map[string]string{"bearer-of-team-a-0123456789": "glpat-team-a"})
	opt.Tenants = append(opt.Tenants, gateway.Tenant{Name: "nobody"})
	auth := opt.Authenticate
	opt.Authenticate = func(tok string) (string, bool) {
		if tok == "bearer-of-nobody-0123456789" {
			return "nobody", true
		}
		return auth(tok)
	}
	in := fleet(t, 1, []gateway.Server{gitlab(t, api, 1, 0)}, opt)
	url := in[0].url + "/mcp/gitlab"
	a := map[string]string{"Authorization": "Bearer bearer-of-team-a-0123456789"}
	init := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	for _, tc := range []struct {
		name   string
		url    string
		header map[string]string
		body   []byte
		status int
		code   int64
	}{
		{"not JSON", url, a, []byte(`{"jsonrpc":"2.0",`), 400, -32700},
		{"not JSON-RPC", url, a, []byte(`{"hello":1}`), 400, -32700},
		{"a batch", url, a, []byte(`[` + string(init) + `]`), 400, -32600},
		{"not UTF-8", url, a, []byte("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"x\":\"\xff\"}}"), 400, -32700},
		{"too large", url, a, bytes.Repeat([]byte(" "), 2<<20), 413, -32600},
		{"unknown server", in[0].url + "/mcp/nope", a, init, 404, -32600},
		{"no token", url, nil, init, 401, -32600},
		{"not granted", url, map[string]string{"Authorization": "Bearer bearer-of-nobody-0123456789"}, init, 403, -32600},
		{"no session", url, a, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`), 400, -32600},
		{"unknown session", url, map[string]string{"Authorization": a["Authorization"], "Mcp-Session-Id": "nope"}, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`), 404, -32600},
	} {
		status, code, msg := post(t, tc.url, tc.header, tc.body)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: status %d, code %d (%s); want %d, %d", tc.name, status, code, msg, tc.status, tc.code)
		}
	}
	if in[0].m.peak["gitlab"] != 0 || api.Requests() != 0 {
		t.Fatalf("bad input reached a backend: %d processes, %d API requests", in[0].m.peak["gitlab"], api.Requests())
	}
	// In a session: bad params of tools/call, before any backend call.
	s := agent(t, url, a)
	ctx := context.Background()
	big := strings.Repeat("x", gateway.MaxArgumentBytes)
	for _, tc := range []struct {
		name string
		args any
	}{
		{"arguments over the bound", map[string]any{"project_id": big, "file_path": "a"}},
	} {
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: tc.args})
		if err == nil || !strings.Contains(err.Error(), "bound") {
			t.Errorf("%s: err = %v; want an invalid-params error naming the bound", tc.name, err)
		}
	}
	if api.Requests() != 0 {
		t.Fatalf("bad arguments reached the API: %d requests", api.Requests())
	}
}

// TestStalledAndOversizedBodies: a body announced over the bound is
// refused 413 before anything is read; a body that stalls is answered 408
// once the body timeout passes, and its connection closed.
func TestStalledAndOversizedBodies(t *testing.T) {
	api := fakegitlab.Start(t)
	opt := gateway.Options{BodyTimeout: 300 * time.Millisecond}
	in := fleet(t, 1, []gateway.Server{gitlab(t, api, 1, 0)}, opt)
	addr := strings.TrimPrefix(in[0].url, "http://")
	for _, tc := range []struct {
		name, head string
		want       string
	}{
		{"announced over the bound", "Content-Length: 10737418240\r\n", "413"},
		{"stalled", "Content-Length: 100\r\n", "408"},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(time.Minute)) // a bound for a stuck server, not a speed check
		fmt.Fprintf(c, "POST /mcp/gitlab HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s\r\n{\"jsonrpc\":", addr, tc.head)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !strings.HasPrefix(resp.Status, tc.want) || !resp.Close {
			t.Errorf("%s: %s, close %v; want %s and the connection closed", tc.name, resp.Status, resp.Close, tc.want)
		}
		c.Close()
	}
	if api.Requests() != 0 || in[0].m.peak["gitlab"] != 0 {
		t.Fatal("a refused body reached a backend")
	}
}

// TestOriginAndFraming: Origin and Host are checked as the MCP servers
// check them (security.md), before any backend: another site's page is
// refused, so is its own name rebound to loopback, and so is a chunked
// body.
func TestOriginAndFraming(t *testing.T) {
	api := fakegitlab.Start(t)
	in := fleet(t, 1, []gateway.Server{gitlab(t, api, 1, 0)}, gateway.Options{AllowedOrigins: []string{"https://agents.example"}})
	url := in[0].url + "/mcp/gitlab"
	host := strings.TrimPrefix(in[0].url, "http://")
	init := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	for _, tc := range []struct {
		name   string
		header map[string]string
		status int
	}{
		{"another site", map[string]string{"Origin": "http://evil.example"}, 403},
		{"null", map[string]string{"Origin": "null"}, 403},
		{"rebound name as Host and Origin", map[string]string{"Host": "evil.example:80", "Origin": "http://evil.example:80"}, 403},
		{"own loopback origin", map[string]string{"Origin": "http://" + host}, 200},
		{"allowed origin", map[string]string{"Origin": "https://agents.example"}, 200},
	} {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range tc.header {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d; want %d", tc.name, resp.StatusCode, tc.status)
		}
	}
	// A chunked body: refused, the connection closed.
	req, _ := http.NewRequest(http.MethodPost, url, io.MultiReader(bytes.NewReader(init)))
	req.Header.Set("Content-Type", "application/json")
	req.TransferEncoding = []string{"chunked"}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 || !resp.Close {
		t.Errorf("chunked: %d, close %v; want 400 and the connection closed", resp.StatusCode, resp.Close)
	}
}
