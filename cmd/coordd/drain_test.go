package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// startChild runs coordd with args in a child process (the test binary
// re-executed; see TestMain), its stderr copied to the test's. A channel in
// marks is closed when a log line containing its key is first seen.
// exited yields the child's exit error once.
func startChild(t *testing.T, marks map[string]chan struct{}, args ...string) (child *exec.Cmd, exited <-chan error) {
	t.Helper()
	skipShort(t)
	child = exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childArgsEnv+"="+strings.Join(args, "\x1f"))
	stderr, err := child.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(os.Stderr, line)
			for key, ch := range marks {
				if strings.Contains(line, key) {
					delete(marks, key)
					close(ch)
				}
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		<-logDone // Wait closes the pipe: read it to the end first
		done <- child.Wait()
	}()
	t.Cleanup(func() {
		_ = child.Process.Kill()
		<-logDone
	})
	return child, done
}

// TestSIGTERMDrainDelay sends SIGTERM to a real coordd process. Health turns
// NOT_SERVING at once, yet for drain_delay the process goes on serving: a
// new connection is accepted and a new GetOrFetch call succeeds, as the
// calls a balancer still routes before it sees the status must. When the
// delay ends the server stops gracefully: health watches end, a call still
// in flight finishes, and only then does the process exit, with status 0,
// before shutdown_grace runs out. Everything is ordered by events; the
// delay only has to outlast a few loopback calls.
func TestSIGTERMDrainDelay(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	release := make(chan struct{})
	up.Set("/in-flight", fakeupstream.Behavior{Block: release})
	addr := freeAddr(t)
	delayOver, graceOver := make(chan struct{}), make(chan struct{})
	child, exited := startChild(t, map[string]chan struct{}{"draining: delay over": delayOver, "draining: grace over": graceOver},
		"--listen", addr, "--redis", rs.URL(), "--upstream", "fake="+up.URL(), "--drain-delay", "3s")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := dial(t, addr) // a connection made before SIGTERM, as a balancer's
	watch, err := healthpb.NewHealthClient(before).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if got := recvHealth(t, watch, exited); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before SIGTERM = %v; want SERVING", got)
	}

	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := recvHealth(t, watch, exited); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after SIGTERM = %v; want NOT_SERVING", got)
	}

	// During the delay: a new connection is accepted and sees NOT_SERVING,
	// and new calls are served, on it and on the old connection.
	after := dial(t, addr)
	r, err := healthpb.NewHealthClient(after).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check on a new connection during the drain delay: %v", err)
	}
	if got := r.GetStatus(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health on a new connection = %v; want NOT_SERVING", got)
	}
	for name, cc := range map[string]*grpc.ClientConn{"new connection": after, "old connection": before} {
		d, err := fleettest.Get(ctx, coorddv1.NewCoordinatorServiceClient(cc), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/during-delay"})
		if err != nil {
			t.Fatalf("GetOrFetch on the %s during the drain delay: %v", name, err)
		}
		if !bytes.Equal(d.Body, up.Body("/during-delay")) {
			t.Fatalf("GetOrFetch on the %s: body differs", name)
		}
	}
	inFlight := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(ctx, coorddv1.NewCoordinatorServiceClient(after), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/in-flight"})
		inFlight <- err
	}()
	if err := up.WaitCount(ctx, "/in-flight", 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-delayOver:
		t.Fatal("the drain delay ended before the calls above were made; is the machine that slow?")
	default:
	}

	// The delay ends; the in-flight call holds the graceful stop open.
	select {
	case <-delayOver:
	case err := <-exited:
		t.Fatalf("coordd exited (%v) before its drain delay ended", err)
	case <-ctx.Done():
		t.Fatal("the drain delay never ended")
	}
	select {
	case err := <-exited:
		t.Fatalf("coordd exited (%v) with a call in flight", err)
	default:
	}
	// The health watch, open since before SIGTERM, ends now: open, it would
	// hold the graceful stop until shutdown_grace ran out.
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("health watch after the drain delay: %v; want it ended with Unavailable", err)
	}
	close(release)
	if err := <-inFlight; err != nil {
		t.Fatalf("call in flight when the delay ended: %v", err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("coordd exit: %v; want status 0", err)
		}
	case <-ctx.Done():
		t.Fatal("coordd did not exit after its last call")
	}
	select {
	case <-graceOver:
		t.Fatal("coordd stopped hard when shutdown_grace ran out; want a graceful stop once its last call ended")
	default:
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// recvHealth returns the next status from a health Watch stream, failing
// the test if the stream breaks or the child exits first.
func recvHealth(t *testing.T, w grpc.ServerStreamingClient[healthpb.HealthCheckResponse], exited <-chan error) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	type result struct {
		r   *healthpb.HealthCheckResponse
		err error
	}
	got := make(chan result, 1)
	go func() {
		r, err := w.Recv()
		got <- result{r, err}
	}()
	select {
	case res := <-got:
		if res.err != nil {
			t.Fatalf("health watch: %v", res.err)
		}
		return res.r.GetStatus()
	case err := <-exited:
		t.Fatalf("coordd exited: %v", err)
	}
	return 0
}

