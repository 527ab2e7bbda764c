package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/haproxytest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestBehindHAProxy runs HAProxy (TCP mode, the health check of
// deploy/haproxy/haproxy.cfg) in front of three coordd processes on one
// Redis, and calls GetOrFetch through it with raw stubs, no retries, on ten
// connections: an L4 balancer spreads connections, not calls.
//
//   - A burst of 150 callers of a cold key, the upstream held until every
//     call is in flight: each gets the body, the upstream sees one request,
//     and every instance served calls (counted in each one's call log,
//     connection by connection).
//   - A second burst on another cold key, led by the instance then sent
//     SIGTERM with calls in flight (the lead call made to it directly, the
//     rest through HAProxy): 75 calls before the signal, 50 during the
//     drain delay, 25 once the delay is over (the instance stops accepting
//     and sends its connections GOAWAY). HAProxy takes it out of rotation
//     on its NOT_SERVING answer, before the delay ends; the instance
//     finishes its fetch and its calls, then exits 0. Every caller gets the
//     body and the upstream still sees one request: the draining leader
//     keeps its fill lock until its fetch ends.
func TestBehindHAProxy(t *testing.T) {
	haproxyBin := haproxytest.Path(t) // fails, never skips, without haproxy
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// drain_delay outlasts a few of HAProxy's checks (every 200ms, one
	// failure takes a server out); shutdown_grace is far longer than the
	// test holds the upstream, so the drained instance's calls end on their
	// own.
	cfgPath := t.TempDir() + "/coordd.yaml"
	if err := os.WriteFile(cfgPath, []byte("log_level: debug\ndrain_delay: 2s\nshutdown_grace: 30s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var insts []*process
	var addrs []string
	logged := make(chan struct{}, 1) // a token when any instance writes a line
	for i := range 3 {
		addr := freeAddr(t)
		insts = append(insts, startProcess(t, fmt.Sprintf("coordd-%d", i+1), logged, childCommand(
			"--config", cfgPath, "--listen", addr, "--redis", rs.URL(), "--upstream", "fake="+up.URL())))
		addrs = append(addrs, addr)
	}
	for _, in := range insts {
		if err := in.await(ctx, contains("coordd serving")); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	sock, front := dir+"/admin.sock", freeAddr(t)
	hcfg := dir + "/haproxy.cfg"
	if err := os.WriteFile(hcfg, []byte(haproxyConfig(t, front, sock, addrs)), 0o600); err != nil {
		t.Fatal(err)
	}
	hap := startProcess(t, "haproxy", nil, exec.Command(haproxyBin, "-db", "-f", hcfg))
	// HAProxy starts its servers UP and logs no change while checks pass:
	// poll its state until each server has passed the gRPC health check.
	if err := awaitHAProxy(ctx, hap, sock, func(st map[string]haproxytest.Server) bool {
		for i := range insts {
			if s := st[fmt.Sprintf("coordd-%d", i+1)]; s.Status != "UP" || s.Check != "L7OK" {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("HAProxy's health checks never all passed: %v", err)
	}

	conns := make([]coorddv1.CoordinatorServiceClient, 10)
	for i := range conns {
		conns[i] = coorddv1.NewCoordinatorServiceClient(dial(t, front))
	}

	// (a) One upstream request for 150 callers spread over three instances.
	releaseA := make(chan struct{})
	up.Set("/a", fakeupstream.Behavior{Block: releaseA})
	a := startCalls(ctx, conns, up.URL()+"/a", 150)
	if err := a.awaitInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	if err := up.WaitCount(ctx, "/a", 1); err != nil {
		t.Fatal(err)
	}
	close(releaseA)
	checkCalls(t, "burst a", a, up.Body("/a"))
	if got := up.Count("/a"); got != 1 {
		t.Fatalf("burst a: upstream requests = %d; want 1", got)
	}
	// Each call's line is written before its status is sent, but read from
	// the instances' output concurrently: wait for all 150.
	shareA := make([]callShare, len(insts))
	for {
		total := 0
		for i, in := range insts {
			shareA[i] = in.calls()
			total += shareA[i].calls
		}
		if total >= 150 {
			break
		}
		select {
		case <-logged:
		case <-ctx.Done():
			t.Fatalf("burst a: %d calls logged by the instances; want 150", total)
		}
	}
	total := 0
	peers := 0
	for i, s := range shareA {
		t.Logf("burst a: coordd-%d served %d calls on %d connections", i+1, s.calls, len(s.peers))
		if s.calls == 0 {
			t.Errorf("burst a: coordd-%d served no call; want every instance to serve some", i+1)
		}
		// Calls stay on their connection: 15 per connection.
		if s.calls != 15*len(s.peers) {
			t.Errorf("burst a: coordd-%d served %d calls on %d connections; want 15 a connection", i+1, s.calls, len(s.peers))
		}
		peers += len(s.peers)
		total += s.calls
	}
	if total != 150 || peers != len(conns) {
		t.Fatalf("burst a: %d calls on %d connections logged; want 150 on %d", total, peers, len(conns))
	}

	// (b) coordd-2 leads the second key's fetch and is drained mid-burst.
	victim := insts[1]
	releaseB := make(chan struct{})
	up.Set("/b", fakeupstream.Behavior{Block: releaseB})
	url := up.URL() + "/b"
	lead := startCalls(ctx, []coorddv1.CoordinatorServiceClient{coorddv1.NewCoordinatorServiceClient(dial(t, addrs[1]))}, url, 1)
	if err := up.WaitCount(ctx, "/b", 1); err != nil { // coordd-2 holds the fill lock
		t.Fatal(err)
	}
	before := startCalls(ctx, conns, url, 74)
	if err := before.awaitInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	down := hap.mark(regexp.MustCompile(`Server coordd/coordd-2 is DOWN, reason: (.*)`))
	delayOver := victim.mark(regexp.MustCompile("draining: delay over"))
	if err := victim.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := victim.await(ctx, contains("draining: health NOT_SERVING")); err != nil {
		t.Fatal(err)
	}
	during := startCalls(ctx, conns, url, 50)
	if err := during.awaitInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-delayOver.seen:
		t.Fatal("coordd-2's drain delay ended before the calls made during it were in flight; is the machine that slow?")
	default:
	}
	select {
	case <-down.seen:
	case <-delayOver.seen:
		t.Fatal("coordd-2's drain delay ended before HAProxy marked it DOWN")
	case <-ctx.Done():
		t.Fatal("HAProxy never marked coordd-2 DOWN")
	}
	// Layer 7: the check got an answer, NOT_SERVING, not a refused connection.
	if reason := down.match[1]; !strings.HasPrefix(reason, "Layer7 invalid response") {
		t.Errorf("HAProxy took coordd-2 down for %q; want a Layer7 invalid response (NOT_SERVING)", reason)
	}
	select {
	case <-delayOver.seen:
	case <-ctx.Done():
		t.Fatal("coordd-2's drain delay never ended")
	}
	// coordd-2 stops accepting and sends GOAWAY: its connections reconnect
	// through HAProxy, to the other two (a call sent before the GOAWAY
	// arrives is still served by coordd-2, or refused and retried by grpc-go
	// transparently).
	after := startCalls(ctx, conns, url, 25)
	if err := after.awaitInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-victim.exited:
		t.Fatalf("coordd-2 exited (%v) with calls in flight", err)
	default:
	}
	close(releaseB)
	for name, c := range map[string]*calls{"the lead call": lead, "before SIGTERM": before, "during the drain delay": during, "after the drain delay": after} {
		checkCalls(t, "burst b, "+name, c, up.Body("/b"))
	}
	if got := up.Count("/b"); got != 1 {
		t.Fatalf("burst b: upstream requests = %d; want 1 (coordd-2 kept its lock until its fetch ended)", got)
	}
	select {
	case err := <-victim.exited:
		if err != nil {
			t.Fatalf("coordd-2 exit: %v; want status 0", err)
		}
	case <-ctx.Done():
		t.Fatal("coordd-2 did not exit after its last call")
	}
	if victim.seen(contains("draining: grace over")) {
		t.Error("coordd-2 cut calls when shutdown_grace ran out; want a graceful stop")
	}
	if served := victim.calls().calls - shareA[1].calls; served < 2 {
		t.Errorf("burst b: coordd-2 served %d calls; want the lead call and some through HAProxy", served)
	} else {
		t.Logf("burst b: coordd-2 served %d calls while draining, the lead call included", served)
	}
	st, err := haproxytest.Stats(sock, "coordd")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"coordd-1": "UP", "coordd-2": "DOWN", "coordd-3": "UP"} {
		if got := st[name].Status; got != want {
			t.Errorf("HAProxy: %s is %s; want %s", name, got, want)
		}
	}
}

// haproxyConfig returns deploy/haproxy/haproxy.cfg made to run here: the
// frontend bound to front, the three servers at addrs, checked every 200ms
// and out of rotation after one failure, no Docker DNS, and a stats socket
// at sock instead of the stats page. The health check itself is the file's.
func haproxyConfig(t *testing.T, front, sock string, addrs []string) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/haproxy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var section string
	var binds, defaults, servers, checks int
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && line[0] != ' ' && line[0] != '\t' && line[0] != '#' {
			section = strings.Join(fields, " ")
		}
		switch {
		case section == "resolvers docker" || section == "frontend stats":
			continue
		case len(fields) == 0 || strings.HasPrefix(fields[0], "#"):
			out = append(out, line)
		case section == "global" && fields[0] == "global":
			out = append(out, line, "    stats socket "+sock+" level admin")
		case section == "frontend grpc" && fields[0] == "bind":
			out = append(out, "    bind "+front)
			binds++
		case section == "backend coordd" && fields[0] == "default-server":
			var kept []string
			for i := 0; i < len(fields); i++ {
				switch fields[i] {
				case "resolvers", "init-addr": // Docker's DNS
					i++
				case "inter", "fall", "rise":
					i++
				default:
					kept = append(kept, fields[i])
				}
			}
			out = append(out, "    "+strings.Join(kept, " ")+" inter 200ms fall 1 rise 1")
			defaults++
		case section == "backend coordd" && fields[0] == "server":
			if servers == 0 {
				for i, a := range addrs {
					out = append(out, fmt.Sprintf("    server coordd-%d %s", i+1, a))
				}
			}
			servers++
		default:
			if fields[0] == "tcp-check" {
				checks++
			}
			out = append(out, line)
		}
	}
	if binds != 1 || defaults != 1 || servers != len(addrs) || checks < 3 {
		t.Fatalf("deploy/haproxy/haproxy.cfg: %d binds in frontend grpc, %d default-server and %d server lines, %d tcp-check lines in backend coordd; want 1, 1, %d, 3 or more", binds, defaults, servers, checks, len(addrs))
	}
	return strings.Join(out, "\n") + "\n"
}

// awaitHAProxy polls HAProxy's stats until ok holds, HAProxy exits or ctx
// ends.
func awaitHAProxy(ctx context.Context, hap *process, sock string, ok func(map[string]haproxytest.Server) bool) error {
	var last error
	for {
		st, err := haproxytest.Stats(sock, "coordd")
		if err == nil && ok(st) {
			return nil
		}
		last = fmt.Errorf("servers %v (%v)", st, err)
		select {
		case err := <-hap.exited:
			return fmt.Errorf("haproxy exited: %v", err)
		case <-ctx.Done():
			return last
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// calls is a set of GetOrFetch calls started together.
type calls struct {
	inFlight sync.WaitGroup // done for each call at its first event, or its end
	results  chan callResult
	n        int
}

type callResult struct {
	doc *fleettest.Doc
	err error
}

// startCalls starts n GetOrFetch calls of url, spread over conns in turn.
func startCalls(ctx context.Context, conns []coorddv1.CoordinatorServiceClient, url string, n int) *calls {
	c := &calls{results: make(chan callResult, n), n: n}
	c.inFlight.Add(n)
	for i := range n {
		go func() {
			var once sync.Once
			cl := firstEventClient{conns[i%len(conns)], func() { once.Do(c.inFlight.Done) }}
			d, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: url})
			once.Do(c.inFlight.Done)
			c.results <- callResult{d, err}
		}()
	}
	return c
}

// awaitInFlight returns once every call has received its first event (it
// is in flight at an instance, its progress sent) or ended.
func (c *calls) awaitInFlight(ctx context.Context) error {
	done := make(chan struct{})
	go func() { c.inFlight.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("calls never all in flight: %w", ctx.Err())
	}
}

// checkCalls waits for every call of c and checks that each got body.
func checkCalls(t *testing.T, name string, c *calls, body []byte) {
	t.Helper()
	failed := 0
	for range c.n {
		r := <-c.results
		switch {
		case r.err != nil:
			if failed++; failed <= 3 {
				t.Errorf("%s: GetOrFetch: %v", name, r.err)
			}
		case !bytes.Equal(r.doc.Body, body):
			if failed++; failed <= 3 {
				t.Errorf("%s: GetOrFetch: body of %d bytes differs from the upstream's", name, len(r.doc.Body))
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%s: %d of %d calls failed; want none", name, failed, c.n)
	}
}

// firstEventClient calls first when a GetOrFetch stream receives its first
// message.
type firstEventClient struct {
	coorddv1.CoordinatorServiceClient
	first func()
}

func (c firstEventClient) GetOrFetch(ctx context.Context, in *coorddv1.GetOrFetchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[coorddv1.GetOrFetchResponse], error) {
	st, err := c.CoordinatorServiceClient.GetOrFetch(ctx, in, opts...)
	if err != nil {
		return nil, err
	}
	return firstEventStream{st, c.first}, nil
}

type firstEventStream struct {
	grpc.ServerStreamingClient[coorddv1.GetOrFetchResponse]
	first func()
}

func (s firstEventStream) Recv() (*coorddv1.GetOrFetchResponse, error) {
	m, err := s.ServerStreamingClient.Recv()
	if err == nil {
		s.first()
	}
	return m, err
}

// childCommand returns the command running coordd with args in a child
// process: the test binary re-executed (see TestMain).
func childCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childArgsEnv+"="+strings.Join(args, "\x1f"))
	return cmd
}

// process is a child process whose output (stdout and stderr) is kept line
// by line, to await and count log lines. Its last lines are logged if the
// test fails; it is killed when the test ends.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan error    // receives the exit status once
	logged chan struct{} // if not nil, given a token (if it has none) at each line

	mu      sync.Mutex
	lines   []string
	partial []byte
	changed chan struct{} // closed and replaced at each new line
	marks   []*mark
}

// mark is the first line matching re from when it was made.
type mark struct {
	re    *regexp.Regexp
	seen  chan struct{} // closed when a line matched
	match []string      // re's submatches; read after seen is closed
}

func startProcess(t *testing.T, name string, logged chan struct{}, cmd *exec.Cmd) *process {
	t.Helper()
	skipShort(t)
	p := &process{name: name, cmd: cmd, exited: make(chan error, 1), logged: logged, changed: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			p.mu.Lock()
			tail := p.lines[max(0, len(p.lines)-40):]
			p.mu.Unlock()
			t.Logf("%s: last %d lines:\n%s", name, len(tail), strings.Join(tail, "\n"))
		}
	})
	return p
}

