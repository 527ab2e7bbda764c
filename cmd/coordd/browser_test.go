package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/server/statuspage"
)

// chromiumPath finds headless Chromium, failing the test with how to
// install it (make deps) when it is missing.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found on PATH: the status page's browser test needs it; run `make deps` (Debian: apt-get install chromium)")
	return ""
}

// artifactDir is where tests leave files for a person to look at:
// $COORDD_ARTIFACTS, or .artifacts at the repository's root (gitignored).
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("COORDD_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "..", ".artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newBrowser starts headless Chromium with a fresh profile, closed when
// the test ends. The flags keep it off the network (updates, sync, QUIC),
// which this machine's closed network would refuse, and out of a sandbox
// that containers cannot give it.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	return ctx
}

// TestStatusPageBrowser loads /status in headless Chromium before a cold
// burst (L1's document bytes shown, the ratios explained), holds the
// burst's fetch, and waits for the page's own refreshes to show the flight
// with its waiters and each upstream's breaker; then for the flight to go
// once the fetch is let through, and its document to add to L1's document
// bytes. It saves a screenshot of the page during the burst (status.png in
// the artifact directory).
func TestStatusPageBrowser(t *testing.T) {
	skipShort(t)
	ctx := newBrowser(t)
	f := startStatusFleet(t)
	f.openFlaky(t)
	for range 5 { // one fetch, then L1 hits: figures for the windows
		if err := f.get(context.Background(), 0, "/docs/guide"); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	f.up.Set("/docs/reference/held-page", fakeupstream.Behavior{Block: release})

	// The browser authenticates as a person would after the Basic prompt;
	// the page's refreshes carry the same header.
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+statusMetricsToken))
	setAuth := func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return chromedp.Void{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // starting Chromium included
	defer cancel()
	if err := chromedp.Do(wctx, setAuth, chromedp.Navigate("http://"+f.metrics[0]+statuspage.PagePath),
		chromedp.WaitVisible(`//table[@id="flights"]//td[contains(., "no flight in progress")]`)); err != nil {
		t.Fatalf("loading the page before the burst: %v", err)
	}
	// /docs/guide's document in L1: what it takes, beside the memory
	// reserved, and the ratios explained under their table.
	docBytes, err := chromedp.Run(wctx, chromedp.Text("#l1-document-bytes"))
	if err != nil || docBytes == "" || docBytes == "0 B" {
		t.Fatalf("L1 document bytes = %q, %v; want /docs/guide's", docBytes, err)
	}
	if note, err := chromedp.Run(wctx, chromedp.Text("#ratios-explained")); err != nil || !strings.Contains(note, "L1 hits ÷ calls") {
		t.Fatalf("the line under the windows = %q, %v; want the ratios explained", note, err)
	}

	waitLeader := f.burst(t, 0, 3, "/docs/reference/held-page")
	defer func() {
		close(release)
		waitLeader()
	}()
	// Rendered by the page's script from status.json: the page was loaded
	// before the flight began.
	flightRow := `//table[@id="flights"]//tr[@data-id][.//span[text()="leader"]][td[contains(@class, "waiters")][text()="3"]]`
	for what, sel := range map[string]string{
		"the flight, leader, 3 waiters": flightRow,
		"docs's breaker closed":         `//table[@id="upstreams"]//tr[@data-upstream="docs"]//span[text()="closed"]`,
		"flaky's breaker open":          `//table[@id="upstreams"]//tr[@data-upstream="flaky"]//span[text()="open"]`,
		"redis up":                      `//dd[@id="redis-health"]/span[text()="up"]`,
	} {
		if err := chromedp.Do(wctx, chromedp.WaitVisible(sel)); err != nil {
			html, _ := chromedp.Run(ctx, chromedp.OuterHTML("main"))
			t.Fatalf("page never showed %s: %v\n%s", what, err, html)
		}
	}
	row, err := chromedp.Run(wctx, chromedp.Text(flightRow))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/docs/reference/held-page", "docs", "team-a", "fetching"} {
		if !strings.Contains(row, want) {
			t.Errorf("flight row %q lacks %q", row, want)
		}
	}
	if live, err := chromedp.Run(wctx, chromedp.Text("#updated")); err != nil || !strings.Contains(live, "as of") {
		t.Errorf("header = %q, %v; want it refreshing (as of …)", live, err)
	}
	shot, err := chromedp.Run(wctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
		t.Fatalf("screenshot is no PNG: %v", err)
	}
	path := filepath.Join(artifactDir(t), "status.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	close(release)
	waitLeader()
	waitLeader, release = func() {}, make(chan struct{})
	if err := chromedp.Do(wctx, chromedp.WaitVisible(`//table[@id="flights"]//td[contains(., "no flight in progress")]`)); err != nil {
		t.Errorf("the flight stayed on the page after it landed: %v", err)
	}
	// The script renders L1 too: the landed document adds to what the
	// documents take.
	if err := chromedp.Do(wctx, chromedp.WaitVisible(fmt.Sprintf(`//dd[@id="l1-document-bytes"][normalize-space() != %q]`, docBytes))); err != nil {
		t.Errorf("L1 document bytes stayed %q after the document landed: %v", docBytes, err)
	}
}
