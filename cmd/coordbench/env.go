package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
	"github.com/coordd/coordd/server"
)

// Names of the things measured, as the table and the plots print them.
const (
	nameCoordd  = "coordd"
	namePolling = "200 ms polling"
	nameFloor   = "bare gRPC floor"
)

// env is everything a measurement runs against: one redis-server, the
// upstream, cfg.maxK instances of coordd and of each baseline, and a client
// connection to each.
type env struct {
	cfg   config
	h     redistest.TB
	redis *redistest.Server
	rdb   *redis.Client // the harness's own, for INFO and CONFIG RESETSTAT
	cat   *catalog
	up    *upstream

	coordd []*instance
	// targets, by name: coordd and the two baselines, each with maxK
	// servers and one client connection per server.
	coorddT, pollT, floorT *target

	seq atomic.Int64 // makes every cold key unique
}

// instance is one coordd: coordinator and gRPC server, as cmd/coordd wires
// them.
type instance struct {
	c    *coordinator.Coordinator
	m    *enginetest.Recorder  // c's events: its running flights
	rt   *storetest.RoundTrips // rdb's round trips to Redis
	g    *server.GRPC
	rdb  *redis.Client // nil in single-node mode
	addr string
}

// target is K servers of one kind and a client for each.
type target struct {
	name  string
	addrs []string
	stubs []coorddv1.CoordinatorServiceClient
}

// newEnv starts everything; h's cleanups stop it.
func newEnv(h redistest.TB, cfg config) *env {
	e := &env{cfg: cfg, h: h, cat: newCatalog()}
	e.redis = redistest.Start(h)
	e.rdb = redis.NewClient(&redis.Options{Addr: e.redis.Addr()})
	h.Cleanup(func() { _ = e.rdb.Close() })
	e.up = startUpstream(h, e.cat)

	e.coorddT = &target{name: nameCoordd}
	e.pollT = &target{name: namePolling}
	e.floorT = &target{name: nameFloor}
	for range cfg.maxK {
		in := e.startCoordd()
		e.coordd = append(e.coordd, in)
		e.coorddT.add(h, in.addr)
		e.pollT.add(h, startPolling(h, e.up.client))
		e.floorT.add(h, startFloor(h, e.cat))
	}
	return e
}

// startCoordd runs one coordd instance on a free loopback port, with the
// upstream's rate limit off (the figures are about coordination, not the
// limiter) and logs discarded.
func (e *env) startCoordd() *instance {
	return startCoordd(e.h, e.redis.URL(), coordinator.Upstream{
		Name:       "bench",
		BaseURL:    e.up.url,
		Protection: coordinator.Protection{RateLimit: -1},
	})
}

// startCoordd runs one coordd instance (coordinator and gRPC server, as
// cmd/coordd wires them) for up on a free loopback port, with Redis at
// redisURL and logs discarded. h's cleanups stop it.
func startCoordd(h redistest.TB, redisURL string, up coordinator.Upstream) *instance {
	return startCoorddWith(h, coorddSpec{redisURL: redisURL, cfg: coordinator.Config{Upstreams: []coordinator.Upstream{up}}})
}

// coorddSpec is what startCoorddWith runs.
type coorddSpec struct {
	redisURL string             // "": single-node mode, no Redis
	cfg      coordinator.Config // its Logger defaults to discarding
	server   []server.Option    // such as server.WithAuth
}

// startCoorddWith runs one coordd instance as s says (coordinator and gRPC
// server, as cmd/coordd wires them) on a free loopback port. h's cleanups
// stop it.
func startCoorddWith(h redistest.TB, s coorddSpec) *instance {
	in := &instance{m: enginetest.NewRecorder(nil), rt: &storetest.RoundTrips{}}
	var rdb redis.UniversalClient
	if s.redisURL != "" {
		opt, err := redis.ParseURL(s.redisURL)
		if err != nil {
			h.Fatalf("redis url: %v", err)
		}
		timeout := 500 * time.Millisecond
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		opt.ContextTimeoutEnabled = true
		in.rdb = redis.NewClient(opt)
		in.rdb.AddHook(in.rt.Hook())
		rdb = in.rdb
	}
	var mu sync.Mutex // protects in.g until it is set
	cfg := s.cfg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := coordinator.New(cfg, coordinator.Options{Redis: rdb, Metrics: in.m, OnRedisHealth: func(up bool) {
		mu.Lock()
		defer mu.Unlock()
		if in.g != nil {
			in.g.SetRedisHealth(up)
		}
	}})
	if err != nil {
		h.Fatalf("coordinator.New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Fatalf("listen: %v", err)
	}
	mu.Lock()
	in.g = server.NewGRPC(server.New(c, cfg.Logger, s.server...), server.Config{MaxConcurrentCalls: -1}) // the 10,000-stream round measures capacity, not the cap
	mu.Unlock()
	go serveLabelled(nameCoordd, func() { _ = in.g.Serve(lis) })
	in.c, in.addr = c, lis.Addr().String()
	h.Cleanup(func() {
		in.g.Stop()
		_ = c.Close()
		if in.rdb != nil {
			_ = in.rdb.Close()
		}
	})
	return in
}

// add dials addr and appends it to t.
func (t *target) add(h redistest.TB, addr string) {
	cc := dial(h, addr)
	t.addrs = append(t.addrs, addr)
	t.stubs = append(t.stubs, coorddv1.NewCoordinatorServiceClient(cc))
}

// dial returns a client connection to addr, closed on cleanup.
func dial(h redistest.TB, addr string) *grpc.ClientConn {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		h.Fatalf("dial %s: %v", addr, err)
	}
	h.Cleanup(func() { _ = cc.Close() })
	return cc
}

