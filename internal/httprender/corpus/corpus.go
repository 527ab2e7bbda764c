// Package corpus reads testdata/http-rendering/cases.json, the cases of
// coordd's one rendering of an answer as HTTP, for the Go tests of the
// HTTP door and the Go drop-in (the TypeScript and Python drop-ins read
// the same file), and checks an answer against a case.
package corpus

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/httprender"
)

// Document is a case of a document's answer.
type Document struct {
	Name     string              `json:"name"`
	Metadata json.RawMessage     `json:"metadata"`
	Status   int                 `json:"status"`
	Headers  map[string][]string `json:"headers"`
	Absent   []string            `json:"absent"`
}

// Error is a case of an error's answer.
type Error struct {
	Name       string              `json:"name"`
	Code       string              `json:"code"`
	Message    string              `json:"message"`
	Reason     string              `json:"reason"`
	Domain     string              `json:"domain"`
	RetryDelay string              `json:"retry_delay"`
	Status     int                 `json:"status"`
	DropIn     string              `json:"drop_in"` // response, not_carried or error
	Headers    map[string][]string `json:"headers"`
	Absent     []string            `json:"absent"`
	Body       json.RawMessage     `json:"body"`
}

// Cases is the whole file.
type Cases struct {
	Documents []Document `json:"documents"`
	Errors    []Error    `json:"errors"`
}

// Load reads the cases.
func Load(t testing.TB) Cases {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "testdata", "http-rendering", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c Cases
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("cases.json: %v", err)
	}
	if len(c.Documents) == 0 || len(c.Errors) == 0 {
		t.Fatal("cases.json: no cases")
	}
	return c
}

// MetadataOf is d's metadata message.
func (d Document) MetadataOf(t testing.TB) *coorddv1.Metadata {
	t.Helper()
	var md coorddv1.Metadata
	if err := protojson.Unmarshal(d.Metadata, &md); err != nil {
		t.Fatalf("%s: metadata: %v", d.Name, err)
	}
	return &md
}

// StatusOf is e's gRPC status, with the details coordd attaches.
func (e Error) StatusOf(t testing.TB) *status.Status {
	t.Helper()
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(`"` + e.Code + `"`)); err != nil {
		t.Fatalf("%s: code %q: %v", e.Name, e.Code, err)
	}
	st := status.New(c, e.Message)
	var ds []protoadapt.MessageV1
	if e.Reason != "" {
		domain := e.Domain
		if domain == "" {
			domain = httprender.Domain
		}
		ds = append(ds, &errdetails.ErrorInfo{Reason: e.Reason, Domain: domain})
	}
	if e.RetryDelay != "" {
		d, err := time.ParseDuration(e.RetryDelay)
		if err != nil {
			t.Fatalf("%s: retry_delay: %v", e.Name, err)
		}
		ds = append(ds, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	}
	if len(ds) > 0 {
		var err error
		if st, err = st.WithDetails(ds...); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// CheckHeaders checks h against a case's headers and absent fields.
func CheckHeaders(t testing.TB, name string, h http.Header, want map[string][]string, absent []string) {
	t.Helper()
	for k, v := range want {
		if got := h.Values(k); !slices.Equal(got, v) {
			t.Errorf("%s: %s = %q; want %q", name, k, got, v)
		}
	}
	for _, k := range absent {
		if got := h.Values(k); len(got) > 0 {
			t.Errorf("%s: %s = %q; want none", name, k, got)
		}
	}
}

// CheckError checks an error's answer (status, header, body) against e.
func CheckError(t testing.TB, e Error, code int, h http.Header, body []byte) {
	t.Helper()
	if code != e.Status {
		t.Errorf("%s: status %d; want %d", e.Name, code, e.Status)
	}
	CheckHeaders(t, e.Name, h, e.Headers, e.Absent)
	var got, want any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Errorf("%s: body %q: %v", e.Name, body, err)
	}
	if err := json.Unmarshal(e.Body, &want); err != nil {
		t.Fatalf("%s: case body: %v", e.Name, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: body %s; want %s", e.Name, body, e.Body)
	}
}