// Write implements io.Writer for the process's output.
func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := string(p.partial[:i])
		p.partial = p.partial[i+1:]
		p.lines = append(p.lines, line)
		for _, m := range p.marks {
			if m.match == nil {
				if sub := m.re.FindStringSubmatch(line); sub != nil {
					m.match = sub
					close(m.seen)
				}
			}
		}
		close(p.changed)
		p.changed = make(chan struct{})
		if p.logged != nil {
			select {
			case p.logged <- struct{}{}:
			default:
			}
		}
	}
	return len(b), nil
}

// mark returns a mark for the first line matching re written from now on.
func (p *process) mark(re *regexp.Regexp) *mark {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := &mark{re: re, seen: make(chan struct{})}
	p.marks = append(p.marks, m)
	return m
}

func contains(s string) func(string) bool {
	return func(line string) bool { return strings.Contains(line, s) }
}

// seen reports whether a line so far satisfies ok.
func (p *process) seen(ok func(string) bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if ok(l) {
			return true
		}
	}
	return false
}

// await returns once a line satisfies ok, or fails when the process exits
// or ctx ends first.
func (p *process) await(ctx context.Context, ok func(string) bool) error {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if p.seen(ok) {
			return nil
		}
		select {
		case <-ch:
		case err := <-p.exited:
			p.exited <- err
			return fmt.Errorf("%s exited (%v) before logging the line awaited", p.name, err)
		case <-ctx.Done():
			return fmt.Errorf("%s: line never logged: %w", p.name, ctx.Err())
		}
	}
}

// callShare is what a coordd's call log says it served.
type callShare struct {
	calls int             // successful GetOrFetch calls
	peers map[string]bool // their connections (HAProxy's source addresses)
}

var (
	getOrFetchOK = regexp.MustCompile(`grpc\.method=GetOrFetch .*grpc\.code=OK`)
	peerAddress  = regexp.MustCompile(`peer\.address=(\S+)`)
)

// calls counts the successful GetOrFetch calls in a coordd's call log
// (debug level).
func (p *process) calls() callShare {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := callShare{peers: map[string]bool{}}
	for _, l := range p.lines {
		if getOrFetchOK.MatchString(l) {
			s.calls++
			if m := peerAddress.FindStringSubmatch(l); m != nil {
				s.peers[m[1]] = true
			}
		}
	}
	return s
}
