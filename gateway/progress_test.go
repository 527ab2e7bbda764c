package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/testing/mcpservers"
)

// everything is the protocol's reference "everything" server over stdio,
// its read-only tools coalesced (trust_read_only).
func everything(t *testing.T) gateway.Server {
	return gateway.Server{
		Name:          "everything",
		Command:       mcpservers.Command(t, "mcp-server-everything"),
		Processes:     1,
		TrustReadOnly: true,
	}
}

// progressLog records the progress notifications an agent receives.
type progressLog struct {
	mu  sync.Mutex
	got map[any][]float64 // by token
	ch  chan struct{}
}

func newProgressLog() *progressLog {
	return &progressLog{got: map[any][]float64{}, ch: make(chan struct{}, 100)}
}

func (p *progressLog) handler(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	p.got[req.Params.ProgressToken] = append(p.got[req.Params.ProgressToken], req.Params.Progress)
	p.mu.Unlock()
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

func (p *progressLog) of(tok any) []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]float64(nil), p.got[tok]...)
}

func progressAgent(t *testing.T, url string, log *progressLog) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: log.handler})
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func longOp(tok string) *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: map[string]any{"duration": 4, "steps": 8}}
	p.SetProgressToken(tok)
	return p
}

// TestProgressPerCaller: two agents share one execution of a read-only
// tool of the everything server; each receives the server's progress
// under its own progress token, and the same result.
func TestProgressPerCaller(t *testing.T) {
	in := fleet(t, 1, []gateway.Server{everything(t)}, gateway.Options{})
	la, lb := newProgressLog(), newProgressLog()
	a := progressAgent(t, in[0].url+"/mcp/everything", la)
	b := progressAgent(t, in[0].url+"/mcp/everything", lb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type out struct {
		r   *mcp.CallToolResult
		err error
	}
	ra, rb := make(chan out, 1), make(chan out, 1)
	go func() { r, err := a.CallTool(ctx, longOp("token-a")); ra <- out{r, err} }()
	// B asks once A's execution has reported progress: it joins it.
	waitFor(t, func() bool { return len(la.of("token-a")) > 0 })
	go func() { r, err := b.CallTool(ctx, longOp("token-b")); rb <- out{r, err} }()
	oa, ob := <-ra, <-rb
	for name, o := range map[string]out{"a": oa, "b": ob} {
		if o.err != nil || o.r.IsError {
			t.Fatalf("agent %s: %v %v", name, o.err, o.r)
		}
	}
	if text(t, oa.r) != text(t, ob.r) {
		t.Fatalf("results differ: %q, %q", text(t, oa.r), text(t, ob.r))
	}
	if n := in[0].m.executions.Load(); n != 1 {
		t.Fatalf("executions = %d; want 1", n)
	}
	pa, pb := la.of("token-a"), lb.of("token-b")
	if len(pa) != 8 || len(pb) == 0 {
		t.Fatalf("progress: a %v, b %v; want 8 for a and some for b", pa, pb)
	}
	if len(la.of("token-b")) > 0 || len(lb.of("token-a")) > 0 {
		t.Fatalf("an agent got another's progress token")
	}
}

// TestCancelDetachesOneCaller: of two agents sharing an execution, the
// one that cancels (notifications/cancelled) is detached; the other gets
// the result.
func TestCancelDetachesOneCaller(t *testing.T) {
	in := fleet(t, 1, []gateway.Server{everything(t)}, gateway.Options{})
	la, lb := newProgressLog(), newProgressLog()
	a := progressAgent(t, in[0].url+"/mcp/everything", la)
	b := progressAgent(t, in[0].url+"/mcp/everything", lb)
	actx, acancel := context.WithCancel(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	erra := make(chan error, 1)
	go func() { _, err := a.CallTool(actx, longOp("token-a")); erra <- err }()
	waitFor(t, func() bool { return len(la.of("token-a")) > 0 })
	rb := make(chan error, 1)
	var res *mcp.CallToolResult
	go func() {
		r, err := b.CallTool(ctx, longOp("token-b"))
		if err == nil && r.IsError {
			err = fmt.Errorf("tool error: %s", text(t, r))
		}
		res = r
		rb <- err
	}()
	waitFor(t, func() bool { return len(lb.of("token-b")) > 0 })
	acancel()
	if err := <-erra; err == nil {
		t.Fatalf("the cancelled call returned no error")
	}
	if err := <-rb; err != nil {
		t.Fatalf("the other caller: %v", err)
	}
	if res == nil || len(res.Content) == 0 {
		t.Fatalf("the other caller got no result")
	}
	if n := in[0].m.executions.Load(); n != 1 {
		t.Fatalf("executions = %d; want 1", n)
	}
}

// TestSamplingReachesItsAgent: the everything server asks for sampling
// during a call (trigger-sampling-request); the request reaches the agent
// whose call it is, over that call's stream, and the answer goes back to
// the server. Two agents with processes of their own each get their own.
func TestSamplingReachesItsAgent(t *testing.T) {
	s := everything(t)
	s.Processes, s.TrustReadOnly = 0, false // one process per agent session
	in := fleet(t, 1, []gateway.Server{s}, gateway.Options{})
	var askedA, askedB atomic.Int64
	a := samplingAgent(t, in[0].url+"/mcp/everything", "agent-a", &askedA)
	b := samplingAgent(t, in[0].url+"/mcp/everything", "agent-b", &askedB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, sess := range map[string]*mcp.ClientSession{"agent-a": a, "agent-b": b} {
		r, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "trigger-sampling-request", Arguments: map[string]any{"prompt": "hi"}})
		if err != nil || r.IsError {
			t.Fatalf("%s: %v %v", name, err, r)
		}
		if got := text(t, r); !strings.Contains(got, "sampled by "+name) {
			t.Fatalf("%s got %q; want its own sampling answer", name, got)
		}
	}
	if askedA.Load() != 1 || askedB.Load() != 1 {
		t.Fatalf("sampling requests: a %d, b %d; want 1 each", askedA.Load(), askedB.Load())
	}
}

// TestListsCachedAndRefreshed: on a shared pool, tools/list of many
// agents at once makes one request to the server per scope (the GitLab
// server, whose list never changes), and every agent gets the server's
// own list, annotations and schemas included (the everything server).
func TestListsCachedAndRefreshed(t *testing.T) {
	api := fakegitlab.Start(t)
	in := fleet(t, 1, []gateway.Server{gitlab(t, api, 1, 0), everything(t)}, gateway.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	lists := make([]*mcp.ListToolsResult, 10)
	errs := make([]error, len(lists))
	for i := range lists {
		s := agent(t, in[0].url+"/mcp/gitlab", nil)
		wg.Go(func() { lists[i], errs[i] = s.ListTools(ctx, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		if len(lists[i].Tools) != len(lists[0].Tools) || len(lists[i].Tools) == 0 {
			t.Fatalf("agent %d got %d tools; agent 0 %d", i, len(lists[i].Tools), len(lists[0].Tools))
		}
	}
	if n := in[0].gw.Status()[0].Calls; n != 1 {
		t.Fatalf("requests to the server for 10 agents' tools/list = %d; want 1", n)
	}
	ev, err := agent(t, in[0].url+"/mcp/everything", nil).ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var long *mcp.Tool
	for _, tl := range ev.Tools {
		if tl.Name == "trigger-long-running-operation" {
			long = tl
		}
	}
	if long == nil || long.Annotations == nil || !long.Annotations.ReadOnlyHint || long.InputSchema == nil {
		t.Fatalf("the server's annotations and schema did not pass through: %+v", long)
	}
}

// TestSamplingDuringSharedCall: a tool allowed to coalesce asks for
// sampling while it runs: the request goes to one agent waiting on the
// execution, whose result it becomes; the other agent's call runs its
// own, and each gets its own agent's answer.
func TestSamplingDuringSharedCall(t *testing.T) {
	s := everything(t)
	s.TrustReadOnly, s.Coalesce = false, []string{"trigger-sampling-request"}
	in := fleet(t, 1, []gateway.Server{s}, gateway.Options{})
	var askedA, askedB atomic.Int64
	a := samplingAgent(t, in[0].url+"/mcp/everything", "agent-a", &askedA)
	b := samplingAgent(t, in[0].url+"/mcp/everything", "agent-b", &askedB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	got := map[string]string{}
	var mu sync.Mutex
	for name, sess := range map[string]*mcp.ClientSession{"agent-a": a, "agent-b": b} {
		wg.Go(func() {
			r, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "trigger-sampling-request", Arguments: map[string]any{"prompt": "same"}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || r.IsError {
				got[name] = fmt.Sprintf("error: %v %v", err, r)
				return
			}
			got[name] = text(t, r)
		})
	}
	wg.Wait()
	for _, name := range []string{"agent-a", "agent-b"} {
		if !strings.Contains(got[name], "sampled by "+name) {
			t.Errorf("%s got %q; want its own agent's sampling answer", name, got[name])
		}
	}
	if askedA.Load() != 1 || askedB.Load() != 1 {
		t.Errorf("sampling requests: a %d, b %d; want 1 each", askedA.Load(), askedB.Load())
	}
}

// TestProgressAcrossInstances: an agent on another instance, waiting on
// the execution an agent of the first instance started, receives the
// server's progress too, under its own token.
func TestProgressAcrossInstances(t *testing.T) {
	in := fleet(t, 2, []gateway.Server{everything(t)}, gateway.Options{})
	la, lb := newProgressLog(), newProgressLog()
	a := progressAgent(t, in[0].url+"/mcp/everything", la)
	b := progressAgent(t, in[1].url+"/mcp/everything", lb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ra, rb := make(chan error, 1), make(chan error, 1)
	go func() { _, err := a.CallTool(ctx, longOp("token-a")); ra <- err }()
	waitFor(t, func() bool { return len(la.of("token-a")) > 0 })
	go func() { _, err := b.CallTool(ctx, longOp("token-b")); rb <- err }()
	if err := <-ra; err != nil {
		t.Fatal(err)
	}
	if err := <-rb; err != nil {
		t.Fatal(err)
	}
	if n := sum(in, func(c *counts) int64 { return c.executions.Load() }); n != 1 {
		t.Fatalf("executions = %d; want 1", n)
	}
	if len(lb.of("token-b")) == 0 {
		t.Fatalf("the agent on the other instance got no progress; a got %v", la.of("token-a"))
	}
	if len(lb.of("token-a")) > 0 {
		t.Fatal("the agent on the other instance got the first agent's token")
	}
}
