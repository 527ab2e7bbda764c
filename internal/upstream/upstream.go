package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// FetchRequest is one request to an upstream.
type FetchRequest struct {
	URL          string // canonical url, inside the upstream
	ETag         string // sent as If-None-Match when set
	LastModified string // sent as If-Modified-Since when set
	// Deadline, when set, returns the latest deadline among the callers
	// waiting for the fetch, and false when one of them has none. It may
	// change while the fetch runs (callers join), so it is asked each time
	// a wait is bounded: the fetch gives up on a rate-limit slot that no
	// caller would live to see.
	Deadline func() (time.Time, bool)
	// LowPriority marks a fetch that only refreshes a copy that is still
	// fresh (a caller's max_age refused it): it takes a rate-limit slot
	// only if the next one is free, so that such callers cannot starve
	// cold misses and background revalidations.
	LowPriority bool
	// Scoped says that Header carries a credential (the upstream's, a
	// tenant's or a caller's): a quota the answer says is spent is that
	// credential's, so its backoff is not imposed on the whole upstream
	// (see Client.Backoff).
	Scoped bool
	// Header holds the request headers of this fetch besides the
	// upstream's RequestHeaders: the caller's forwarded headers and the
	// credential. It is sent on each attempt and each redirect hop, all of
	// which stay within the upstream's BaseURL.
	Header http.Header
	// QuotaScope names the credential Header carries, as a cache id does
	// ("s/" and a keyed hash; "" without one), so that the quota an answer
	// announces is paced for that credential alone; QuotaLabel says whose
	// it is on a status page, without the credential ("upstream",
	// "tenant NAME", "caller").
	QuotaScope, QuotaLabel string
	// Tenant is the tenant the fetch is made for (its first caller's), and
	// Weight that tenant's share of the upstream's slots while fetches wait
	// for them (0: 1).
	Tenant string
	Weight int
	// Background, when set, reports whether no caller waits for the fetch
	// at the time it is asked (a stale-while-revalidate refresh, or calls
	// marked background): such a fetch takes slots after every fetch a
	// caller waits for.
	Background func() bool
	// First, when set, is the first attempt's admission, asked ahead
	// (Client.PrepareAsk) for the fetch this request makes. Fetch takes
	// it, or drops it if it was asked for another priority.
	First *FirstAsk
}

// Response is an upstream's answer with its body read in full.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// Fetcher fetches from one upstream. It is the seam where retries, the
// circuit breaker and the rate limit wrap the plain HTTP fetch. A Fetcher
// returns a Response for every HTTP answer, whatever its status, and an
// error only when there is none (network error, timeout, too large, breaker
// open). report, when not nil, receives progress events; it is called from
// the Fetch goroutine. Implementations must be safe for concurrent use.
type Fetcher interface {
	Fetch(ctx context.Context, req FetchRequest, report func(Event)) (*Response, error)
}

// httpFetcher does one HTTP request against one upstream, bounded by the
// upstream's timeout and max_body_bytes. It never follows a redirect: it
// returns it, and Client.Fetch follows it through the guard, so that
// every request reaching the upstream is admitted and counted.
type httpFetcher struct {
	up     *Config
	client *http.Client
}

func newHTTPFetcher(up *Config, transport http.RoundTripper) *httpFetcher {
	f := &httpFetcher{up: up}
	f.client = &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return f
}

func (f *httpFetcher) Fetch(ctx context.Context, fr FetchRequest, _ func(Event)) (*Response, error) {
	ctx, cancel := context.WithTimeout(ctx, f.up.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fr.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	req.Header.Set("User-Agent", "coordd/1")
	for name, vs := range f.up.requestHeaders {
		req.Header[name] = vs
	}
	for name, vs := range fr.Header {
		req.Header[name] = vs
	}
	if fr.ETag != "" {
		req.Header.Set("If-None-Match", fr.ETag)
	}
	if fr.LastModified != "" {
		req.Header.Set("If-Modified-Since", fr.LastModified)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, f.up.Name, unwrapURLError(err))
	}
	defer resp.Body.Close()
	max := f.up.MaxBodyBytes
	if resp.ContentLength > max {
		return nil, fmt.Errorf("%w: %s answered %d bytes; the limit is %d", ErrTooLarge, f.up.Name, resp.ContentLength, max)
	}
	size := int64(64 << 10)
	if resp.ContentLength > 0 {
		size = resp.ContentLength + 1
	}
	buf := make([]byte, 0, min(size, max+1))
	body, err := readAll(io.LimitReader(resp.Body, max+1), buf)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: reading body: %v", ErrUnavailable, f.up.Name, unwrapURLError(err))
	}
	if int64(len(body)) > max {
		return nil, fmt.Errorf("%w: %s answered more than %d bytes", ErrTooLarge, f.up.Name, max)
	}
	return &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// readAll is io.ReadAll into a caller-sized buffer, so that a body with a
// Content-Length is read with one allocation.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				return b, nil
			}
			return b, err
		}
	}
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return fmt.Errorf("timeout: %w", context.DeadlineExceeded)
		}
		return ue.Err
	}
	return err
}

// maxRetryAfterSecs bounds a Retry-After in seconds before it becomes a
// Duration, which would overflow (negative: no backoff at all) past about
// 292 years. Callers cap it far lower anyway (Protection.RetryAfterCap).
const maxRetryAfterSecs = 1 << 31

// parseRetryAfter reads a Retry-After header: delay-seconds (digits only;
// too many seconds are clamped to maxRetryAfterSecs) or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil || secs > maxRetryAfterSecs { // err: out of range, as v is all digits
			secs = maxRetryAfterSecs
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d, true
		}
		return 0, true
	}
	return 0, false
}
