package server

import (
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/httprender"
	"github.com/coordd/coordd/internal/httprender/corpus"
)

// TestDoorErrorsFollowTheCorpus: the door answers every error of
// testdata/http-rendering as the mapping says (status, Retry-After,
// X-Coordd-Error, the JSON body), as the drop-ins do.
func TestDoorErrorsFollowTheCorpus(t *testing.T) {
	for _, e := range corpus.Load(t).Errors {
		rec := httptest.NewRecorder()
		writeError(rec, e.StatusOf(t).Err())
		corpus.CheckError(t, e, rec.Code, rec.Header(), rec.Body.Bytes())
	}
}

// TestDoorDocumentIsItsMetadata: the door renders a document from what
// the metadata message says of it (documentOf is metadataPB's fields
// without the message), so the corpus's document cases, which the
// rendering's tests run on metadata, are the door's too; and
// Metadata.cache_control is the door's Cache-Control.
func TestDoorDocumentIsItsMetadata(t *testing.T) {
	now := time.Unix(1_700_000_000, 123_456_789)
	docs := []*coordinator.Document{
		{},
		{Body: []byte("x"), StatusCode: 200, ContentType: "text/html", Key: "k", Upstream: "a", ETag: `"v1"`,
			LastModified: "Mon, 02 Jan 2006 15:04:05 GMT", FetchedAt: now.Add(-1500 * time.Millisecond),
			FreshUntil: now.Add(90 * time.Second), StaleUntil: now.Add(time.Hour), Revalidation: document.RevalidateStrictly},
		{Body: make([]byte, 300), StatusCode: 404, FetchedAt: now.Add(-2 * time.Hour), FreshUntil: now.Add(-time.Hour), StaleUntil: now.Add(time.Hour)},
	}
	for i, d := range docs {
		for _, src := range []coordinator.Source{coordinator.SourceL1, coordinator.SourceL2, coordinator.SourceUpstream} {
			for _, flags := range []int{0, 1, 2, 3} {
				res := &coordinator.Result{Doc: d, Source: src, Stale: flags&1 != 0}
				private := flags&2 != 0
				got := documentOf(res, private, now)
				want := httprender.FromMetadata(metadataPB(res, private, now).GetMetadata())
				if !reflect.DeepEqual(got, want) {
					t.Errorf("doc %d source %v flags %d: door %+v; metadata says %+v", i, src, flags, got, want)
				}
			}
		}
	}
}
