package coordd

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/coordd/coordd/internal/httprender/corpus"
)

// TestTransportFollowsTheCorpus: the Transport renders every document and
// error of testdata/http-rendering as coordd's HTTP door does, and tells a
// request coordd does not carry by the status's reason alone.
func TestTransportFollowsTheCorpus(t *testing.T) {
	cases := corpus.Load(t)
	for _, d := range cases.Documents {
		req, _ := http.NewRequest(http.MethodGet, "https://developer.mozilla.org/x", nil)
		res := httpResponse(req, &stream{md: d.MetadataOf(t)})
		if res.StatusCode != d.Status {
			t.Errorf("%s: status %d; want %d", d.Name, res.StatusCode, d.Status)
		}
		corpus.CheckHeaders(t, d.Name, res.Header, d.Headers, d.Absent)
	}
	fallback := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusTeapot, Body: http.NoBody}, nil
	})
	for _, e := range cases.Errors {
		req, _ := http.NewRequest(http.MethodGet, "https://example.org/", nil)
		err := e.StatusOf(t).Err()
		without := &transport{}
		res, rerr := without.failed(req, err)
		switch e.DropIn {
		case "response":
			if rerr != nil {
				t.Errorf("%s: %v; want a response", e.Name, rerr)
				continue
			}
			body, _ := io.ReadAll(res.Body)
			corpus.CheckError(t, e, res.StatusCode, res.Header, body)
		case "not_carried":
			if !errors.Is(rerr, ErrNotCarried) {
				t.Errorf("%s: %v, %v; want ErrNotCarried", e.Name, res, rerr)
			}
			with := &transport{fallback: fallback}
			if res, err := with.failed(req, err); err != nil || res.StatusCode != http.StatusTeapot {
				t.Errorf("%s: with a fallback: %v, %v; want the fallback's answer", e.Name, res, err)
			}
		case "error":
			if rerr == nil || errors.Is(rerr, ErrNotCarried) {
				t.Errorf("%s: %v, %v; want coordd's error", e.Name, res, rerr)
			}
			with := &transport{fallback: fallback}
			if res, err := with.failed(req, err); err == nil {
				t.Errorf("%s: with a fallback: %v; want coordd's error, never the fallback", e.Name, res.StatusCode)
			}
		default:
			t.Fatalf("%s: drop_in %q", e.Name, e.DropIn)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