// TestDrainDelayConfig: drain_delay is validated and named, from the file
// and from the flag.
func TestDrainDelayConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		args       []string
	}{
		{"negative in the file", "drain_delay: -1s\n", nil},
		{"negative flag", "", []string{"--drain-delay", "-1s"}},
		{"negative flag over a valid file", "drain_delay: 2s\n", []string{"--drain-delay", "-1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/coordd.yaml"
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--config", path, "--listen", "127.0.0.1:0"}, tt.args...)
			err := run(context.Background(), args, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), "drain_delay") {
				t.Fatalf("run error = %v; want one naming drain_delay", err)
			}
		})
	}
}

// TestSIGINTSkipsDrainDelay: Ctrl-C at a terminal stops coordd without the
// drain delay (here an hour), which only a balancer needs; the in-flight
// calls are still let finish.
func TestSIGINTSkipsDrainDelay(t *testing.T) {
	serving := make(chan struct{})
	child, exited := startChild(t, map[string]chan struct{}{"coordd serving": serving},
		"--listen", freeAddr(t), "--drain-delay", "1h")
	select {
	case <-serving:
	case err := <-exited:
		t.Fatalf("coordd exited before serving: %v", err)
	}
	if err := child.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("coordd after SIGINT: %v; want a clean exit", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("coordd still running a minute after SIGINT: it waited out the drain delay")
	}
}

// TestSecondSIGTERMEndsDrainDelay: a second SIGTERM during the drain
// delay (here an hour) ends it: coordd stops at once, cleanly (its locks
// released, exit status 0), instead of waiting the delay out or dying.
func TestSecondSIGTERMEndsDrainDelay(t *testing.T) {
	serving, draining := make(chan struct{}), make(chan struct{})
	child, exited := startChild(t, map[string]chan struct{}{"coordd serving": serving, "draining: health NOT_SERVING": draining},
		"--listen", freeAddr(t), "--drain-delay", "1h")
	for _, mark := range []chan struct{}{serving, draining} {
		select {
		case <-mark:
		case err := <-exited:
			t.Fatalf("coordd exited: %v", err)
		}
		if err := child.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("coordd after a second SIGTERM: %v; want a clean exit", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("coordd still running a minute after a second SIGTERM: it waited out the drain delay")
	}
}

// TestHurriedStopIsClean: two signals that come before coordd has started
// serving stop it cleanly, however its goroutines are scheduled: the gRPC
// server stopped before Serve ran is a clean stop, not "the server has
// been stopped" and exit status 1 (seen under stress-ng in
// TestSecondSIGTERMEndsDrainDelay).
func TestHurriedStopIsClean(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	hurry, hurried := context.WithCancel(context.Background())
	hurried()
	for i := range 30 {
		if err := runHurried(ctx, hurry, []string{"--listen", "127.0.0.1:0", "--drain-delay", "1h", "--log-level", "error"}, os.Stderr); err != nil {
			t.Fatalf("run %d: %v; want a clean stop", i, err)
		}
	}
}
