package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/upstream"
)

// children returns the pids of this process's children whose command
// line holds name.
func children(t *testing.T, name string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	me := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != strconv.Itoa(me) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmd), name) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAll(t *testing.T, name string) {
	t.Helper()
	pids := children(t, name)
	if len(pids) == 0 {
		t.Fatalf("no %s process to kill", name)
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// TestProcessKilledMidCall: the server's process is killed while a call
// runs in it. A coalesced (read-only) call runs again in a process
// started anew and is answered; a write gets an error that says its
// outcome is unknown, and is not run again.
func TestProcessKilledMidCall(t *testing.T) {
	api := fakegitlab.Start(t)
	in := fleet(t, 1, []gateway.Server{gitlab(t, api, 1, 0)}, gateway.Options{})
	s := agent(t, in[0].url+"/mcp/gitlab", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("read", func(t *testing.T) {
		release := api.Hold()
		defer release()
		got := make(chan *mcp.CallToolResult, 1)
		errc := make(chan error, 1)
		go func() {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "1", "file_path": "k.md"}})
			got <- r
			errc <- err
		}()
		waitFor(t, func() bool { return api.Files() == 1 })
		killAll(t, "server-gitlab")
		waitFor(t, func() bool { return api.Files() == 2 }) // run again, in a new process
		release()
		r, err := <-got, <-errc
		if err != nil || r.IsError {
			t.Fatalf("read after a kill: %v %v", err, r)
		}
		if !strings.Contains(text(t, r), "contents of k.md") {
			t.Fatalf("read after a kill: %q", text(t, r))
		}
		if n := in[0].m.restarts.Load(); n < 1 {
			t.Errorf("restarts = %d; want at least 1", n)
		}
	})
	t.Run("write", func(t *testing.T) {
		release := api.Hold()
		defer release()
		errc := make(chan error, 1)
		go func() {
			_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "create_issue", Arguments: map[string]any{"project_id": "1", "title": "once"}})
			errc <- err
		}()
		waitFor(t, func() bool { return api.Issues() == 1 })
		killAll(t, "server-gitlab")
		err := <-errc
		if err == nil || !strings.Contains(err.Error(), "outcome is unknown") {
			t.Fatalf("write after a kill: %v; want an error saying the outcome is unknown", err)
		}
		release()
		if n := api.Issues(); n != 1 {
			t.Fatalf("issues created = %d; want 1 (a write is never run again)", n)
		}
	})
}

// TestBreaker: a server that cannot start fails calls with a tool error;
// after failure_threshold failures the breaker, shared by the fleet,
// opens and fails calls at once without starting the server again; once
// the server can start, a probe goes through and calls succeed again.
func TestBreaker(t *testing.T) {
	api := fakegitlab.Start(t)
	dir := t.TempDir()
	starts, ok := filepath.Join(dir, "starts"), filepath.Join(dir, "ok")
	s := gitlab(t, api, 1, 0)
	node, script := s.Command[0], s.Command[1]
	s.Command = []string{"sh", "-c", `echo x >> "$1"; test -f "$2" && exec "$3" "$4"; exit 1`, "sh", starts, ok, node, script}
	s.Protection.Retry.MaxAttempts = 1
	s.Protection.Breaker.FailureThreshold = 2
	s.Protection.Breaker.OpenFor = 500 * time.Millisecond
	in := fleet(t, 2, []gateway.Server{s}, gateway.Options{})
	a := agent(t, in[0].url+"/mcp/gitlab", nil)
	b := agent(t, in[1].url+"/mcp/gitlab", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The agents connected although the server cannot start: initialize
	// answers with tools alone, and the calls say why they fail.
	call := func(s *mcp.ClientSession) (string, bool) {
		r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "1", "file_path": "b.md"}})
		if err != nil {
			return err.Error(), false
		}
		return text(t, r), !r.IsError
	}
	countStarts := func() int {
		b, _ := os.ReadFile(starts)
		return strings.Count(string(b), "x")
	}
	for range 2 {
		if msg, ok := call(a); ok || !strings.Contains(msg, "unavailable") {
			t.Fatalf("call to a server that cannot start: %q; want a tool error saying unavailable", msg)
		}
	}
	before := countStarts()
	msg, success := call(b) // the other instance: the breaker is the fleet's
	if success || !strings.Contains(msg, "breaker") {
		t.Fatalf("call with the breaker open: %q; want a tool error naming the breaker", msg)
	}
	// A write is refused by the open breaker too, before any process.
	r, err := b.CallTool(ctx, &mcp.CallToolParams{Name: "create_issue", Arguments: map[string]any{"project_id": "1", "title": "t"}})
	if err != nil || !r.IsError || !strings.Contains(text(t, r), "breaker") {
		t.Fatalf("a write with the breaker open: %v %v; want a tool error naming the breaker", err, r)
	}
	if n := countStarts(); n != before {
		t.Fatalf("the server was started %d times while the breaker was open", n-before)
	}
	if err := os.WriteFile(ok, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := call(a); return ok })
	if _, ok := call(b); !ok {
		t.Fatalf("the other instance still fails after the probe succeeded")
	}
}

// TestMisbehavingBackends: servers that write garbage to stdout, flood
// stderr without answering, never answer initialize, or answer ids they
// were not asked fail their own calls within init_timeout, with a tool
// error; a healthy server beside them answers meanwhile.
func TestMisbehavingBackends(t *testing.T) {
	api := fakegitlab.Start(t)
	bad := map[string]string{
		"garbage": `while read l; do echo 'this is not JSON-RPC {{{'; done`,
		"flood":   `yes flood-flood-flood-flood >&2`,
		"silent":  `cat > /dev/null`,
		"wrongid": `while read l; do echo '{"jsonrpc":"2.0","id":999999,"result":{}}'; done`,
	}
	servers := []gateway.Server{gitlab(t, api, 1, 0)}
	for name, script := range bad {
		servers = append(servers, gateway.Server{Name: name, Command: []string{"sh", "-c", script}, Processes: 1,
			Coalesce: []string{"x"}, InitTimeout: 2 * time.Second, Protection: upstream.Protection{Retry: upstream.RetryPolicy{MaxAttempts: 1}}})
	}
	in := fleet(t, 1, servers, gateway.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for name := range bad {
		wg.Go(func() {
			s := agent(t, in[0].url+"/mcp/"+name, nil) // initialize answers while the server cannot
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "x", Arguments: map[string]any{}})
			if err == nil && !r.IsError {
				t.Errorf("%s: a call succeeded: %v", name, r)
			}
		})
	}
	healthy := agent(t, in[0].url+"/mcp/gitlab", nil)
	r, err := healthy.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "1", "file_path": "ok.md"}})
	if err != nil || r.IsError {
		t.Fatalf("the healthy server beside misbehaving ones: %v %v", err, r)
	}
	wg.Wait()
}