// newKey returns a path never used before in this run.
func (e *env) newKey(kind string) string {
	return fmt.Sprintf("/%s/%d", kind, e.seq.Add(1))
}

// flightsDone waits (at most 5s) until none of the first k coordd
// instances has a flight running, so that every Redis command of a burst
// has been sent.
func (e *env) flightsDone(ctx context.Context, k int) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		busy := false
		for _, in := range e.coordd[:k] {
			busy = busy || in.m.RunningFlights() > 0
		}
		if !busy {
			return
		}
		time.Sleep(time.Millisecond) // the coordinator offers no notification for this
	}
}

// redisCommands returns the commands Redis processed since the last
// resetRedisStats, by command, leaving out the background ones that do
// not depend on the traffic (PING from the health checks) and the
// harness's own (INFO, CONFIG).
func (e *env) redisCommands(ctx context.Context) (int64, map[string]int64, error) {
	s, err := e.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, nil, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	by := parseCommandStats(s)
	var total int64
	for cmd, n := range by {
		if ignoredCommand(cmd) {
			continue
		}
		total += n
	}
	return total, by, nil
}

func ignoredCommand(cmd string) bool {
	switch cmd {
	case "ping", "info", "config", "config|resetstat":
		return true
	}
	return false
}

func (e *env) resetRedisStats(ctx context.Context) error {
	return e.rdb.ConfigResetStat(ctx).Err()
}

// parseCommandStats reads INFO commandstats lines such as
// "cmdstat_get:calls=21,usec=175,usec_per_call=8.33,...".
func parseCommandStats(info string) map[string]int64 {
	by := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					by[cmd] = n
				}
			}
		}
	}
	return by
}

// catalog holds, by path, what the upstream and the floor serve.
type catalog struct {
	m sync.Map // path → *entry

	mu     sync.Mutex // protects bodies
	bodies map[int][]byte
}

func newCatalog() *catalog { return &catalog{bodies: make(map[int][]byte)} }

// entry is one document: its body and, for a cold burst, the gate that
// holds its answer back until every caller waits.
type entry struct {
	body []byte
	gate *gate // nil: answer at once

	once   sync.Once
	frames [][]byte // the floor's messages: metadata, then chunks; built once
	// hit, when set, is what coordd sends for a warm hit of this entry
	// (progress, metadata, chunks), each message in wire form: the floor
	// sends these bytes instead, with a request id as coordd does, so
	// that warm hits compare the same bytes on the wire.
	hit atomic.Pointer[[][]byte]
}

// body returns a deterministic body of size bytes, shared by every entry
// of that size.
func (c *catalog) body(size int) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bodies[size]; ok {
		return b
	}
	b := make([]byte, size)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789<>/ \n"[i%41]
	}
	c.bodies[size] = b
	return b
}

func (c *catalog) put(path string, e *entry) { c.m.Store(path, e) }
func (c *catalog) drop(path string)          { c.m.Delete(path) }

func (c *catalog) get(path string) *entry {
	v, ok := c.m.Load(path)
	if !ok {
		return nil
	}
	return v.(*entry)
}

// gate holds the answers for one cold key until released, then records
// when the first answer left: the moment lags are measured from.
type gate struct {
	release  chan struct{}
	latency  time.Duration // waited after release, before answering
	requests atomic.Int64  // upstream requests for the key

	once  sync.Once
	leave time.Time // set once, by the first answer to leave

	arriveOnce sync.Once
	arrive     time.Time // set once, by the first request to arrive
}

// arrived records that a request arrives now; only the first counts.
func (g *gate) arrived() { g.arriveOnce.Do(func() { g.arrive = time.Now() }) }

// arrivedAt returns when the first request arrived; call it after every
// answer has been received.
func (g *gate) arrivedAt() time.Time {
	g.arriveOnce.Do(func() {}) // orders the read after arrived's write
	return g.arrive
}

func newGate(latency time.Duration) *gate {
	return &gate{release: make(chan struct{}), latency: latency}
}

// left records that an answer leaves now; only the first counts.
func (g *gate) left() { g.once.Do(func() { g.leave = time.Now() }) }

// leftAt returns when the first answer left; call it after every answer
// has been received.
func (g *gate) leftAt() time.Time {
	g.once.Do(func() {}) // orders the read after left's write
	return g.leave
}

// upstream is the local documentation upstream: a plain net/http server
// on loopback answering from the catalog.
type upstream struct {
	url      string
	client   *http.Client // for the polling baseline's fetches
	requests atomic.Int64 // every request, gated or not
}

func startUpstream(h redistest.TB, cat *catalog) *upstream {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Fatalf("upstream listen: %v", err)
	}
	u := &upstream{url: "http://" + lis.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		e := cat.get(r.URL.Path)
		if e == nil {
			http.NotFound(w, r)
			return
		}
		if g := e.gate; g != nil {
			g.arrived()
			g.requests.Add(1)
			select {
			case <-g.release:
			case <-r.Context().Done():
				return
			}
			if g.latency > 0 {
				t := time.NewTimer(g.latency)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				}
			}
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(e.body)))
		w.WriteHeader(http.StatusOK)
		if e.gate != nil {
			e.gate.left()
		}
		_, _ = w.Write(e.body)
	})}
	go func() { _ = srv.Serve(lis) }()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	u.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	h.Cleanup(func() {
		_ = srv.Close()
		tr.CloseIdleConnections()
	})
	return u
}
