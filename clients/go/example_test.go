package coordd_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"time"

	"github.com/google/go-github/v75/github"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/server"
)

// startDemo runs what the examples need on loopback: a documentation
// upstream serving one small page, and a single-node coordd in front of it.
func startDemo() (addr, upstream string, stop func()) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/docs/hello" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<h1>Hello</h1>")
	}))
	quiet := slog.New(slog.DiscardHandler)
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "docs", BaseURL: up.URL}},
		Logger:    quiet,
	}, coordinator.Options{})
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	g := server.NewGRPC(server.New(c, quiet), server.Config{})
	go func() { _ = g.Serve(lis) }()
	return lis.Addr().String(), up.URL, func() {
		g.Stop()
		c.Close()
		up.Close()
	}
}

func Example() {
	addr, upstream, stop := startDemo()
	defer stop()

	c, err := coordd.Dial(addr) // host:port means dns:///host:port
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	doc, err := c.Get(ctx, upstream+"/docs/hello")
	if err != nil {
		log.Fatal(err)
	}
	md := doc.Metadata
	fmt.Println(md.GetStatusCode(), md.GetContentType(), md.GetSource())
	fmt.Println(string(doc.Body))

	// A missing page is a document with the upstream's status, not an error.
	doc, err = c.Get(ctx, upstream+"/docs/missing")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(doc.Metadata.GetStatusCode())
	// Output:
	// 200 text/html; charset=utf-8 SOURCE_UPSTREAM
	// <h1>Hello</h1>
	// 404
}

func ExampleWithProgress() {
	addr, upstream, stop := startDemo()
	defer stop()
	c, err := coordd.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	show := coordd.WithProgress(func(p *coorddv1.Progress) {
		fmt.Println("progress:", p.GetRole(), p.GetStage())
	})
	for range 2 {
		doc, err := c.Get(context.Background(), upstream+"/docs/hello", show)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("served from", doc.Metadata.GetSource())
	}
	// Output:
	// progress: ROLE_LEADER STAGE_FETCHING
	// served from SOURCE_UPSTREAM
	// progress: ROLE_HIT STAGE_UNSPECIFIED
	// served from SOURCE_L1
}

func ExampleClient_Invalidate() {
	addr, upstream, stop := startDemo()
	defer stop()
	c, err := coordd.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	url := upstream + "/docs/hello"
	for _, invalidate := range []bool{false, true} {
		if invalidate {
			if _, err := c.Invalidate(ctx, url); err != nil {
				log.Fatal(err)
			}
		}
		doc, err := c.Get(ctx, url)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(doc.Metadata.GetSource())
	}
	// Output:
	// SOURCE_UPSTREAM
	// SOURCE_UPSTREAM
}

func ExampleWithBreakerPolicy() {
	// A port nothing listens on: coordd is down.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	c, err := coordd.Dial(addr,
		coordd.WithTimeout(5*time.Second),
		coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		coordd.WithBreakerPolicy(coordd.BreakerPolicy{Failures: 2, OpenFor: time.Minute}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Two attempts find no coordd and open the breaker; the third is
	// refused without touching the network, and so is every call after.
	for range 2 {
		_, err = c.Get(context.Background(), "https://developer.mozilla.org/en-US/docs/Web")
		fmt.Println(errors.Is(err, coordd.ErrCircuitOpen))
	}
	// Output:
	// true
	// true
}

// startGitHubDemo runs a single-node coordd in front of a stand-in for
// GitHub's API (on loopback) that accepts callers' own credentials, as
// this configuration says:
//
//	upstreams:
//	  - name: github
//	    base_url: "https://api.github.com/"
//	    forward_headers: [Accept]
//	    caller_credentials: true
func startGitHubDemo() (addr, api string, stop func()) {
	gh := fakeapi.Start(fakeapi.Options{Tokens: map[string]string{"ghp_example": "octocat"}})
	quiet := slog.New(slog.DiscardHandler)
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "github", BaseURL: gh.URL() + "/", ForwardHeaders: []string{"Accept"}, CallerCredentials: true}},
		Logger:    quiet,
	}, coordinator.Options{})
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	g := server.NewGRPC(server.New(c, quiet), server.Config{})
	go func() { _ = g.Serve(lis) }()
	return lis.Addr().String(), gh.URL() + "/", func() {
		g.Stop()
		c.Close()
		gh.Close()
	}
}

// Any library that takes an *http.Client reads through coordd with one
// line: here go-github, unmodified, with the caller's own token (the
// Transport sends its Authorization header to coordd as the call's
// credential).
func ExampleNewTransport() {
	addr, api, stop := startGitHubDemo()
	defer stop()
	c, err := coordd.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	hc := &http.Client{Transport: coordd.NewTransport(c)} // the one line

	gh := github.NewClient(hc).WithAuthToken("ghp_example")
	gh.BaseURL, _ = url.Parse(api) // the stand-in; keep the default for api.github.com
	for range 2 {
		user, res, err := gh.Users.Get(context.Background(), "")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(user.GetLogin(), res.StatusCode, res.Header.Get(coordd.SourceHeader), res.Rate.Limit)
	}

	// A 404 is go-github's usual *ErrorResponse, not a transport error.
	_, _, err = gh.Users.Get(context.Background(), "nobody")
	var er *github.ErrorResponse
	fmt.Println(errors.As(err, &er), er.Response.StatusCode)

	// A POST is not carried: an error, unless WithFallback names a
	// transport for it.
	_, _, err = gh.Issues.Create(context.Background(), "o", "r", &github.IssueRequest{Title: github.Ptr("hi")})
	fmt.Println(errors.Is(err, coordd.ErrNotCarried))
	// Output:
	// octocat 200 upstream 5000
	// octocat 200 l1 5000
	// true 404
	// true
}
