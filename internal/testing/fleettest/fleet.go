package fleettest

import (
	"net/http"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
)

// Fleet is coordd instances sharing one Redis, in front of one fake
// upstream: the multi-instance fixture of the coordination tests.
type Fleet struct {
	Up        *fakeupstream.Upstream
	Instances []*Instance
	// Clients are gRPC clients, Clients[i] dialled to Instances[i].
	Clients []coorddv1.CoordinatorServiceClient
	// Fetches[i] counts Instances[i]'s upstream requests, with
	// FleetOptions.CountFetches; else nil.
	Fetches []*CountingTransport
}

// FleetOptions configure StartFleet. Set RedisURL or RedisClient.
type FleetOptions struct {
	// RedisURL is the Redis every instance dials (Options.RedisURL).
	RedisURL string
	// RedisClient, when set, returns the client of one instance, built for
	// cfg, its configuration after Tune: a Redis Cluster or Sentinel
	// client, usually with cfg.RedisTimeout as its timeouts. Called once
	// per instance; Stop and Crash close the client.
	RedisClient func(cfg coordinator.Config) redis.UniversalClient
	// Tune, when set, adjusts each instance's configuration, which starts
	// as one upstream named "fake" at the fake upstream.
	Tune func(*coordinator.Config)
	// CountFetches gives each instance a CountingTransport (Fleet.Fetches).
	CountFetches bool
	// Metrics serves each instance's metrics (Options.Metrics).
	Metrics bool
}

// StartFleet starts a fake upstream, then n instances on it, each with a
// gRPC client; they are stopped on cleanup. The Redis is the caller's.
func StartFleet(t testing.TB, n int, o FleetOptions) *Fleet {
	t.Helper()
	f := &Fleet{Up: fakeupstream.New(t)}
	for range n {
		var tr *CountingTransport
		if o.CountFetches {
			tr = &CountingTransport{n: make(map[string]int)}
		}
		cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: f.Up.URL()}}}
		if o.Tune != nil {
			o.Tune(&cfg)
		}
		opts := Options{RedisURL: o.RedisURL, Config: cfg, Metrics: o.Metrics}
		if o.RedisClient != nil {
			opts.RedisClient = o.RedisClient(cfg)
		}
		if tr != nil {
			// Only when set: a nil *CountingTransport in the interface
			// would not be a nil Transport.
			opts.Transport = tr
		}
		in := Start(t, opts)
		f.Instances = append(f.Instances, in)
		f.Clients = append(f.Clients, in.Dial(t))
		if tr != nil {
			f.Fetches = append(f.Fetches, tr)
		}
	}
	return f
}

// CountingTransport counts one instance's upstream requests per path, and
// passes them on to http.DefaultTransport. It is safe for concurrent use.
type CountingTransport struct {
	mu sync.Mutex     // protects n
	n  map[string]int // requests per URL path
}

// RoundTrip implements http.RoundTripper.
func (c *CountingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// Count returns how many requests for path went through c.
func (c *CountingTransport) Count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}
