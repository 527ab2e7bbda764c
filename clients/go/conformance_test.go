package coordd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/internal/testing/clientconformance"
)

// TestConformance plays every case of the client conformance corpus
// (testdata/client-conformance, shared with the TypeScript and Python
// clients) against its scripted fake coordd.
func TestConformance(t *testing.T) {
	corpus, err := clientconformance.Load("../../testdata/client-conformance")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := clientconformance.Start(corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ran := 0
	for _, cs := range corpus.Cases {
		t.Run(cs.Name, func(t *testing.T) {
			ran++
			playCase(t, srv, cs)
		})
	}
	if ran != len(corpus.Cases) {
		t.Errorf("ran %d cases; the corpus has %d", ran, len(corpus.Cases))
	}
}

func playCase(t *testing.T, srv *clientconformance.Server, cs clientconformance.Case) {
	cc := cs.Client
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	c := dial(t, srv.Addr(),
		coordd.WithRetryPolicy(coordd.RetryPolicy{
			MaxAttempts:    cc.MaxAttempts,
			InitialBackoff: ms(cc.InitialBackoffMs),
			MaxBackoff:     ms(cc.MaxBackoffMs),
		}),
		coordd.WithTimeout(ms(cc.TimeoutMs)),
		coordd.WithMaxBodyBytes(cc.MaxBodyBytes),
	)
	url := fmt.Sprintf("http://%s/%s/go", clientconformance.URLHost, cs.Name)
	var opts []coordd.CallOption
	switch cs.Call.Priority {
	case "interactive":
		opts = append(opts, coordd.WithPriority(coordd.Interactive))
	case "background":
		opts = append(opts, coordd.WithPriority(coordd.Background))
	}
	doc, err := c.Get(context.Background(), url, opts...)

	want := cs.Want
	if want.Document != nil {
		if err != nil {
			t.Fatalf("Get: %v; want a document", err)
		}
		wd, md := want.Document, doc.Metadata
		var progress []string
		for _, p := range doc.Progress {
			progress = append(progress, p.GetStage().String())
		}
		if string(doc.Body) != wd.Body || md.GetStatusCode() != wd.StatusCode || md.GetContentType() != wd.ContentType ||
			md.GetEtag() != wd.ETag || !slices.Equal(progress, wd.Progress) {
			t.Errorf("document: body %q, status %d, content type %q, etag %q, progress %q; want %q, %d, %q, %q, %q",
				doc.Body, md.GetStatusCode(), md.GetContentType(), md.GetEtag(), progress,
				wd.Body, wd.StatusCode, wd.ContentType, wd.ETag, wd.Progress)
		}
	} else {
		switch want.Error {
		case clientconformance.ErrBadStream:
			if !errors.Is(err, coordd.ErrBadStream) {
				t.Errorf("err = %v; want ErrBadStream", err)
			}
		case clientconformance.ErrBodyTooLarge:
			if !errors.Is(err, coordd.ErrBodyTooLarge) {
				t.Errorf("err = %v; want ErrBodyTooLarge", err)
			}
		default:
			var code codes.Code
			if e := code.UnmarshalJSON([]byte(`"` + want.Error + `"`)); e != nil {
				t.Fatalf("want.error %q: %v", want.Error, e)
			}
			if got := status.Code(err); err == nil || got != code {
				t.Errorf("err = %v (code %v); want code %v", err, got, code)
			}
		}
	}

	rec := srv.Record(url)
	if len(rec.Problems) > 0 {
		t.Errorf("the fake could not play the calls: %q", rec.Problems)
	}
	if rec.Attempts != want.Attempts {
		t.Errorf("attempts = %d; want %d", rec.Attempts, want.Attempts)
	}
	for i, p := range rec.Priorities {
		if p != cs.WantPriority() {
			t.Errorf("attempt %d: priority %s; want %s", i+1, p, cs.WantPriority())
		}
	}
	for i, least := range want.MinGapsMs {
		if i < len(rec.GapsMs) && rec.GapsMs[i] < float64(least) {
			t.Errorf("wait before attempt %d = %.1f ms; want at least %d ms", i+2, rec.GapsMs[i], least)
		}
	}
}
