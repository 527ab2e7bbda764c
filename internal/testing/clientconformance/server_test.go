package clientconformance

import (
	"context"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// TestServerReportsProblems checks that a call the fake cannot play, an
// unknown case or an attempt beyond the script, is answered with ABORTED
// and reported, so that a runner fails on it.
func TestServerReportsProblems(t *testing.T) {
	corpus := &Corpus{Cases: []Case{{
		Name:     "one",
		Attempts: [][]Step{{{Metadata: &Metadata{StatusCode: 200}}}},
		Want:     Want{Document: &Document{StatusCode: 200}, Attempts: 1},
	}}}
	srv, err := Start(corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cc, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := coorddv1.NewCoordinatorServiceClient(cc)
	get := func(url string) error {
		st, err := api.GetOrFetch(context.Background(), &coorddv1.GetOrFetchRequest{Url: url})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}

	const played = "http://conformance.test/one/test"
	if err := get(played); err != nil {
		t.Fatalf("attempt 1: %v", err)
	}
	if err := get(played); status.Code(err) != codes.Aborted {
		t.Errorf("attempt 2: %v; want ABORTED", err)
	}
	if rec := srv.Record(played); rec.Attempts != 2 || len(rec.Problems) != 1 || !strings.Contains(rec.Problems[0], "not scripted") {
		t.Errorf("record = %+v; want 2 attempts and one not scripted", rec)
	}

	const unknown = "http://conformance.test/two/test"
	if err := get(unknown); status.Code(err) != codes.Aborted {
		t.Errorf("unknown case: %v; want ABORTED", err)
	}
	if rec := srv.Record(unknown); len(rec.Problems) != 1 || !strings.Contains(rec.Problems[0], `no case "two"`) {
		t.Errorf("record = %+v; want the unknown case reported", rec)
	}
}
