package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coordd/coordd/coordinator"
)

// memResult compares coordd's L1 holding docs documents with the naive
// cache it avoids: a Go map of *coordinator.Document, every body and
// string a pointer the garbage collector must trace.
type memResult struct {
	docs, size   int
	held         int // of the sampled documents, how many L1 still served
	sampled      int
	coordd, map_ memFigures
}

type memFigures struct {
	bytesPerDoc float64       // live heap after a GC, per document
	gcCycle     time.Duration // median wall time of a forced full GC
	gcPause     time.Duration // longest stop-the-world pause of those GCs
	fill        time.Duration // coordd only: time to get every document through Get
}

// memBase is the upstream of the memory figure; memTransport answers for
// it without a network.
const memBase = "http://docs.bench.invalid"

// memTransport answers every request with 200 and body, in memory: filling
// a million documents through loopback HTTP would measure the network
// stack, not L1.
type memTransport struct{ body []byte }

func (t memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/html; charset=utf-8"}},
		Body:          io.NopCloser(bytes.NewReader(t.body)),
		ContentLength: int64(len(t.body)),
		Request:       req,
	}, nil
}

// measureMemory builds the naive map of docs documents of size bytes, then
// drops it and fills a single-node coordinator's L1 with the same documents
// through Get, and measures each. The map goes first because it is freed
// at once, where L1 stays reachable from its documents' cleanups until
// those ran.
func measureMemory(ctx context.Context, docs, size int) (memResult, error) {
	r := memResult{docs: docs, size: size}
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	r.map_ = measureMap(docs, body)
	return r, measureL1(ctx, &r, body)
}

func docURL(i int) string { return memBase + "/docs/" + strconv.Itoa(i) }

// measureL1 fills coordd's L1 and measures it.
func measureL1(ctx context.Context, r *memResult, body []byte) error {
	docs := r.docs
	settle()
	before := liveBytes()
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{
			Name: "mem", BaseURL: memBase, Protection: coordinator.Protection{RateLimit: -1},
		}},
		// Room for every document twice over, so that none is evicted.
		L1MaxBytes: max(64<<20, 2*int64(docs)*int64(len(body)+1024)),
		Logger:     slog.New(slog.DiscardHandler),
	}, coordinator.Options{Transport: memTransport{body}})
	if err != nil {
		return err
	}
	defer c.Close()
	start := time.Now()
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= docs {
					return
				}
				if err := getDoc(ctx, c, docURL(i), nil); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("fill L1: %w", firstErr)
	}
	r.coordd.fill = time.Since(start)
	settle()
	r.coordd.bytesPerDoc = (float64(liveBytes()) - float64(before)) / float64(docs)
	r.coordd.gcCycle, r.coordd.gcPause = forcedGCs(3)
	// Check that L1 holds what was put in it: a sample must be L1 hits.
	for i := 0; i < docs; i += max(1, docs/1000) {
		var src coordinator.Source
		if err := getDoc(ctx, c, docURL(i), &src); err != nil {
			return err
		}
		r.sampled++
		if src == coordinator.SourceL1 {
			r.held++
		}
	}
	return ctx.Err()
}

// measureMap builds the naive cache of docs documents and measures it.
func measureMap(docs int, body []byte) memFigures {
	var f memFigures
	settle()
	before := liveBytes()
	now := time.Now()
	m := make(map[string]*coordinator.Document)
	for i := range docs {
		u := docURL(i)
		m[u] = &coordinator.Document{
			Key: u, URL: u, Upstream: "mem", StatusCode: http.StatusOK, ContentType: "text/html; charset=utf-8",
			FetchedAt: now, FreshUntil: now.Add(10 * time.Minute), StaleUntil: now.Add(24 * time.Hour),
			Body: bytes.Clone(body), // each fetch reads its own body
		}
	}
	settle()
	f.bytesPerDoc = (float64(liveBytes()) - float64(before)) / float64(docs)
	f.gcCycle, f.gcPause = forcedGCs(3)
	runtime.KeepAlive(m)
	return f
}

// getDoc gets u through c and, if src is not nil, stores where it came from.
func getDoc(ctx context.Context, c *coordinator.Coordinator, u string, src *coordinator.Source) error {
	t, err := c.Resolve(u, "")
	if err != nil {
		return err
	}
	res, err := c.Get(ctx, t, coordinator.GetOptions{})
	if err == nil && src != nil {
		*src = res.Source
	}
	return err
}

// forcedGCs runs n full collections and returns their median wall time
// and their longest stop-the-world pause.
func forcedGCs(n int) (median, pause time.Duration) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	first := ms.NumGC
	walls := make([]time.Duration, n)
	for i := range walls {
		start := time.Now()
		runtime.GC()
		walls[i] = time.Since(start)
	}
	runtime.ReadMemStats(&ms)
	if ms.NumGC-first > 256 {
		first = ms.NumGC - 256 // older pauses are overwritten
	}
	for g := first + 1; g <= ms.NumGC; g++ {
		pause = max(pause, time.Duration(ms.PauseNs[(g+255)%256]))
	}
	slices.Sort(walls)
	return walls[n/2], pause
}
