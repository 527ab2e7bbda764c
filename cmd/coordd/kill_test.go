package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// childArgsEnv carries the arguments of a coordd run in a child process:
// the test binary re-executed, as groupcache's tests do, so that the test
// can SIGKILL a real coordd process.
const childArgsEnv = "COORDD_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(childArgsEnv); args != "" {
		os.Unsetenv(childArgsEnv)           // no COORDD_ variable coordd would warn of
		ctx, hurry, stop := signalContext() // as main: SIGTERM drains, a second hurries
		defer stop()
		if err := runHurried(ctx, hurry, strings.Split(args, "\x1f"), os.Stderr); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if builds.dir != "" {
		os.RemoveAll(builds.dir) // coorddBinary's builds
	}
	os.Exit(code)
}

// TestLockHolderProcessKilled: the coordd process holding a key's fill
// lock is SIGKILLed mid-fetch; its lease runs out and another instance
// completes the waiters.
// skipShort skips a test that starts a child process under -short: the
// short loop starts no process.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a child process: not run under -short")
	}
}

func TestLockHolderProcessKilled(t *testing.T) {
	skipShort(t)
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	release := make(chan struct{})
	defer close(release)
	up.SetSequence("/k", []fakeupstream.Behavior{{Block: release}, {}})
	cfgPath := t.TempDir() + "/coordd.yaml"
	if err := os.WriteFile(cfgPath, []byte("lock_ttl: 1s\nlog_level: error\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childArgsEnv+"="+strings.Join([]string{
		"--config", cfgPath, "--listen", addr, "--redis", rs.URL(), "--upstream", "fake=" + up.URL()}, "\x1f"))
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for {
		r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("child coordd never served")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The child leads: its fetch hangs at the upstream.
	go func() {
		_, _ = fleettest.Get(ctx, coorddv1.NewCoordinatorServiceClient(cc), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/k"})
	}()
	if err := up.WaitCount(ctx, "/k", 1); err != nil {
		t.Fatal(err)
	}
	// Another instance's callers follow it.
	other := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}, LockTTL: time.Second}})
	oc := other.Dial(t)
	type result struct {
		d   *fleettest.Doc
		err error
	}
	done := make(chan result, 20)
	for range 20 {
		go func() {
			d, err := fleettest.Get(ctx, oc, &coorddv1.GetOrFetchRequest{Url: up.URL() + "/k"})
			done <- result{d, err}
		}()
	}
	if err := enginetest.AwaitJoined(ctx, up.URL()+"/k", 20, other.Coordinator); err != nil {
		t.Fatalf("the followers never joined: %v", err)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		r := <-done
		if r.err != nil {
			t.Fatalf("follower: %v", r.err)
		}
		if !bytes.Equal(r.d.Body, up.Body("/k")) {
			t.Fatal("follower: body differs")
		}
	}
	if got := up.Count("/k"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (the killed holder's, then one takeover)", got)
	}
}
