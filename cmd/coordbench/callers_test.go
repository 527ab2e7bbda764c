package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestMain lets the test binary be the callers' child process, as the
// coordbench binary is (startCallers runs os.Executable with --callers).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == callersFlag {
		if err := callersMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "callers:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRemoteCallers runs at-once bursts with the callers in a child
// process, against coordd over 2 instances and against the floor: every
// caller gets the whole body, coordd's key is fetched once, and the
// child's times (its release, each caller's last byte) fall around the
// upstream's, as read in this process.
func TestRemoteCallers(t *testing.T) {
	cfg, err := parseConfig([]string{"--quick", "--latency", "1ms", "--small", "64"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.maxK = 2
	e := newEnv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const k, callers = 2, 20
	for _, tg := range []*target{e.coorddT, e.floorT} {
		p, err := startCallers(tg.addrs[:k])
		if err != nil {
			t.Fatal(err)
		}
		coorddK := 0
		if tg == e.coorddT {
			coorddK = k
		}
		for range 2 {
			r, err := e.burst(ctx, burstSpec{stubs: tg.stubs[:k], callers: callers, size: cfg.small, coorddK: coorddK, atOnce: true, remote: p})
			if err != nil {
				t.Fatalf("%s: %v", tg.name, err)
			}
			if r.errors != 0 {
				t.Fatalf("%s: %d errors, the first: %v", tg.name, r.errors, r.firstErr)
			}
			if want := int64(coorddK / k); r.upstream != want { // coordd: one fetch; the floor: none
				t.Errorf("%s: %d upstream requests; want %d", tg.name, r.upstream, want)
			}
			if len(r.body) != callers || r.first <= 0 || r.first > time.Minute {
				t.Errorf("%s: %d last bytes, first answer %v after the release", tg.name, len(r.body), r.first)
			}
			if tg == e.coorddT && (r.pre <= 0 || r.post <= 0) {
				t.Errorf("%s: release → upstream %v, answer → first last byte %v; want both after", tg.name, r.pre, r.post)
			}
		}
		p.close()
	}
}
